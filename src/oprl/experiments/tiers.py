"""The statistical sections of ``oprl report``: what a sweep's seeds can and cannot tell apart, in tables and words.

From per-run summaries (``(labels, numbers)`` pairs, ``results.summarize`` or a results.csv) and the pure
statistics of ``oprl.experiments.stats``: for each metric where higher is better (final eval accuracy, its AUC),
one comparison per setting (the methods at that lag, paired over seeds) and, with two or more settings on the lag
ladder, one pooled over them (the methods run at every lag of it, paired over seeds × lags, each lag weighing the
same). Each gives the tier not separable from the best and the methods below it, by how much; the design's minimum
detectable difference goes at the top of the report, and ``oprl report --plan DELTA`` turns the same noise into
seeds needed. Verdicts are words that never order the members of a tier. Differences are in points (1 point = 0.01
of accuracy).

Not here: the statistics themselves (``stats``), the lag figure (``arena``), the per-cell tables (``report``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable
from dataclasses import dataclass

from oprl.experiments import stats
from oprl.experiments.arena import lag_label, lag_of
from oprl.experiments.curves import _setting_rank

METRICS = {"final_accuracy": "final eval accuracy", "accuracy_auc": "eval-accuracy AUC (mean accuracy over training)"}
"""The metrics compared (higher is better, accuracies: differences in points)."""

LAYOUT = ("preset", "setting", "seed")
"""Labels a table lays out itself (rows, columns, the spread over seeds); any other sweep axis joins the row."""


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
    ladder: list[str]
    """The settings pooled over, in lag order."""
    noise: stats.Noise
    """σ̂ of one run, pooled over every setting."""
    methods: int
    seeds: int
    """Seeds per cell (the most common count)."""
    short: dict[str, int]
    """Cells with fewer seeds than ``seeds`` (a sweep in progress): ``{"m2po (lag-4)": 1}``."""

    @property
    def pairs(self) -> int:
        return self.methods * (self.methods - 1) // 2


def values_by_setting(summaries, metric: str) -> dict[str, dict[str, dict[Hashable, float]]]:
    """``{setting: {method: {seed: value}}}``, NaN values dropped, settings in schedule order."""
    table: dict[str, dict[str, dict[Hashable, float]]] = defaultdict(lambda: defaultdict(dict))
    for labels, numbers in summaries:
        value = float(numbers.get(metric, math.nan))
        if not math.isnan(value):
            table[labels["setting"]][row_label(labels)][labels["seed"]] = value
    return {s: dict(table[s]) for s in sorted(table, key=_setting_rank)}


def analyse(summaries, metric: str) -> Analysis:
    by_setting = values_by_setting(summaries, metric)
    per_setting = {setting: stats.compare(values) for setting, values in by_setting.items()}
    ladder = sorted((s for s in by_setting if lag_of(s) is not None), key=lambda s: lag_of(s) or 0.0)
    everything, strata = _stack(by_setting, list(by_setting))
    # Pooled over the ladder: the methods run at every lag of it. A method at one lag only (the stale arena's
    # lag-0 anchor is GRPO alone) would set its single lag's mean beside the others' means over every lag.
    everywhere = [m for m in by_setting[ladder[0]] if all(m in by_setting[s] for s in ladder)] if ladder else []
    pooled = None
    if len(ladder) >= 2 and len(everywhere) >= 2:
        on_ladder = {s: {m: by_setting[s][m] for m in everywhere} for s in ladder}
        pooled = stats.compare(*_stack(on_ladder, ladder))
    counts = [len(per) for values in by_setting.values() for per in values.values()]
    seeds = max(set(counts), key=counts.count) if counts else 0
    methods = len({m for values in by_setting.values() for m in values})
    short = {
        f"{m} ({s})": len(per) for s, values in by_setting.items() for m, per in values.items() if len(per) < seeds
    }
    noise = stats.residual_noise(everything, strata)
    return Analysis(metric, per_setting, pooled, ladder, noise, methods, seeds, short)


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


def design_lines(analyses: list[Analysis]) -> list[str]:
    """The report's first section: the noise, and the smallest difference the design finds (2 SE, 80 % power)."""
    lines = [
        "## What these seeds can tell apart",
        "",
        "Differences between two methods in points (0.01 of accuracy), paired over seeds (same prompts, same "
        "evaluation samples); σ̂ is one run's seed-to-seed SD once the seed's effect on every method is taken "
        "out (the residual of method + seed, per setting, identical runs counted once); 80 % power with Holm over "
        "every pair of methods is its worst case (a single true difference among them). Formulas: "
        "`oprl.experiments.stats`.",
        "",
        "| metric | σ̂ of a run (df) | comparison | pairs of runs | 2 SE | MDE, 80 % power, one test | "
        "MDE, 80 % power, Holm over the pairs |",
        "|---|---|---|---|---|---|---|",
    ]
    for a in analyses:
        if math.isnan(a.noise.sd):
            continue
        designs = [(f"one setting, {a.methods} methods", 1)]
        if a.pooled is not None:
            designs.append((f"pooled over {len(a.ladder)} lags", len(a.ladder)))
        for name, strata in designs:
            se = stats.design_se(a.noise.sd, a.seeds, strata)
            df = stats.design_df(a.methods, a.seeds, strata)
            lines.append(
                f"| {METRICS[a.metric]} | {points(a.noise.sd, 2)} ({a.noise.df}) | {name} | {a.seeds * strata} | "
                f"{points(2 * se, 2)} | {points(stats.mde(se, df), 2)} | "
                f"{points(stats.mde(se, df, comparisons=a.pairs), 2)} ({a.pairs} pairs) |"
            )
    if len(lines) == 6:  # no metric has a noise estimate: no table under the header
        lines[4:] = ["(No σ̂: every cell has one seed, so no difference can be tested; run two seeds or more.)"]
    elif partial := next((a for a in analyses if a.short), None):
        # A sweep in progress: the rows are the finished design's; σ̂ is from the runs there are, and a method
        # still missing seeds is left out of it when that leaves more degrees of freedom (stats.residual_noise).
        cells = ", ".join(f"{cell} {n} of {partial.seeds}" for cell, n in partial.short.items())
        lines += [
            "",
            f"Seeds still missing: {cells}. The MDEs are the design's once every cell has its seeds; "
            "σ̂ and its df are from the runs finished (a cell short of seeds is left out of σ̂ when the cells "
            "with every seed give more degrees of freedom).",
        ]
    return [*lines, ""]


def verdict_lines(analysis: Analysis) -> list[str]:
    """A line per setting and one pooled over the lags: the tier (unordered), the methods below it and by how
    much (d̄ ± the 95 % half-width, points; Holm's p̃), the identical runs."""
    legend = (
        "Tied = not separable from the best at α = 0.05 after Holm over every pair (listed by name: not ranked); "
        "below = separable, by d̄ ± the 95 % half-width in points."
    )
    if analysis.pooled is not None:  # said only where a pooled line follows
        legend += " Pooled: the mean over the lags, each lag weighing the same."
    lines = [f"### Verdicts: {METRICS[analysis.metric]}", "", legend, ""]
    named = [(setting, c) for setting, c in analysis.per_setting.items()]
    if analysis.pooled is not None:
        named.append((f"pooled over {', '.join(analysis.ladder)}", analysis.pooled))
    for name, comparison in named:
        lines.append(f"- **{name}**: {verdict(comparison)}")
    return [*lines, ""]


def verdict(comparison: stats.Comparison) -> str:
    if not comparison.means:
        return "no runs."
    if not comparison.noise.df:
        values = list(comparison.means.values())
        return (f"{len(values)} method(s), means {min(values):.3f}-{max(values):.3f}: no noise estimate (one seed, or "
                "no seed shared by two methods), so nothing can be told apart.")  # fmt: skip
    tier = comparison.tier
    span = [comparison.means[m] for m in tier]
    spread = f"means {min(span):.3f}-{max(span):.3f}" if len(tier) > 1 else f"mean {span[0]:.3f}"
    if not comparison.below:
        head = f"all {len(tier)} tied ({spread}): nothing separable" if len(tier) > 1 else f"{tier[0]} alone ({spread})"
    else:
        head = f"{', '.join(tier)} tied best ({spread})" if len(tier) > 1 else f"{tier[0]} best ({spread})"
        head += "; below: " + ", ".join(
            f"{d.b} {points(d.mean)} ± {points(d.half_width)} ({p_text(d.p_holm)})" for d in comparison.below
        )
    if comparison.identical:
        head += "; identical runs: " + "; ".join(" = ".join(group) for group in comparison.identical)
    return head + "."


def tier_table(analysis: Analysis) -> list[str]:
    """Markdown: a row per method (by name), per lag its mean, **bold** in the tier of the best, else its
    distance below the best in points; the pooled column last."""
    columns = [(lag_label(lag_of(s) or 0.0), analysis.per_setting[s]) for s in analysis.ladder]
    if analysis.pooled is not None:
        columns.append(("pooled", analysis.pooled))
    methods = sorted({m for _, c in columns for m in c.means})
    names = [name if name in ("offline", "pooled") else f"lag {name}" for name, _ in columns]
    rows = ["| method | " + " | ".join(names) + " |", "|---|" + "---|" * len(columns)]
    for method in methods:
        cells = []
        for _, comparison in columns:
            if method not in comparison.means:
                cells.append("—")
            elif method in comparison.tier:
                cells.append(f"**{comparison.means[method]:.3f}**")
            else:
                below = next(d for d in comparison.below if d.b == method)
                cells.append(f"{comparison.means[method]:.3f} (−{points(below.mean)})")
        rows.append(f"| {method} | " + " | ".join(cells) + " |")
    return rows


def significant_losses(summaries, metric: str = "final_accuracy") -> dict[str, tuple[float, stats.Difference] | None]:
    """Per method, the first lag whose mean is significantly below the method's own lag 0 (paired over seeds,
    Holm over the method's lags, σ̂ the method's own cells' pooled sample SD: seeds are not a shared block
    across lags), with the difference lag 0 − lag; None where no lag is, or there is no lag 0."""
    by_method: dict[str, dict[float, dict[Hashable, float]]] = defaultdict(lambda: defaultdict(dict))
    for labels, numbers in summaries:
        lag, value = lag_of(labels["setting"]), float(numbers.get(metric, math.nan))
        if lag is not None and not math.isnan(value):
            by_method[row_label(labels)][lag][labels["seed"]] = value
    out: dict[str, tuple[float, stats.Difference] | None] = {}
    for method, lags in sorted(by_method.items()):
        out[method] = None
        if 0.0 not in lags or len(lags) < 2:
            continue
        noise = stats.Noise(*stats.pooled_sd([list(v.values()) for v in lags.values()]))
        later = sorted(lag for lag in lags if lag > 0)
        losses = [stats.difference(lags[0.0], lags[lag], noise, ("lag 0", lag_label(lag))) for lag in later]
        for lag, loss, adjusted in zip(later, losses, stats.holm([d.p for d in losses]), strict=True):
            if adjusted < stats.ALPHA and loss.mean > 0:
                loss.p_holm = adjusted
                out[method] = (lag, loss)
                break
    return out


def _at(lag: str) -> str:
    return lag if lag == "offline" else f"lag {lag}"


def loss_lines(summaries) -> list[str]:
    seeds: dict[tuple[str, str], int] = defaultdict(int)
    for labels, _ in summaries:
        seeds[(row_label(labels), labels["setting"])] += 1
    if max(seeds.values(), default=0) < 2:
        return ["A loss against a method's own lag 0 cannot be tested with one seed per cell.", ""]
    losses = significant_losses(summaries)
    if not any(lags for lags in losses.values()):
        return ["No method's final accuracy is significantly below its own lag 0 at any lag (Holm over its lags).", ""]
    parts = [
        f"{method} {_at(lag_label(found[0]))} (−{points(found[1].mean)} ± {points(found[1].half_width)}, "
        f"{p_text(found[1].p_holm)})"
        for method, found in losses.items()
        if found is not None
    ]
    held = [method for method, found in losses.items() if found is None]
    return [
        "**First lag with a significant loss of final accuracy against the method's own lag 0** (paired over "
        "seeds, the method's own pooled sample SD, Holm over its lags): " + "; ".join(parts) + ". "
        f"None at any lag: {', '.join(held) or 'no method'}.",
        "",
    ]


def pair_rows(analyses: list[Analysis]) -> list[dict]:
    """Every pairwise difference of every comparison, for ``stats.csv``."""
    rows = []
    for a in analyses:
        named = list(a.per_setting.items()) + ([("pooled", a.pooled)] if a.pooled is not None else [])
        for name, comparison in named:
            for d in comparison.pairs:
                numbers = {"mean_a_minus_b": d.mean, "se": d.se, "low": d.low, "high": d.high, "p": d.p,
                           "p_holm": d.p_holm}  # fmt: skip
                rows.append({"metric": a.metric, "comparison": name, "a": d.a, "b": d.b, "n": d.n, "df": d.df,
                             **{k: float(f"{v:.6g}") for k, v in numbers.items()},  # a readable file, diffable
                             "a_in_tier": d.a in comparison.tier, "b_in_tier": d.b in comparison.tier})  # fmt: skip
    return rows


def plan_lines(analyses: list[Analysis], delta: float) -> list[str]:
    """``--plan DELTA``: the seeds per cell that resolve a true difference Δ at 80 % power (Holm over the pairs),
    from this sweep's σ̂ taken as a pilot's, per setting and pooled over its lags."""
    lines = [f"Seeds per cell to find a true difference of {points(delta)} points at 80 % power (Holm over every "
             "pair of methods), with this sweep's σ̂ as the pilot's:"]  # fmt: skip
    for a in analyses:
        if math.isnan(a.noise.sd):
            lines.append(f"  {METRICS[a.metric]}: no σ̂ (one seed per cell?)")
            continue
        parts = []
        for name, strata in [("at one setting", 1)] + ([(f"pooled over {len(a.ladder)} lags", len(a.ladder))]
                                                        if a.pooled is not None else []):  # fmt: skip
            need = stats.seeds_needed(delta, a.noise.sd, a.methods, strata)
            parts.append(f"{name} {need if need is not None else '> 10000'}")
        lines.append(
            f"  {METRICS[a.metric]} (σ̂ {points(a.noise.sd, 2)} points, {a.methods} methods, {a.pairs} pairs): "
            + ", ".join(parts)
            + f" (this sweep: {a.seeds})"
        )
    return lines
