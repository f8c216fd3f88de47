"""A fraction of runs (k of n that collapsed) with its exact interval: a count, not a mean of accuracies.

The Clopper–Pearson interval inverts two one-sided binomial tests, so it never covers less than its level at any
n or true fraction p (it is conservative; a normal-approximation interval at n = 3-9 can cover far less):

    low  = B⁻¹(α/2; k, n − k + 1)       (0 when k = 0)
    high = B⁻¹(1 − α/2; k + 1, n − k)   (1 when k = n)

with B⁻¹ the Beta quantile. ``scipy.stats.binomtest(k, n).proportion_ci(method="exact")`` computes exactly this;
e.g. 3 of 4 → [0.194, 0.994], 0 of 4 → [0, 0.602], 3 of 3 → [0.292, 1].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats as distributions

from oprl.experiments.stats.difference import ALPHA


@dataclass(frozen=True)
class Proportion:
    """k of n, the fraction k/n and its exact (Clopper–Pearson) 1 − α interval; NaN where n = 0."""

    k: int
    n: int
    fraction: float
    low: float
    high: float


def proportion(k: int, n: int, alpha: float = ALPHA) -> Proportion:
    """k of n with its Clopper–Pearson 1 − α interval (module docstring); n = 0 gives NaNs, not an error (a cell
    whose runs have not finished)."""
    if not 0 <= k <= n:
        raise ValueError(f"a proportion needs 0 <= k <= n, not k={k}, n={n}")
    if n == 0:
        return Proportion(0, 0, math.nan, math.nan, math.nan)
    interval = distributions.binomtest(k, n).proportion_ci(confidence_level=1 - alpha, method="exact")
    return Proportion(k, n, k / n, float(interval.low), float(interval.high))
