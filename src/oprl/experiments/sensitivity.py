"""What a sweep's seeds can tell apart: the report's first section, and ``oprl report --plan DELTA``'s seeds.

From a sweep's ``tiers.Analysis`` (its comparisons, each pair with its own noise or the declared pooled σ̂): per
comparison the noise of a pair (s_d, the SD of its paired differences: the median pair and the noisiest), 2 SE,
and the minimum detectable difference at 80 % power (``stats.design``) for one test and against the best (the
tier's one-sided test at α/(k − 1)); under ``report.noise: pooled`` σ̂ per setting beside Brown–Forsythe's test of
one noise level. ``plan_lines`` turns the same noise, taken as a pilot's, into the paired seeds a true difference
Δ needs. Differences are in points (1 point = 0.01 of accuracy).

Not here: the verdicts and tiers (``tiers``), the formulas (``stats``).
"""

from __future__ import annotations

import math
import statistics

from oprl.experiments import stats
from oprl.experiments.tiers import METRICS, Analysis, points


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
