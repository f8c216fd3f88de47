"""Each method's losses against its own lag 0: the first lag whose final accuracy is significantly below it.

One family of tests, every method × later lag: lag 0 − lag paired over seeds with its own noise
(``stats.contrast``, one-sided: a loss), Holm over the whole family ("which methods lose at which lag"); each
method's answer checked with each seed left out (``Loss.fragile``). A sweep without a lag 0 or with one seed per
cell has no such test, and says so. Differences are in points (1 point = 0.01 of accuracy).

Not here: the tiers at each lag (``tiers``), the formulas (``stats``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable
from dataclasses import dataclass

from oprl.experiments import stats
from oprl.experiments.arena import lag_label, lag_of
from oprl.experiments.tiers import p_text, points, row_label


@dataclass(frozen=True)
class Loss:
    """A method's answer in the losses' family: its first lag significantly below its own lag 0 (None: no lag is),
    lag 0 − that lag (one-sided, Holm's p̃ over the family), and the seeds whose leaving out changes the answer."""

    lag: float | None
    difference: stats.Difference | None = None
    fragile: tuple = ()


def significant_losses(summaries, metric: str = "final_accuracy") -> dict[str, Loss]:
    """Per method, the first lag whose mean is significantly below the method's own lag 0: lag 0 − lag paired over
    seeds with its own noise (``stats.contrast``, one-sided: a loss), Holm over **every method × lag** (one family:
    "which methods lose at which lag"), no lag where none is or there is no lag 0; each method's answer checked
    with each seed left out (``Loss.fragile``)."""
    by_method: dict[str, dict[float, dict[Hashable, float]]] = defaultdict(lambda: defaultdict(dict))
    for labels, numbers in summaries:
        lag, value = lag_of(labels["setting"]), float(numbers.get(metric, math.nan))
        if lag is not None and not math.isnan(value):
            by_method[row_label(labels)][lag][labels["seed"]] = value
    found = _first_losses(by_method)
    seeds = sorted({u for lags in by_method.values() for per in lags.values() for u in per}, key=str)
    without = {seed: _first_losses(_without(by_method, seed)) for seed in seeds}
    out = {}
    for method, (lag, difference) in found.items():
        fragile = tuple(seed for seed in seeds if without[seed][method][0] != lag)
        out[method] = Loss(lag, difference, fragile)
    return out


def _without(by_method, seed) -> dict:
    return {m: {lag: {u: v for u, v in per.items() if u != seed} for lag, per in lags.items()}
            for m, lags in by_method.items()}  # fmt: skip


def _first_losses(by_method) -> dict[str, tuple[float | None, stats.Difference | None]]:
    """The family: every method × later lag, one-sided, Holm over all of them; per method its first lag below."""
    tests = []
    for method, lags in sorted(by_method.items()):
        if 0.0 in lags:
            for lag in sorted(lag for lag in lags if lag > 0):
                names = (f"{method} lag 0", f"lag {lag_label(lag)}")
                tests.append((method, lag, stats.contrast(lags[0.0], lags[lag], names, tails=1)))
    for (_, _, d), adjusted in zip(tests, stats.holm([d.p for _, _, d in tests]), strict=True):
        d.p_adjusted = adjusted
    out: dict[str, tuple[float | None, stats.Difference | None]] = dict.fromkeys(by_method, (None, None))
    for method, lag, d in tests:
        if out[method][0] is None and d.p_adjusted < stats.ALPHA and d.mean > 0:
            out[method] = (lag, d)
    return dict(sorted(out.items()))


def family_size(summaries) -> int:
    """The losses' family: every (method, later lag) of a method that has a lag 0."""
    cells = {(row_label(labels), lag_of(labels["setting"])) for labels, _ in summaries}
    with_zero = {m for m, lag in cells if lag == 0.0}
    return sum(1 for m, lag in cells if m in with_zero and lag is not None and lag > 0)


def _at(lag: str) -> str:
    return lag if lag == "offline" else f"lag {lag}"


def loss_lines(summaries) -> list[str]:
    seeds: dict[tuple[str, str], int] = defaultdict(int)
    for labels, _ in summaries:
        seeds[(row_label(labels), labels["setting"])] += 1
    if max(seeds.values(), default=0) < 2:
        return ["A loss against a method's own lag 0 cannot be tested with one seed per cell.", ""]
    losses = significant_losses(summaries)
    how = (
        f"paired over seeds, each method × lag with its own noise, one-sided, Holm over all {family_size(summaries)} "
        "method × lag tests; †: the answer changes when the named seed is left out"
    )
    lost = {m: loss for m, loss in losses.items() if loss.lag is not None and loss.difference is not None}
    if not lost:
        return [f"No method's final accuracy is significantly below its own lag 0 at any lag ({how}).", ""]
    parts = [
        f"{method}{_dagger(loss)} {_at(lag_label(loss.lag))} (−{points(loss.difference.mean)}, "
        f"{p_text(loss.difference.p_adjusted)})"
        for method, loss in lost.items()
        if loss.lag is not None and loss.difference is not None
    ]
    held = [method + _dagger(loss) for method, loss in losses.items() if method not in lost]
    return [
        f"**First lag with a significant loss of final accuracy against the method's own lag 0** ({how}): "
        + "; ".join(parts)
        + f". None at any lag: {', '.join(held) or 'no method'}.",
        "",
    ]


def _dagger(loss: Loss) -> str:
    return f"† (seed {', '.join(map(str, loss.fragile))})" if loss.fragile else ""
