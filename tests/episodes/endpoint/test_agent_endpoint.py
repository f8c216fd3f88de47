"""The agent endpoint with the real ``openai`` client on 127.0.0.1: chat and completion formats, tools, n,
errors (400 with a message, 401 without the token), token-in-token-out bookkeeping, segments, and faults
(agents that raise, hang, loop, return nonsense, rewrite their history)."""

import itertools
import threading
import time

import openai
import pytest
import torch

from oprl.algorithms.method import Method
from oprl.episodes.agents import task_episodes
from oprl.episodes.endpoint.server import Endpoint, bind
from oprl.episodes.episode import run_episodes
from oprl.errors import OprlError
from oprl.models.chat import encode_prompt
from oprl.models.tiny import build_model, build_tokenizer
from oprl.rollout import Sampling
from oprl.rollout.lean_engine import LeanEngine
from oprl.tasks import build_task
from oprl.tasks.agent import AgentTaskConfig
from oprl.tasks.tool_arithmetic import ToolArithmeticTask

MAX_TURNS, MAX_TOKENS = 3, 48


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def engine(tokenizer):
    torch.manual_seed(0)
    # 256 positions: a chat prompt with a tools block is 166 tokens, past the default 128 (refused since #25)
    return LeanEngine(build_model(tokenizer, max_positions=256), tokenizer, max_new_tokens=10)


class EndingEngine:
    """Replies ``[2*3]`` then the last tool answer, each ended by EOS, with log-prob -0.25 per token (a model
    that always ends its turns, which the untrained tiny model does not)."""

    sampling, max_new_tokens = Sampling(), 10

    def __init__(self, tokenizer):
        self.tokenizer, self.sampled = tokenizer, []

    def generate(self, prompt_ids, *, seed, sampling=None, batch_size=None, row_seeds=None):
        from oprl.rollout import Rollout

        rows = []
        for context in prompt_ids:
            text = self.tokenizer.decode(context)
            reply = text.split("<|tool|>")[-1].split("</s>")[0] if "<|tool|>" in text else "[2*3]"
            rows.append([*self.tokenizer(reply, add_special_tokens=False).input_ids, self.tokenizer.eos_token_id])
        self.sampled.append(rows)
        return Rollout(
            rows,
            [[-0.25] * len(r) for r in rows],
            self.tokenizer.batch_decode(rows, skip_special_tokens=True),
            [False] * len(rows),
        )


def calculator_agent(client, problem):
    """The tool-arithmetic episode as an openai-client loop: ``[expr]`` calls the calculator."""
    messages = list(problem["messages"])
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(model="policy", messages=messages).choices[0].message
        text = (reply.content or "").strip()
        messages.append({"role": "assistant", "content": reply.content})
        if not text.startswith("["):
            correct = text.lstrip("-").isdigit() and int(text) == int(problem["answer"])
            return {"reward": float(correct), "correct": float(correct)}
        inner = text[1:-1] if text.endswith("]") else ""
        ok = inner != "" and all(ch in "0123456789+-*" for ch in inner) and inner[0].isdigit() and inner[-1].isdigit()
        ok = ok and not any(a in "+-*" and b in "+-*" for a, b in itertools.pairwise(inner))
        messages.append({"role": "tool", "content": str(eval(inner)) if ok and len(inner) <= 40 else "error"})
    return 0.0


def agent_task(agent, **fields):
    task = build_task(
        AgentTaskConfig(
            agent="tests/episodes/endpoint/test_agent_endpoint.py:calculator_agent",
            problems={"name": "tool-arithmetic", "train_size": 40, "test_size": 10},
            **fields,
        )
    )
    task.rollout = agent
    return task


def run(engine, tokenizer, task, problems, **kw):
    kw = {"seed": 5, "max_turns": MAX_TURNS, "max_tokens": MAX_TOKENS} | kw
    return task_episodes(engine, tokenizer, task, problems, **kw)


def test_calculator_agent_rows_equal_the_built_in_episodic_path(engine, tokenizer):
    """Lean engine, fixed seed, every agent asks every turn: the endpoint's calls are the built-in path's."""
    task = agent_task(calculator_agent, batch_wait_s=5.0)
    problems = [p for p in task.problems("train")[:4] for _ in range(2)]
    built_in = run_episodes(
        engine,
        tokenizer,
        ToolArithmeticTask(train_size=40, test_size=10),
        problems,
        seed=5,
        max_turns=MAX_TURNS,
        max_tokens=MAX_TOKENS,
    )
    agent = run(engine, tokenizer, task, problems)
    for mine, theirs in zip(agent, built_in, strict=True):
        assert mine.prompt_ids == theirs.prompt_ids
        assert mine.response_ids == theirs.response_ids
        assert mine.loss_mask == theirs.loss_mask
        assert mine.behavior_logprobs == theirs.behavior_logprobs
        assert mine.truncated == theirs.truncated
        assert mine.outcome.total == theirs.outcome.total
        assert mine.info["segments"] == 1 and mine.info["agent_failed"] == 0


def test_a_partial_switch_is_refused_in_one_line(engine, tokenizer):
    """task_episodes hands run_episodes' arguments to the agent loop whole; a switch (partial rollouts) is
    refused there."""
    task = agent_task(calculator_agent)
    with pytest.raises(OprlError, match=r"sync\.partial=true"):
        run(engine, tokenizer, task, task.problems("train")[:1], switch=object())


def test_openai_client_chat_completion_tools_and_errors(engine, tokenizer):
    task = agent_task(calculator_agent)
    seen = {}

    def agent(client, problem):
        chat = client.chat.completions.create(model="policy", messages=problem["messages"], n=2, max_tokens=5)
        seen["chat"] = chat
        seen["completion"] = client.completions.create(model="policy", prompt="<|user|>1+1=</s><|assistant|>")
        tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
        seen["tools"] = client.chat.completions.create(model="policy", messages=problem["messages"], tools=tools)
        for bad in (
            {"messages": []},
            {"messages": "hi"},
            {"tool_choice": "required"},
            {"temperature": 0.3},
            {"max_tokens": 500},
            {"logit_bias": {"5": 1.0}},
        ):
            body = {"model": "policy", "messages": problem["messages"]} | bad
            with pytest.raises(openai.BadRequestError) as err:
                client.post("/chat/completions", body=body, cast_to=object)
            seen.setdefault("errors", []).append(err.value.message)
        unauthorized = openai.OpenAI(base_url=str(client.base_url), api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            unauthorized.chat.completions.create(model="policy", messages=problem["messages"])
        import httpx

        raw = httpx.post(
            str(client.base_url) + "chat/completions",
            content=b"{not json",
            headers={"Authorization": f"Bearer {client.api_key}"},
        )
        seen["raw"] = (raw.status_code, raw.json()["error"]["message"])
        return 1.0

    task.rollout = agent
    [episode] = run(engine, tokenizer, task, task.problems("train")[:1])
    chat = seen["chat"]
    assert len(chat.choices) == 2 and all(len(c.message.content) <= 5 for c in chat.choices)
    assert chat.usage.prompt_tokens == len(encode_prompt(tokenizer, task.problems("train")[0].messages))
    assert seen["completion"].object == "text_completion" and seen["completion"].choices[0].finish_reason
    assert seen["tools"].choices[0].message.role == "assistant"
    errors = seen["errors"]
    assert "messages" in errors[0] and "messages" in errors[1] and "tool_choice" in errors[2]
    assert "temperature" in errors[3] and "max_new_tokens" in errors[4] and "logit_bias" in errors[5]
    assert seen["raw"] == (400, "the request body is not JSON")
    # Requests that did not extend the history are segments of their own; the last one is stored.
    assert episode.info["segments"] >= 3 and episode.info["dropped_tokens"] > 0
    assert episode.outcome.total == (0.0 if episode.truncated else 1.0)  # a reply cut at the limit scores 0


def test_stored_tokens_are_the_sampled_ones_and_environment_tokens_are_masked(engine, tokenizer):
    replies = []

    def agent(client, problem):
        messages = list(problem["messages"])
        for turn in range(2):
            reply = client.chat.completions.create(model="policy", messages=messages).choices[0].message.content
            replies.append(reply)
            messages += [{"role": "assistant", "content": reply}, {"role": "tool", "content": f"{turn}7"}]
        return 0.5

    task, engine = agent_task(agent), EndingEngine(tokenizer)
    [episode] = run(engine, tokenizer, task, task.problems("train")[:1], max_turns=5, max_tokens=100)
    model_ids = [t for t, m in zip(episode.response_ids, episode.loss_mask, strict=True) if m]
    assert model_ids == [t for call in engine.sampled for t in call[0]]  # token in, token out
    assert replies == ["[2*3]", "07"]
    environment = tokenizer.decode([t for t, m in zip(episode.response_ids, episode.loss_mask, strict=True) if not m])
    assert "07" in environment and "<|tool|>" in environment
    assert all(lp == 0.0 for lp, m in zip(episode.behavior_logprobs, episode.loss_mask, strict=True) if not m)
    assert episode.outcome.total == 0.5


def test_faults_score_zero_and_the_batch_goes_on(engine, tokenizer, caplog):
    def agent(client, problem):
        kind = problem["task_id"]
        messages = list(problem["messages"])
        if kind.endswith("0"):
            raise RuntimeError("agent bug")
        if kind.endswith("1"):
            client.chat.completions.create(model="policy", messages=messages)
            time.sleep(30)  # hangs past rollout.episode_timeout
        if kind.endswith("2"):
            while True:  # loops: the turn budget refuses it
                reply = client.chat.completions.create(model="policy", messages=messages).choices[0].message
                messages += [{"role": "assistant", "content": reply.content}, {"role": "user", "content": "again"}]
        if kind.endswith("3"):
            return "not a number"
        for _ in range(2):  # rewrites its history: always the first message alone
            client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "2*3="}])
        return 1.0

    task, engine = agent_task(agent), EndingEngine(tokenizer)
    problems = [p for p in task.problems("train") if p.task_id[-1] in "01234"][:5]
    problems.sort(key=lambda p: p.task_id[-1])
    start = time.perf_counter()
    episodes = run(engine, tokenizer, task, problems, episode_timeout=3.0)
    assert time.perf_counter() - start < 15
    failed = [e.info["agent_failed"] for e in episodes]
    assert failed == [1.0, 1.0, 0.0, 1.0, 0.0]  # the looping agent is truncated (its budget), not a fault
    assert [e.outcome.total for e in episodes] == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert episodes[2].truncated and episodes[2].info["refused_requests"] >= 1
    assert episodes[0].loss_mask == [0] and episodes[0].response_ids == [tokenizer.eos_token_id]
    assert episodes[4].info["segments"] == 2
    assert "timeout" in caplog.text and "agent bug" in caplog.text


def test_async_agent(tokenizer):
    async def agent(client, problem):
        reply = await client.chat.completions.create(model="policy", messages=problem["messages"])
        return float(bool(reply.choices[0].message.content is not None))

    task = agent_task(agent)
    task.is_async = True
    episodes = run(EndingEngine(tokenizer), tokenizer, task, task.problems("train")[:2])
    assert [e.outcome.total for e in episodes] == [1.0, 1.0]


def test_a_port_in_use_is_one_line(tokenizer):
    taken = bind("127.0.0.1", 0)
    with pytest.raises(OprlError, match=r"cannot listen on 127\.0\.0\.1"):
        Endpoint(tokenizer, port=taken.getsockname()[1])
    taken.close()
    assert threading.active_count() > 0


def test_environment_tokens_of_agent_episodes_get_zero_gradient(tokenizer):
    """Agent episodes as experiences: the trainer's loss has zero gradient at every token the agent sent
    (tool results, headers) and non-zero gradient at every token the engine sampled."""
    from types import SimpleNamespace

    from oprl.algorithms.presets import resolve_preset
    from oprl.messages import Experience
    from oprl.trainer.inputs import loss_mask_of
    from oprl.trainer.trainer import Trainer

    task = agent_task(calculator_agent)
    episodes = run(EndingEngine(tokenizer), tokenizer, task, task.problems("train")[:4])
    rows = [
        Experience(
            e.prompt_ids,
            e.response_ids,
            [-1.0 if m else 0.0 for m in e.loss_mask],
            e.outcome.total,
            {},
            0,
            f"t/{i}",
            0,
            "",
            loss_mask=e.loss_mask,
        )
        for i, e in enumerate(episodes)
    ]
    assert all(0 in e.loss_mask for e in episodes)  # every episode called the calculator
    model = build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    settings = resolve_preset(
        "grpo", weight="importance-sampling", clip_mode="none", regularizer="squared-log-ratio", regularizer_coef=0.1
    )
    optim = SimpleNamespace(
        lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0, epochs=1, mini_batches=1, micro_batch_size=4, grad_clip=1.0
    )
    trainer = Trainer(
        model,
        pad_id=tokenizer.pad_token_id,
        method=Method.of(settings, max_response_tokens=64, entropy_coef=0.01),
        optim=optim,
        sampling=Sampling(),
    )
    kept = {}
    real = trainer.policy

    def keeping(*args, **kwargs):
        logprobs, entropy, mask = real(*args, **kwargs)
        logprobs.retain_grad()
        kept.update(logprobs=logprobs)
        return logprobs, entropy, mask

    trainer.policy = keeping
    loss = trainer._micro_loss(rows, torch.tensor([1.0, -1.0, 0.5, -0.5]), None).loss
    loss.backward()
    model_mask = loss_mask_of(rows, kept["logprobs"].shape[1])
    padding = torch.tensor([[t < len(e.response_ids) for t in range(model_mask.shape[1])] for e in rows])
    grad = kept["logprobs"].grad
    assert torch.all(grad[padding & ~model_mask] == 0.0) and torch.all(grad[model_mask] != 0.0)
