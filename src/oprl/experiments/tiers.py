"""The tiers of ``oprl report``: per metric, which methods a sweep's seeds cannot separate from the best, in words.

From per-run summaries (``(labels, numbers)`` pairs, ``results.summarize`` or a results.csv) and the pure
statistics of ``oprl.experiments.stats``: for each metric where higher is better (final eval accuracy, its AUC),
one comparison per setting (the methods at that lag, paired over seeds) and, with two or more settings on the lag
ladder, one pooled over them (the methods run at every lag of it: per seed, the mean over the lags, each lag
weighing the same; then paired over seeds). Each pair of methods carries its own noise (the SD of its paired
differences) unless the spec declares ``report.noise: pooled``; the tier of the best is Hsu's MCB (``stats``),
and every place in it is checked with each seed left out. Verdicts are words that never order the members of a
tier. Differences are in points (1 point = 0.01 of accuracy).

Not here: the statistics themselves (``stats``), what the design can detect and the seeds a difference needs
(``sensitivity``), each method's losses against its own lag 0 (``lag_losses``), the lag figure (``arena``), the
per-cell tables (``report``).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Hashable
from dataclasses import dataclass, field

from oprl.experiments import stats
from oprl.experiments.arena import lag_label, lag_of
from oprl.experiments.curves import _setting_rank

METRICS = {"final_accuracy": "final eval accuracy", "accuracy_auc": "eval-accuracy AUC (mean accuracy over training)"}
"""The metrics compared (higher is better, accuracies: differences in points)."""

LAYOUT = ("preset", "setting", "seed")
"""Labels a table lays out itself (rows, columns, the spread over seeds); any other sweep axis joins the row."""

NOISES = ("own", "pooled")
"""``report.noise``: each contrast with its own noise (the default), or the pooled σ̂ declared (``stats``)."""


def row_label(labels: dict[str, str]) -> str:
    """A method: the preset, then every other sweep axis of the run (``aspo lr=0.0001``), so that a sweep over
    learning rates (configs/sweeps/arena-lr.yaml) gets one row per rate instead of a mean over the rates."""
    return " ".join([labels["preset"], *(f"{k}={labels[k]}" for k in sorted(labels) if k not in LAYOUT)])


def points(value: float, digits: int = 1) -> str:
    return f"{100 * value:.{digits}f}"


def p_text(p: float) -> str:
    return "p̃ < 0.001" if p < 0.001 else f"p̃ = {p:.3f}"


@dataclass
class Analysis:
    """One metric of a sweep: a comparison per setting, one pooled over the lag ladder, and the design."""

    metric: str
    per_setting: dict[str, stats.Comparison]
    pooled: stats.Comparison | None
    """Pooled over the lag ladder (per seed the mean over its lags), or None."""
    ladder: list[str]
    """The settings pooled over, in lag order."""
    methods: int
    seeds: int
    """Seeds per cell (the most common count)."""
    short: dict[str, int]
    """Cells with fewer seeds than ``seeds`` (a sweep in progress): ``{"m2po (lag-4)": 1}``."""
    noise: str = "own"
    """``report.noise``: ``own`` (each pair's paired differences) or ``pooled`` (σ̂, declared)."""
    spread: dict[str, tuple[float, float, int]] = field(default_factory=dict)
    """With a pooled σ̂: per setting Brown–Forsythe's (W, p, methods) (``stats.spread_test``)."""

    @property
    def named(self) -> list[tuple[str, stats.Comparison]]:
        """Every comparison with its name: the settings, then ``pooled`` over the ladder."""
        return list(self.per_setting.items()) + ([("pooled", self.pooled)] if self.pooled is not None else [])


def values_by_setting(summaries, metric: str) -> dict[str, dict[str, dict[Hashable, float]]]:
    """``{setting: {method: {seed: value}}}``, NaN values dropped, settings in schedule order."""
    table: dict[str, dict[str, dict[Hashable, float]]] = defaultdict(lambda: defaultdict(dict))
    for labels, numbers in summaries:
        value = float(numbers.get(metric, math.nan))
        if not math.isnan(value):
            table[labels["setting"]][row_label(labels)][labels["seed"]] = value
    return {s: dict(table[s]) for s in sorted(table, key=_setting_rank)}


def analyse(summaries, metric: str, noise: str = "own") -> Analysis:
    by_setting = values_by_setting(summaries, metric)
    pooled_noise = noise == "pooled"
    per_setting = {setting: stats.compare(values, pooled=pooled_noise) for setting, values in by_setting.items()}
    ladder = sorted((s for s in by_setting if lag_of(s) is not None), key=lambda s: lag_of(s) or 0.0)
    # Pooled over the ladder: the methods run at every lag of it. A method at one lag only (the stale arena's
    # lag-0 anchor is GRPO alone) would set its single lag's mean beside the others' means over every lag.
    everywhere = [m for m in by_setting[ladder[0]] if all(m in by_setting[s] for s in ladder)] if ladder else []
    pooled = None
    if len(ladder) >= 2 and len(everywhere) >= 2:
        on_ladder = {s: {m: by_setting[s][m] for m in everywhere} for s in ladder}
        if pooled_noise:  # σ̂ fitted per lag (units: lag × seed, strata: the lags)
            values, strata = _stack(on_ladder, ladder)
            pooled = stats.compare(values, pooled=True, strata=strata)
        else:
            pooled = stats.compare(_over_lags(on_ladder, ladder))
    counts = [len(per) for values in by_setting.values() for per in values.values()]
    seeds = max(set(counts), key=counts.count) if counts else 0
    methods = len({m for values in by_setting.values() for m in values})
    short = {
        f"{m} ({s})": len(per) for s, values in by_setting.items() for m, per in values.items() if len(per) < seeds
    }
    spread = {s: stats.spread_test(values) for s, values in by_setting.items()} if pooled_noise else {}
    return Analysis(metric, per_setting, pooled, ladder, methods, seeds, short, noise, spread)


def _over_lags(on_ladder, ladder: list[str]) -> dict[str, dict[Hashable, float]]:
    """``{method: {seed: mean over the ladder's lags}}`` over the seeds a method has at every lag: the unit of a
    pooled comparison is the seed (one seed's prompts at every lag), so its lags are averaged before pairing."""
    out: dict[str, dict[Hashable, float]] = {}
    for method in on_ladder[ladder[0]]:
        seeds = [u for u in on_ladder[ladder[0]][method] if all(u in on_ladder[s][method] for s in ladder)]
        out[method] = {u: statistics.fmean(on_ladder[s][method][u] for s in ladder) for u in seeds}
    return out


def _stack(by_setting, settings: list[str]):
    """``{method: {(setting, seed): value}}`` over ``settings`` and the unit -> setting map (the strata)."""
    values: dict[str, dict[Hashable, float]] = defaultdict(dict)
    strata: dict[Hashable, Hashable] = {}
    for setting in settings:
        for method, per_seed in by_setting[setting].items():
            for seed, value in per_seed.items():
                values[method][(setting, seed)] = value
                strata[(setting, seed)] = setting
    return dict(values), strata


def verdict_lines(analysis: Analysis) -> list[str]:
    """A line per setting and one pooled over the lags: the tier (unordered), the methods below it and by how
    much (j − method with its one-sided bound at α/(k − 1), MCB's p̃), the fragile places, the identical runs."""
    noise = "the pooled σ̂ (declared)" if analysis.noise == "pooled" else "each pair's own noise"
    legend = (
        f"Tier = not separable from the best by Hsu's MCB at α = 0.05 ({noise}; listed by name: not ranked); "
        "below = some method is above it in the one-sided test at α/(k − 1): the difference, ≥ its lower bound. "
        "† fragile: the method's place changes when the named seed is left out."
    )
    if analysis.pooled is not None:  # said only where a pooled line follows
        legend += " Pooled: per seed the mean over the lags, each lag weighing the same."
    lines = [f"### Verdicts: {METRICS[analysis.metric]}", "", legend, ""]
    for name, comparison in analysis.named:
        name = f"pooled over {', '.join(analysis.ladder)}" if name == "pooled" else name
        lines.append(f"- **{name}**: {verdict(comparison)}")
    return [*lines, ""]


def verdict(comparison: stats.Comparison) -> str:
    if not comparison.means:
        return "no runs."
    if not testable(comparison):
        values = list(comparison.means.values())
        return (f"{len(values)} method(s), means {min(values):.3f}-{max(values):.3f}: no noise estimate (one seed, or "
                "no seed shared by two methods), so nothing can be told apart.")  # fmt: skip
    tier, mark = comparison.tier, _marker(comparison)
    span = [comparison.means[m] for m in tier]
    spread = f"means {min(span):.3f}-{max(span):.3f}" if len(tier) > 1 else f"mean {span[0]:.3f}"
    names = ", ".join(mark(m) for m in tier)
    if not comparison.below:
        head = f"all {len(tier)} in the tier ({spread}): nothing separable" if len(tier) > 1 else f"{names} alone"
    else:
        head = f"{names} in the tier of the best ({spread})" if len(tier) > 1 else f"{names} best ({spread})"
        head += "; below: " + ", ".join(
            f"{mark(d.b)} {points(d.mean)} under {d.a} (≥ {points(d.low)}, {p_text(d.p_adjusted)})"
            for d in comparison.below
        )
    if comparison.fragile:
        head += "; † " + "; ".join(
            f"{m} without seed {', '.join(map(str, units))}" for m, units in sorted(comparison.fragile.items())
        )
    if comparison.identical:
        head += "; identical runs: " + "; ".join(" = ".join(group) for group in comparison.identical)
    return head + "."


def testable(comparison: stats.Comparison) -> bool:
    """Whether some pair has a noise estimate (two seeds shared by two methods): else there is no tier, and
    every method is "in" the best's only because nothing can be told apart."""
    return any(d.se == d.se for d in comparison.pairs)


def _marker(comparison: stats.Comparison):
    return lambda method: method + ("†" if method in comparison.fragile else "")


def tier_table(analysis: Analysis) -> list[str]:
    """Markdown: a row per method (by name), per lag its mean, **bold** in the tier of the best, else its
    distance below the method that puts it below, in points (MCB); † a place that one seed left out changes;
    the pooled column last. A column without a noise estimate (one seed: ``testable``) has plain means: no tier."""
    columns = [(lag_label(lag_of(s) or 0.0), analysis.per_setting[s]) for s in analysis.ladder]
    if analysis.pooled is not None:
        columns.append(("pooled", analysis.pooled))
    methods = sorted({m for _, c in columns for m in c.means})
    names = [name if name in ("offline", "pooled") else f"lag {name}" for name, _ in columns]
    rows = ["| method | " + " | ".join(names) + " |", "|---|" + "---|" * len(columns)]
    for method in methods:
        cells = []
        for _, comparison in columns:
            dagger = "†" if method in comparison.fragile else ""
            if method not in comparison.means:
                cells.append("—")
            elif not testable(comparison):
                cells.append(f"{comparison.means[method]:.3f}")
            elif method in comparison.tier:
                cells.append(f"**{comparison.means[method]:.3f}**{dagger}")
            else:
                below = next(d for d in comparison.below if d.b == method)
                cells.append(f"{comparison.means[method]:.3f} (−{points(below.mean)}){dagger}")
        rows.append(f"| {method} | " + " | ".join(cells) + " |")
    return rows


def pair_rows(analyses: list[Analysis]) -> list[dict]:
    """Every pairwise difference of every comparison (two-sided, Holm over the comparison's pairs), for
    ``stats.csv``."""
    rows = []
    for a in analyses:
        for name, comparison in a.named:
            for d in comparison.pairs:
                numbers = {"mean_a_minus_b": d.mean, "se": d.se, "df": d.df, "low": d.low, "high": d.high, "p": d.p,
                           "p_holm": d.p_adjusted}  # fmt: skip
                rows.append({"metric": a.metric, "comparison": name, "a": d.a, "b": d.b, "procedure": d.procedure,
                             "n": d.n, **{k: float(f"{v:.6g}") for k, v in numbers.items()},  # a readable file
                             "a_in_tier": d.a in comparison.tier, "b_in_tier": d.b in comparison.tier})  # fmt: skip
    return rows
