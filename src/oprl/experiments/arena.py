"""The arena's view of a sweep (configs/sweeps/arena.yaml): accuracy against staleness, one curve per method.

From per-run summaries (``results.summarize``) it draws final eval accuracy and the area under the eval-accuracy
curve against the lag (categorical axis: 0, 1, 2, 4, ..., offline; mean over seeds with its 95 % t-interval), a
note on the figure naming the methods whose runs are identical at a lag (so that a method drawn exactly under
another does not look missing), and, where ``<setting>-bf16`` runs have their float32 pair, a figure and table of
the bfloat16 sampler's effect at equal staleness. ``oprl report`` adds them, and the tier tables of
``oprl.experiments.tiers``, when the sweep has at least two lags. A setting's lag is read from its name:
``lag-N`` / ``stale-N`` is N, ``on-policy`` is 0, ``offline`` comes last; other settings (``lag-4-bf16``,
``sync-20``) are left out of the curves and listed.

Not here: reading runs (``results``), the per-setting training curves (``curves``), the statistics (``stats``).
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from oprl.experiments import stats

OFFLINE = math.inf
"""The lag of ``offline``: after every finite lag."""

BF16 = "-bf16"
"""A setting named ``<setting>-bf16`` is ``<setting>`` with a bfloat16 sampler (``rollout.dtype``)."""

METRICS = {"final_accuracy": "final eval accuracy", "accuracy_auc": "eval-accuracy AUC (mean over training)"}


def lag_of(setting: str) -> float | None:
    """The lag a setting name stands for, or None if it is not a point of the lag ladder."""
    if setting in ("on-policy", "lag-0"):
        return 0.0
    if setting == "offline":
        return OFFLINE
    found = re.fullmatch(r"(?:lag|stale)-(\d+)", setting)
    return float(found.group(1)) if found else None


def lag_label(lag: float) -> str:
    return "offline" if lag == OFFLINE else str(int(lag))


def by_method_and_lag(summaries, metric: str) -> dict[str, dict[float, list[float]]]:
    """``{preset: {lag: [metric per seed]}}`` from ``(labels, numbers)`` pairs; NaN values are dropped."""
    table: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for labels, numbers in summaries:
        lag = lag_of(labels["setting"])
        value = numbers.get(metric, math.nan)
        if lag is not None and not math.isnan(value):
            table[labels["preset"]][lag].append(value)
    return {preset: dict(lags) for preset, lags in table.items()}


def other_settings(summaries) -> list[str]:
    """The settings of the runs that are not on the lag ladder (sorted)."""
    return sorted({labels["setting"] for labels, _ in summaries if lag_of(labels["setting"]) is None})


def identical_at_lags(summaries) -> dict[float, list[list[str]]]:
    """``{lag: [[preset, ...], ...]}``: methods whose runs at that lag are identical as far as the summaries tell
    (every metric of ``METRICS`` equal at every seed; on-policy with an exact sampler ρ ≡ 1, so a clip never fires
    and REC-OneSide-NoIS is REINFORCE run for run)."""
    per: dict[float, dict[str, dict[str, tuple]]] = defaultdict(lambda: defaultdict(dict))
    for labels, numbers in summaries:
        lag = lag_of(labels["setting"])
        if lag is not None:
            per[lag][labels["preset"]][labels["seed"]] = tuple(numbers.get(m, math.nan) for m in METRICS)
    out = {}
    for lag, methods in sorted(per.items()):
        runs = {m: {s: repr(v) for s, v in seeds.items()} for m, seeds in methods.items()}
        groups = stats.identical_groups(runs, sorted(runs))
        if groups:
            out[lag] = groups
    return out


def plot_lag_curves(summaries, out: Path) -> Path | None:
    """Final accuracy and AUC against the lag, one curve per method (mean over seeds, 95 % t-interval bars);
    identical runs are named under the panels and drawn with a hollow marker on top of their twin."""
    tables = {metric: by_method_and_lag(summaries, metric) for metric in METRICS}
    lags = sorted({lag for table in tables.values() for per_lag in table.values() for lag in per_lag})
    if not any(len(per_lag) >= 2 for table in tables.values() for per_lag in table.values()):
        return None  # no method seen at two lags (the distillation sweep's rows are each at one): no curve to draw
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    identical = identical_at_lags(summaries)
    copies = {(lag, m) for lag, groups in identical.items() for group in groups for m in group[1:]}
    presets = sorted({p for table in tables.values() for p in table})
    palette = plt.cm.tab10 if len(presets) <= 10 else plt.cm.tab20
    fig, axes = plt.subplots(1, len(METRICS), figsize=(6.5 * len(METRICS), 4.8), squeeze=False)
    position = {lag: i for i, lag in enumerate(lags)}
    for axis, (metric, title) in zip(axes[0], METRICS.items(), strict=True):
        for index, preset in enumerate(presets):
            per_lag = tables[metric].get(preset, {})
            points = sorted(per_lag)
            if not points:
                continue
            cells = [stats.describe(per_lag[lag]) for lag in points]
            xs = [position[lag] for lag in points]
            mean = [c.mean for c in cells]
            half = [0.0 if math.isnan(c.sd) else c.high - c.mean for c in cells]  # one seed: no interval
            style = "--" if index >= 10 and len(presets) > 10 else "-"
            color = palette(index % palette.N)
            axis.errorbar(xs, mean, yerr=half, label=preset, color=color, marker="o", markersize=3,
                          linestyle=style, capsize=2, linewidth=1.2)  # fmt: skip
            twins = [(x, m) for x, m, lag in zip(xs, mean, points, strict=True) if (lag, preset) in copies]
            if twins:  # a run identical to another method's: a ring around the point it hides under
                axis.scatter(*zip(*twins, strict=True), s=60, facecolors="none", edgecolors=[color], linewidths=1.0)
        axis.set_xticks(range(len(lags)), [lag_label(lag) for lag in lags])
        axis.set_xlabel("lag (policy versions between sampling and training)")
        axis.set_ylabel(title)
        axis.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.suptitle("Accuracy against staleness (mean over seeds, 95 % t-interval of the mean)")
    if identical:
        note = "Identical runs (equal in every seed; ringed points lie under their twin): " + "; ".join(
            f"lag {lag_label(lag)}: " + ", ".join(" = ".join(group) for group in groups)
            for lag, groups in identical.items()
        )
        fig.text(0.01, -0.02, note, fontsize=7, ha="left", va="top", wrap=True)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


def mismatch_pairs(
    summaries, metric: str = "final_accuracy"
) -> dict[str, dict[str, tuple[float, float, stats.Difference]]]:
    """``{preset: {setting: (mean with a float32 sampler, mean with bfloat16, bfloat16 − float32)}}`` for each
    ``<setting>-bf16`` run setting whose ``<setting>`` also ran (the sampler-trainer mismatch axis at equal
    staleness); the difference is paired over seeds with the two cells' pooled sample SD."""
    values: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for labels, numbers in summaries:
        if not math.isnan(numbers.get(metric, math.nan)):
            values[(labels["preset"], labels["setting"])][labels["seed"]] = numbers[metric]
    pairs: dict[str, dict[str, tuple[float, float, stats.Difference]]] = defaultdict(dict)
    for (preset, setting), bf16 in values.items():
        base = setting.removesuffix(BF16)
        if setting.endswith(BF16) and (preset, base) in values:
            float32 = values[(preset, base)]
            noise = stats.PooledSigma(*stats.pooled_sd([list(float32.values()), list(bf16.values())]))
            change = stats.difference(bf16, float32, noise, ("bfloat16", "float32"))
            pairs[preset][base] = (statistics.mean(float32.values()), statistics.mean(bf16.values()), change)
    return dict(pairs)


def plot_mismatch(summaries, out: Path) -> Path | None:
    """Final accuracy with a bfloat16 sampler minus with float32, per method, one bar per paired setting."""
    pairs = mismatch_pairs(summaries)
    settings = sorted({s for per in pairs.values() for s in per}, key=lambda s: (lag_of(s) or 0.0, s))
    if not settings:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    presets = sorted(pairs)
    width = 0.8 / len(settings)
    fig, axis = plt.subplots(figsize=(max(6.0, 0.5 * len(presets) + 2), 4.2))
    for index, setting in enumerate(settings):
        changes = [pairs[p][setting][2] if setting in pairs[p] else None for p in presets]
        deltas = [c.mean if c is not None else math.nan for c in changes]
        half = [c.half_width if c is not None and not math.isnan(c.half_width) else 0.0 for c in changes]
        axis.bar([i + index * width for i in range(len(presets))], deltas, width, yerr=half, capsize=2,
                 error_kw={"linewidth": 0.8}, label=setting)  # fmt: skip
    axis.axhline(0, color="black", linewidth=0.8)
    axis.set_xticks([i + width * (len(settings) - 1) / 2 for i in range(len(presets))], presets, rotation=60,
                    ha="right", fontsize=8)  # fmt: skip
    axis.set_ylabel("final accuracy: bfloat16 − float32 sampler")
    axis.legend(fontsize=8)
    axis.set_title("bfloat16 sampler at equal staleness (paired over seeds, 95 % interval)", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def arena_section(summaries, figures_dir: Path, tables: Sequence[str] = ()) -> list[str]:
    """The report's "Accuracy against lag" lines (empty unless some method ran at two lags or more): the figure,
    ``tables`` (the caller's: the tiers), the identical runs in words, the bfloat16 mismatch figure and table where
    ``<setting>-bf16`` runs have their float32 pair."""
    figure = plot_lag_curves(summaries, figures_dir / "arena-lag.png")
    if figure is None:
        return []
    lines = ["## Accuracy against lag", "", f"![accuracy against lag](figures/{figure.name})", "", *tables]
    identical = identical_at_lags(summaries)
    if identical:
        lines += [
            "Identical runs (every seed's final accuracy and AUC equal; drawn under each other in the figure): "
            + "; ".join(
                f"lag {lag_label(lag)}: " + ", ".join(" = ".join(group) for group in groups)
                for lag, groups in identical.items()
            )
            + ".",
            "",
        ]
    others = other_settings(summaries)
    if others:
        lines += [f"Settings not on the lag ladder (not in the tiers by lag): {', '.join(others)}.", ""]
    mismatch = plot_mismatch(summaries, figures_dir / "arena-mismatch.png")
    if mismatch is not None:
        pairs = mismatch_pairs(summaries)
        settings = sorted({s for per in pairs.values() for s in per}, key=lambda s: (lag_of(s) or 0.0, s))
        lines += ["## The bfloat16 sampler at equal staleness", "", f"![mismatch](figures/{mismatch.name})", "",
                  "Final accuracy, float32 → bfloat16 sampler (difference ± 95 % half-width, paired over seeds, "
                  "the two cells' pooled sample SD; not corrected for the number of methods):", "",
                  "| method | " + " | ".join(f"{s}: float32 → bfloat16" for s in settings) + " |",
                  "|---|" + "---|" * len(settings)]  # fmt: skip
        for preset in sorted(pairs):
            cells = []
            for setting in settings:
                if setting not in pairs[preset]:
                    cells.append("—")
                    continue
                a, b, change = pairs[preset][setting]
                spread = "" if math.isnan(change.half_width) else f" ± {change.half_width:.3f}"
                cells.append(f"{a:.3f} → {b:.3f} ({change.mean:+.3f}{spread})")
            lines.append(f"| {preset} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines
