"""Sessions of the agent endpoint, driven with the real ``openai`` client (issue 52): tool-call turns extend the
segment so every sampled token is stored once (chat and Responses), a reply is stored on the request it was
sampled for whatever the session does meanwhile, and no request leaves a row without a response token.

Every row is checked token by token against the engine's calls (``Recorder.check``): each run of sampled tokens
(loss mask 1) follows exactly the context it was sampled on and carries the log-probs the engine returned.
"""

import contextlib
import inspect
import json
import threading
import time
from collections.abc import Callable

import openai
import pytest

from oprl.episodes.agents import task_episodes
from oprl.models.tiny import build_tokenizer
from oprl.rollout import Rollout, Sampling
from oprl.tasks import build_task
from oprl.tasks.agent import AgentTask, AgentTaskConfig

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def tool_call(expression: str) -> str:
    return "<tool_call>" + json.dumps({"name": "calculate", "arguments": {"expression": expression}}) + "</tool_call>"


class Recorder:
    """A scripted engine: with tools in the context it calls ``calculate`` twice (on ``2*3``, then on the result
    ``*1``) and then answers with the last tool result; without tools it answers ``ok``. Each reply ends with
    EOS; the k-th token sampled gets log-prob ``-k/1000``; every call is kept (context -> ids, log-probs).
    ``gate``: when set, the first call waits for it (``started`` tells it began), so a test can send a request
    while another is being sampled; ``hold(text)``: a context for which it is true is sampled only once the
    agent's session has closed (``task``'s endpoint has no session left), so its reply is never recorded."""

    sampling, max_new_tokens = Sampling(), 200

    def __init__(self, tokenizer, gate: threading.Event | None = None):
        self.tokenizer, self.gate, self.started = tokenizer, gate, threading.Event()
        self.hold: Callable[[str], bool] = lambda text: False
        self.task: AgentTask | None = None
        self.sampled: dict[tuple[int, ...], tuple[list[int], list[float]]] = {}
        self.count = 0

    def generate(self, prompt_ids, *, seed, sampling=None, batch_size=None, row_seeds=None):
        self.started.set()
        if self.gate is not None:
            self.gate.wait(10)
            self.gate = None
        rows, logprobs = [], []
        for context in prompt_ids:
            text = self.tokenizer.decode(context)
            deadline = time.monotonic() + 10
            while self.hold(text) and self.task.endpoint.sessions and time.monotonic() < deadline:
                time.sleep(0.005)
            turn = text.count("<|assistant|>") - 1  # model turns already in this context
            if "<tools>" not in text:
                reply = "ok"
            elif turn < 2:
                reply = tool_call("2*3" if turn == 0 else "6*1")
            else:
                reply = text.split("<|tool|>")[-1].split("</s>")[0]
            row = [*self.tokenizer(reply, add_special_tokens=False).input_ids, self.tokenizer.eos_token_id]
            rows.append(row)
            logprobs.append([-(self.count + k + 1) / 1000 for k in range(len(row))])
            self.count += len(row)
            self.sampled[tuple(context)] = (row, logprobs[-1])
        texts = self.tokenizer.batch_decode(rows, skip_special_tokens=True)
        return Rollout(rows, logprobs, texts, [False] * len(rows))

    def check(self, episode) -> int:
        """Assert that every sampled run of ``episode`` is (a prefix of) the reply to exactly the context before
        it, with its log-probs; returns the number of runs."""
        context, k, runs, mask = list(episode.prompt_ids), 0, 0, episode.loss_mask
        while k < len(mask):
            if not mask[k]:
                context.append(episode.response_ids[k])
                k += 1
                continue
            end = next((j for j in range(k, len(mask)) if not mask[j]), len(mask))
            assert tuple(context) in self.sampled, "sampled tokens stored after a context they were not sampled on"
            ids, logprobs = self.sampled[tuple(context)]
            assert episode.response_ids[k:end] == ids[: end - k]
            assert episode.behavior_logprobs[k:end] == logprobs[: end - k]
            context += episode.response_ids[k:end]
            k, runs = end, runs + 1
        return runs

    def tokens(self) -> int:
        return sum(len(ids) for ids, _ in self.sampled.values())


def run_agent(agent, engine, tokenizer, *, problems: int = 1, **kw):
    task = build_task(
        AgentTaskConfig(
            agent="tests/episodes/endpoint/test_agent_sessions.py:chat_tool_agent",
            problems={"name": "tool-arithmetic", "train_size": 8, "test_size": 2},
            batch_wait_s=kw.pop("batch_wait_s", 0.05),
        )
    )
    task.rollout, task.is_async, engine.task = agent, inspect.iscoroutinefunction(agent), task
    settings = {"seed": 0, "max_turns": 4, "max_tokens": 400, "episode_timeout": 30} | kw
    return task, task_episodes(engine, tokenizer, task, task.problems("train")[:problems], **settings)


def chat_tool_agent(client, problem: dict) -> float:
    """The tool loop every framework runs: the reply echoed as the client returned it (``model_dump``: content
    ``None`` beside ``tool_calls``), one ``tool`` message per call, until a reply without calls."""
    messages = [{"role": "user", "content": "2*3="}]
    for _ in range(4):
        message = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return float(message.content == "6")
        for call in message.tool_calls:
            value = str(eval(json.loads(call.function.arguments)["expression"]))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": value})
    return 0.0


def responses_tool_agent(client, problem: dict) -> float:
    """The same loop on ``/v1/responses``: output items appended to ``input`` as they came (openai-agents' way)."""
    items: list = [{"role": "user", "content": "2*3="}]
    tools = [{"type": "function", "name": "calculate", "parameters": TOOLS[0]["function"]["parameters"]}]
    for _ in range(4):
        response = client.responses.create(model="policy", input=items, tools=tools)
        calls = [item for item in response.output if item.type == "function_call"]
        items += [item.model_dump(exclude_none=True) for item in response.output]
        if not calls:
            return float(response.output_text == "6")
        for call in calls:
            value = str(eval(json.loads(call.arguments)["expression"]))
            items.append({"type": "function_call_output", "call_id": call.call_id, "output": value})
    return 0.0


@pytest.mark.parametrize("agent", [chat_tool_agent, responses_tool_agent], ids=["chat", "responses"])
def test_tool_call_turns_extend_the_segment_and_every_token_is_stored_once(agent, tokenizer):
    """Item 1: three model turns, two of them tool calls echoed back as ``tool_calls``: one segment, nothing
    dropped, every token sampled stored once with its log-prob, the last turn sampled after the model's own
    tool calls (4db1016: the third turn started a new segment on an empty assistant turn)."""
    engine = Recorder(tokenizer)
    _, [episode] = run_agent(agent, engine, tokenizer)
    assert episode.info["segments"] == 1 and episode.info["dropped_tokens"] == 0, episode.info
    assert episode.turns == 3 and episode.outcome.total == 1.0 and not episode.truncated
    assert engine.check(episode) == 3 and sum(episode.loss_mask) == engine.tokens()
    last = max(engine.sampled, key=len)  # the context of the final answer
    assert tokenizer.decode(list(last)).count("<tool_call>") == 2


def test_a_rewritten_history_renders_the_models_tool_call_not_an_empty_turn(tokenizer):
    """A new segment whose history holds the model's tool call (the agent dropped its first message) renders the
    call as the text the model sampled, in the new prompt."""

    def agent(client, problem):
        messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2*3="}]
        message = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS).choices[0].message
        call = message.tool_calls[0]
        messages += [message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "6"}]
        client.chat.completions.create(model="policy", messages=messages[1:], tools=TOOLS)  # system message dropped
        return 1.0

    engine = Recorder(tokenizer)
    _, [episode] = run_agent(agent, engine, tokenizer)
    assert episode.info["segments"] == 2
    assert tool_call("2*3") + "</s><|tool|>6</s>" in tokenizer.decode(episode.prompt_ids)
    assert engine.check(episode) == 1


def test_a_reply_is_stored_on_its_own_request_when_another_arrives_meanwhile(tokenizer):
    """Item 2: a second conversation of the same session (a critic, in a thread of the agent's) arrives while the
    first request (n=2) is being sampled; the agent returns with the first reply, before the critic is answered.
    4db1016 stored the critic's prompt followed by the tokens sampled for the problem's prompt; now the first
    reply, its segment set aside, is dropped (counted), and the critic's segment is one context token."""
    gate = threading.Event()
    engine = Recorder(tokenizer, gate)
    engine.hold = lambda text: "critic?" in text
    replies: dict = {}

    def agent(client, problem):
        def critic():
            with contextlib.suppress(openai.APIStatusError):  # its session closed before it was answered (408)
                client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "critic?"}])

        def ask():
            messages = [{"role": "user", "content": "2+2="}]
            replies["first"] = client.chat.completions.create(model="policy", messages=messages, n=2)

        first = threading.Thread(target=ask)
        first.start()
        engine.started.wait(10)
        threading.Thread(target=critic, daemon=True).start()
        endpoint, deadline = engine.task.endpoint, time.monotonic() + 10
        while not endpoint.pending and time.monotonic() < deadline:  # the critic's request is queued
            time.sleep(0.005)
        gate.set()
        first.join()
        return 1.0

    _, [episode] = run_agent(agent, engine, tokenizer)
    assert len(replies["first"].choices) == 2
    assert engine.check(episode) == 0  # 4db1016: the first reply, stored after the critic's prompt
    assert "critic?" in tokenizer.decode(episode.prompt_ids) and episode.loss_mask == [0]
    assert episode.info["segments"] == 2 and episode.info["dropped_tokens"] == 2 * 3  # two choices: "ok" and EOS


def test_a_completion_that_extends_a_prompt_in_flight_is_a_segment_of_its_own(tokenizer):
    """Item 2, token ids: a second prompt that starts with the first one, sent while the first is sampled, does
    not extend it (4db1016 stored the first reply after the second prompt's extra tokens)."""
    gate = threading.Event()
    engine = Recorder(tokenizer, gate)
    engine.hold = lambda text: text.count("1+1=") == 2
    prompt = tokenizer("<|user|>1+1=</s><|assistant|>", add_special_tokens=False).input_ids

    def agent(client, problem):
        first = threading.Thread(target=lambda: client.completions.create(model="policy", prompt=prompt))
        first.start()
        engine.started.wait(10)
        threading.Thread(target=lambda: _ignore(client.completions.create, prompt + prompt), daemon=True).start()
        endpoint, deadline = engine.task.endpoint, time.monotonic() + 10
        while not endpoint.pending and time.monotonic() < deadline:
            time.sleep(0.005)
        gate.set()
        first.join()
        return 1.0

    _, [episode] = run_agent(agent, engine, tokenizer)
    assert engine.check(episode) == 0  # 4db1016: the first reply, stored after the second prompt
    assert episode.prompt_ids == prompt + prompt and episode.info["segments"] == 2


def _ignore(create, prompt) -> None:
    with contextlib.suppress(openai.APIStatusError):  # its session closed before it was answered (408)
        create(model="policy", prompt=prompt)


def test_a_request_past_the_turn_budget_never_leaves_a_row_without_a_response_token(tokenizer):
    """Item 3: after two turns (``max_turns=2``) the agent starts another conversation: refused (400), and the
    stored row is the earlier segment, truncated, with its tokens (4db1016: the new prompt with 0 response
    tokens, which stops the trainer)."""
    seen = {}

    def agent(client, problem):
        messages = [{"role": "user", "content": "hi"}]
        for _ in range(2):
            reply = client.chat.completions.create(model="policy", messages=messages).choices[0].message.content
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "again"}]
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "other"}])
        seen["message"] = refused.value.message
        return 1.0

    engine = Recorder(tokenizer)
    _, [episode] = run_agent(agent, engine, tokenizer, max_turns=2)
    assert "turn budget" in seen["message"]
    assert episode.response_ids and episode.truncated and episode.outcome.total == 0.0
    assert engine.check(episode) == 2 and episode.info["segments"] == 1


def test_a_segment_whose_reply_never_came_is_one_context_token(tokenizer):
    """Item 3: concurrent requests past the budget, each a segment of its own, and an agent that returns before
    the last one is answered: every row has a response token (the end-of-turn, mask 0), none trained."""

    def agent(client, problem):
        def ask(k):
            messages = [{"role": "user", "content": f"{problem['task_id']} q{k}"}]
            with contextlib.suppress(openai.APIStatusError):  # refused (budget) or its session closed
                client.chat.completions.create(model="policy", messages=messages)

        threads = [threading.Thread(target=ask, args=(k,), daemon=True) for k in range(6)]
        for thread in threads:
            thread.start()
        return 1.0  # without waiting: the last requests are in flight or refused

    engine = Recorder(tokenizer)
    _, episodes = run_agent(agent, engine, tokenizer, problems=4, max_turns=2)
    for episode in episodes:
        assert len(episode.response_ids) >= 1
        engine.check(episode)
