"""One trainer step's metrics, accumulated in one place: micro-batches into an optimizer update (weighted by their
shares), updates into the step (averaged), and what the batch itself says (rewards, lengths, lags, advantages).

Weights, so that the numbers do not depend on micro-batching or ranks: the loss's own values (``AGGREGATED_METRICS``)
by the micro-batch's share of the loss's count, every other token metric by its share of the mini-batch's tokens;
``*_min`` / ``*_max`` keep their extreme; ``perf/*`` seconds and the skipped-update count (``SKIPPED``) add up over
the step, the rest is the mean over its updates. Data-parallel ranks' sums are reduced (``SingleProcess.
reduce_metrics``) before the update is counted.

Not here: what is measured (``oprl.algorithms.step`` and the losses return their metrics as tensors), or where the
metrics go (the driver writes them).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import TypeVar

import torch

from oprl.messages import Experience, batch_metrics
from oprl.trainer.staleness import token_lag_metrics

AGGREGATED_METRICS = ("loss/pg_loss", "loss/reg_loss", "loss/total", "kl/ref")
"""Micro-batch metrics aggregated like the loss (``loss_agg``), so averaged with the loss's micro-batch shares."""

SKIPPED = "optim/skipped_updates"
"""The optimizer updates of a step skipped for a non-finite loss or gradient norm (``Trainer._skip_nonfinite``)."""

Result = TypeVar("Result")


class StepMetrics:
    """Sums and extremes of metrics, added one micro-batch or one update at a time."""

    def __init__(self, seconds: dict[str, float] | None = None):
        self.sums: dict[str, float] = defaultdict(float, seconds or {})
        self.extremes: dict[str, float] = {}
        self.updates = 0

    def add(self, metrics: dict[str, float], weight: float = 1.0, weights: dict[str, float] | None = None) -> None:
        """``*_min`` / ``*_max`` keys keep their extreme, the others add into the sums times their weight
        (``weights[key]``, else ``weight``)."""
        for key, value in metrics.items():
            if key.endswith("_min") or key.endswith("_max"):
                pick = min if key.endswith("_min") else max
                self.extremes[key] = pick(self.extremes.get(key, value), value)
            else:
                self.sums[key] += value * (weights or {}).get(key, weight)

    def add_micro(self, metrics: dict[str, torch.Tensor], tokens: float, share: float) -> None:
        """One micro-batch's metrics: the loss's own by its ``share`` of the loss's count, the rest by its share of
        the mini-batch's ``tokens``."""
        self.add(floats(metrics), tokens, dict.fromkeys(AGGREGATED_METRICS, share))

    def add_update(self, metrics: dict[str, float]) -> None:
        self.add(metrics)
        self.updates += 1

    def timed(self, key: str, function: Callable[..., Result], *args) -> Result:
        """``function(*args)``, its seconds added to ``key``."""
        tick = time.perf_counter()
        out = function(*args)
        self.sums[key] += time.perf_counter() - tick
        return out

    def reduced(self, parallel) -> dict[str, float]:
        """Sums and extremes over the data-parallel ranks (``perf/*`` stay this rank's)."""
        sums, extremes = parallel.reduce_metrics(dict(self.sums), self.extremes)
        return sums | extremes

    def means(self) -> dict[str, float]:
        """The step's metrics: means over its updates; seconds and skipped updates add up."""
        count = max(self.updates, 1)
        summed = {key: value if key.startswith("perf/") or key == SKIPPED else value / count
                  for key, value in self.sums.items()}  # fmt: skip
        return summed | self.extremes


def floats(metrics: dict[str, torch.Tensor]) -> dict[str, float]:
    return {key: float(value) for key, value in metrics.items()}


def batch_step_metrics(batch: list[Experience], version: int) -> dict[str, float]:
    """What ``batch`` (as sampled, whole groups) says at trainer ``version`` (before the step's bump): rewards,
    lengths, lags."""
    versions = [e.policy_version for e in batch]  # each row's oldest token (the version it started with)
    lags = [version - v for v in versions]  # how many updates the weights made since each sample
    return (
        batch_metrics(batch)
        | {
            "lag/min": float(min(lags)),
            "lag/mean": sum(lags) / len(lags),
            "lag/max": float(max(lags)),
            "batch/start_version_max": float(max(versions)),
            "batch/use_count_mean": sum(e.use_count for e in batch) / len(batch),
        }
        | token_lag_metrics(batch, version)
    )  # batch/version_min|max over tokens, lag/token_*


def advantage_metrics(batch: list[Experience], adv) -> dict[str, float]:
    """The spread of the step's advantages ``adv`` (``GroupAdvantages``) over ``batch``."""
    group_rewards: dict[int, set[float]] = defaultdict(set)
    for e in batch:
        group_rewards[e.group_id].add(e.reward)
    kept = ~adv.dropped
    return {
        # Groups whose rewards are all equal: A = r - baseline = 0 for each of their responses.
        "adv/zero_groups_frac": sum(len(r) == 1 for r in group_rewards.values()) / len(group_rewards),
        "adv/keep_frac": 1 - float(adv.dropped.float().mean()),
        "adv/abs_mean": float(adv.advantages[kept].abs().mean()) if bool(kept.any()) else 0.0,
    }


def step_means(updates: list[dict[str, float]], seconds: dict[str, float]) -> dict[str, float]:
    """A step's metrics from its optimizer updates' (``Trainer._update``) and the ``seconds`` spent before them."""
    metrics = StepMetrics(seconds)
    for update in updates:
        metrics.add_update(update)
    return metrics.means()
