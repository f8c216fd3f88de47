"""The pooled σ̂, a declared choice only (``report.noise: pooled``), and the test of its assumption beside it.

``residual_noise``: the residual SD of the additive model y_{m,u} = μ + α_m + β_u + ε fitted per setting over every
method, df (k − 1)(n − 1); ``difference``: a − b with SE = σ̂ · sqrt(2 / n). It buys degrees of freedom by assuming
one noise level for every method of a setting. Where the methods' noise differs (a collapsing seed: ~10× in the
tiny arena), σ̂ is an average: it *understates* the noise of every pair with a noisy member (intervals too narrow,
differences declared that are not there) and depends on which other methods ran. So it is never silent:
``spread_test`` (Brown–Forsythe) is printed beside it. ``pooled_sd``: the plain pooled SD of groups (two cells of
one contrast, the arena's float32/bfloat16 pair).

Not here: each contrast with its own noise, the default (``difference``).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as distributions

from oprl.experiments.stats.difference import ALPHA, POOLED, Difference, _estimate, _finite, _shared


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
class PooledSigma:
    """A pooled σ̂ of one run and its degrees of freedom (the declared choice ``report.noise: pooled``)."""

    sd: float
    df: int


def residual_noise(values: Mapping[str, Mapping[Any, float]], strata: Mapping[Any, Any] | None = None) -> PooledSigma:
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
    return PooledSigma(math.sqrt(squares / df), df) if df else PooledSigma(math.nan, 0)


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
    noise: PooledSigma,
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


def _pooled(a, b, noise: PooledSigma, names: tuple[str, str], strata) -> Difference:
    shared: dict[Hashable, list[float]] = {}
    for unit in _shared(a, b):
        shared.setdefault(strata[unit] if strata is not None else None, []).append(a[unit] - b[unit])
    n = sum(len(d) for d in shared.values())
    if not shared:
        return _estimate(names, 0, math.nan, math.nan, 0, POOLED)
    mean = float(np.mean([np.mean(d) for d in shared.values()]))
    se = noise.sd * math.sqrt(2 * sum(1 / len(d) for d in shared.values())) / len(shared)
    return _estimate(names, n, mean, se, noise.df, POOLED)
