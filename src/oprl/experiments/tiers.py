"""The statistical sections of ``oprl report``: what a sweep's seeds can and cannot tell apart, in tables and words.

From per-run summaries (``(labels, numbers)`` pairs, ``results.summarize`` or a results.csv) and the pure
statistics of ``oprl.experiments.stats``: for each metric where higher is better (final eval accuracy, its AUC),
one comparison per setting (the methods at that lag, paired over seeds) and, with two or more settings on the lag
ladder, one pooled over them (the methods run at every lag of it: per seed, the mean over the lags, each lag
weighing the same; then paired over seeds). Each pair of methods carries its own noise (the SD of its paired
differences) unless the spec declares ``report.noise: pooled``; the tier of the best is Hsu's MCB (``stats``),
and every place in it is checked with each seed left out. Then each method's losses against its own lag 0, one
family of every method × lag (Holm). The design's minimum detectable differences go at the top of the report,
and ``oprl report --plan DELTA`` turns the same noise into seeds needed. Verdicts are words that never order
the members of a tier. Differences are in points (1 point = 0.01 of accuracy).

Not here: the statistics themselves (``stats``), the lag figure (``arena``), the per-cell tables (``report``).
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


def pair_sds(comparison: stats.Comparison) -> list[tuple[float, stats.Difference]]:
    """(s_d, pair) of every paired pair of a comparison with its own noise: s_d = SE · √n, the SD of the paired
    differences, largest first."""
    found = [(d.se * math.sqrt(d.n), d) for d in comparison.pairs if d.procedure == stats.PAIRED and d.se == d.se]
    return sorted(found, key=lambda x: -x[0])


def design_lines(analyses: list[Analysis]) -> list[str]:
    """The report's first section: the noise of a contrast and the smallest difference the design finds."""
    if analyses and analyses[0].noise == "pooled":
        return _pooled_design_lines(analyses)
    lines = [
        "## What these seeds can tell apart",
        "",
        "Differences between two methods in points (0.01 of accuracy), paired over seeds (same prompts, same "
        "evaluation samples), each pair with its own noise: s_d, the SD of its paired differences, SE = s_d/√n "
        "on n − 1 df. The noise differs from pair to pair (a collapsing seed makes a method's every pair noisy), "
        "so the table gives the median pair and the noisiest. 80 % power; against the best: the one-sided test "
        "at α/(k − 1) of the tier (Hsu's MCB). Formulas: `oprl.experiments.stats`.",
        "",
        "| metric | comparison | seeds | s_d of a pair: median (largest: pair) | 2 SE, median pair | "
        "MDE, one test, median pair | MDE, one test, noisiest pair | MDE against the best, median pair |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for a in analyses:
        for name, comparison in a.named:
            found = pair_sds(comparison)
            if not found:
                continue
            n = max(d.n for _, d in found)
            median = statistics.median(sd for sd, _ in found)
            (largest, pair), k = found[0], len(comparison.means)
            se = median / math.sqrt(n)
            lines.append(
                f"| {METRICS[a.metric]} | {name} | {n} | {points(median, 2)} ({points(largest, 2)}: {pair.a} − "
                f"{pair.b}) | {points(2 * se, 2)} | {points(stats.mde(se, n - 1), 2)} | "
                f"{points(stats.mde(largest / math.sqrt(n), n - 1), 2)} | "
                f"{points(stats.mde(se, n - 1, comparisons=max(1, k - 1), tails=1), 2)} ({k} methods) |"
            )
    if len(lines) == 6:  # no pair has two shared seeds: no table under the header
        lines[4:] = ["(No noise: no two methods share two seeds, so no difference can be tested; run two seeds or "
                     "more.)"]  # fmt: skip
    return lines + _missing(analyses) + [""]


def _missing(analyses: list[Analysis]) -> list[str]:
    """A sweep in progress: the cells still short of seeds, named."""
    partial = next((a for a in analyses if a.short), None)
    if partial is None:
        return []
    cells = ", ".join(f"{cell} {n} of {partial.seeds}" for cell, n in partial.short.items())
    return ["", f"Seeds still missing: {cells}. A pair is tested over the seeds both its methods have."]


def _pooled_design_lines(analyses: list[Analysis]) -> list[str]:
    """The design with the declared pooled σ̂, beside Brown–Forsythe's test of one noise level per setting."""
    lines = [
        "## What these seeds can tell apart (pooled σ̂, declared: `report.noise: pooled`)",
        "",
        "σ̂ is one run's seed-to-seed SD once the seed's effect on every method is taken out (the residual of "
        "method + seed, per setting, identical runs counted once), assumed the same for every method of a setting; "
        "Brown–Forsythe's test of that assumption is beside it (a small p: the methods' noise differs, and σ̂ "
        "understates the noise of any pair with a noisy member). Formulas: `oprl.experiments.stats`.",
        "",
        "| metric | setting | σ̂ of a run (df) | Brown–Forsythe W (p), methods | 2 SE | MDE, one test | "
        "MDE against the best |",
        "|---|---|---|---|---|---|---|",
    ]
    for a in analyses:
        for name, comparison in a.per_setting.items():
            noise = comparison.noise
            if noise is None or math.isnan(noise.sd):
                continue
            w, p, k = a.spread.get(name, (math.nan, math.nan, 0))
            se, df = stats.design_se(noise.sd, a.seeds), noise.df
            test = "—" if math.isnan(w) else f"{w:.2f} ({p:.3g}), {k}"
            lines.append(
                f"| {METRICS[a.metric]} | {name} | {points(noise.sd, 2)} ({df}) | {test} | {points(2 * se, 2)} | "
                f"{points(stats.mde(se, df), 2)} | "
                f"{points(stats.mde(se, df, comparisons=max(1, k - 1), tails=1), 2)} |"
            )
    if len(lines) == 6:
        lines[4:] = ["(No σ̂: every cell has one seed, so no difference can be tested; run two seeds or more.)"]
    return lines + _missing(analyses) + [""]


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


def plan_lines(analyses: list[Analysis], delta: float) -> list[str]:
    """``--plan DELTA``: the paired seeds that resolve a true difference Δ at 80 % power, from this sweep's pair
    noise taken as a pilot's (the median pair and the noisiest), one two-sided test and against the best."""
    lines = [
        f"Seeds to find a true difference of {points(delta)} points at 80 % power, each pair with its own noise "
        "(this sweep's as the pilot's): one two-sided test / against the best (one-sided, α/(k − 1)):"
    ]
    for a in analyses:
        for name, comparison in a.named:
            found = pair_sds(comparison)
            if not found:
                lines.append(f"  {METRICS[a.metric]}, {name}: no pair noise (one seed per cell?)")
                continue
            k = len(comparison.means)
            parts = []
            for which, sd in (("median pair", statistics.median(s for s, _ in found)), ("noisiest", found[0][0])):
                one = stats.seeds_needed(delta, sd)
                best = stats.seeds_needed(delta, sd, comparisons=max(1, k - 1), tails=1)
                parts.append(f"{which} (s_d {points(sd, 2)}) {_count(one)} / {_count(best)}")
            lines.append(f"  {METRICS[a.metric]}, {name}: " + ", ".join(parts) + f" (this sweep: {a.seeds})")
    return lines


def _count(n: int | None) -> str:
    return "> 10000" if n is None else str(n)
