"""Many methods at once: Holm over a family, the tier of the best (Hsu's MCB), and leave-one-out robustness.

- Multiplicity, one family per question: Holm's step-down (``holm``: p̃_(i) = max_{j ≤ i} min(1, (m − j + 1)
  · p_(j))) over every pair of a comparison (``stats.csv``) and over every method × lag of the losses against
  lag 0; Bonferroni (α/m, each side) over the m contrasts of a report's findings.
- The **tier of the best**: Hsu's multiple comparison with the best (MCB) with Bonferroni's critical value
  (``with_the_best``). Method i is below the best when some method j beats it in the one-sided test at level
  α/(k − 1), each pair with its own SE and df: x̄_j − x̄_i − t_{1−α/(k−1), df_ji} · SE_ji > 0, and p̃_i =
  min_j min(1, (k − 1) · p_{j > i}). The true best is put below only if one of its own k − 1 comparisons errs,
  so with probability ≥ 1 − α the tier holds the best and every "below" is right (Hsu 1984; Bonferroni's value
  in place of Dunnett's keeps that with unequal SEs, conservatively). k − 1 tests, not Holm over k(k − 1)/2
  pairs: the tier is what the data can say about the best, not a ranking. Members of a tier are not ranked.
- Robustness (``flips``): a verdict recomputed with each seed left out (and, with a pooled σ̂, each method
  outside the contrast left out of the pool); one that changes is fragile, and the left-out unit is named.

``compare`` does all three for ``{method: {seed: value}}``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, TypeVar

import numpy as np
from scipy import stats as distributions

from oprl.experiments.stats.difference import ALPHA, Difference, _own
from oprl.experiments.stats.pooled import PooledSigma, _pooled, residual_noise


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's adjusted p-values, in the given order: p̃_(i) = max_{j ≤ i} min(1, (m − j + 1) · p_(j)) over the
    m finite p-values sorted ascending; NaN stays NaN (not counted in m)."""
    finite = sorted((p, i) for i, p in enumerate(pvalues) if not math.isnan(p))
    m = len(finite)
    adjusted = [math.nan] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(finite):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def with_the_best(pairs: Sequence[Difference], alpha: float = ALPHA) -> dict[str, Difference]:
    """Hsu's MCB with Bonferroni's critical value over every pair of k methods (module docstring): per method i,
    the j − i with the smallest one-sided p (the pairs' estimates; their own tests are not used), tested one-sided
    at level α/(k − 1), with p̃ = min(1, (k − 1) · p); i is below the best when p̃ < α. A method with no
    testable pair maps to nothing."""
    methods = sorted({m for d in pairs for m in (d.a, d.b)})
    level = alpha / max(1, len(methods) - 1)
    ordered = [d for pair in pairs if pair.se == pair.se for d in (pair, pair.flipped())]  # j − i, both ways
    if not ordered:
        return {}
    mean, se = np.array([d.mean for d in ordered]), np.array([d.se for d in ordered])
    with np.errstate(divide="ignore", invalid="ignore"):  # SE 0: an exact difference, p 0 or 1
        p = np.where(se > 0, distributions.t.sf(mean / np.where(se > 0, se, 1), [max(d.df, 1) for d in ordered]),
                     (mean > 0) * 0.0 + (mean <= 0) * 1.0)  # fmt: skip
    strongest: dict[str, tuple[float, float, Difference]] = {}
    for d, p_one in zip(ordered, p, strict=True):
        if d.b not in strongest or (p_one, -d.mean) < strongest[d.b][:2]:
            strongest[d.b] = (float(p_one), -d.mean, d)
    out = {}
    for method, (_, _, d) in strongest.items():
        out[method] = d.test(level, tails=1)
        out[method].p_adjusted = min(1.0, (len(methods) - 1) * out[method].p)
    return out


T = TypeVar("T")


U = TypeVar("U")


def flips(verdict: T, without: Callable[[U], T], units: Iterable[U]) -> list[tuple[U, T]]:
    """Leave-one-out robustness: ``(unit, verdict without it)`` for each unit whose removal changes ``verdict``."""
    out = []
    for unit in units:
        other = without(unit)
        if other != verdict:
            out.append((unit, other))
    return out


@dataclass
class Comparison:
    """The methods of one comparison (a lag, or every lag pooled): their means, every pairwise difference (Holm
    over the pairs), the tier of the best by MCB and the methods below it."""

    means: dict[str, float]
    pairs: list[Difference] = field(repr=False)
    tier: list[str] = field(default_factory=list)
    """The best mean and every method MCB cannot put below the best (sorted by name: not ranked)."""
    below: list[Difference] = field(default_factory=list)
    """Per method outside the tier, j − method for the j that puts it below (one-sided, at α/(k − 1); by name)."""
    identical: list[list[str]] = field(default_factory=list)
    """Groups of methods equal at every unit (identical runs, as far as these numbers tell)."""
    units: int = 0
    """Units (seeds) per method, the most any method has."""
    noise: PooledSigma | None = None
    """The pooled σ̂ where the report declared one; None: each pair's own noise."""
    fragile: dict[str, list[Hashable]] = field(default_factory=dict)
    """Methods whose place (tier or below) changes when one seed is left out (or, pooled, one other method): the
    units that change it."""

    @property
    def best(self) -> str:
        return max(self.means, key=lambda m: (self.means[m], m))

    def between(self, a: str, b: str) -> Difference | None:
        """a − b, from the pairs (computed b − a flipped where needed)."""
        for pair in self.pairs:
            if (pair.a, pair.b) == (a, b):
                return pair
            if (pair.a, pair.b) == (b, a):
                return pair.flipped()
        return None


def compare(
    values: Mapping[str, Mapping[Any, float]],
    alpha: float = ALPHA,
    pooled: bool = False,
    strata: Mapping[Any, Any] | None = None,
    robust: bool = True,
) -> Comparison:
    """The tier of ``{method: {unit: value}}`` (higher is better; module docstring): every pair's two-sided
    ``contrast`` (or, ``pooled``, ``difference`` with the ``residual_noise`` σ̂ over ``strata``), Holm over the
    k(k − 1)/2 pairs for ``stats.csv``, the tier of the best by ``with_the_best``, and (``robust``) which
    methods' places flip when one unit, or with a pooled σ̂ one method, is left out. Methods without a value are
    left out."""
    values = {m: {u: v for u, v in per.items() if not math.isnan(v)} for m, per in values.items()}
    methods = sorted(m for m, per in values.items() if per)
    values = {m: values[m] for m in methods}
    noise = residual_noise(values, strata) if pooled else None
    means = {m: _mean_over_strata(values[m], strata) for m in methods}
    pairs = [_pair(values, a, b, noise, strata) for a, b in combinations(methods, 2)]
    if robust:  # the reported comparison (not a leave-one-out's): every pair tested, Holm over the pairs
        pairs = [pair.test(alpha) for pair in pairs]
        for pair, adjusted in zip(pairs, holm([p.p for p in pairs]), strict=True):
            pair.p_adjusted = adjusted
    comparison = Comparison(means, pairs, identical=identical_groups(values, methods), noise=noise)
    comparison.units = max((len(v) for v in values.values()), default=0)
    beaten = with_the_best(pairs, alpha)
    for method in methods:
        d = beaten.get(method)
        if method != comparison.best and d is not None and d.p_adjusted < alpha and d.mean > 0:
            comparison.below.append(d)
        else:  # the best itself, not separable from every other, or too few shared units to tell
            comparison.tier.append(method)
    if robust and methods:
        comparison.fragile = _fragile(values, comparison, alpha, pooled, strata)
    return comparison


def _pair(values, a: str, b: str, noise: PooledSigma | None, strata) -> Difference:
    """a − b's estimate: its own noise, or the pooled σ̂ where one is declared."""
    return _own(values[a], values[b], (a, b)) if noise is None else _pooled(values[a], values[b], noise, (a, b), strata)


def _fragile(values, comparison: Comparison, alpha: float, pooled: bool, strata) -> dict[str, list[Hashable]]:
    """Per method, the left-out units (seeds; with a pooled σ̂ also methods) that move it into or out of the tier."""
    place = {m: m in comparison.tier for m in values}
    out: dict[str, list[Hashable]] = {}
    units = list(dict.fromkeys(u for per in values.values() for u in per))
    leave = [("seed", u) for u in units] + ([("method", m) for m in values] if pooled else [])
    for kind, left in leave:
        if kind == "seed":
            rest = {m: {u: v for u, v in per.items() if u != left} for m, per in values.items()}
        else:
            rest = {m: per for m, per in values.items() if m != left}
        again = compare(rest, alpha, pooled, strata, robust=False)
        for method in rest:
            if method in again.means and (method in again.tier) != place[method]:
                out.setdefault(method, []).append(left if kind == "seed" else f"without {left}")
    return out


def _mean_over_strata(per_unit: Mapping[Any, float], strata: Mapping[Any, Any] | None) -> float:
    """The mean over units, each stratum weighing the same (the mean of the strata's means)."""
    groups: dict[Hashable, list[float]] = {}
    for unit, value in per_unit.items():
        groups.setdefault(strata[unit] if strata is not None else None, []).append(value)
    return float(np.mean([np.mean(g) for g in groups.values()]))


def identical_groups(values: Mapping[str, Mapping[Any, object]], methods: list[str]) -> list[list[str]]:
    """Methods whose values are equal at every unit (the same units, two or more): a group per distinct run."""
    groups: dict[tuple, list[str]] = {}
    for method in methods:
        if len(values[method]) >= 2:
            key = tuple(sorted((repr(u), repr(v)) for u, v in values[method].items()))
            groups.setdefault(key, []).append(method)
    return [group for group in groups.values() if len(group) > 1]
