"""Multi-turn episodes: token layout and who-wrote-what, limits, grouping, the loss mask (environment tokens
get exactly zero gradient), and the experience store's schema version 2 (version 1 still loads)."""

import json
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from oprl.algorithms import group_advantages
from oprl.algorithms.method import Method
from oprl.algorithms.presets import resolve_preset
from oprl.checkpoint.store import SCHEMA, read_parquet, write_parquet
from oprl.episodes.episode import run_episodes, teacher_forced
from oprl.explorer.explorer import Explorer
from oprl.messages import Experience
from oprl.models.tiny import build_model, build_tokenizer
from oprl.rollout import Rollout, Sampling
from oprl.tasks.base import EpisodicTask, Problem
from oprl.tasks.tool_arithmetic import ToolArithmeticTask
from oprl.trainer.inputs import loss_mask_of
from oprl.trainer.trainer import Trainer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def task():
    return ToolArithmeticTask(train_size=40, test_size=10)


def problem(expression: str) -> Problem:
    return Problem(
        task_id=f"t/{expression}",
        messages=({"role": "user", "content": expression + "="},),
        answer=str(eval(expression)),
    )


class ScriptedEngine:
    """Answers each row with ``script(turn, context text)``; a reply ending in '~' stops without EOS (as if
    it hit max_new_tokens). Records every call's contexts and seed."""

    def __init__(self, tokenizer, script):
        self.tokenizer, self.script, self.calls = tokenizer, script, []

    def generate(self, prompt_ids, *, seed, sampling=None, batch_size=None):
        self.calls.append((seed, [list(p) for p in prompt_ids]))
        ids, logprobs, texts, truncated = [], [], [], []
        for context in prompt_ids:
            reply = self.script(len(self.calls) - 1, self.tokenizer.decode(context))
            cut = reply.endswith("~")
            tokens = self.tokenizer(reply.rstrip("~"), add_special_tokens=False).input_ids
            tokens += [] if cut else [self.tokenizer.eos_token_id]
            ids.append(tokens)
            logprobs.append([-0.5] * len(tokens))
            texts.append(reply.rstrip("~"))
            truncated.append(cut)
        return Rollout(ids, logprobs, texts, truncated)


def test_tool_arithmetic_is_an_episodic_task_with_the_documented_format(task, tokenizer):
    assert isinstance(task, EpisodicTask)
    p = problem("37*48")
    episode = teacher_forced(tokenizer, task, p, task.demonstration(p))
    assert tokenizer.decode(episode.prompt_ids) == "<|user|>37*48=</s><|assistant|>"
    assert tokenizer.decode(episode.response_ids) == "[37*48]</s><|tool|>1776</s><|assistant|>1776</s>"
    model = tokenizer.decode([t for t, m in zip(episode.response_ids, episode.loss_mask, strict=True) if m])
    environment = tokenizer.decode([t for t, m in zip(episode.response_ids, episode.loss_mask, strict=True) if not m])
    assert model == "[37*48]</s>1776</s>" and environment == "<|tool|>1776</s><|assistant|>"
    assert episode.reward.total == 1.0 and episode.reward.components["tool_calls"] == 1.0
    assert len(episode.prompt_ids) + len(episode.response_ids) < 48  # the tiny model's contexts stay short


@pytest.mark.parametrize(
    "replies,total,correct,form,calls",
    [
        (["[37*48]", "1776"], 1.0, 1.0, 1.0, 1.0),
        (["1776"], 1.0, 1.0, 0.0, 0.0),  # right without the tool: correct, but not the format
        (["[37*48]", "1777"], 0.0, 0.0, 1.0, 1.0),
        (["[37/48]", "[37*48]", "1776"], 1.0, 1.0, 1.0, 2.0),  # a bad call gets "error", then a good one
        (["[37*48]", "answer"], 0.0, 0.0, 0.0, 1.0),
    ],
)
def test_calculator_environment_rules(task, replies, total, correct, form, calls):
    env = task.environment(problem("37*48"))
    env.reset(problem("37*48"))
    observations = []
    for reply in replies:
        step = env.step(reply)
        observations += [m["content"] for m in step.observation]
    assert step.done and step.reward.total == total
    assert step.reward.components == {"correct": correct, "format": form, "tool_calls": calls}
    if replies[0] == "[37/48]":
        assert observations == ["error", "1776"]


def test_run_episodes_batches_turns_and_enforces_every_limit(task, tokenizer):
    def script(turn, context):
        expression = context.split("<|user|>")[1].split("=")[0]
        if expression == "11+11":  # runs past the per-turn token limit (no EOS)
            return "[11+11~"
        if expression == "12+12":  # keeps calling: hits max_turns
            return "[12+12]"
        if expression == "13+13":  # a long call: hits the episode token budget
            return "[13+13+0+0+0+0+0+0+0]"
        return "[" + expression + "]" if turn == 0 else context.split("<|tool|>")[-1].split("</s>")[0]

    engine = ScriptedEngine(tokenizer, script)
    problems = [problem(e) for e in ("10+10", "11+11", "12+12", "13+13")]
    episodes = run_episodes(engine, tokenizer, task, problems, seed=7, max_turns=3, max_tokens=50)
    assert [c[0] for c in engine.calls] == [7, 8, 9]  # turn t samples with seed + t
    assert [len(c[1]) for c in engine.calls] == [4, 3, 1]  # finished rows leave the batch
    done, cut, looping, long = episodes
    assert (done.reward.total, done.truncated, done.turns) == (1.0, False, 2)
    assert (cut.truncated, cut.turns, cut.reward.total) == (True, 1, 0.0)
    assert (looping.truncated, looping.turns, looping.reward.total) == (True, 3, 0.0)
    assert long.truncated and len(long.response_ids) == 50 and long.reward.total == 0.0
    for e in episodes:
        assert len(e.response_ids) == len(e.loss_mask) == len(e.behavior_logprobs)
        assert all((lp == -0.5) == bool(m) for lp, m in zip(e.behavior_logprobs, e.loss_mask, strict=True))
    # The second turn's context is the first turn plus the environment's answer, as tokens.
    assert tokenizer.decode(engine.calls[1][1][0]).endswith("[10+10]</s><|tool|>20</s><|assistant|>")


def test_explorer_groups_k_episodes_per_problem(task, tokenizer):
    def script(turn, context):
        expression = context.split("<|user|>")[1].split("=")[0]
        return "[" + expression + "]" if turn == 0 else str(len(context) % 3)  # sometimes right, mostly not

    explorer = Explorer(
        task,
        tokenizer,
        ScriptedEngine(tokenizer, script),
        prompts_per_step=2,
        group_size=3,
        seed=1,
        max_turns=3,
        max_episode_tokens=64,
    )
    experiences, timing = explorer.explore(step=2, version=5)
    assert [e.group_id for e in experiences] == [2, 2, 2, 3, 3, 3]
    assert all(e.loss_mask is not None and e.extra["turns"] == 2 and e.policy_version == 5 for e in experiences)
    assert timing.generated_tokens == sum(sum(e.loss_mask) for e in experiences)
    rewards = torch.tensor([e.reward for e in experiences])
    adv = group_advantages(rewards, torch.tensor([e.group_id for e in experiences]))
    for group in (slice(0, 3), slice(3, 6)):
        assert float(adv.advantages[group].sum()) == pytest.approx(0.0, abs=1e-6)


def episode_experiences(task, tokenizer):
    rows = []
    for i, expression in enumerate(("37*48", "12+30", "99-15", "20*20")):
        p = problem(expression)
        replies = task.demonstration(p) if i % 2 == 0 else [task.demonstration(p)[0], "0"]
        e = teacher_forced(tokenizer, task, p, replies)
        rows.append(
            Experience(
                prompt_ids=e.prompt_ids,
                response_ids=e.response_ids,
                behavior_logprobs=[-1.0 if m else 0.0 for m in e.loss_mask],
                reward=e.reward.total,
                reward_components=dict(e.reward.components),
                group_id=0,
                task_id=p.task_id,
                policy_version=0,
                response_text="",
                loss_mask=e.loss_mask,
                extra={"turns": e.turns},
            )
        )
    return rows


def make_trainer(model, tokenizer):
    """A trainer with an importance weight, a squared-log-ratio regularizer and an entropy bonus: every term
    of the loss touches every token it is allowed to."""
    settings = resolve_preset(
        "grpo", weight="importance-sampling", clip_mode="none", regularizer="squared-log-ratio", regularizer_coef=0.1
    )
    optim = SimpleNamespace(
        lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0, epochs=1, mini_batches=1, micro_batch_size=2, grad_clip=1.0
    )
    return Trainer(
        model,
        pad_id=tokenizer.pad_token_id,
        method=Method.of(settings, max_response_tokens=64, entropy_coef=0.01),
        optim=optim,
        sampling=Sampling(),
    )


def test_environment_tokens_get_exactly_zero_gradient(task, tokenizer):
    """The trainer's loss (policy term, k2 regularizer, entropy bonus) has zero gradient with respect to the
    log-prob of every environment token and non-zero gradient at model tokens: tool output is never trained."""
    model = build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    trainer = make_trainer(model, tokenizer)
    rows = episode_experiences(task, tokenizer)
    kept = {}
    real = trainer.policy

    def keeping(*args, **kwargs):
        logprobs, entropy, mask = real(*args, **kwargs)
        logprobs.retain_grad()
        kept.update(logprobs=logprobs, entropy=entropy)
        return logprobs, entropy, mask

    trainer.policy = keeping
    loss = trainer._micro_loss(rows, torch.tensor([1.0, -1.0, 0.5, -0.5]), None).loss
    kept["entropy"].retain_grad()
    loss.backward()
    model_mask = loss_mask_of(rows, kept["logprobs"].shape[1])
    padding = torch.tensor([[t < len(e.response_ids) for t in range(model_mask.shape[1])] for e in rows])
    environment = padding & ~model_mask
    assert int(environment.sum()) == sum(len(r.response_ids) - sum(r.loss_mask) for r in rows) > 0
    grad = kept["logprobs"].grad
    assert torch.all(grad[environment] == 0.0) and torch.all(grad[model_mask] != 0.0)
    assert torch.all(kept["entropy"].grad[environment] == 0.0)


def test_environment_tokens_behaviour_logprobs_do_not_matter(task, tokenizer):
    model = build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    trainer = make_trainer(model, tokenizer)
    rows = episode_experiences(task, tokenizer)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    loss, metrics, _ = trainer._micro_loss(rows, advantages, None)
    for e in rows:
        e.behavior_logprobs = [b if m else -50.0 for b, m in zip(e.behavior_logprobs, e.loss_mask, strict=True)]
    changed, changed_metrics, _ = trainer._micro_loss(rows, advantages, None)
    assert float(loss.detach()) == float(changed.detach()) and metrics == changed_metrics


def test_store_schema_2_round_trips_masks_and_version_1_still_loads(task, tokenizer, tmp_path):
    rows = episode_experiences(task, tokenizer)
    single = Experience(
        prompt_ids=[1, 2],
        response_ids=[3],
        behavior_logprobs=[-0.1],
        reward=1.0,
        reward_components={"correct": 1.0},
        group_id=1,
        task_id="a/1",
        policy_version=0,
        response_text="x",
    )
    write_parquet(tmp_path / "batch-000001.parquet", [*rows, single], 1)
    table = pq.read_table(tmp_path / "batch-000001.parquet")
    assert table.schema.metadata[b"oprl_schema"] == b"4"
    back = read_parquet(tmp_path / "batch-000001.parquet")
    assert [e.loss_mask for e in back] == [e.loss_mask for e in rows] + [None]
    assert back[-1].model_tokens == 1 and back[0].model_tokens == sum(rows[0].loss_mask)
    version_1 = table.drop_columns(["loss_mask"]).replace_schema_metadata({"oprl_schema": "1"})
    pq.write_table(version_1, tmp_path / "batch-000002.parquet")
    old = read_parquet(tmp_path / "batch-000002.parquet")
    assert [e.loss_mask for e in old] == [None] * 5 and [e.response_ids for e in old] == [e.response_ids for e in back]
    assert SCHEMA.field("loss_mask").type == pa.list_(pa.int8())
    assert json.loads(table.column("extra")[0].as_py()) == {"turns": 2}
