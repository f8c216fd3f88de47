"""Requests as the agent sent them (issue 67, item 8), each with the real ``openai`` client or raw HTTP: a huge
request is parsed on the endpoint's heavy executor and refused by the context bound before its body is walked,
while another agent's small request is served (the timing bound: ``benchmarks/agent_endpoint_parsing.py``);
boolean token ids are refused naming the field; chat log-probs are those of the returned text (no EOS); a
Responses request's refusals name its own fields, not the chat fields it is translated to."""

import json
import threading

import httpx
import openai
import pytest
from test_agent_sessions import Recorder, run_agent

from oprl.episodes.endpoint import openai_api
from oprl.episodes.endpoint.routes import HEAVY_BYTES
from oprl.models.tiny import build_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def test_a_small_request_is_served_while_a_huge_one_waits_for_the_heavy_executor(tokenizer, monkeypatch):
    """A 100,000-message request (3 MiB, past ``HEAVY_BYTES``) waits for the endpoint's heavy thread, held busy
    here; another agent's one-message request is served meanwhile (9790d4b: both on the event loop's default
    executor, and twelve such requests delayed another agent by 4.75 s). Then the huge one is refused by the
    context bound (at least 2 tokens a message) without its messages being walked or validated."""
    walked = []
    check_tree = openai_api.check_tree
    monkeypatch.setattr(openai_api, "check_tree", lambda data: walked.append(len(data["messages"])) or check_tree(data))
    engine = Recorder(tokenizer)
    engine.context = 2048  # the room the bound is checked against (2048 - max_new_tokens)
    huge_sent, small_done, seen = threading.Event(), threading.Event(), {}

    def agent(client, problem):
        if not problem["task_id"].endswith("0"):
            huge_sent.wait(10)
            reply = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
            seen["small"] = reply.choices[0].message.content
            small_done.set()
            return 1.0
        endpoint, blocker = engine.task.endpoint, threading.Event()
        endpoint.heavy.submit(blocker.wait, 10)  # the heavy thread busy: a huge request queues behind this
        body = json.dumps({"model": "policy", "messages": [{"role": "user", "content": ""}] * 100_000}).encode()
        assert len(body) > HEAVY_BYTES
        headers = {"Authorization": f"Bearer {client.api_key}", "Content-Type": "application/json"}

        def send():
            r = httpx.post(str(client.base_url) + "chat/completions", content=body, headers=headers, timeout=30)
            seen["huge"] = (r.status_code, r.json()["error"]["message"])

        huge = threading.Thread(target=send)
        huge.start()
        huge_sent.set()
        seen["small_first"] = small_done.wait(10) and huge.is_alive()
        blocker.set()
        huge.join(30)
        return 1.0

    _, episodes = run_agent(agent, engine, tokenizer, problems=2, batch_wait_s=0.0)
    assert seen["small"] == "ok" and seen["small_first"], seen
    status, message = seen["huge"]
    assert status == 400 and "at least 200000 tokens" in message, message
    assert 100_000 not in walked  # refused before its messages were walked (and validated)
    assert episodes[0].truncated and episodes[1].outcome.total == 1.0


def test_boolean_token_ids_are_refused_naming_the_field(tokenizer):
    """``prompt: [5, true]`` (9790d4b: taken as token 1, a 200), ``2.0`` alike; ``n: true`` too."""
    refusals = []

    def agent(client, problem):
        for prompt, extra in (([5, True], {}), ([5, 2.0], {}), ([5, 6], {"n": True})):
            with pytest.raises(openai.BadRequestError) as refused:
                client.completions.create(model="policy", prompt=prompt, extra_body=extra)
            refusals.append(refused.value.body["message"])
        return 1.0

    run_agent(agent, Recorder(tokenizer), tokenizer)
    assert refusals[0].startswith("prompt: item 1 is true: a token id is an integer"), refusals
    assert refusals[1].startswith("prompt: item 1 is 2.0") and refusals[2].startswith("n: "), refusals


def test_chat_logprobs_are_the_returned_texts_tokens_without_the_eos(tokenizer):
    """The reply ``ok`` ended by EOS: log-probs for ``o`` and ``k`` only, their text the content (9790d4b: a third
    entry ``</s>``, a token the agent never sees); completions keep the EOS (a prompt by ids must hold it)."""
    seen = {}

    def agent(client, problem):
        reply = client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "hi"}], logprobs=True
        )
        seen["chat"] = (reply.choices[0].message.content, reply.choices[0].logprobs.content)
        seen["stream"] = [
            c.choices[0].logprobs.content
            for c in client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "hi"}], logprobs=True, stream=True
            )
            if c.choices and c.choices[0].logprobs
        ]
        completion = client.completions.create(model="policy", prompt="<|user|>hi</s><|assistant|>", logprobs=0)
        seen["completion"] = completion.choices[0].logprobs.tokens
        return 1.0

    engine = Recorder(tokenizer)
    run_agent(agent, engine, tokenizer)
    content, entries = seen["chat"]
    assert content == "ok" and [e.token for e in entries] == ["o", "k"], entries
    assert [e.logprob for e in entries] == pytest.approx([-0.001, -0.002])  # the behaviour log-probs, unchanged
    assert [[e.token for e in chunk] for chunk in seen["stream"]] == [["o", "k"]]
    assert seen["completion"][-1] == tokenizer.eos_token


def test_responses_refusals_name_the_responses_fields(tokenizer):
    """A Responses request is translated to chat; its refusals name what the agent sent (9790d4b:
    ``messages.0.tool_calls.0.function.name``, ``messages.1.role``, ``max_tokens``, ``tools.0.function.parameters``)."""
    refusals = []
    bad = [
        {"input": [{"type": "function_call", "call_id": "c1", "name": 5, "arguments": "{}"}]},
        {"instructions": "Be brief.", "input": [{"role": "robot", "content": "hi"}]},
        {"input": "hi", "max_output_tokens": 10_000},
        {"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": "none"}]},
        {"input": [{"role": "user", "content": "a"}, {"type": "function_call_output", "call_id": 7, "output": "3"}]},
    ]

    def agent(client, problem):
        for body in bad:
            with pytest.raises(openai.BadRequestError) as refused:
                client.responses.create(model="policy", **body)
            refusals.append(refused.value.body["message"])
        return 1.0

    run_agent(agent, Recorder(tokenizer), tokenizer)
    fields = ["input.0.name:", "input.0.role:", "max_output_tokens=10000 exceeds", "tools.0.parameters:"]
    fields.append("input.1.call_id:")
    for message, field in zip(refusals, fields, strict=True):
        assert message.startswith(field), (field, message)
