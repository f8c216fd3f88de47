"""Paper-style figures from run records: one panel per off-policy setting, one line per preset, the mean
over seeds with a min-max band. ``oprl plot RUN_DIRS...`` draws them for any set of runs.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from oprl.experiments.results import RunRecord, load_run

PANELS = {
    "eval_accuracy": ("eval/accuracy", "eval accuracy (pass@1)"),
    "train_reward": ("reward/mean", "training reward"),
    "clip_fraction": ("loss/clip_frac", "clip fraction"),
    "kl": ("kl/behavior_k3", "KL(π_θ ‖ π_behaviour), k3"),
    "kl_initial": ("kl/ref", "KL to the initial policy"),
    "entropy": ("entropy/mean", "entropy per token"),
    "response_length": ("response/length_mean", "response length (tokens)"),
}
SETTING_ORDER = ["on-policy", "stale", "infrequent", "sync", "offline"]


def _setting_rank(name: str) -> tuple[int, str]:
    rank = next((i for i, prefix in enumerate(SETTING_ORDER) if name.startswith(prefix)), len(SETTING_ORDER))
    return rank, name


def mean_band(records: list[RunRecord], key: str, smooth: int = 1):
    """(steps, mean, low, high) across seeds over the steps all records share; ``smooth`` = moving average."""
    curves = []
    for record in records:
        steps, values = record.curve(key)
        if smooth > 1 and len(values) >= smooth:
            values = [
                sum(values[max(0, i - smooth + 1) : i + 1]) / len(values[max(0, i - smooth + 1) : i + 1])
                for i in range(len(values))
            ]
        curves.append(dict(zip(steps, values, strict=True)))
    shared = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    columns = [[c[s] for c in curves] for s in shared]
    return (shared, [sum(v) / len(v) for v in columns], [min(v) for v in columns], [max(v) for v in columns])


def plot_panels(records: list[RunRecord], key: str, ylabel: str, out: Path, smooth: int = 1) -> Path | None:
    """One PNG: a panel per setting, a line (+ band over seeds) per preset. None if no run logs ``key``."""
    return plot_grid(records, [(key, ylabel, smooth)], out)


def plot_grid(
    records: list[RunRecord], rows: list[tuple[str, str, int]], out: Path, title: str | None = None
) -> Path | None:
    """One PNG with a row per metric ``(key, ylabel, smooth)`` and a column per setting; a line (+ min-max
    band over seeds) per preset. Rows no run logs are left out; None if none is logged."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if any(rec.curve(r[0])[0] for rec in records)]
    if not rows:
        return None
    settings = sorted({r.labels["setting"] for r in records}, key=_setting_rank)
    presets = sorted({r.labels["preset"] for r in records})
    colors = {p: plt.cm.tab20(i % 20) for i, p in enumerate(presets)}
    fig, axes = plt.subplots(
        len(rows), len(settings), figsize=(4.2 * len(settings), 3.2 * len(rows) + 0.4), sharey="row", squeeze=False
    )
    for row, (key, ylabel, smooth) in enumerate(rows):
        for col, setting in enumerate(settings):
            ax = axes[row][col]
            by_preset: dict[str, list[RunRecord]] = defaultdict(list)
            for record in records:
                if record.labels["setting"] == setting and record.curve(key)[0]:
                    by_preset[record.labels["preset"]].append(record)
            for preset in sorted(by_preset):
                steps, mean, low, high = mean_band(by_preset[preset], key, smooth)
                ax.plot(steps, mean, label=preset, color=colors[preset], lw=1.4)
                if len(by_preset[preset]) > 1:
                    ax.fill_between(steps, low, high, color=colors[preset], alpha=0.15, lw=0)
            if key.startswith("kl/"):
                # KL spans orders of magnitude between stable and collapsing runs; linear near 0 (it starts at 0).
                ax.set_yscale("symlog", linthresh=1e-2)
            if row == 0:
                ax.set_title(setting)
            if row == len(rows) - 1:
                ax.set_xlabel("trainer step")
            if col == 0:
                ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
    handles, labels = [], []
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    ncol = min(len(labels), 7)
    legend_rows = -(-len(labels) // ncol)
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    if title:
        fig.suptitle(title)
    legend_height = (0.28 * legend_rows + 0.1) / fig.get_figheight()
    fig.tight_layout(rect=(0, legend_height, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


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

    parser = argparse.ArgumentParser(prog="oprl plot", description="Paper-style figures from run directories.")
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("plots"))
    args = parser.parse_args(argv)
    missing = [str(r) for r in args.runs if not (r / "metrics.jsonl").is_file()]
    if missing:
        raise OprlError(f"not a run directory (no metrics.jsonl): {', '.join(missing)}")
    for path in plot_all([load_run(r) for r in args.runs], args.out):
        print(path)
    return 0
