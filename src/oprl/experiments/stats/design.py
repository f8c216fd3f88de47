"""What a design can detect: the power of a t-test, the minimum detectable difference, the seeds it needs.

A t-test at level α' with standard error SE on df degrees of freedom detects a true difference Δ with probability
P(T' > t_{1−α'/tails, df}) (+ the wrong-sign tail when two-sided), T' noncentral t(df, Δ / SE). The **minimum
detectable difference** (MDE) is the Δ where that reaches 80 %; for a contrast with its own noise SE = s_d / √n on
n − 1 df, so the seeds a design needs follow from a pilot's pair SD s_d (``seeds_needed``). "2 SE" is the rougher
rule of thumb (about 50 % power at one two-sided test). ``design_se`` and ``design_df``: the same for a complete
design under the pooled σ̂.
"""

from __future__ import annotations

import math

from scipy import optimize
from scipy import stats as distributions

from oprl.experiments.stats.difference import ALPHA

POWER = 0.8
"""The power at which the minimum detectable difference is quoted."""


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
