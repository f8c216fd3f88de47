"""What the seeds of a sweep can and cannot tell apart: the statistics of ``oprl report``.

Pure functions on numbers (no runs, no files), the distributions from ``scipy.stats``. A sweep's design is
method × setting × seed; runs of different methods with the same seed label share their prompts and their
evaluation samples (common random numbers: ``eval.seed``), so they are compared *paired*, seed by seed.

- A cell (one method at one setting, n seeds ``x_1..x_n``): mean x̄, the **sample** SD
  s = sqrt(Σ(x_i − x̄)² / (n − 1)) (Bessel's n − 1: the population SD, with n, underestimates σ by a factor
  sqrt((n − 1)/n), 18 % at n = 3), and the 95 % t-interval x̄ ± t_{0.975, n−1} · s / √n.
- The noise σ of one run: the residual SD of the additive model y_{m,u} = μ + α_m + β_u + ε (method m, unit u:
  a seed, which acts on every method alike), fitted per lag and pooled over lags (``residual_noise``); with k
  methods and n seeds it has (k − 1)(n − 1) degrees of freedom per lag. Pooling over the methods is what gives
  3 seeds a usable test (a pair's own SD would have 2 degrees of freedom); it assumes one noise level for every
  method of a lag, and where one method is noisier (a collapsing run) σ̂ grows and every interval of that lag
  widens: the error is on the side of declaring fewer differences.
- Two methods a, b, paired over their shared seeds: d̄ = mean of a_u − b_u (pooled over lags: the mean over the
  S lags of each lag's mean difference), SE = σ̂ · sqrt(2 · Σ_s 1/n_s) / S (one lag: σ̂ · sqrt(2/n)), the 95 %
  interval d̄ ± t_{0.975, df} · SE and the two-sided t-test p = 2 · P(T_df > |d̄| / SE), df those of σ̂.
- Multiplicity: Holm's step-down over every pair of methods of one comparison (m = k(k−1)/2 pairs for k
  methods): with p_(1) ≤ … ≤ p_(m), p̃_(i) = max_{j ≤ i} min(1, (m − j + 1) · p_(j)); a pair differs when
  p̃ < α. Holm holds the family-wise error ≤ α whatever is true, so naming the best of the data and testing
  every method against it (the tier below) stays within α too: each such test is one of the m pairs.
- The **tier** of a comparison: the method with the highest mean and every method not separable from it
  (p̃ ≥ α); the others are below it, each by d̄ ± the half-width of its 95 % interval. Members of a tier are
  not ranked: the data cannot order them.
- Power: a two-sided t-test at level α' with standard error SE on df degrees of freedom detects a true
  difference Δ with probability P(|T'| > t_{1−α'/2, df}), T' noncentral t(df, Δ / SE). The **minimum
  detectable difference** (MDE) is the Δ where that reaches 80 %; with α' = α / m it is Holm's worst case (its
  first step, Bonferroni's level), so a single true difference of the MDE among m pairs is found at least 80 %
  of the time. "2 SE" is the rougher rule of thumb (about 50 % power at one test).

Not here: reading runs (``results``), laying the numbers out (``report``, ``arena``).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import numpy as np
from scipy import optimize
from scipy import stats as distributions

ALPHA = 0.05
"""Family-wise error rate of a comparison (Holm), and 1 − the confidence of every interval."""

POWER = 0.8
"""The power at which the minimum detectable difference is quoted."""


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
    x = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    n = len(x)
    if n == 0:
        return Cell(0, math.nan, math.nan, math.nan, math.nan)
    mean = float(x.mean())
    if n == 1:
        return Cell(1, mean, math.nan, math.nan, math.nan)
    sd = float(x.std(ddof=1))
    half = float(distributions.t.ppf(1 - alpha / 2, n - 1)) * sd / math.sqrt(n)
    return Cell(n, mean, sd, mean - half, mean + half)


def pooled_sd(groups: Sequence[Sequence[float]]) -> tuple[float, int]:
    """(sqrt(Σ_g (n_g − 1) s_g² / Σ_g (n_g − 1)), Σ_g (n_g − 1)): the sample SD pooled over groups of 2 or more
    values (each about its own mean), and its degrees of freedom; (NaN, 0) when no group has two values."""
    squares, df = 0.0, 0
    for group in groups:
        x = np.asarray([v for v in group if not math.isnan(v)], dtype=float)
        if len(x) >= 2:
            squares += float(((x - x.mean()) ** 2).sum())
            df += len(x) - 1
    return (math.sqrt(squares / df), df) if df else (math.nan, 0)


@dataclass(frozen=True)
class Noise:
    """The seed-to-seed noise of one comparison: σ̂ (the residual SD of the additive model) and its degrees of
    freedom."""

    sd: float
    df: int


def residual_noise(values: Mapping[str, Mapping[Any, float]], strata: Mapping[Any, Any] | None = None) -> Noise:
    """σ̂² = SS_E / df_E of the additive model y_{m,u} = μ + α_m + β_u + ε (method m, unit u) fitted within each
    stratum (a lag) over the units every method has there (or, when more degrees of freedom remain that way, over
    the methods that have every unit: ``_block``), SS_E and df_E = (k − 1)(b − 1) summed over strata:
    SS_E = Σ (y_{m,u} − ȳ_{m·} − ȳ_{·u} + ȳ_{··})². The unit term β_u takes out what a seed does to every method
    alike (the pairing); what remains is each run's own noise. Without ``strata`` all units form one stratum."""
    squares, df = 0.0, 0
    for units in _by_stratum(values, strata).values():
        methods = [m for m in values if any(u in values[m] for u in units)]
        # A method still missing units (a sweep in progress) would cut every method's block down to its units:
        # it is left out of σ̂ when the methods that have every unit give more degrees of freedom.
        whole = [m for m in methods if all(_has(values[m], u) for u in units)]
        y = max(_block(values, methods, units), _block(values, whole, units), key=_df)
        if not _df(y):
            continue
        residual = y - y.mean(axis=1, keepdims=True) - y.mean(axis=0, keepdims=True) + y.mean()
        squares += float((residual**2).sum())
        df += _df(y)
    return Noise(math.sqrt(squares / df), df) if df else Noise(math.nan, 0)


def _df(block: np.ndarray) -> int:
    """(k − 1)(b − 1) of a (k methods, b units) block; 0 below two of either."""
    k, b = block.shape
    return (k - 1) * (b - 1) if k >= 2 and b >= 2 else 0


def _has(per_unit: Mapping[Any, float], unit: Hashable) -> bool:
    return unit in per_unit and not math.isnan(per_unit[unit])


def _block(values: Mapping[str, Mapping[Any, float]], methods: list[str], units: list[Hashable]) -> np.ndarray:
    """(k distinct methods, b units) over the units every one of ``methods`` has. Methods whose runs are one run
    (equal at every unit: the same loss on-policy) are one measurement: counted k times they would shrink σ̂ and
    add degrees of freedom that no new seed brought."""
    common = [u for u in units if all(_has(values[m], u) for m in methods)]
    rows = list({tuple(values[m][u] for u in common): None for m in methods})
    return np.asarray(rows, dtype=float).reshape(len(rows), len(common))


def _by_stratum(values: Mapping[str, Mapping[Any, float]], strata: Mapping[Any, Any] | None) -> dict:
    """``{stratum: [units]}`` over every unit of ``values`` (first-seen order)."""
    out: dict[Hashable, list[Hashable]] = {}
    for per_unit in values.values():
        for unit in per_unit:
            units = out.setdefault(strata[unit] if strata is not None else None, [])
            if unit not in units:
                units.append(unit)
    return out


@dataclass
class Difference:
    """a − b: the mean paired difference d̄ over the units both have, its 95 % interval, the t-test's p and Holm's
    p̃ (set by ``compare`` over the comparison's pairs), n shared units."""

    a: str
    b: str
    n: int
    mean: float
    se: float
    df: int
    low: float
    high: float
    p: float
    p_holm: float = math.nan

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


def difference(
    a: Mapping[Any, float],
    b: Mapping[Any, float],
    noise: Noise,
    names: tuple[str, str] = ("a", "b"),
    strata: Mapping[Any, Any] | None = None,
    alpha: float = ALPHA,
) -> Difference:
    """a − b over their shared units u, paired: d̄_s = mean of a_u − b_u over the shared units of stratum s (n_s of
    them), d̄ = the mean of d̄_s over the S strata (each lag weighs the same), and with σ̂ from ``noise``

        SE = σ̂ · sqrt(2 · Σ_s (1 / n_s)) / S,   t = d̄ / SE on df_E,   p = 2 · P(T_{df_E} > |t|),

    interval d̄ ± t_{1−α/2, df_E} · SE (for one stratum: SE = σ̂ · sqrt(2 / n), the paired t with a pooled σ̂)."""
    shared: dict[Hashable, list[float]] = {}
    for unit in a:
        if unit in b and not math.isnan(a[unit]) and not math.isnan(b[unit]):
            shared.setdefault(strata[unit] if strata is not None else None, []).append(a[unit] - b[unit])
    n = sum(len(d) for d in shared.values())
    if not shared:
        return Difference(*names, 0, math.nan, math.nan, 0, math.nan, math.nan, math.nan)
    mean = float(np.mean([np.mean(d) for d in shared.values()]))
    se = noise.sd * math.sqrt(2 * sum(1 / len(d) for d in shared.values())) / len(shared)
    if not noise.df or math.isnan(se):
        return Difference(*names, n, mean, math.nan, 0, math.nan, math.nan, math.nan)
    if se == 0:  # no noise at all (every run a copy of another, up to the method): any difference is exact
        p = 1.0 if mean == 0 else 0.0
        return Difference(*names, n, mean, 0.0, noise.df, mean, mean, p)
    half = float(distributions.t.ppf(1 - alpha / 2, noise.df)) * se
    p = float(2 * distributions.t.sf(abs(mean) / se, noise.df))
    return Difference(*names, n, mean, se, noise.df, mean - half, mean + half, p)


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


@dataclass
class Comparison:
    """The methods of one comparison (a lag, or every lag pooled): their means, the noise, every pairwise
    difference (Holm-adjusted), the tier not separable from the best and the methods below it."""

    means: dict[str, float]
    noise: Noise
    pairs: list[Difference] = field(repr=False)
    tier: list[str] = field(default_factory=list)
    """The best mean and every method not separable from it (sorted by name: not ranked)."""
    below: list[Difference] = field(default_factory=list)
    """best − method for each method outside the tier (sorted by name)."""
    identical: list[list[str]] = field(default_factory=list)
    """Groups of methods equal at every unit (identical runs, as far as these numbers tell)."""
    units: int = 0
    """Units (seeds, seeds × lags) per method, the most any method has."""

    @property
    def best(self) -> str:
        return max(self.means, key=lambda m: (self.means[m], m))

    def between(self, a: str, b: str) -> Difference | None:
        """a − b, from the pairs (computed b − a flipped where needed)."""
        for pair in self.pairs:
            if (pair.a, pair.b) == (a, b):
                return pair
            if (pair.a, pair.b) == (b, a):
                return Difference(a, b, pair.n, -pair.mean, pair.se, pair.df, -pair.high, -pair.low, pair.p,
                                  pair.p_holm)  # fmt: skip
        return None


def compare(
    values: Mapping[str, Mapping[Any, float]],
    strata: Mapping[Any, Any] | None = None,
    alpha: float = ALPHA,
) -> Comparison:
    """The tier of ``{method: {unit: value}}`` (higher is better; module docstring): σ̂ (``residual_noise``),
    every pair's ``difference``, Holm over all k(k−1)/2 pairs, then the best mean and every method whose
    difference to it is not significant (p̃ ≥ α, or untestable). Methods without a value are left out."""
    values = {m: {u: v for u, v in per.items() if not math.isnan(v)} for m, per in values.items()}
    methods = sorted(m for m, per in values.items() if per)
    values = {m: values[m] for m in methods}
    noise = residual_noise(values, strata)
    means = {m: _mean_over_strata(values[m], strata) for m in methods}
    pairs = [difference(values[a], values[b], noise, (a, b), strata, alpha) for a, b in combinations(methods, 2)]
    for pair, adjusted in zip(pairs, holm([p.p for p in pairs]), strict=True):
        pair.p_holm = adjusted
    comparison = Comparison(means, noise, pairs, identical=identical_groups(values, methods))
    comparison.units = max((len(v) for v in values.values()), default=0)
    if not methods:
        return comparison
    best = comparison.best
    for method in methods:
        versus = comparison.between(best, method) if method != best else None
        if versus is not None and versus.p_holm < alpha and versus.mean > 0:
            comparison.below.append(versus)
        else:  # the best itself, a tie, or too few shared units to tell
            comparison.tier.append(method)
    return comparison


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


def design_se(sd: float, seeds: int, strata: int = 1) -> float:
    """SE of a paired difference between two methods of a complete design: σ · sqrt(2 / (seeds · strata))."""
    return sd * math.sqrt(2 / (seeds * strata)) if seeds * strata > 0 else math.inf


def design_df(methods: int, seeds: int, strata: int = 1) -> int:
    """df_E of the complete design: strata · (methods − 1) · (seeds − 1)."""
    return strata * max(0, methods - 1) * max(0, seeds - 1)


def power(delta: float, se: float, df: int, alpha: float = ALPHA, comparisons: int = 1) -> float:
    """P(a two-sided t-test at level α / comparisons rejects | true difference Δ) with standard error SE on df
    degrees of freedom: P(|T'| > t_{1−α/(2·comparisons), df}), T' ~ noncentral t(df, Δ / SE)."""
    if df < 1 or not se > 0:
        return math.nan
    critical = distributions.t.ppf(1 - alpha / max(1, comparisons) / 2, df)
    shift = delta / se
    upper = float(distributions.nct.sf(critical, df, shift))
    lower = float(distributions.nct.cdf(-critical, df, shift))  # the wrong-sign tail; scipy gives NaN far out
    return upper + (0.0 if math.isnan(lower) else lower)


def mde(se: float, df: int, alpha: float = ALPHA, power_: float = POWER, comparisons: int = 1) -> float:
    """The minimum detectable difference: the Δ at which ``power`` reaches ``power_`` (inf without degrees of
    freedom, NaN without a standard error)."""
    if df < 1:
        return math.inf
    if not se > 0:
        return math.nan
    high = se
    while power(high, se, df, alpha, comparisons) < power_:
        high *= 2
    return float(optimize.brentq(lambda d: power(d, se, df, alpha, comparisons) - power_, 0.0, high, xtol=1e-12 * se))


def seeds_needed(
    delta: float,
    sd: float,
    methods: int,
    strata: int = 1,
    alpha: float = ALPHA,
    power_: float = POWER,
    comparisons: int | None = None,
    most: int = 10_000,
) -> int | None:
    """The fewest seeds per cell with which a complete design of ``methods`` × ``strata`` (lags) finds a true
    difference Δ between two methods with probability ≥ ``power_``: SE = ``design_se``, df = ``design_df``, at
    level α / comparisons (default: every pair, k(k−1)/2, Holm's worst case). None when ``most`` seeds do not."""
    if not delta > 0 or not sd > 0:
        return None
    m = comparisons if comparisons is not None else max(1, methods * (methods - 1) // 2)

    def enough(seeds: int) -> bool:  # NaN power (no degrees of freedom) compares False
        return power(delta, design_se(sd, seeds, strata), design_df(methods, seeds, strata), alpha, m) >= power_

    high = 2
    while not enough(high):
        high *= 2
        if high > most:
            return None
    low = 1  # never enough: one seed has no noise estimate
    while high - low > 1:  # power grows with the seeds: bisect for the first count that is enough
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle) else (middle, high)
    return high
