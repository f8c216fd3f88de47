"""How to add an advantage estimator that needs per-response score norms
(docs/algorithms.md#adding-an-estimator-that-needs-score-norms): a change in ``oprl.algorithms`` only. Here it
is done from this test, editing no file at all: a baseline function in ``BASELINES`` and, in
``WEIGHTED_BASELINES``, how its per-response weights come from the score statistics. The algorithm then asks the
trainer for those statistics (``Algorithm.needs``), the trainer computes them, and the config accepts the name,
with no edit to the trainer, the config or the runtime.

The estimator: each group's baseline is the reward mean weighted by the squared score norms alone,
b = Σ_j s_j·r_j / Σ_j s_j with s_j = ‖∇θ log π_θ(y_j)‖² (no importance weight, unlike VCPO's off-policy optimal)."""

import json

import torch

from oprl.algorithms import Algorithm, advantages
from oprl.algorithms.step import BatchInputs, step_advantages
from oprl.cli import main


def _score_weighted_baseline(rewards, keep, group, num_groups, count, tau, log_weights=None):
    """(G,) Σ s·r / Σ s over each group's kept rows, s = exp(log_weights) = the squared score norms."""
    s = torch.where(keep, log_weights.to(rewards.dtype).exp(), torch.zeros_like(rewards))  # (N,)
    total = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, group, s)
    weighted = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, group, s * rewards)
    return weighted / total.clamp(min=1e-12)


def _log_score_norms(log_ratios, score_sq_norms):
    """The weights of the baseline from the score statistics ``(log w (N,), ‖∇ log π‖² (N,))``: log s = log ‖∇‖²."""
    return score_sq_norms.to(log_ratios.dtype).log()


def _register(monkeypatch):
    monkeypatch.setitem(advantages.BASELINES, "score-weighted", _score_weighted_baseline)
    monkeypatch.setitem(advantages.WEIGHTED_BASELINES, "score-weighted", _log_score_norms)


def test_the_estimator_asks_for_score_norms_and_gets_them(monkeypatch):
    _register(monkeypatch)
    algorithm = Algorithm.of("reinforce", {"baseline": "score-weighted"})
    assert algorithm.needs.score_statistics and not Algorithm.of("reinforce").needs.score_statistics
    rewards, groups = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 0, 1, 1])
    norms = torch.tensor([3.0, 1.0, 0.0, 2.0, 5.0])  # (N,) squared score norms; a zero norm does not count
    given = BatchInputs(rewards, groups, torch.ones(5), score_statistics=(torch.zeros(5), norms))
    adv, metrics, _ = step_advantages(given, algorithm)
    baseline = 3.0 / 4.0  # group 0: (3·1 + 1·0) / (3 + 1); group 1: all rewards equal, A = 0
    assert torch.allclose(adv.advantages, torch.tensor([1 - baseline, -baseline, -baseline, 0.0, 0.0]))
    assert torch.allclose(metrics["vcpo/baseline_gap"], torch.tensor((3 * abs(baseline - 1 / 3) + 2 * 0) / 5))


def test_the_estimator_trains_through_the_config_and_the_trainer(monkeypatch, small_overrides, tmp_path):
    _register(monkeypatch)
    args = [*small_overrides, "steps=2", "run_name=scored", "eval.interval=0", "tensorboard=false"]
    assert main(["train", *args, "algorithm.preset=reinforce", "algorithm.baseline=score-weighted"]) == 0
    rows = [json.loads(r) for r in (tmp_path / "runs" / "scored" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/correct" in r]
    assert len(steps) == 2
    assert all(r["vcpo/score_norm_mean"] > 0 and "perf/train_score_s" in r for r in steps)  # the trainer computed them
