"""Group-relative advantages: one scalar per response from the rewards of its group (docs/paper.md#advantages).

A group is the K responses to one prompt, identified by ``group_ids``; groups need not be contiguous or
sorted. The baseline is the group mean (or the OPMD soft baseline, or VCPO's off-policy optimal weighted mean
of per-response weights the caller passes as ``log_weights``), optionally shifted down by δ (AsymRE)
and followed by division by the population std (GRPO). RED-Drop (``drop="balance"``) removes surplus
negative responses first and computes every statistic over the responses it keeps; ``drop="probabilistic"``
(Trinity-RFT's first RED-Drop) drops negatives at random and keeps the whole group's statistics.

Not here: token masks, ratios or any loss; responses flagged ``keep=False`` must be removed by the caller
(zero their token mask), which makes them count in no loss denominator. With ``keep_dropped`` the dropped
responses stay (``keep=True``, A = 0) and count in the denominators, as in Trinity-RFT's final RED-Drop.
Adaptive RED-Weight (``red_weight``) reshapes the finished advantages last (``red_weight.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from oprl.algorithms.red_weight import red_weight_advantages, red_weight_metrics
from oprl.algorithms.registry import lookup
from oprl.algorithms.spec import Advantages as A
from oprl.algorithms.variance import off_policy_baseline_log_weights
from oprl.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch", globals())  # imported on first use (oprl.lazy): the config needs only names

STD_EPS = 1e-6
"""Added to the group std before dividing (docs/paper.md#advantages: A = (r − mean)/(std + 1e-6))."""

TIE_TOLERANCE = 1e-6
"""RED-Drop counts r as positive if r ≥ mean − TIE_TOLERANCE·(1 + |mean|): a float mean of equal rewards
can land one ulp above them, which would otherwise make every response of the group negative."""


@dataclass(frozen=True)
class GroupAdvantages:
    """Per-response advantages and which responses stay in the batch."""

    advantages: torch.Tensor
    """(N,) float; 0 where ``keep`` is False."""
    keep: torch.Tensor
    """(N,) bool; the rows to train on: False for responses RED-Drop removed (all True without dropping, and
    with ``keep_dropped``)."""
    dropped: torch.Tensor
    """(N,) bool; the responses the drop rule selected out (their advantage is 0 whether or not they are kept)."""
    baseline: torch.Tensor
    """(N,) float; the baseline b of each response's group (before the shift δ and any normalisation)."""
    metrics: dict[str, torch.Tensor]
    """Scalar tensors of the step's advantage shaping (adaptive RED-Weight's ``red_weight_temperature`` and
    ``red_weight_fired_frac``; empty without ``red_weight``)."""


def _segment_sum(values: torch.Tensor, group: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Σ of ``values`` (N,) per group → (G,)."""
    return torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(0, group, values)


def _segment_extreme(values, keep, group, num_groups, reduce):
    """Max or min (``reduce`` = "amax"/"amin") of the kept ``values`` (N,) per group → (G,)."""
    fill = -math.inf if reduce == "amax" else math.inf
    out = torch.full((num_groups,), fill, dtype=values.dtype, device=values.device)
    kept_values = torch.where(keep, values, torch.full_like(values, fill))
    return out.scatter_reduce(0, group, kept_values, reduce=reduce, include_self=True)


def _no_drop(rewards, group, num_groups, generator):
    return torch.ones_like(rewards, dtype=torch.bool)


def _negatives(rewards, group, num_groups):
    """``(positive (N,) bool, #positives (G,), #negatives (G,))``; positive = r ≥ group mean (ties included)."""
    size = torch.bincount(group, minlength=num_groups)  # (G,) long
    mean = (_segment_sum(rewards, group, num_groups) / size)[group]  # (N,)
    positive = rewards >= mean - TIE_TOLERANCE * (1 + mean.abs())  # (N,)
    num_positive = torch.bincount(group[positive], minlength=num_groups)  # (G,)
    return positive, num_positive, size - num_positive


def _uniform(rewards, generator):
    device = generator.device if generator is not None else rewards.device
    return torch.rand(rewards.shape, generator=generator, device=device).to(rewards.device)  # (N,)


def _balance_drop(rewards, group, num_groups, generator):
    """RED-Drop: keep every positive (r ≥ group mean) and min(#neg, #pos) negatives chosen at random."""
    positive, num_positive, _ = _negatives(rewards, group, num_groups)
    size = torch.bincount(group, minlength=num_groups)  # (G,)
    # Rank the responses inside each group: negatives first in a uniformly random order, then positives.
    # Keeping the negatives ranked below #pos is a uniform random subset of min(#neg, #pos) of them.
    noise = _uniform(rewards, generator)
    order = torch.argsort(noise + positive.to(noise.dtype))
    order = order[torch.argsort(group[order], stable=True)]  # grouped, random order inside each group
    group_start = torch.cumsum(size, 0) - size  # (G,)
    rank = torch.empty_like(group)
    rank[order] = torch.arange(len(group), device=group.device) - group_start[group[order]]
    return positive | (rank < num_positive[group])


def _probabilistic_drop(rewards, group, num_groups, generator):
    """Trinity-RFT's first RED-Drop: where negatives outnumber positives, each negative is dropped on its own
    with probability 1 − #pos/#neg (kept with #pos/#neg: as many as the positives on average, not exactly)."""
    positive, num_positive, num_negative = _negatives(rewards, group, num_groups)
    keep_probability = (num_positive / num_negative.clamp(min=1)).clamp(max=1.0)[group]  # (N,)
    return positive | (_uniform(rewards, generator) < keep_probability)


class DropRule(NamedTuple):
    select: Callable
    """``(rewards, group, num_groups, generator) -> keep (N,) bool``."""
    recenter: bool
    """True: baseline and std over the kept responses; False: over the whole group (the kept advantages then
    no longer sum to zero: a positive shift like AsymRE's)."""


DROP_RULES: dict[str, DropRule] = {
    "none": DropRule(_no_drop, recenter=True),  # every response stays
    # RED-Drop (Yao et al. 2025, section 4; Trinity-RFT's final version): as many negatives as positives.
    "balance": DropRule(_balance_drop, recenter=True),
    # Trinity-RFT's first version: drop with probability 1 − pos/neg, statistics of the whole group.
    "probabilistic": DropRule(_probabilistic_drop, recenter=False),
}


def _mean_baseline(rewards, keep, group, num_groups, count, tau):
    return _segment_sum(rewards * keep, group, num_groups) / count


def _logavgexp_baseline(rewards, keep, group, num_groups, count, tau):
    # b = τ·log((1/K) Σ exp(r/τ)) written as max + τ·log(mean(exp((r − max)/τ))) so nothing overflows.
    top = _segment_extreme(rewards, keep, group, num_groups, "amax")  # (G,)
    scaled = torch.where(keep, (rewards - top[group]) / tau, torch.full_like(rewards, -math.inf))
    return top + tau * torch.log(_segment_sum(scaled.exp(), group, num_groups) / count)


def _off_policy_optimal_baseline(rewards, keep, group, num_groups, count, tau, log_weights=None):
    # b = Σ u·r / Σ u over the group's rows with u = exp(log_weights − the group's largest), so nothing overflows;
    # a group whose weights are all 0 (−inf) falls back to its mean.
    if log_weights is None:
        raise ValueError(
            "baseline=off-policy-optimal needs log_weights (N,): log(w_i²·‖∇log π(y_i)‖²), which the oprl trainer "
            "computes (Trainer.score_statistics; oprl.algorithms.variance)"
        )
    log_u = torch.where(keep, log_weights.to(rewards.dtype), torch.full_like(rewards, -math.inf))  # (N,)
    top = _segment_extreme(log_u, keep, group, num_groups, "amax")  # (G,)
    finite = torch.isfinite(top)  # (G,) some row of the group has u > 0
    shifted = torch.where(finite[group], log_u - torch.where(finite, top, torch.zeros_like(top))[group], log_u)
    u = torch.where(keep, shifted.exp(), torch.zeros_like(rewards))  # (N,) in [0, 1], 1 at the group's largest
    total = _segment_sum(u, group, num_groups)  # (G,) ≥ 1 where finite
    weighted = _segment_sum(u * rewards, group, num_groups) / total.clamp(min=1.0)
    return torch.where(finite, weighted, _mean_baseline(rewards, keep, group, num_groups, count, tau))


BASELINES: dict[str, Callable] = {
    "mean": _mean_baseline,  # group-relative REINFORCE / GRPO
    "logavgexp": _logavgexp_baseline,  # OPMD's soft baseline (Kimi k1.5 / Yao et al. 2025, section 3)
    # VCPO's closed-form minimum-variance baseline for off-policy data (arXiv 2602.17616): Σ u·r / Σ u with
    # u = w²·‖∇log π(y)‖² per response (oprl.algorithms.variance), given as ``log_weights``.
    "off-policy-optimal": _off_policy_optimal_baseline,
}

WEIGHTED_BASELINES: dict[str, Callable] = {
    "off-policy-optimal": off_policy_baseline_log_weights,  # VCPO: log u = 2·log w + log ‖∇log π(y)‖²
}
"""The baselines that read per-response ``log_weights``, each with how they are made from the score statistics
``(log w (N,), ‖∇θ log π_θ(y)‖² (N,)) -> log_weights (N,)``: an algorithm whose baseline is a key here makes the
trainer compute those statistics (``Algorithm.needs.score_statistics``), and ``step_advantages`` hands the
baseline its weights. A new estimator that needs the score norms is one entry here and one in ``BASELINES``."""


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    std_normalize: bool = A.std_normalize,
    mean_normalize: bool = A.mean_normalize,
    drop: str = A.drop,
    keep_dropped: bool = A.keep_dropped,
    baseline_shift: float = A.baseline_shift,
    baseline: str = A.baseline,
    tau: float = A.tau,
    red_weight: str = A.red_weight,
    red_weight_level: str = A.red_weight_level,
    generator: torch.Generator | None = None,
    log_weights: torch.Tensor | None = None,
    response_lengths: torch.Tensor | None = None,
) -> GroupAdvantages:
    """Advantages of ``rewards`` (N,) within the groups of ``group_ids`` (N,), in four stages.

    1. The rows S of each group's statistics: all of them, or the rows the ``drop`` rule keeps (``DROP_RULES``:
       RED-Drop's ``balance`` keeps every positive, r_i ≥ the group mean, and as many negatives drawn with
       ``generator``; ``probabilistic`` drops each negative with probability 1 − #pos/#neg and keeps S whole).
    2. The baseline b over S (``BASELINES``) and r_i − b:
         b = mean_S(r)                                   (baseline="mean")
         b = τ·log((1/|S|) Σ_S exp(r_j/τ))               (baseline="logavgexp", OPMD)
         b = Σ_S u_j·r_j / Σ_S u_j, u = exp(log_weights)  (``WEIGHTED_BASELINES``: VCPO's off-policy-optimal,
                                                          log u_j = log(w_j²·‖∇log π(y_j)‖²); mean if all u_j = 0)
       A group whose rewards over S are all equal (a singleton included) gets r_i − b = 0 exactly.
    3. The scale and the shift δ = baseline_shift (AsymRE: the baseline lowered by δ, so an all-equal group
       gets δ, AsymRE's uniform push up):
         A_i = (r_i − b)/(std_S(r) + 1e-6) + δ           (std_normalize, GRPO; population std)
         A_i = (r_i − b)/mean_S(r) + δ                   (mean_normalize, MaxRL; 0 where mean_S(r) ≤ 0)
         A_i = (r_i − b) + δ                             (neither)
       Dropped rows get A = 0 and keep=False (keep=True with ``keep_dropped``: in the loss denominators).
    4. Adaptive RED-Weight (``red_weight``: adaptive / shift, over the batch or each group: ``red_weight_level``)
       reshapes the A_i of the rows not dropped where Σ A_i·L_i < 0, L_i = ``response_lengths`` (``red_weight.py``).
    """
    _check_options(drop, baseline, tau, std_normalize, mean_normalize, red_weight, response_lengths)
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.get_default_dtype())
    distinct, group = torch.unique(group_ids, return_inverse=True)  # group: (N,) dense ids 0..G-1
    num_groups = len(distinct)
    rule = DROP_RULES[drop]
    chosen = rule.select(rewards, group, num_groups, generator)  # (N,) bool
    stats = chosen if rule.recenter else torch.ones_like(chosen)  # (N,) the rows S of the statistics
    count = _segment_sum(stats.to(rewards.dtype), group, num_groups).clamp(min=1)  # (G,)
    weights = {"log_weights": log_weights} if baseline in WEIGHTED_BASELINES else {}  # read by those alone
    center = BASELINES[baseline](rewards, stats, group, num_groups, count, tau, **weights)  # (G,)
    centered = _centered(rewards, center, stats, group, num_groups)  # (N,)
    scaled = _scaled(centered, rewards, stats, group, num_groups, count, std_normalize, mean_normalize)  # (N,)
    advantages = torch.where(chosen, scaled + baseline_shift, torch.zeros_like(rewards))
    metrics: dict[str, torch.Tensor] = {}
    if red_weight != "none":
        assert response_lengths is not None  # checked above
        shaped = red_weight_advantages(
            advantages, response_lengths, group, rule=red_weight, level=red_weight_level, members=chosen
        )
        advantages, metrics = shaped.advantages, red_weight_metrics(shaped.fired, shaped.temperature)
    keep = torch.ones_like(chosen) if keep_dropped else chosen
    return GroupAdvantages(advantages=advantages, keep=keep, dropped=~chosen, baseline=center[group], metrics=metrics)


def _check_options(drop, baseline, tau, std_normalize, mean_normalize, red_weight, response_lengths) -> None:
    """A ``ValueError`` naming the first option ``group_advantages`` cannot run with."""
    lookup(DROP_RULES, drop, "drop")
    lookup(BASELINES, baseline, "baseline")
    if not tau > 0:
        raise ValueError(f"tau must be > 0 (the logavgexp temperature), got {tau!r}")
    if std_normalize and mean_normalize:
        raise ValueError("std_normalize and mean_normalize are alternatives (GRPO's std, MaxRL's mean): choose one")
    if red_weight != "none" and response_lengths is None:
        raise ValueError(f"red_weight={red_weight} needs response_lengths (N,): each response's loss token count")


def _centered(rewards, center, stats, group, num_groups) -> torch.Tensor:
    """(N,) r_i − b of each row's group; exactly 0 in a group whose rewards over ``stats`` are all equal, not the
    rounding error of (r − mean), which the std division would inflate."""
    highest = _segment_extreme(rewards, stats, group, num_groups, "amax")  # (G,)
    lowest = _segment_extreme(rewards, stats, group, num_groups, "amin")  # (G,)
    varies = (highest > lowest)[group]  # (N,)
    return torch.where(varies, rewards - center[group], torch.zeros_like(rewards))


def _scaled(centered, rewards, stats, group, num_groups, count, std_normalize, mean_normalize) -> torch.Tensor:
    """(N,) ``centered`` divided by the group's population std over ``stats`` + 1e-6 (GRPO) or by its mean reward
    (MaxRL: the group's success rate rescales the gradient, rare successes weigh more; 0 where the mean is ≤ 0)."""
    in_stats = stats.to(rewards.dtype)
    mean = _segment_sum(rewards * in_stats, group, num_groups) / count  # (G,)
    if std_normalize:
        std = (_segment_sum(in_stats * (rewards - mean[group]).square(), group, num_groups) / count).sqrt()
        centered = centered / (std[group] + STD_EPS)
    if mean_normalize:
        row_mean = mean[group]  # (N,)
        centered = torch.where(row_mean > 0, centered / row_mean.clamp(min=STD_EPS), torch.zeros_like(centered))
    return centered
