"""The arena's view of a sweep (configs/sweeps/arena.yaml): accuracy against staleness, one curve per method.

From per-run summaries (``results.summarize``) it draws final eval accuracy and the area under the eval-accuracy
curve against the lag (categorical axis: 0, 1, 2, 4, ..., offline; mean over seeds with a min-max bar), and
writes a markdown table ranking the methods at each lag, with the first lag at which each method loses more
than ``LOSS_POINTS`` against its own lag-0 accuracy; where ``<setting>-bf16`` runs have their float32 pair, a
figure and table of the bfloat16 sampler's effect at equal staleness. ``oprl report`` adds them when the sweep
has at least two lags. A setting's lag is read from its name: ``lag-N`` / ``stale-N`` is N, ``on-policy`` is 0,
``offline`` comes last; other settings (``lag-4-bf16``, ``sync-20``) are left out of the curves and listed.

Not here: reading runs (``results``), the per-setting training curves (``curves``).
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from pathlib import Path

OFFLINE = math.inf
"""The lag of ``offline``: after every finite lag."""

LOSS_POINTS = 0.05
"""A method "loses" at the first lag where its mean final accuracy is this far below its own lag-0 mean."""

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


def first_losing_lag(lags: dict[float, list[float]], points: float = LOSS_POINTS) -> float | None:
    """The smallest lag whose mean is more than ``points`` below the lag-0 mean (None: never, or no lag 0)."""
    if 0.0 not in lags:
        return None
    base = statistics.mean(lags[0.0])
    return next((lag for lag in sorted(lags) if lag > 0 and statistics.mean(lags[lag]) < base - points), None)


def ranked_table(summaries, metric: str = "final_accuracy") -> list[str]:
    """Markdown rows: a method per row (ordered by mean rank over the lags), per lag its mean and its rank there
    (1 = best; ties share a rank), then the first lag losing more than ``LOSS_POINTS`` of final accuracy
    against its lag 0."""
    table = by_method_and_lag(summaries, metric)
    losing = by_method_and_lag(summaries, "final_accuracy")
    lags = sorted({lag for per_lag in table.values() for lag in per_lag})
    means = {(p, lag): statistics.mean(v) for p, per_lag in table.items() for lag, v in per_lag.items()}
    ranks: dict[tuple[str, float], int] = {}
    for lag in lags:  # competition ranking: equal means share a rank (1, 1, 3)
        at_lag = [means[(p, lag)] for p in table if (p, lag) in means]
        ranks |= {(p, lag): 1 + sum(m > means[(p, lag)] for m in at_lag) for p in table if (p, lag) in means}
    order = sorted(table, key=lambda p: (statistics.mean(r for (q, _), r in ranks.items() if q == p), p))
    header = "| method | " + " | ".join(f"lag {lag_label(lag)}" for lag in lags) + f" | loses > {LOSS_POINTS:g} at |"
    rows = [header, "|---|" + "---|" * (len(lags) + 1)]
    for preset in order:
        cells = [f"{means[(preset, lag)]:.3f} (#{ranks[(preset, lag)]})" if (preset, lag) in means else "—"
                 for lag in lags]  # fmt: skip
        lost = first_losing_lag(losing.get(preset, {}))
        rows.append(f"| {preset} | " + " | ".join(cells) + f" | {'—' if lost is None else lag_label(lost)} |")
    return rows


def plot_lag_curves(summaries, out: Path) -> Path | None:
    """Final accuracy and AUC against the lag, one curve per method (mean over seeds, min-max bars)."""
    tables = {metric: by_method_and_lag(summaries, metric) for metric in METRICS}
    lags = sorted({lag for table in tables.values() for per_lag in table.values() for lag in per_lag})
    if not any(len(per_lag) >= 2 for table in tables.values() for per_lag in table.values()):
        return None  # no method seen at two lags (the distillation sweep's rows are each at one): no curve to draw
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
            xs = [position[lag] for lag in points]
            mean = [statistics.mean(per_lag[lag]) for lag in points]
            low = [m - min(per_lag[lag]) for m, lag in zip(mean, points, strict=True)]
            high = [max(per_lag[lag]) - m for m, lag in zip(mean, points, strict=True)]
            style = "--" if index >= 10 and len(presets) > 10 else "-"
            axis.errorbar(xs, mean, yerr=[low, high], label=preset, color=palette(index % palette.N), marker="o",
                          markersize=3, linestyle=style, capsize=2, linewidth=1.2)  # fmt: skip
        axis.set_xticks(range(len(lags)), [lag_label(lag) for lag in lags])
        axis.set_xlabel("lag (policy versions between sampling and training)")
        axis.set_ylabel(title)
        axis.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.suptitle("Accuracy against staleness (mean over seeds, min-max bars)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


def mismatch_pairs(summaries, metric: str = "final_accuracy") -> dict[str, dict[str, tuple[float, float]]]:
    """``{preset: {setting: (mean with a float32 sampler, mean with bfloat16)}}`` for each ``<setting>-bf16``
    run setting whose ``<setting>`` also ran (the sampler-trainer mismatch axis at equal staleness)."""
    values: dict[tuple[str, str], list[float]] = defaultdict(list)
    for labels, numbers in summaries:
        if not math.isnan(numbers.get(metric, math.nan)):
            values[(labels["preset"], labels["setting"])].append(numbers[metric])
    pairs: dict[str, dict[str, tuple[float, float]]] = defaultdict(dict)
    for (preset, setting), bf16 in values.items():
        base = setting.removesuffix(BF16)
        if setting.endswith(BF16) and (preset, base) in values:
            pairs[preset][base] = (statistics.mean(values[(preset, base)]), statistics.mean(bf16))
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
        deltas = [pairs[p][setting][1] - pairs[p][setting][0] if setting in pairs[p] else math.nan for p in presets]
        axis.bar([i + index * width for i in range(len(presets))], deltas, width, label=setting)
    axis.axhline(0, color="black", linewidth=0.8)
    axis.set_xticks([i + width * (len(settings) - 1) / 2 for i in range(len(presets))], presets, rotation=60,
                    ha="right", fontsize=8)  # fmt: skip
    axis.set_ylabel("final accuracy: bfloat16 − float32 sampler")
    axis.legend(fontsize=8)
    axis.set_title("bfloat16 sampler at equal staleness (means over seeds)", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def arena_section(summaries, figures_dir: Path) -> list[str]:
    """The report's "Accuracy against lag" lines (empty unless some method ran at two lags or more), the bfloat16
    mismatch figure and table where ``<setting>-bf16`` runs have their float32 pair."""
    figure = plot_lag_curves(summaries, figures_dir / "arena-lag.png")
    if figure is None:
        return []
    lines = ["## Accuracy against lag", "", f"![accuracy against lag](figures/{figure.name})", ""]
    for metric, title in METRICS.items():
        lines += [f"Ranked at each lag: {title} (mean over seeds, #rank):", "", *ranked_table(summaries, metric), ""]
    others = other_settings(summaries)
    if others:
        lines += [f"Settings not on the lag ladder (in the tables above only): {', '.join(others)}.", ""]
    mismatch = plot_mismatch(summaries, figures_dir / "arena-mismatch.png")
    if mismatch is not None:
        pairs = mismatch_pairs(summaries)
        settings = sorted({s for per in pairs.values() for s in per}, key=lambda s: (lag_of(s) or 0.0, s))
        lines += ["## The bfloat16 sampler at equal staleness", "", f"![mismatch](figures/{mismatch.name})", "",
                  "| method | " + " | ".join(f"{s}: float32 → bfloat16" for s in settings) + " |",
                  "|---|" + "---|" * len(settings)]  # fmt: skip
        for preset in sorted(pairs):
            cells = [f"{a:.3f} → {b:.3f} ({b - a:+.3f})" if s in pairs[preset] else "—"
                     for s in settings for a, b in [pairs[preset].get(s, (math.nan, math.nan))]]  # fmt: skip
            lines.append(f"| {preset} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines
