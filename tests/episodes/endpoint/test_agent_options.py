"""The OpenAI options agent frameworks send, served exactly or refused with a 400 (issue 41): ``stop`` (matches
across token boundaries, log-probs unchanged, stored = returned), content parts (an echo in parts extends the
session), ``tool_choice`` none, ``logprobs``, and streaming (the real ``openai`` client and ``httpx`` line by
line, chat and completions, tool calls and usage)."""

import json

import httpx
import openai
import pytest
from test_agent_endpoint import agent_task, run

from oprl.models.chat import render
from oprl.models.tiny import build_tokenizer
from oprl.rollout import Rollout, Sampling

CALL = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


class ScriptEngine:
    """Replies ``REPLY`` (a tool call when tools are in the prompt), then EOS; token k has log-prob -0.01 (k+1)."""

    sampling, max_new_tokens = Sampling(), 120
    REPLY = "12 Observation: 3 Observation: 4"

    def __init__(self, tokenizer):
        self.tokenizer, self.sampled = tokenizer, []

    def generate(self, prompt_ids, *, seed, sampling=None, batch_size=None, row_seeds=None):
        rows = []
        for context in prompt_ids:
            reply = CALL if "<tools>" in self.tokenizer.decode(context) else self.REPLY
            rows.append([*self.tokenizer(reply, add_special_tokens=False).input_ids, self.tokenizer.eos_token_id])
        self.sampled.append(rows)
        logprobs = [[-0.01 * (k + 1) for k in range(len(r))] for r in rows]
        texts = self.tokenizer.batch_decode(rows, skip_special_tokens=True)
        return Rollout(rows, logprobs, texts, [False] * len(rows))


def conversation(tokenizer, episode) -> str:
    return tokenizer.decode(episode.prompt_ids + episode.response_ids)


def test_stop_sequences_cut_the_reply_and_the_stored_tokens_are_the_returned_ones(tokenizer):
    seen = {}

    def agent(client, problem):
        messages = list(problem["messages"])
        for turn in range(2):
            reply = client.chat.completions.create(
                model="policy", messages=messages, stop=["Observation:", "zz"], logprobs=True
            )
            seen.setdefault("replies", []).append(reply)
            messages += [{"role": "assistant", "content": reply.choices[0].message.content}]
            messages += [{"role": "user", "content": f"Observation: {turn}"}]
        seen["messages"] = messages[:-1]
        seen["too_many"] = _error(client, {"messages": messages, "stop": ["a", "b", "c", "d", "e"]})
        return 1.0

    engine = ScriptEngine(tokenizer)
    task = agent_task(agent)
    [episode] = run(engine, tokenizer, task, task.problems("train")[:1], max_turns=5, max_tokens=200)
    first = seen["replies"][0].choices[0]
    assert first.message.content == "12 " and first.finish_reason == "stop"  # the match spans 12 tokens
    assert [t.logprob for t in first.logprobs.content] == pytest.approx([-0.01, -0.02, -0.03])  # unchanged
    assert "".join(t.token for t in first.logprobs.content) == "12 "
    assert seen["too_many"][0] == 400 and "stop" in seen["too_many"][1]
    # Stored: the cut replies (their sampled log-probs), the template's end of turn after each, one segment.
    assert episode.info["segments"] == 1 and episode.info["refused_requests"] == 1
    model = [lp for lp, m in zip(episode.behavior_logprobs, episode.loss_mask, strict=True) if m]
    assert model == pytest.approx([-0.01, -0.02, -0.03] * 2)
    expected = render(tokenizer, seen["messages"], generation_prompt=False)
    assert conversation(tokenizer, episode) == expected.removesuffix(tokenizer.eos_token)  # stored = sent + returned


def test_stop_on_completions_extends_by_text(tokenizer):
    seen = []

    def agent(client, problem):
        prompt = "<|user|>1+1=</s><|assistant|>"
        for _ in range(2):
            reply = client.completions.create(model="policy", prompt=prompt, stop="Obs", logprobs=0)
            seen.append(reply.choices[0])
            prompt += reply.choices[0].text + "Obs: ok\n"
        return 1.0

    task = agent_task(agent)
    [episode] = run(ScriptEngine(tokenizer), tokenizer, task, task.problems("train")[:1], max_turns=5, max_tokens=200)
    assert [c.text for c in seen] == ["12 ", "12 "] and seen[0].logprobs.tokens == ["1", "2", " "]
    assert seen[0].logprobs.token_logprobs == pytest.approx([-0.01, -0.02, -0.03])
    assert episode.info["segments"] == 1
    assert conversation(tokenizer, episode) == "<|user|>1+1=</s><|assistant|>12 Obs: ok\n12 "


def test_content_parts_echo_extends_and_tool_choice_none_keeps_the_tools_in_the_prompt(tokenizer):
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    seen = {}

    def agent(client, problem):
        messages = [{"role": "user", "content": [{"type": "text", "text": "2+"}, {"type": "text", "text": "1="}]}]
        reply = client.chat.completions.create(model="policy", messages=messages, tools=tools, tool_choice="none")
        content = reply.choices[0].message.content
        seen["none"] = (content, reply.choices[0].message.tool_calls)
        messages += [{"role": "assistant", "content": [{"type": "text", "text": content}]}]
        messages += [{"role": "user", "content": [{"type": "text", "text": "again"}]}]
        client.chat.completions.create(model="policy", messages=messages, tools=tools, tool_choice="none")
        return 1.0

    task = agent_task(agent)
    [episode] = run(ScriptEngine(tokenizer), tokenizer, task, task.problems("train")[:1], max_turns=5, max_tokens=200)
    assert seen["none"] == (CALL, None)  # the tools in the prompt (as OpenAI shows them), the reply as text
    assert episode.info["segments"] == 1 and "<tools>" in conversation(tokenizer, episode)
    assert "<|user|>2+\n1=</s>" in conversation(tokenizer, episode)  # text parts joined by a newline


def _error(client, body):
    headers = {"Authorization": f"Bearer {client.api_key}"}
    r = httpx.post(str(client.base_url) + "chat/completions", json=body, headers=headers)
    return r.status_code, r.json()["error"]["message"]


def test_streaming_with_the_openai_client_and_httpx(tokenizer):
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    seen = {}

    def agent(client, problem):
        messages = list(problem["messages"])
        stream = client.chat.completions.create(
            model="policy", messages=messages, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
        seen["content"] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        seen["finish"] = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        seen["usage"] = chunks[-1].usage
        messages += [{"role": "assistant", "content": seen["content"]}, {"role": "user", "content": "go"}]
        calls = client.chat.completions.create(model="policy", messages=messages, tools=tools, stream=True)
        seen["calls"] = [c.choices[0].delta.tool_calls for c in calls if c.choices and c.choices[0].delta.tool_calls]
        headers = {"Authorization": f"Bearer {client.api_key}"}
        body = {"prompt": "<|user|>1=</s><|assistant|>", "stream": True}
        with httpx.stream("POST", str(client.base_url) + "completions", json=body, headers=headers) as r:
            seen["lines"] = [line for line in r.iter_lines() if line]
            seen["type"] = r.headers["content-type"]
        return 1.0

    task = agent_task(agent)
    [_] = run(ScriptEngine(tokenizer), tokenizer, task, task.problems("train")[:1], max_turns=5, max_tokens=400)
    assert seen["content"] == ScriptEngine.REPLY and seen["finish"] == ["stop"]
    assert seen["usage"].completion_tokens == len(ScriptEngine.REPLY) + 1 and seen["usage"].prompt_tokens > 0
    [[call]] = seen["calls"]
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 1, "b": 2}
    assert seen["type"].startswith("text/event-stream") and seen["lines"][-1] == "data: [DONE]"
    events = [json.loads(line.removeprefix("data: ")) for line in seen["lines"][:-1]]
    assert "".join(e["choices"][0]["text"] for e in events) == ScriptEngine.REPLY
    assert events[-1]["choices"][0]["finish_reason"] == "stop" and events[0]["object"] == "text_completion"


def test_options_that_cannot_be_honoured_are_refused(tokenizer):
    refusals = {}

    def agent(client, problem):
        for name, value in [
            ("tool_choice", {"type": "function", "function": {"name": "add"}}),
            ("response_format", {"type": "json_object"}),
            ("presence_penalty", 0.5),
            ("frequency_penalty", 0.1),
            ("top_logprobs", 2),
            ("top_k", 5),
            ("functions", [{"name": "f"}]),
        ]:
            refusals[name] = _error(client, {"messages": problem["messages"], name: value})
        with pytest.raises(openai.BadRequestError, match="previous_response_id"):
            client.responses.create(model="policy", input="hi", previous_response_id="resp_1")
        return 1.0

    task = agent_task(agent)
    [episode] = run(ScriptEngine(tokenizer), tokenizer, task, task.problems("train")[:1])
    for name, (status, message) in refusals.items():
        assert status == 400 and name in message, (name, message)
    assert episode.info["refused_requests"] == len(refusals) + 1


def test_an_echo_with_the_matched_stop_appended_extends(tokenizer):
    """An agent that closes a cut reply with the stop sequence it was cut at (as smolagents' CodeAgent does with
    ``</code>``) continues its session: the stop sequence's tokens are context (mask 0), stored = sent."""
    seen = {}

    def agent(client, problem):
        messages = list(problem["messages"])
        reply = client.chat.completions.create(model="policy", messages=messages, stop=["Observation:"])
        content = reply.choices[0].message.content + "Observation:"
        messages += [{"role": "assistant", "content": content}, {"role": "user", "content": "3"}]
        last = client.chat.completions.create(model="policy", messages=messages, stop=["Observation:"])
        seen["messages"] = [*messages, {"role": "assistant", "content": last.choices[0].message.content}]
        return 1.0

    task = agent_task(agent)
    [episode] = run(ScriptEngine(tokenizer), tokenizer, task, task.problems("train")[:1], max_turns=5, max_tokens=200)
    assert episode.info["segments"] == 1
    expected = render(tokenizer, seen["messages"], generation_prompt=False).removesuffix(tokenizer.eos_token)
    assert conversation(tokenizer, episode) == expected
    context = tokenizer.decode([t for t, m in zip(episode.response_ids, episode.loss_mask, strict=True) if not m])
    assert context.startswith("Observation:</s>")  # the agent's stop sequence, then the end of turn


def test_an_agent_task_refuses_a_weight_switch_naming_the_key():
    from oprl.episodes.agents import run_agent_episodes
    from oprl.episodes.episode import EpisodeSettings
    from oprl.errors import OprlError

    with pytest.raises(OprlError, match=r"^sync\.partial=true: agent tasks .* set sync\.partial=false$"):
        run_agent_episodes(None, None, None, [], EpisodeSettings(seed=0, max_turns=1, max_tokens=8, switch=object()))


UNHONOURED = {
    "ignore_eos": True,
    "min_tokens": 5,
    "stop_token_ids": [2],
    "guided_json": {"type": "object"},
    "structured_outputs": {"json": {"type": "object"}},
    "reasoning_effort": "high",
    "chat_template_kwargs": {"enable_thinking": False},
    "echo": True,
    "best_of": 2,
    "use_beam_search": True,
    "continue_final_message": True,
    "add_generation_prompt": False,
}


def test_every_option_the_endpoint_does_not_honour_is_a_400_naming_it(tokenizer):
    """Issue 67, item 6 (9790d4b: each got a 200 and unconstrained sampling; ``continue_final_message`` started a
    new turn; Responses' ``top_logprobs`` was dropped while chat's is a 400). At their neutral value they are
    accepted, through the openai client's ``extra_body`` as frameworks send them."""
    refused, served = {}, []

    def agent(client, problem):
        for name, value in UNHONOURED.items():
            refused[name] = _error(client, {"messages": problem["messages"], name: value})
        headers = {"Authorization": f"Bearer {client.api_key}"}
        r = httpx.post(str(client.base_url) + "completions", json={"prompt": "1=", "min_tokens": 3}, headers=headers)
        refused["completions min_tokens"] = (r.status_code, r.json()["error"]["message"])
        with pytest.raises(openai.BadRequestError, match="top_logprobs=2: the engine \\(ScriptEngine\\)"):
            include = ["message.output_text.logprobs"]  # the engine records no top log-probs
            client.responses.create(model="policy", input="hi", top_logprobs=2, include=include)
        neutral = {"ignore_eos": False, "min_tokens": 0, "continue_final_message": False, "echo": False}
        reply = client.chat.completions.create(model="policy", messages=problem["messages"], extra_body=neutral)
        served.append(reply.choices[0].message.content)
        return 1.0

    task = agent_task(agent)
    [episode] = run(ScriptEngine(tokenizer), tokenizer, task, task.problems("train")[:1])
    for name, (status, message) in refused.items():
        assert status == 400 and message.startswith(name.split()[-1] + "="), (name, message)
    assert "/v1/completions" in refused["continue_final_message"][1]
    assert served == [ScriptEngine.REPLY] and episode.info["refused_requests"] == len(UNHONOURED) + 2


TWO_CALLS = CALL + CALL.replace('"a": 1', '"a": 5')


class ParallelEngine(ScriptEngine):
    """With tools in the prompt: two parallel calls the first turn, then "3"; without: ``REPLY``."""

    max_new_tokens = 200

    def generate(self, prompt_ids, *, seed, sampling=None, batch_size=None, row_seeds=None):
        rows = []
        for context in prompt_ids:
            text = self.tokenizer.decode(context)
            reply = (TWO_CALLS if "<|tool|>" not in text else "3") if "<tools>" in text else self.REPLY
            rows.append([*self.tokenizer(reply, add_special_tokens=False).input_ids, self.tokenizer.eos_token_id])
        self.sampled.append(rows)
        logprobs = [[-0.01 * (k + 1) for k in range(len(r))] for r in rows]
        return Rollout(rows, logprobs, self.tokenizer.batch_decode(rows, skip_special_tokens=True), [False] * len(rows))


@pytest.mark.parametrize("last", ["auto", "none"])
def test_parallel_calls_echoed_in_another_order_and_a_last_tool_choice_none_extend_the_segment(tokenizer, last):
    """Issue 67, item 7: a framework that echoes parallel calls in the order they finished, and one that asks its
    last turn with ``tool_choice="none"``, extend the segment: every sampled token stored once (9790d4b: each
    started a new segment and the calls' tokens were dropped)."""
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]

    def agent(client, problem):
        messages = [{"role": "user", "content": "1+2 and 5+2?"}]
        message = client.chat.completions.create(model="policy", messages=messages, tools=tools).choices[0].message
        calls = [c.model_dump() for c in message.tool_calls][::-1]  # the second call finished first
        messages.append({"role": "assistant", "content": message.content, "tool_calls": calls})
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": str(k)} for k, c in enumerate(calls)]
        client.chat.completions.create(model="policy", messages=messages, tools=tools, tool_choice=last)
        return 1.0

    engine = ParallelEngine(tokenizer)
    task = agent_task(agent)
    [episode] = run(engine, tokenizer, task, task.problems("train")[:1], max_turns=5, max_tokens=1000)
    assert episode.info["segments"] == 1 and episode.info["dropped_tokens"] == 0
    first, second = engine.sampled[0][0], engine.sampled[1][0]
    assert episode.response_ids[: len(first)] == first and episode.response_ids[-len(second) :] == second
    assert sum(episode.loss_mask) == len(first) + len(second)
