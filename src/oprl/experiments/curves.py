"""Paper-style figures from run records: one panel per off-policy setting, one curve per configuration.
The setting is the sweep's label, else ``results.setting_of`` (async runs get panels of their own, ``async, lag <= S``).

Runs are averaged only when their configs differ in nothing but the seed (``curve_groups``): such a group is
one curve, the mean over its seeds with a min-max band; every other run is its own curve over its own steps.
A curve equal to another of its panel (every seed's points equal) is drawn dashed on top and named in the panel as a
coinciding curve: two curves are two configs, so equal points of one metric do not make them identical runs.
Distillation runs are labelled by what they optimise (``results.objective_of``) and get a reverse-KL figure.
A curve is labelled by its preset and the settings that tell it apart from the other curves of its panel
(``lr=0.001``, ``k=4``, ``group=16``, ...). A moving average is stated in the y label. ``oprl plot RUN_DIRS...``
draws them for any set of runs; ``oprl report`` for a sweep.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from oprl.config import read_saved
from oprl.experiments.results import RunRecord, load_run, objective_of

PANELS = {
    "eval_accuracy": ("eval/accuracy", "eval accuracy (pass@1)"),
    "train_reward": ("reward/mean", "training reward"),
    "clip_fraction": ("loss/clip_frac", "clip fraction"),
    "kl": ("kl/behavior_k3", "KL(π_θ ‖ π_behaviour), k3"),
    "kl_initial": ("kl/ref", "KL to the initial policy"),
    # The importance weights' effective sample size (docs/metrics.md#the-ess-warning-what-it-catches-and-when):
    # 1 on-policy, its fall the early sign of a collapse.
    "ess": ("rho/ess", "ESS of ρ, token level (1 = on-policy)"),
    "ess_seq": ("rho/ess_seq", "ESS of ρ, sequence level"),
    "entropy": ("entropy/mean", "entropy per token"),
    "response_length": ("response/length_mean", "response length (tokens)"),
    # Distillation's own signal (docs/algorithms.md#distillation): drawn for the runs that log it, beside the reward.
    "distill_reverse_kl": ("distill/reverse_kl", "reverse KL to the teacher (per token)"),
}
SETTING_ORDER = ["on-policy", "lag", "stale", "infrequent", "sync", "async", "offline"]
NOT_A_SETTING = ("seed", "run_name", "output_dir", "resume", "overwrite", "progress", "tensorboard")
"""Config keys (and key prefixes below) that name, place or display a run without changing what it computes."""
NOT_A_SETTING_PREFIXES = ("tracking.", "logging.", "checkpoint.", "eval.checkpoint", "runtime.max_restarts",
                          "runtime.restart_window")  # fmt: skip
# Healing after a dead worker changes no number (docs/runtime.md#self-healing-runs): runs of before and after those
# settings existed are one curve.
SHORT_NAMES = {
    "optim.lr": "lr",
    "sync.interval": "k",
    "sync.offset": "m",
    "sync.mode": "sync",
    "rollout.group_size": "group",
    "rollout.prompts_per_step": "prompts",
    "rollout.engine": "engine",
    "rollout.max_new_tokens": "max_new_tokens",
    "model.path": "model",
    "model.dtype": "dtype",
    "task.name": "task",
    "replay.groups_per_step": "replay",
}


def _setting_rank(name: str) -> tuple[int, tuple[int, ...], str]:
    """Settings in schedule order, numbers compared as numbers: lag-0, lag-0-bf16, lag-1, ..., lag-64, offline."""
    rank = next((i for i, prefix in enumerate(SETTING_ORDER) if name.startswith(prefix)), len(SETTING_ORDER))
    return rank, tuple(int(n) for n in re.findall(r"\d+", name)), name


def setting_title(setting: str) -> str:
    """A panel's title: the setting's name, an async one's spelled out (``async-8`` -> ``async, lag <= 8``)."""
    bound = re.fullmatch(r"async-(\d+)", setting)
    return f"async, lag <= {bound.group(1)}" if bound else setting


def flat_settings(config: dict, prefix: str = "") -> dict[str, Any]:
    """The config as dotted keys, without the keys that do not change a run's numbers (``NOT_A_SETTING``); a saved
    config is first read as today's loader reads it (``oprl.config.read_saved``: keys added since get their
    defaults), so runs of an older tree join their method's curve instead of one of their own."""
    out: dict[str, Any] = {}
    for key, value in (config if prefix else read_saved(config)).items():
        dotted = f"{prefix}{key}"
        if dotted in NOT_A_SETTING or dotted.startswith(NOT_A_SETTING_PREFIXES):
            continue
        if isinstance(value, dict):
            out |= flat_settings(value, f"{dotted}.")
        else:
            out[dotted] = value
    return out


class Curve:
    """Runs whose configs differ only in the seed: one line (their mean) and, for two or more, a band."""

    def __init__(self, records: list[RunRecord]):
        self.records = records
        self.settings = flat_settings(records[0].config)
        self.label = ""

    @property
    def seeds(self) -> list[Any]:
        return [r.config.get("seed") for r in self.records]


def curve_groups(records: list[RunRecord]) -> list[Curve]:
    """Records grouped by everything in their config but the seed, in first-seen order."""
    groups: dict[str, list[RunRecord]] = {}
    for record in records:
        key = repr(sorted(flat_settings(record.config).items()))
        groups.setdefault(key, []).append(record)
    return [Curve(members) for members in groups.values()]


def label_curves(curves: list[Curve]) -> dict[str, str]:
    """``curve.label``: what the run optimises (``results.objective_of``: the preset, or its distillation), then the
    settings whose values differ between ``curves`` (algorithm keys
    only among runs of the same preset, whose other values the preset explains; a section's other keys only
    among runs of the same ``<section>.name``, which explains them: a dataset task's ``train_file`` is not
    set apart from the arithmetic task's ``digits``), each under its shortest unambiguous name
    (``short_names``), then the seed of a single-seed curve when the curves' seeds differ, or the number of
    seeds averaged. Returns the short names used, to their full keys (the legend spells them out)."""
    keys = sorted({k for c in curves for k in c.settings})
    differing = [k for k in keys if len({repr(c.settings.get(k)) for c in curves}) > 1]
    if len({c.settings.get("algorithm.preset") for c in curves}) > 1:
        differing = [k for k in differing if not k.startswith("algorithm.")]
    differing = [k for k in differing if k != "algorithm.preset"]
    named = [k.removesuffix("name") for k in differing if k.endswith(".name")]  # "task." for task.name
    differing = [k for k in differing if k.endswith(".name") or not k.startswith(tuple(named))]
    names = short_names(differing, keys)
    seeds = {s for c in curves for s in c.seeds}
    for curve in curves:
        parts = [objective_of({k.removeprefix("algorithm."): v for k, v in curve.settings.items()})]
        parts += [f"{names[k]}={_value(curve.settings.get(k))}" for k in differing]
        if len(curve.records) > 1:
            parts.append(f"({len(curve.records)} seeds: mean, min-max band)")
        elif len(seeds) > 1:
            parts.append(f"seed={curve.seeds[0]}")
        curve.label = " ".join(parts)
    return {names[k]: k for k in differing if names[k] != k}


def short_names(keys: list[str], every: list[str]) -> dict[str, str]:
    """Each of ``keys`` under its shortest name that no other key of ``every`` could be read as: the usual
    abbreviation (``SHORT_NAMES``: ``lr``, ``k``, ``group``), else the shortest dotted suffix that ends no
    other key (``eval.interval``, not ``interval``, beside ``sync.interval``)."""
    taken = {v for k, v in SHORT_NAMES.items() if k in every}
    names = {}
    for key in keys:
        if key in SHORT_NAMES:
            names[key] = SHORT_NAMES[key]
            continue
        parts = key.split(".")
        for n in range(1, len(parts) + 1):
            suffix = ".".join(parts[-n:])
            clash = any(o != key and (o == suffix or o.endswith(f".{suffix}")) for o in every)
            if not clash and (suffix not in taken or n == len(parts)):
                names[key] = suffix
                break
        else:  # every suffix, the key itself included, ends another key (``mode`` beside ``sync.mode``)
            names[key] = key
    return names


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str) and "/" in value:
        return value.rstrip("/").rsplit("/", 1)[-1]
    return str(value)


def smoothed(values: list[float], window: int) -> list[float]:
    """Trailing moving average over ``window`` points (the first ones over what there is)."""
    if window <= 1:
        return list(values)
    return [
        sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1])
        for i in range(len(values))
    ]


def mean_band(records: list[RunRecord], key: str, smooth: int = 1):
    """(steps, mean, low, high) across the seeds of one curve, over the steps they all logged."""
    curves = []
    for record in records:
        steps, values = record.curve(key)
        curves.append(dict(zip(steps, smoothed(values, smooth), strict=True)))
    shared = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    columns = [[c[s] for c in curves] for s in shared]
    return (shared, [sum(v) / len(v) for v in columns], [min(v) for v in columns], [max(v) for v in columns])


def plot_panels(records: list[RunRecord], key: str, ylabel: str, out: Path, smooth: int = 1) -> Path | None:
    """One PNG: a panel per setting, a curve per configuration (``draw_grid``). None if no run logs ``key``."""
    return plot_grid(records, [(key, ylabel, smooth)], out)


def plot_grid(
    records: list[RunRecord], rows: list[tuple[str, str, int]], out: Path, title: str | None = None
) -> Path | None:
    """One PNG with a row per metric ``(key, ylabel, smooth)`` and a column per setting (``draw_grid``);
    None if no run logs any of the rows."""
    import matplotlib.pyplot as plt

    fig = draw_grid(records, rows, title)
    if fig is None:
        return None
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def draw_grid(records: list[RunRecord], rows: list[tuple[str, str, int]], title: str | None = None):
    """The figure of ``plot_grid``: a curve per ``curve_groups`` group in the column of its setting, a
    min-max band where it averages seeds; one colour per label across the figure. None if nothing is logged."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if any(rec.curve(r[0])[0] for rec in records)]
    if not rows:
        return None
    settings = sorted({r.labels["setting"] for r in records}, key=_setting_rank)
    columns: dict[str, list[Curve]] = {}
    abbreviations: dict[str, str] = {}
    for setting in settings:
        columns[setting] = curve_groups([r for r in records if r.labels["setting"] == setting])
        abbreviations |= label_curves(columns[setting])
    labels = sorted({c.label for curves in columns.values() for c in curves})
    palette = plt.cm.tab10 if len(labels) <= 10 else plt.cm.tab20
    colors = {label: palette(i % palette.N) for i, label in enumerate(labels)}
    fig, axes = plt.subplots(
        len(rows), len(settings), figsize=(4.2 * len(settings), 3.2 * len(rows) + 0.4), sharey="row", squeeze=False
    )
    for row, (key, ylabel, smooth) in enumerate(rows):
        for col, setting in enumerate(settings):
            ax = axes[row][col]
            # A curve equal to another's (REC-OneSide-NoIS is REINFORCE on-policy: ρ ≡ 1) would hide under it and
            # look missing: it is drawn dashed on top, and the panel names the pair. Their configs differ (else they
            # would be one curve), and one metric's coinciding says nothing of the rest (offline distillation runs
            # can share a KL curve and part on accuracy): "coinciding curves", never "identical runs".
            drawn: dict[tuple, str] = {}
            twins = []
            for curve in columns[setting]:
                signature = _signature(curve, key)
                twin = drawn.get(signature) if signature else None
                _draw_curve(ax, curve, key, smooth, colors[curve.label], dashed=twin is not None)
                if twin is not None:
                    twins.append(f"{_short_label(curve.label)} = {twin}")
                elif signature:
                    drawn[signature] = _short_label(curve.label)
            if twins:
                ax.text(0.02, 0.02, TWINS_NOTE + "\n".join(twins), transform=ax.transAxes,
                        fontsize=6, va="bottom", ha="left", alpha=0.8)  # fmt: skip
            if key.startswith("kl/"):
                # KL spans orders of magnitude between stable and collapsing runs; linear near 0 (it starts at 0).
                ax.set_yscale("symlog", linthresh=1e-2)
            if row == 0:
                ax.set_title(setting_title(setting))
            if row == len(rows) - 1:
                ax.set_xlabel("trainer step")
            ax.set_ylabel(ylabel + (f"\n(moving average, {smooth} steps)" if smooth > 1 else ""), fontsize=8)
            ax.grid(alpha=0.3)
    if title:  # before the layout, which then leaves it room above the column titles
        fig.suptitle(title)
    names = "   ".join(f"{short} = {key}" for short, key in sorted(abbreviations.items()))
    _legend(fig, axes, names or None)
    return fig


TWINS_NOTE = "coinciding curves (dashed; their configs differ):\n"
"""The head of a panel's note naming the curves drawn dashed on an equal curve of another config."""


def _signature(curve: Curve, key: str) -> tuple:
    """A curve's data for ``key``: each seed's (seed, steps, values); empty when nothing is logged."""
    points = []
    for record in curve.records:
        steps, values = record.curve(key)
        if steps:
            points.append((str(record.config.get("seed")), tuple(steps), tuple(values)))
    return tuple(sorted(points))


def _short_label(label: str) -> str:
    """A curve's label without its seed count (``grpo (3 seeds: mean, min-max band)`` -> ``grpo``)."""
    return label.split(" (")[0] if " seeds: " in label else label


def _draw_curve(ax, curve: Curve, key: str, smooth: int, color, dashed: bool = False) -> None:
    logged = [r for r in curve.records if r.curve(key)[0]]
    if not logged:
        return
    steps, mean, low, high = mean_band(logged, key, smooth)
    ax.plot(steps, mean, label=curve.label, color=color, lw=1.4, marker="o" if len(steps) <= 12 else None, ms=3,
            linestyle=(0, (4, 3)) if dashed else "-")  # fmt: skip
    if len(logged) > 1:
        ax.fill_between(steps, low, high, color=color, alpha=0.2, lw=0, label=f"{curve.label}: min-max")


def _legend(fig, axes, title: str | None = None) -> None:
    """One legend for the figure, below the panels and inside the figure: as many columns as fit its width
    (measured, not guessed), the figure widened when even one column does not fit; the panels are laid out
    in the height above it. ``title``: the full keys of the short names in the labels."""
    handles, labels = [], []
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels and not label.endswith(": min-max"):
                handles.append(handle)
                labels.append(label)
    renderer = fig.canvas.get_renderer()
    ncol = max(1, min(len(labels), 4))
    while True:
        legend = fig.legend(
            handles, labels, loc="lower center", ncol=ncol, fontsize=8, frameon=False, title=title, title_fontsize=8
        )
        width = legend.get_window_extent(renderer).width
        if width <= 0.98 * fig.bbox.width or ncol == 1:
            break
        legend.remove()
        ncol -= 1
    if width > 0.98 * fig.bbox.width:
        fig.set_figwidth(width / fig.dpi + 0.3)
    height = legend.get_window_extent(renderer).height / fig.bbox.height
    fig.tight_layout(rect=(0, min(0.6, height + 0.02), 1, 1))


def plot_all(records: list[RunRecord], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (key, ylabel) in PANELS.items():
        smooth = 5 if key != "eval/accuracy" else 1
        path = plot_panels(records, key, ylabel, out_dir / f"{name}.png", smooth=smooth)
        if path:
            written.append(path)
    return written


def main(argv: list[str]) -> int:
    from oprl.errors import OprlError

    parser = argparse.ArgumentParser(
        prog="oprl plot",
        description="Paper-style figures (eval accuracy, reward, clip fraction, KL, entropy, length, ESS) of run "
        "directories: a panel per off-policy setting, a curve per configuration; runs whose configs differ only "
        "in the seed are averaged (min-max band), every other run is its own curve, labelled by what differs.",
        epilog="Settings of the runs themselves: oprl config --help.",
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (each with metrics.jsonl)")
    parser.add_argument("--out", type=Path, default=Path("plots"), help="where the PNGs go (default: plots/)")
    args = parser.parse_args(argv)
    missing = [str(r) for r in args.runs if not (r / "metrics.jsonl").is_file()]
    if missing:
        raise OprlError(f"not a run directory (no metrics.jsonl): {', '.join(missing)}")
    for path in plot_all([load_run(r) for r in args.runs], args.out):
        print(path)
    return 0
