"""Agent frameworks through the endpoint (issue 41): LangChain, openai-agents, pydantic-ai and smolagents, each in
its sync, async and streaming modes (``examples/agents/``), finish their episodes, and every stored episode's
tokens decode to exactly what the framework sent and received (captured at the HTTP client, ``httpx``).

Two layers: a scripted policy (call the calculator, then answer with its result, in the ``<tool_call>`` format
the endpoint parses) runs every framework x mode in process, so tool calls, tool results, stop sequences and
echoes are all exercised (one segment per episode, reward 1); and one ``oprl train`` run trains the tiny model
(a long-context copy: the frameworks' tool prompts pass its 128 positions) 2 steps with every framework at once.
"""

import asyncio
import itertools
import json
import re
from collections import defaultdict

import httpx
import pyarrow.parquet as pq
import pytest

from oprl.cli import main
from oprl.episodes.agents import task_episodes
from oprl.models.chat import render
from oprl.models.tiny import build_tokenizer
from oprl.rollout import Rollout, Sampling
from oprl.tasks import build_task
from oprl.tasks.agent import AgentTask, AgentTaskConfig, load_agent

EXAMPLES = "examples/agents"
MODES = [
    ("langchain", "rollout"),
    ("langchain", "rollout_async"),
    ("langchain", "rollout_stream"),
    ("openai_agents", "rollout"),
    ("openai_agents", "rollout_async"),
    ("openai_agents", "rollout_stream"),
    ("openai_agents", "rollout_responses"),
    ("openai_agents", "rollout_responses_stream"),
    ("pydantic_ai", "rollout"),
    ("pydantic_ai", "rollout_async"),
    ("pydantic_ai", "rollout_stream"),
    ("smolagents", "rollout"),
    ("smolagents", "rollout_stream"),
    ("smolagents", "rollout_code"),
]

REWRITES = {("smolagents", "rollout"): 3, ("smolagents", "rollout_stream"): 3, ("smolagents", "rollout_code"): 3}
"""Segments per episode where the framework rewrites its history: smolagents' agents send each earlier step
back with text the model never wrote (``Calling tools: [{...}]`` after the reply or in its place): each step is
a new segment, and the last one (the final answer) is stored."""


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


class Capture:
    """Every exchange of the agents' HTTP clients with a session: the request body and the reply message (JSON
    or the Server-Sent Events put together), per session id."""

    def __init__(self, monkeypatch):
        self.exchanges: dict[str, list[tuple[dict, dict]]] = defaultdict(list)
        for module in (httpx, pytest.importorskip("httpx2") if _has_httpx2() else None):  # openai 3 uses httpx2
            if module is not None:
                self.wrap(module, monkeypatch)

    def wrap(self, module, monkeypatch) -> None:
        send, asend = module.Client.send, module.AsyncClient.send

        def sync(client, request, **kw):
            response = send(client, request, **kw)
            response.read()
            self.record(request, response)
            return response

        async def asynchronous(client, request, **kw):
            response = await asend(client, request, **kw)
            await response.aread()
            self.record(request, response)
            return response

        monkeypatch.setattr(module.Client, "send", sync)
        monkeypatch.setattr(module.AsyncClient, "send", asynchronous)

    def record(self, request, response) -> None:
        parts = request.url.path.split("/")
        if len(parts) < 3 or parts[1] != "s" or response.status_code != 200 or request.method != "POST":
            return
        body = json.loads(request.content)
        if parts[-1] == "responses":
            self.exchanges[parts[2]].append(_from_responses(body, response))
            return
        if response.headers["content-type"].startswith("text/event-stream"):
            message: dict = {"content": "", "tool_calls": []}
            for line in response.text.splitlines():
                if line.startswith("data: {"):
                    for choice in json.loads(line[6:])["choices"]:
                        delta = choice.get("delta", {})
                        message["content"] += delta.get("content") or ""
                        message["tool_calls"] += delta.get("tool_calls") or []
        else:
            message = response.json()["choices"][0]["message"]
        self.exchanges[parts[2]].append((body, message))

    def conversations(self, tokenizer) -> list[str]:
        """Each session's last request and the reply it got, as the chat template renders them."""
        out = []
        for exchanges in self.exchanges.values():
            body, reply = exchanges[-1]
            messages = [_normalised(m) for m in body["messages"]]
            tools = [] if body.get("tool_choice") == "none" else body.get("tools") or []
            text = render(tokenizer, messages, tools) + raw_text(reply)
            out.append(text.removesuffix(tokenizer.eos_token))
        return out


def _from_responses(body: dict, response) -> tuple[dict, dict]:
    """A Responses exchange as chat: instructions + input items as messages, function tools as chat tools,
    the output items (``response.completed`` when streamed) as the reply message."""
    messages = [{"role": "system", "content": body["instructions"]}] if body.get("instructions") else []
    items = body["input"] if isinstance(body["input"], list) else [{"role": "user", "content": body["input"]}]
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            content = item["content"]
            text = content if isinstance(content, str) else "\n".join(p["text"] for p in content)
            messages.append({"role": item["role"], "content": text})
        elif kind == "function_call":
            call = {"function": {"name": item["name"], "arguments": item["arguments"]}}
            if messages[-1]["role"] != "assistant":
                messages.append({"role": "assistant", "content": ""})
            messages[-1].setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "tool", "content": item["output"]})
    keys = ("name", "description", "parameters")
    tools = [
        {"type": "function", "function": {k: t[k] for k in keys if t.get(k) is not None}}
        for t in body.get("tools") or []
    ]
    if response.headers["content-type"].startswith("text/event-stream"):
        events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
        output = next(e for e in events if e["type"] == "response.completed")["response"]["output"]
    else:
        output = response.json()["output"]
    reply: dict = {"content": "", "tool_calls": []}
    for item in output:
        if item["type"] == "message":
            reply["content"] += "".join(p["text"] for p in item["content"])
        else:
            reply["tool_calls"].append({"function": {"name": item["name"], "arguments": item["arguments"]}})
    return {"messages": messages, "tools": tools}, reply


def _has_httpx2() -> bool:
    import importlib.util

    return importlib.util.find_spec("httpx2") is not None


def _normalised(message: dict) -> dict:
    """A message as a chat template takes it: text parts joined by a newline, a tool-call echo as the text the
    model wrote, ``developer`` as ``system``."""
    content = message.get("content")
    if isinstance(content, list):
        content = "\n".join(p["text"] for p in content)
    role = "system" if message["role"] == "developer" else message["role"]
    if role == "assistant" and message.get("tool_calls"):
        return {"role": role, "content": raw_text(message)}
    return {"role": role, "content": content or ""}


def raw_text(message: dict) -> str:
    """The text the scripted policy wrote for a reply (its tool calls in the ``<tool_call>`` format)."""
    calls = message.get("tool_calls") or []
    if not calls:
        return message.get("content") or ""
    blocks = []
    for call in calls:
        function = call["function"]
        blocks.append(tool_call(function["name"], json.loads(function["arguments"] or "{}")))
    return "".join(blocks)


def tool_call(name: str, arguments: dict) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


class ScriptedPolicy:
    """Three model turns: calls the calculator on the question, calls it again on the result (``value*1``),
    then answers with the second result (smolagents' ToolCallingAgent: through its ``final_answer`` tool;
    CodeAgent: one code block each). Each reply ends with EOS; every sampled token gets a log-prob of its own
    (``-k/1000`` for the k-th token sampled), and every call is kept in ``sampled`` (context -> ids, log-probs)
    so a stored row can be checked against the request it was sampled for."""

    sampling, max_new_tokens, context = Sampling(), 200, 32768

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.sampled: dict[tuple[int, ...], tuple[list[int], list[float]]] = {}
        self.count = 0

    def generate(self, prompt_ids, *, seed, sampling=None, batch_size=None, row_seeds=None):
        replies = [self.reply(self.tokenizer.decode(c)) for c in prompt_ids]
        rows = [[*self.tokenizer(r, add_special_tokens=False).input_ids, self.tokenizer.eos_token_id] for r in replies]
        logprobs = []
        for context, row in zip(prompt_ids, rows, strict=True):
            logprobs.append([-(self.count + k + 1) / 1000 for k in range(len(row))])
            self.count += len(row)
            self.sampled[tuple(context)] = (row, logprobs[-1])
        texts = self.tokenizer.batch_decode(rows, skip_special_tokens=True)
        return Rollout(rows, logprobs, texts, [False] * len(rows))

    @staticmethod
    def reply(context: str) -> str:
        messages = re.findall(r"<\|(\w+)\|>(.*?)</s>", context, re.S)
        expression = re.search(r"<\|user\|>(?:New task:\s*)?(\d[\d+\-*]*)=", context).group(1)
        turn = sum(role == "assistant" for role, _ in messages)  # model turns so far in this context
        last = messages[-1][1]
        value = re.findall(r"-?\d+", last)[-1] if turn else ""
        if "<code>" in messages[0][1]:  # CodeAgent: its system prompt asks for code blocks; a stop cuts "</code>"
            steps = [
                f'print(calculator("{expression}"))',
                f'print(calculator("{value}*1"))',
                f'final_answer("{value}")',
            ]
            return f"Thought: calculate.\n<code>\n{steps[min(turn, 2)]}\n</code>"
        block = context.split("<tools>", 1)[-1].split("</tools>", 1)[0] if "<tools>" in context else ""
        names = [n for n in re.findall(r'"name": "(\w+)"', block) if n != "final_answer"]
        if not names:
            return str(eval(expression))
        if turn < 2:  # first the question, then the result checked once more
            return tool_call(names[0], {"expression": expression if turn == 0 else f"{value}*1"})
        return tool_call("final_answer", {"answer": value}) if '"final_answer"' in block else value


def check_rows(episodes, policy: ScriptedPolicy) -> int:
    """Every sampled run of tokens in ``episodes`` (loss mask 1) is a prefix of what the policy returned for
    exactly the context before it, with those log-probs: a reply is stored on the request it was sampled for.
    Returns how many runs were compared."""
    runs = 0
    for episode in episodes:
        context, k, mask = list(episode.prompt_ids), 0, episode.loss_mask
        while k < len(mask):
            if not mask[k]:
                context.append(episode.response_ids[k])
                k += 1
                continue
            end = next((j for j in range(k, len(mask)) if not mask[j]), len(mask))
            assert tuple(context) in policy.sampled, "a reply stored after a context it was not sampled on"
            ids, logprobs = policy.sampled[tuple(context)]
            assert episode.response_ids[k:end] == ids[: end - k]
            assert episode.behavior_logprobs[k:end] == logprobs[: end - k]
            context += episode.response_ids[k:end]
            k, runs = end, runs + 1
    return runs


def agent_task(spec: str) -> AgentTask:
    return build_task(
        AgentTaskConfig(agent=spec, problems={"name": "tool-arithmetic", "train_size": 16, "test_size": 4})
    )


@pytest.mark.parametrize(("framework", "mode"), MODES, ids=[f"{f}-{m}" for f, m in MODES])
def test_framework_episodes_store_what_the_framework_sent_and_received(framework, mode, tokenizer, monkeypatch):
    """Three model turns (two tool calls, then the answer): where the framework echoes faithfully, one segment
    holds every token sampled (none dropped), each reply after the context it was sampled on, with its log-probs;
    every stored row decodes to the framework's last request and the reply it got."""
    capture = Capture(monkeypatch)
    task = agent_task(f"{EXAMPLES}/{framework}_agent.py:{mode}")
    problems = task.problems("train")[:2]
    policy = ScriptedPolicy(tokenizer)
    episodes = task_episodes(policy, tokenizer, task, problems, seed=0, max_turns=4, max_tokens=800, episode_timeout=60)
    segments = REWRITES.get((framework, mode), 1)
    for episode in episodes:
        assert episode.info["agent_failed"] == 0 and episode.info["segments"] == segments, episode.info
        assert episode.outcome.total == 1.0 and not episode.truncated and episode.info["refused_requests"] == 0
        if segments == 1:  # three model turns, none dropped
            assert episode.turns == 3 and episode.info["dropped_tokens"] == 0, episode.info
    if segments == 1:  # every token sampled is in a row, trained once
        assert sum(sum(e.loss_mask) for e in episodes) == sum(len(ids) for ids, _ in policy.sampled.values())
    assert check_rows(episodes, policy) == sum(e.turns for e in episodes)
    stored = sorted(tokenizer.decode(e.prompt_ids + e.response_ids).removesuffix(tokenizer.eos_token) for e in episodes)
    assert stored == sorted(capture.conversations(tokenizer))


class ThinkingPolicy(ScriptedPolicy):
    """The scripted policy as a reasoning model writes it: every reply opens with a ``<think>`` block."""

    @staticmethod
    def reply(context: str) -> str:
        return "<think>I use the calculator.</think>\n" + ScriptedPolicy.reply(context)


@pytest.mark.parametrize("mode", ["rollout", "rollout_async", "rollout_stream"])
def test_pydantic_ai_with_think_replies_keeps_one_segment(mode, tokenizer):
    """#67 item 7: pydantic-ai's chat model splits a reply's ``<think>`` block into a thinking part and echoes
    it re-rendered (``<think>\\n...\\n</think>``): recognised as the reply returned, so the three model turns
    are one segment, every sampled token trained once (9790d4b: 3 segments, only the answer trained). Streamed,
    the think tags come as deltas of their own, as a token-streaming server sends them (9790d4b: ``run_stream``
    took the think text for the final answer after one turn, reward 0)."""
    task = agent_task(f"{EXAMPLES}/pydantic_ai_agent.py:{mode}")
    policy = ThinkingPolicy(tokenizer)
    episodes = task_episodes(
        policy, tokenizer, task, task.problems("train")[:2], seed=0, max_turns=4, max_tokens=800, episode_timeout=60
    )
    for episode in episodes:
        assert episode.outcome.total == 1.0 and episode.turns == 3, (episode.info, episode.turns)
        assert episode.info["segments"] == 1 and episode.info["dropped_tokens"] == 0, episode.info
    assert sum(sum(e.loss_mask) for e in episodes) == sum(len(ids) for ids, _ in policy.sampled.values())
    assert check_rows(episodes, policy) == 6


class LoopingPolicy(ScriptedPolicy):
    """Never answers: calls the calculator on the question every turn."""

    @staticmethod
    def reply(context: str) -> str:
        expression = re.search(r"<\|user\|>(?:New task:\s*)?(\d[\d+\-*]*)=", context).group(1)
        return tool_call("calculator", {"expression": expression})


@pytest.mark.parametrize("mode", ["rollout", "rollout_stream"])
def test_smolagents_with_its_defaults_past_the_turn_budget_stores_a_response_token_in_every_row(mode, tokenizer):
    """Item 3: smolagents' default ``max_steps`` (20) passes ``rollout.max_turns`` (4); every step rewrites its
    history (a new segment), so the fifth request is one past the budget: refused, the last segment is kept,
    truncated, with its sampled tokens (4db1016: an empty new segment, a row with 0 response tokens that stops
    the trainer)."""
    task = agent_task(f"{EXAMPLES}/smolagents_agent.py:{mode}")
    policy = LoopingPolicy(tokenizer)
    episodes = task_episodes(
        policy, tokenizer, task, task.problems("train")[:2], seed=0, max_turns=4, max_tokens=4000, episode_timeout=60
    )
    for episode in episodes:
        assert episode.truncated and episode.info["refused_requests"] >= 1 and episode.info["segments"] == 4
        assert sum(episode.loss_mask) > 0  # the last step's call, sampled and stored
    assert check_rows(episodes, policy) == len(episodes)


# ~30 s (a whole run with every framework imported), in the default suite all the same: issue #41 asks that every
# framework trains the tiny model through the endpoint in the suite CI runs, not only in `make test-slow`.
def test_every_framework_trains_the_tiny_model_through_the_endpoint(tmp_path, tokenizer, monkeypatch):
    """``oprl train`` 2 steps, each episode through the next framework x mode (one agent file dispatching to
    ``examples/agents/``): the run finishes and every stored row is what its framework sent and received."""
    capture = Capture(monkeypatch)
    model = load_agent(f"{EXAMPLES}/tiny_long_context.py:save")(
        str(tmp_path / "tiny-long"), 2048
    )  # the documented copy
    args = [
        "task.name=agent",
        "task.agent=tests/integration/test_agent_frameworks.py:each_framework",
        "task.problems.train_size=64",
        "task.problems.test_size=4",
        f"model.path={model}",
        "rollout.prompts_per_step=5",
        "rollout.group_size=2",
        "rollout.max_new_tokens=12",
        "rollout.max_turns=3",
        "rollout.max_episode_tokens=64",
        "eval.num_problems=4",
        "progress=false",
        "tensorboard=false",
        "runtime.torch_threads=1",
        f"output_dir={tmp_path / 'runs'}",
        "run_name=frameworks",
        "steps=2",
    ]
    assert main(["train", *args]) == 0
    conversations, compared = set(capture.conversations(tokenizer)), 0
    for step in (1, 2):
        table = pq.read_table(tmp_path / "runs" / "frameworks" / "experiences" / f"batch-{step:06d}.parquet")
        assert table.num_rows == 10
        hidden = set(tokenizer.all_special_ids) - {tokenizer.eos_token_id}  # sampled and stored, never returned
        rows = zip(*(table.column(c).to_pylist() for c in ("prompt_ids", "response_ids", "loss_mask")), strict=True)
        for prompt, response, mask in rows:
            if not any(mask):  # smolagents' system prompts (4k-9k characters) pass 2048 positions: refused
                continue
            compared += 1
            seen = [t for t, m in zip(response, mask, strict=True) if not (m and t in hidden)]
            text = tokenizer.decode(prompt + seen).removesuffix(tokenizer.eos_token)
            assert text in conversations or any(c.startswith(text) for c in conversations), text[-200:]
    assert compared >= 10  # of 20 rows: all but smolagents' (in process above, with a longer context)


_NEXT = itertools.count()


def each_framework(client, problem: dict):
    """The next framework x mode of ``MODES`` (async ones in an event loop of their own)."""
    framework, mode = MODES[next(_NEXT) % len(MODES)]
    rollout = load_agent(f"{EXAMPLES}/{framework}_agent.py:{mode}")
    result = rollout(client, problem)
    return asyncio.run(result) if asyncio.iscoroutine(result) else result
