"""One cell and one contrast a − b with its own noise: the default test of every finding, tier and loss.

- A cell (one method at one setting, n seeds ``x_1..x_n``): mean x̄, the **sample** SD
  s = sqrt(Σ(x_i − x̄)² / (n − 1)) (Bessel's n − 1: the population SD, with n, underestimates σ by a factor
  sqrt((n − 1)/n), 18 % at n = 3), and the 95 % t-interval x̄ ± t_{0.975, n−1} · s / √n.
- **Each contrast with its own noise** (``contrast``): a − b over the seeds both cells have, when they share two
  or more: the paired differences d_u = a_u − b_u, their mean d̄ and their own sample SD s_d, SE = s_d / √n on
  n − 1 degrees of freedom (``paired``). Cells that share fewer seeds are compared unpaired (``welch``):
  SE² = s_a²/n_a + s_b²/n_b on the Welch–Satterthwaite df = SE⁴ / (s_a⁴/(n_a²(n_a − 1)) + s_b⁴/(n_b²(n_b − 1))).
  The noise of a contrast is that of its two cells and no other: which other methods ran cannot change it, and a
  pair with a noisy member is as wide as that member.
- Tests and intervals: two-sided, p = 2 · P(T_df > |d̄| / SE) and d̄ ± t_{1−α/2, df} · SE; for a one-sided claim
  a − b > θ (a finding's θ = −margin, a loss against lag 0, a method below the best) p = P(T_df > (d̄ − θ) / SE)
  and the two one-sided bounds d̄ ∓ t_{1−α, df} · SE (the claim holds above the lower, fails below the upper).

Not here: the pooled σ̂ (``pooled``), families of contrasts (``comparison``), power (``design``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy import stats as distributions

ALPHA = 0.05
"""Family-wise error rate of a family of tests, and 1 − the confidence of every interval."""


PAIRED, WELCH, POOLED = "paired t", "Welch t", "pooled σ̂"
"""The procedures a ``Difference`` names: its own paired differences, Welch's unpaired test, the pooled σ̂."""


@dataclass(frozen=True)
class Cell:
    """One cell's seeds: n, mean, sample SD (n − 1) and the 95 % t-interval of the mean (NaN below 2 values)."""

    n: int
    mean: float
    sd: float
    low: float
    high: float


def describe(values: Sequence[float], alpha: float = ALPHA) -> Cell:
    """x̄, s = sqrt(Σ(x − x̄)² / (n − 1)) and x̄ ± t_{1−α/2, n−1} · s / √n of ``values`` (NaN values dropped)."""
    x = _finite(values)
    n = len(x)
    if n == 0:
        return Cell(0, math.nan, math.nan, math.nan, math.nan)
    mean = float(x.mean())
    if n == 1:
        return Cell(1, mean, math.nan, math.nan, math.nan)
    sd = float(x.std(ddof=1))
    half = float(distributions.t.ppf(1 - alpha / 2, n - 1)) * sd / math.sqrt(n)
    return Cell(n, mean, sd, mean - half, mean + half)


def _finite(values: Iterable[float]) -> np.ndarray:
    return np.asarray([v for v in values if not math.isnan(v)], dtype=float)


@dataclass
class Difference:
    """a − b: its estimate d̄ with SE on df degrees of freedom (``procedure``), the bounds and p of one test (two
    one-sided bounds at the test's level for a one-sided test), n pairs (paired) or runs (Welch, n_a + n_b), and
    the family's adjusted p̃ (Holm, or the MCB's Bonferroni) where a family set it."""

    a: str
    b: str
    n: int
    mean: float
    se: float
    df: float
    low: float
    high: float
    p: float
    p_adjusted: float = math.nan
    procedure: str = PAIRED
    tails: int = 2

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def test(self, alpha: float = ALPHA, tails: int = 2, threshold: float = 0.0) -> Difference:
        """The same estimate tested again: level α, ``tails`` 1 (the claim a − b > ``threshold``) or 2."""
        return _tested((self.a, self.b), self.n, self.mean, self.se, self.df, self.procedure, alpha, tails, threshold)

    def flipped(self) -> Difference:
        """b − a: the same test from the other side (a one-sided p against 0 becomes 1 − p)."""
        p = self.p if self.tails == 2 else 1 - self.p
        return replace(self, a=self.b, b=self.a, mean=-self.mean, low=-self.high, high=-self.low, p=p)


def _p(t: float, df: float, tails: int) -> float:
    return float(2 * distributions.t.sf(abs(t), df)) if tails == 2 else float(distributions.t.sf(t, df))


def _tested(names: tuple[str, str], n: int, mean: float, se: float, df: float, procedure: str, alpha: float = ALPHA,
            tails: int = 2, threshold: float = 0.0) -> Difference:  # fmt: skip
    """A ``Difference`` from an estimate: bounds d̄ ∓ t_{1−α/tails, df} · SE, p of d̄ against ``threshold``
    (module docstring); an exact estimate (SE = 0: every pair differs by the same amount) has p 0 or 1."""
    if not df > 0 or math.isnan(se):
        return Difference(*names, n, mean, math.nan, 0.0, math.nan, math.nan, math.nan, procedure=procedure)
    if se == 0:
        beyond = mean > threshold if tails == 1 else mean != threshold
        return Difference(*names, n, mean, 0.0, df, mean, mean, 0.0 if beyond else 1.0, procedure=procedure,
                          tails=tails)  # fmt: skip
    half = float(distributions.t.ppf(1 - alpha / tails, df)) * se
    p = _p((mean - threshold) / se, df, tails)
    return Difference(*names, n, mean, se, df, mean - half, mean + half, p, procedure=procedure, tails=tails)


def contrast(
    a: Mapping[Any, float],
    b: Mapping[Any, float],
    names: tuple[str, str] = ("a", "b"),
    alpha: float = ALPHA,
    tails: int = 2,
    threshold: float = 0.0,
) -> Difference:
    """a − b of ``{seed: value}`` cells with their own noise: ``paired`` over the seeds both have when there are
    two or more, else ``welch`` over every value of each."""
    return _own(a, b, names).test(alpha, tails, threshold)


def _own(a: Mapping[Any, float], b: Mapping[Any, float], names: tuple[str, str]) -> Difference:
    """``contrast``'s estimate, untested (bounds and p NaN)."""
    if len(_shared(a, b)) >= 2:
        return _paired(a, b, names)
    return _welch(list(a.values()), list(b.values()), names)


def _shared(a: Mapping[Any, float], b: Mapping[Any, float]) -> list:
    return [u for u in a if u in b and not math.isnan(a[u]) and not math.isnan(b[u])]


def _estimate(names: tuple[str, str], n: int, mean: float, se: float, df: float, procedure: str) -> Difference:
    """An estimate with no test yet (``Difference.test`` adds the bounds and p)."""
    return Difference(*names, n, mean, se, df, math.nan, math.nan, math.nan, procedure=procedure)


def paired(a, b, names=("a", "b"), alpha=ALPHA, tails=2, threshold=0.0) -> Difference:
    """The paired t over the shared units: d_u = a_u − b_u (n of them), d̄, SE = s_d / √n, df n − 1 (scipy's
    ``ttest_rel``)."""
    return _paired(a, b, names).test(alpha, tails, threshold)


def _paired(a, b, names) -> Difference:
    d = np.asarray([a[u] - b[u] for u in _shared(a, b)], dtype=float)
    if len(d) < 2:
        return _estimate(names, len(d), float(d.mean()) if len(d) else math.nan, math.nan, 0, PAIRED)
    return _estimate(names, len(d), float(d.mean()), float(d.std(ddof=1)) / math.sqrt(len(d)), len(d) - 1, PAIRED)


def welch(a: Sequence[float], b: Sequence[float], names=("a", "b"), alpha=ALPHA, tails=2, threshold=0.0) -> Difference:
    """Welch's unpaired t: SE² = v_a + v_b with v = s² / n, df = (v_a + v_b)² / (v_a²/(n_a − 1) + v_b²/(n_b − 1))
    (Welch–Satterthwaite; scipy's ``ttest_ind(equal_var=False)``)."""
    return _welch(a, b, names).test(alpha, tails, threshold)


def _welch(a: Sequence[float], b: Sequence[float], names: tuple[str, str]) -> Difference:
    x, y = _finite(a), _finite(b)
    n, mean = len(x) + len(y), (float(x.mean() - y.mean()) if len(x) and len(y) else math.nan)
    if len(x) < 2 or len(y) < 2:
        return _estimate(names, n, mean, math.nan, 0, WELCH)
    va, vb = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    df = (va + vb) ** 2 / (va**2 / (len(x) - 1) + vb**2 / (len(y) - 1)) if va + vb > 0 else len(x) + len(y) - 2
    return _estimate(names, n, mean, math.sqrt(va + vb), float(df), WELCH)
