"""Adaptive RED-Weight: reshape group advantages so that their token-weighted sum is not negative.

Source: the RED authors' follow-up (arXiv 2606.20002) as Trinity-RFT implements it (``trinity/algorithm/
advantage_fn/cod_advantage.py`` at commit 139d1c4: ``red_weight_adaptive_temp`` with the ``bisection`` version,
``red_weight_adv_shift``, ``red_weight_adaptive_level``), run with REC-OneSide-NoIS in its ``examples/research_cod``.

Over a set S of responses (the whole batch, or one prompt's group), with s_i the group advantage (r_i − the
group's mean, no std) and L_i response i's token count, the rule acts only when Σ_S s_i·L_i < 0, i.e. when a
token-mean loss would push the policy down on average:
  adaptive: A_i = s_i·exp(s_i/T), T ∈ [0.8, 100] the bisection root of f(T) = Σ_S s_i·exp(s_i/T)·L_i
  shift:    A_i = s_i − Σ_S s_j·L_j / Σ_S L_j
and A_i = s_i otherwise. f rises with 1/T (positive s gain weight, negative s lose it), so it has one root; where
even T = 0.8 leaves f < 0, T ends near 0.8 (the lower end keeps the weighting from growing without bound).

Not here: the fixed-T RED-Weight w = exp(A/T), which is a loss weight (``weight=advantage``, ``losses.py``), nor
the group baseline itself (``advantages.py`` computes s and calls ``red_weight_advantages`` last).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from oprl.algorithms.registry import lookup
from oprl.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch", globals())  # imported on first use (oprl.lazy): the config needs only names

TEMPERATURE_LOW, TEMPERATURE_HIGH = 0.8, 100.0
"""The bisection's bracket (Trinity-RFT: 0.8 "avoid too aggressive weighting", 100)."""
TOLERANCE = 0.05
"""The bisection stops once hi − lo < TOLERANCE."""
MAX_STEPS = 20
"""Trinity-RFT's cap on the bisection steps."""


def _bisection_steps() -> int:
    """How many halvings the bisection makes: hi − lo halves each step whatever f is, so every set stops after
    the same count (11: 99.2/2¹¹ = 0.048 < 0.05; the cap of 20 never binds)."""
    width, steps = TEMPERATURE_HIGH - TEMPERATURE_LOW, 0
    while steps < MAX_STEPS:
        width, steps = width / 2, steps + 1
        if width < TOLERANCE:
            break
    return steps


BISECTION_STEPS = _bisection_steps()


class RedWeight(NamedTuple):
    """The reshaped advantages and, per set of S, whether the rule acted and at which temperature."""

    advantages: torch.Tensor
    """(N,) float."""
    fired: torch.Tensor
    """(M,) bool, one per set: Σ_S s_i·L_i < 0, so the rule changed the set's advantages."""
    temperature: torch.Tensor
    """(M,) float: the bisection's T where ``adaptive`` fired, NaN elsewhere (and for every other rule)."""


def _set_sum(values: torch.Tensor, sets: torch.Tensor, num_sets: int) -> torch.Tensor:
    """Σ of ``values`` (N,) per set → (M,)."""
    return torch.zeros(num_sets, dtype=values.dtype, device=values.device).index_add_(0, sets, values)


def _unchanged(scores, lengths, sets, num_sets):
    nothing = torch.zeros(num_sets, dtype=torch.bool, device=scores.device)
    return scores, nothing, torch.full((num_sets,), torch.nan, dtype=scores.dtype, device=scores.device)


def _adaptive(scores, lengths, sets, num_sets):
    # Every set bisects in lockstep (the bracket's width depends on the step count alone); a set whose weighted sum
    # is not negative keeps its scores, whatever its bisection gave.
    fired = _set_sum(scores * lengths, sets, num_sets) < 0  # (M,)
    low = torch.full((num_sets,), TEMPERATURE_LOW, dtype=scores.dtype, device=scores.device)  # (M,)
    high = torch.full_like(low, TEMPERATURE_HIGH)
    for _ in range(BISECTION_STEPS):
        middle = (low + high) / 2  # (M,)
        f = _set_sum(scores * torch.exp(scores / middle[sets]) * lengths, sets, num_sets)  # (M,)
        high, low = torch.where(f < 0, middle, high), torch.where(f < 0, low, middle)
    temperature = torch.where(fired, middle, torch.full_like(middle, torch.nan))  # T = the last midpoint tried
    reweighted = scores * torch.exp(scores / middle[sets])  # (N,)
    return torch.where(fired[sets], reweighted, scores), fired, temperature


def _shift(scores, lengths, sets, num_sets):
    token_mean = _set_sum(scores * lengths, sets, num_sets) / _set_sum(lengths, sets, num_sets).clamp(min=1)  # (M,)
    fired = token_mean < 0
    shifted = scores - torch.where(fired, token_mean, torch.zeros_like(token_mean))[sets]  # (N,)
    return shifted, fired, torch.full_like(token_mean, torch.nan)


RED_WEIGHT_RULES: dict[str, Callable] = {
    "none": _unchanged,  # the group advantages as computed
    # Trinity-RFT's red_weight_adaptive_temp (bisection): A = s·exp(s/T), T solving Σ s·exp(s/T)·L = 0.
    "adaptive": _adaptive,
    # Trinity-RFT's red_weight_adv_shift: subtract the negative token-weighted mean instead of re-weighting.
    "shift": _shift,
}
"""``(scores (N,), lengths (N,), sets (N,) dense ids, num_sets) -> (advantages (N,), fired (M,), T (M,))``."""

RED_WEIGHT_LEVELS: tuple[str, ...] = ("batch", "group")
"""The set S of the rule: the whole batch (Trinity-RFT's default) or each prompt's group (its ``task`` level)."""


def red_weight_advantages(
    scores: torch.Tensor,
    response_lengths: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    rule: str,
    level: str,
    members: torch.Tensor | None = None,
) -> RedWeight:
    """The advantages of ``rule`` from the group advantages ``scores`` (N,) (module docstring).

    ``response_lengths`` (N,): each response's loss tokens L_i; ``group_ids`` (N,): each response's prompt group
    (read for ``level="group"``; any integers); ``members`` (N,) bool: the rows that take part (all by default;
    RED-Drop's dropped rows do not: they keep their advantage and count in no sum). Computed in float64
    (Trinity-RFT's Python floats), returned in ``scores``' dtype.
    """
    rule_fn = lookup(RED_WEIGHT_RULES, rule, "red_weight")
    if level not in RED_WEIGHT_LEVELS:
        raise ValueError(f"unknown red_weight_level {level!r}; valid values: {', '.join(RED_WEIGHT_LEVELS)}")
    if response_lengths.shape != scores.shape:
        raise ValueError(
            f"red_weight={rule} needs response_lengths (N,) = each response's token count; got shape "
            f"{tuple(response_lengths.shape)} for {tuple(scores.shape)} scores"
        )
    if level == "group":
        distinct, sets = torch.unique(group_ids, return_inverse=True)  # sets: (N,) dense ids 0..M−1
        num_sets = len(distinct)
    else:
        sets, num_sets = torch.zeros_like(group_ids), 1  # (N,) one set: the whole batch
    lengths = response_lengths.to(device=scores.device, dtype=torch.float64)  # (N,)
    if members is not None:
        lengths = torch.where(members, lengths, torch.zeros_like(lengths))
    advantages, fired, temperature = rule_fn(scores.double(), lengths, sets, num_sets)
    if members is not None:
        advantages = torch.where(members, advantages, scores.double())
    return RedWeight(advantages.to(scores.dtype), fired, temperature.to(scores.dtype))


def red_weight_metrics(fired: torch.Tensor, temperature: torch.Tensor) -> dict[str, torch.Tensor]:
    """Scalar tensors of ``RedWeight``'s ``fired`` (M,) and ``temperature`` (M,): ``red_weight_fired_frac``, the
    share of sets the rule acted on, and ``red_weight_temperature``, the mean T over the sets where ``adaptive``
    fired (0 where none did: Trinity-RFT's ``active_weight_temp_mean``)."""
    active = ~torch.isnan(temperature)  # (M,)
    total = torch.where(active, temperature, torch.zeros_like(temperature)).sum()
    return {
        "red_weight_fired_frac": fired.float().sum() / max(len(fired), 1),
        "red_weight_temperature": total / active.sum().clamp(min=1),
    }
