"""What the seeds of a sweep can and cannot tell apart: the statistics of ``oprl report``.

Pure functions on numbers (no runs, no files), the distributions from ``scipy.stats``. A sweep's design is
method × setting × seed; runs with the same seed label share their prompts and their evaluation samples (common
random numbers: ``eval.seed``), so two cells are compared *paired*, seed by seed.

- A cell (one method at one setting, n seeds ``x_1..x_n``): mean x̄, the **sample** SD
  s = sqrt(Σ(x_i − x̄)² / (n − 1)) (Bessel's n − 1: the population SD, with n, underestimates σ by a factor
  sqrt((n − 1)/n), 18 % at n = 3), and the 95 % t-interval x̄ ± t_{0.975, n−1} · s / √n.
- **Each contrast with its own noise** (the default of every finding, tier and loss against lag 0, ``contrast``):
  a − b over the seeds both cells have, when they share two or more: the paired differences d_u = a_u − b_u,
  their mean d̄ and their own sample SD s_d, SE = s_d / √n on n − 1 degrees of freedom (``paired``). Cells that
  share fewer seeds are compared unpaired (``welch``): SE² = s_a²/n_a + s_b²/n_b on the Welch–Satterthwaite
  df = SE⁴ / (s_a⁴/(n_a²(n_a − 1)) + s_b⁴/(n_b²(n_b − 1))). The noise of a contrast is that of its two cells and
  no other: which other methods ran cannot change it, and a pair with a noisy member is as wide as that member.
- Tests and intervals: two-sided, p = 2 · P(T_df > |d̄| / SE) and d̄ ± t_{1−α/2, df} · SE; for a one-sided claim
  a − b > θ (a finding's θ = −margin, a loss against lag 0, a method below the best) p = P(T_df > (d̄ − θ) / SE)
  and the two one-sided bounds d̄ ∓ t_{1−α, df} · SE (the claim holds above the lower, fails below the upper).
- **Pooled σ̂**, a declared choice only (``report.noise: pooled``; ``residual_noise``, ``difference``): the residual
  SD of the additive model y_{m,u} = μ + α_m + β_u + ε fitted per setting over every method, df (k − 1)(n − 1),
  SE = σ̂ · sqrt(2 / n). It buys degrees of freedom by assuming one noise level for every method of a setting.
  Where the methods' noise differs (a collapsing seed: ~10× in the tiny arena), σ̂ is an average: it
  *understates* the noise of every pair with a noisy member (intervals too narrow, differences declared that are
  not there) and depends on which other methods ran. So it is never silent: ``spread_test`` (Brown–Forsythe)
  is printed beside it.
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
- Power: a t-test at level α' with standard error SE on df degrees of freedom detects a true difference Δ with
  probability P(T' > t_{1−α'/tails, df}) (+ the wrong-sign tail when two-sided), T' noncentral t(df, Δ / SE).
  The **minimum detectable difference** (MDE) is the Δ where that reaches 80 %; for a contrast with its own
  noise SE = s_d / √n on n − 1 df, so the seeds a design needs follow from a pilot's pair SD s_d
  (``seeds_needed``). "2 SE" is the rougher rule of thumb (about 50 % power at one two-sided test).

Not here: reading runs (``results``), laying the numbers out (``report``, ``tiers``, ``findings``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import combinations
from typing import Any, TypeVar

import numpy as np
from scipy import optimize
from scipy import stats as distributions

ALPHA = 0.05
"""Family-wise error rate of a family of tests, and 1 − the confidence of every interval."""

POWER = 0.8
"""The power at which the minimum detectable difference is quoted."""

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


def spread_test(values: Mapping[str, Mapping[Any, float]]) -> tuple[float, float, int]:
    """Brown–Forsythe's test that the methods of one setting have one noise level (scipy's ``levene``, centred
    on medians): each method's runs less the seed's mean over the methods (y_{m,u} − ȳ_{·u}: what a seed does
    to every method taken out), over the seeds every method has. (W, p, methods); NaN below 2 × 2."""
    methods = [m for m in values if values[m]]
    units = [u for u in (values[methods[0]] if methods else {}) if all(u in values[m] for m in methods)]
    if len(methods) < 2 or len(units) < 2:
        return math.nan, math.nan, len(methods)
    y = np.asarray([[values[m][u] for u in units] for m in methods], dtype=float)
    residual = y - y.mean(axis=0, keepdims=True)
    if not np.any(residual):
        return 0.0, 1.0, len(methods)
    result = distributions.levene(*residual, center="median")
    return float(result.statistic), float(result.pvalue), len(methods)


def pooled_sd(groups: Sequence[Sequence[float]]) -> tuple[float, int]:
    """(sqrt(Σ_g (n_g − 1) s_g² / Σ_g (n_g − 1)), Σ_g (n_g − 1)): the sample SD pooled over groups of 2 or more
    values (each about its own mean), and its degrees of freedom; (NaN, 0) when no group has two values."""
    squares, df = 0.0, 0
    for group in groups:
        x = _finite(group)
        if len(x) >= 2:
            squares += float(((x - x.mean()) ** 2).sum())
            df += len(x) - 1
    return (math.sqrt(squares / df), df) if df else (math.nan, 0)


@dataclass(frozen=True)
class Noise:
    """A pooled σ̂ of one run and its degrees of freedom (the declared choice ``report.noise: pooled``)."""

    sd: float
    df: int


def residual_noise(values: Mapping[str, Mapping[Any, float]], strata: Mapping[Any, Any] | None = None) -> Noise:
    """σ̂² = SS_E / df_E of the additive model y_{m,u} = μ + α_m + β_u + ε (method m, unit u) fitted within each
    stratum (a lag) over the units every method has there (or, when more degrees of freedom remain that way, over
    the methods that have every unit: ``_block``), SS_E and df_E = (k − 1)(b − 1) summed over strata:
    SS_E = Σ (y_{m,u} − ȳ_{m·} − ȳ_{·u} + ȳ_{··})². The unit term β_u takes out what a seed does to every method
    alike (the pairing); what remains is each run's own noise, assumed one level for every method. Without
    ``strata`` all units form one stratum."""
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


def difference(
    a: Mapping[Any, float],
    b: Mapping[Any, float],
    noise: Noise,
    names: tuple[str, str] = ("a", "b"),
    strata: Mapping[Any, Any] | None = None,
    alpha: float = ALPHA,
    tails: int = 2,
    threshold: float = 0.0,
) -> Difference:
    """a − b paired over their shared units with a **pooled** σ̂ (``noise``): d̄_s = mean of a_u − b_u over the
    n_s shared units of stratum s, d̄ = the mean of d̄_s over the S strata (each lag weighs the same), and

        SE = σ̂ · sqrt(2 · Σ_s (1 / n_s)) / S   on σ̂'s df_E   (one stratum: SE = σ̂ · sqrt(2 / n)),

    tested as in ``_tested``. Only where a report declares ``report.noise: pooled``; else ``contrast``."""
    return _pooled(a, b, noise, names, strata).test(alpha, tails, threshold)


def _pooled(a, b, noise: Noise, names: tuple[str, str], strata) -> Difference:
    shared: dict[Hashable, list[float]] = {}
    for unit in _shared(a, b):
        shared.setdefault(strata[unit] if strata is not None else None, []).append(a[unit] - b[unit])
    n = sum(len(d) for d in shared.values())
    if not shared:
        return _estimate(names, 0, math.nan, math.nan, 0, POOLED)
    mean = float(np.mean([np.mean(d) for d in shared.values()]))
    se = noise.sd * math.sqrt(2 * sum(1 / len(d) for d in shared.values())) / len(shared)
    return _estimate(names, n, mean, se, noise.df, POOLED)


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
    noise: Noise | None = None
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


def _pair(values, a: str, b: str, noise: Noise | None, strata) -> Difference:
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


def design_se(sd: float, seeds: int, strata: int = 1) -> float:
    """SE of a paired difference between two methods of a complete design, pooled σ̂: σ · sqrt(2 / (seeds ·
    strata))."""
    return sd * math.sqrt(2 / (seeds * strata)) if seeds * strata > 0 else math.inf


def design_df(methods: int, seeds: int, strata: int = 1) -> int:
    """df_E of the complete design's pooled σ̂: strata · (methods − 1) · (seeds − 1)."""
    return strata * max(0, methods - 1) * max(0, seeds - 1)


def power(delta: float, se: float, df: float, alpha: float = ALPHA, comparisons: int = 1, tails: int = 2) -> float:
    """P(a t-test at level α / comparisons rejects | true difference Δ) with standard error SE on df degrees of
    freedom: P(T' > t_{1−α/(tails·comparisons), df}) (+ P(T' < −t) when two-sided), T' ~ noncentral t(df, Δ / SE)."""
    if df < 1 or not se > 0:
        return math.nan
    critical = distributions.t.ppf(1 - alpha / max(1, comparisons) / tails, df)
    shift = delta / se
    upper = float(distributions.nct.sf(critical, df, shift))
    if tails == 1:
        return upper
    lower = float(distributions.nct.cdf(-critical, df, shift))  # the wrong-sign tail; scipy gives NaN far out
    return upper + (0.0 if math.isnan(lower) else lower)


def mde(
    se: float, df: float, alpha: float = ALPHA, power_: float = POWER, comparisons: int = 1, tails: int = 2
) -> float:
    """The minimum detectable difference: the Δ at which ``power`` reaches ``power_`` (inf without degrees of
    freedom, NaN without a standard error)."""
    if df < 1:
        return math.inf
    if not se > 0:
        return math.nan
    high = se

    def short(d: float) -> float:
        return power(d, se, df, alpha, comparisons, tails) - power_

    while short(high) < 0:
        high *= 2
    return float(optimize.brentq(short, 0.0, high, xtol=1e-12 * se))


def seeds_needed(
    delta: float,
    pair_sd: float,
    alpha: float = ALPHA,
    power_: float = POWER,
    comparisons: int = 1,
    tails: int = 2,
    most: int = 10_000,
) -> int | None:
    """The fewest paired seeds n with which a contrast whose paired differences have SD ``pair_sd`` (a pilot's
    s_d) finds a true difference Δ with probability ≥ ``power_``: SE = s_d / √n on n − 1 df, at level
    α / comparisons, ``tails`` as the test's. None when ``most`` seeds do not."""
    if not delta > 0 or not pair_sd > 0:
        return None

    def enough(seeds: int) -> bool:  # NaN power (one seed: no degrees of freedom) compares False
        return power(delta, pair_sd / math.sqrt(seeds), seeds - 1, alpha, comparisons, tails) >= power_

    high = 2
    while not enough(high):
        high *= 2
        if high > most:
            return None
    low = 1
    while high - low > 1:  # power grows with the seeds: bisect for the first count that is enough
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle) else (middle, high)
    return high
