"""``rollout.record_top_k`` on the built-in multi-turn tasks (#70): a tool-arithmetic episode sampled by the lean
engine carries, at every token the model sampled, the sampler's top-K of the distribution it drew that token from
(equal to a plain forward's over the episode's context, ``tests/rollout/test_top_k.py``'s reference and tolerance),
and at every token the environment wrote K entries of id 0 at ``-inf`` (no mass: the trainer's padding); the rows
keep them through the explorer and the experience store, and a step of a top-K method trains on them.

The model: the tiny Llama fitted for a few seconds on tool-arithmetic's demonstrations (``fitted``), so that at
temperature 1 it calls the calculator in most episodes and the episodes hold model, tool and model turns; the
top-K are compared wherever it sampled, whatever it sampled (its answers are mostly wrong: the training step sets
alternating rewards so the group advantages are not 0)."""

import copy
import math

import pytest
import torch

from oprl.algorithms import PRESETS
from oprl.algorithms.method import Method
from oprl.checkpoint.store import read_parquet, write_parquet
from oprl.cli import main
from oprl.config import OptimConfig
from oprl.episodes.episode import Episode, run_episodes, teacher_forced
from oprl.explorer.explorer import Explorer
from oprl.metrics import read_metrics
from oprl.models.tiny import build_model, build_tokenizer
from oprl.rollout import LeanEngine, Sampling
from oprl.tasks.tool_arithmetic import ToolArithmeticTask
from oprl.trainer.trainer import Trainer
from recipes import EPISODES

K = 4
FIT_STEPS = 40
TOLERANCE = 1e-5
"""Largest |recorded − reference| log-prob allowed, as ``tests/rollout/test_top_k.py`` (measured there ≤ 4.8e-7)."""


@pytest.fixture(scope="module")
def task():
    return ToolArithmeticTask(train_size=40, test_size=10)


@pytest.fixture(scope="module")
def fitted(task):
    """``(model, tokenizer)``: the tiny model after ``FIT_STEPS`` AdamW steps (lr 1e-2) of teacher forcing on 8
    demonstrations (model tokens only, as the warm start), enough to call the tool at temperature 1 most of the
    time (8 of 8 episodes here)."""
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, seed=3)
    problems = list(task.problems("train"))[:8]
    rows = [teacher_forced(tokenizer, task, p, task.demonstration(p)) for p in problems]
    width = max(len(e.prompt_ids) + len(e.response_ids) for e in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    for row, e in enumerate(rows):
        tokens = e.prompt_ids + e.response_ids
        ids[row, : len(tokens)] = torch.tensor(tokens)
        trained = [t if m else -100 for t, m in zip(e.response_ids, e.loss_mask, strict=True)]
        labels[row, len(e.prompt_ids) : len(tokens)] = torch.tensor(trained)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small: a second thread only spins (~6x the CPU time on a busy machine)
    try:
        for _ in range(FIT_STEPS):
            optimizer.zero_grad()
            model(input_ids=ids, labels=labels).loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    model.eval()
    return model, tokenizer


def engine_of(fitted):
    model, tokenizer = fitted
    return LeanEngine(model, tokenizer, sampling=Sampling(1.0), max_new_tokens=10, record_top_k=K)


def reference_top_k(model, episode: Episode):
    """``(ids (T, K), log-probs (T, K))`` at every response position: ``log_softmax`` of one forward over the
    unpadded prompt + response (causal: position t sees the context the sampler saw), then ``topk``."""
    tokens = episode.prompt_ids + episode.response_ids
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].float()  # (P + T, V)
    scores = logits[len(episode.prompt_ids) - 1 : len(tokens) - 1]  # (T, V), temperature 1
    values, ids = torch.log_softmax(scores, dim=-1).topk(K, dim=-1)
    return ids, values


def test_episodes_carry_the_samplers_top_k_at_model_tokens_and_none_at_environment_tokens(task, fitted):
    model, tokenizer = fitted
    problems = [p for p in list(task.problems("train"))[:4] for _ in range(2)]
    episodes = run_episodes(engine_of(fitted), tokenizer, task, problems, seed=0, max_turns=3, max_tokens=48)
    assert sum(0 in e.loss_mask for e in episodes) >= 4  # most episodes called the calculator
    assert any(e.loss_mask[-1] == 1 and 0 in e.loss_mask for e in episodes)  # a model turn after a tool turn
    compared = 0
    for e in episodes:
        assert e.top_k == K and len(e.top_k_ids) == len(e.top_k_logprobs) == len(e.response_ids)
        ids, values = reference_top_k(model, e)
        for t, sampled in enumerate(e.loss_mask):
            if not sampled:  # the environment's token: no distribution of the sampler
                assert e.top_k_ids[t] == [0] * K and e.top_k_logprobs[t] == [-math.inf] * K
                continue
            assert e.top_k_ids[t] == ids[t].tolist(), (t, e.top_k_ids[t], ids[t].tolist())
            assert max(abs(a - b) for a, b in zip(e.top_k_logprobs[t], values[t].tolist(), strict=True)) < TOLERANCE
            assert (
                e.behavior_logprobs[t] <= e.top_k_logprobs[t][0] + TOLERANCE
            )  # the top-K is sorted, most likely first
            compared += 1
    assert compared == sum(sum(e.loss_mask) for e in episodes)


def test_a_model_turn_without_top_k_is_refused():
    episode = Episode(prompt_ids=[1], top_k=K)
    episode.add([5, 6], None)  # the environment's tokens: padding
    with pytest.raises(ValueError, match="record_top_k=4: the engine returned no top log-probs"):
        episode.add([7], [-0.5])


def test_a_model_turn_with_top_k_for_fewer_tokens_is_refused():
    """Top-K rows one short of the turn's tokens would shift every later token's distribution: refused."""
    episode = Episode(prompt_ids=[1], top_k=K)
    top = ([[1] * K], [[-0.1] * K])  # one row for two tokens
    with pytest.raises(ValueError, match="top log-probs for 1 / 1 of a turn's 2 tokens"):
        episode.add([7, 8], [-0.5, -0.6], top=top)
    assert episode.top_k_ids == [] and episode.response_ids == []  # nothing half-added


@pytest.mark.parametrize(("preset", "key"), [("reinforce-sc", "loss/score_centering"),
                                             ("dppo-tv-topk", "loss/dppo_divergence_mean")])  # fmt: skip
def test_the_explorers_rows_keep_the_top_k_through_the_store_and_a_top_k_method_trains_on_them(
    task, fitted, tmp_path, preset, key
):
    model, tokenizer = fitted
    explorer = Explorer(task, tokenizer, engine_of(fitted), prompts_per_step=2, group_size=4, seed=1, max_turns=3,
                        max_episode_tokens=48)  # fmt: skip
    rows, _ = explorer.explore(step=1, version=0)
    assert any(0 in e.loss_mask for e in rows)
    for e in rows:
        assert len(e.top_k_ids) == len(e.top_k_logprobs) == len(e.response_ids) == len(e.loss_mask)
        padding = [t for t, m in enumerate(e.loss_mask) if not m]
        assert all(e.top_k_ids[t] == [0] * K and e.top_k_logprobs[t] == [-math.inf] * K for t in padding)
    write_parquet(tmp_path / "batch.parquet", rows, 1)
    stored = read_parquet(tmp_path / "batch.parquet")
    assert [(e.top_k_ids, e.top_k_logprobs, e.loss_mask) for e in stored] == [
        (e.top_k_ids, e.top_k_logprobs, e.loss_mask) for e in rows
    ]
    trainer = Trainer(copy.deepcopy(model), pad_id=tokenizer.pad_token_id,
                      method=Method.of(PRESETS[preset], max_response_tokens=48), optim=OptimConfig(),
                      sampling=Sampling())  # fmt: skip
    for index, e in enumerate(stored):  # the fitted model's answers all score 0: rewards that give advantages
        e.reward = float(index % 2)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    metrics = trainer.step(stored)
    assert math.isfinite(metrics[key]) and math.isfinite(metrics["loss/total"])
    assert any(not torch.equal(p, before[name]) for name, p in trainer.model.named_parameters())


@pytest.mark.slow  # a 60-step warm start and two steps of episodes: ~30 s on a loaded 2-core machine
def test_oprl_train_runs_a_top_k_method_on_tool_arithmetic(tmp_path):
    args = ["task.name=tool-arithmetic", "task.train_size=600", "task.test_size=64", *EPISODES,
            f"output_dir={tmp_path / 'runs'}", "steps=2", "eval.interval=0", "checkpoint.interval=0",
            "rollout.record_top_k=4", "algorithm.preset=dppo-tv-topk", "run_name=r"]  # fmt: skip
    assert main(["train", *args]) == 0
    rows = [
        row for row in read_metrics(tmp_path / "runs" / "r" / "metrics.jsonl") if "loss/dppo_divergence_mean" in row
    ]
    assert len(rows) == 2 and all(math.isfinite(row["loss/dppo_divergence_mean"]) for row in rows)
    assert all(0 < row["response/model_tokens"] <= row["response/tokens"] for row in rows)
