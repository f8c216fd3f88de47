"""``oprl report SWEEP_DIR``: figures plus a markdown report with the sweep's tables.

Tables: final eval accuracy (mean ± std over seeds), area under the eval-accuracy curve (a mean accuracy
over training), and the first step reaching initial accuracy + ``report.threshold_gain`` (default 0.05), each
preset × setting (a row per value of any other sweep axis: ``aspo lr=0.0001``); with two or more lags
(``lag-N``, ``stale-N``, ``offline``), accuracy against lag and a table ranked at each lag
(``oprl.experiments.arena``); then, for each of the spec's ``report.groups``, one figure (accuracy, reward,
clip fraction, KL to the initial policy × settings) and its table. Labels are the sweep's own (its setting names).
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections import defaultdict
from pathlib import Path

import yaml

from oprl.errors import OprlError
from oprl.experiments.arena import arena_section
from oprl.experiments.curves import PANELS, _setting_rank, plot_all, plot_grid
from oprl.experiments.results import collect_results, load_run, summarize, write_table
from oprl.experiments.sweep import plan, threshold_gain

GROUP_ROWS = [
    (*PANELS[name], 1 if name == "eval_accuracy" else 5)
    for name in ("eval_accuracy", "train_reward", "clip_fraction", "kl_initial")
]
"""Rows of a group figure: (metric key, y label, moving-average window)."""


def build_report(sweep_dir: Path) -> Path:
    sweep_dir = Path(sweep_dir)
    run_dirs = [d for d in sorted(sweep_dir.iterdir()) if (d / "summary.json").is_file()] if sweep_dir.is_dir() else []
    if not run_dirs:
        raise OprlError(f"report: no finished runs (directories with summary.json) in {sweep_dir}")
    spec = _spec(sweep_dir)
    report = spec.get("report") or {}
    gain = threshold_gain(spec)
    # The sweep's own axis labels (e.g. setting names) where the run was planned by it, else derived ones.
    runs = plan(spec) if spec.get("grid") else None
    planned = {r.name: r.labels for r in runs or []}
    records = [load_run(d, planned.get(d.name)) for d in run_dirs]
    table = collect_results(sweep_dir, runs, threshold_gain=gain)
    write_table(table, sweep_dir / "results.csv")
    figures = plot_all(records, sweep_dir / "figures")
    summaries = [(r.labels, summarize(r, gain)) for r in records]
    lines = [f"# Sweep report: {sweep_dir.name}", "", f"{len(records)} finished runs.", ""]
    for metric, title, fmt in (
        ("final_accuracy", "Final eval accuracy (mean ± std over seeds)", "{:.3f} ± {:.3f}"),
        ("accuracy_auc", "Area under the eval-accuracy curve (mean accuracy over training)", "{:.3f} ± {:.3f}"),
        (
            "steps_to_threshold",
            f"First eval step with accuracy ≥ initial + {gain:g} (mean over the seeds that "
            "reach it, * = not all do; — = none does)",
            "{:.0f}",
        ),
    ):
        lines += [f"## {title}", "", *_table(summaries, metric, fmt), ""]
    lines += arena_section(summaries, sweep_dir / "figures")  # a lag ladder (the arena): accuracy against lag
    for index, (title, presets) in enumerate((report.get("groups") or {}).items(), start=1):
        chosen = [r for r in records if r.labels["preset"] in presets]
        missing = sorted(set(presets) - {r.labels["preset"] for r in chosen})
        if missing:
            raise OprlError(
                f"report group {title!r}: no finished runs of preset(s) {', '.join(missing)} in {sweep_dir}"
            )
        figure = plot_grid(chosen, GROUP_ROWS, sweep_dir / "figures" / f"group-{index}.png", title=title)
        chosen_summaries = [(r.labels, summarize(r, gain)) for r in chosen]
        lines += [
            f"## {title}",
            "",
            "Final eval accuracy (mean ± std over seeds):",
            "",
            *_table(chosen_summaries, "final_accuracy", "{:.3f} ± {:.3f}"),
            "",
            *([f"![{title}](figures/{figure.name})", ""] if figure else []),  # None: the runs log none of its rows
        ]
    lines += ["## Figures (all presets)", ""]
    lines += [f"![{f.stem}](figures/{f.name})" for f in figures]
    out = sweep_dir / "report.md"
    out.write_text("\n".join(lines) + "\n")
    return out


def _spec(sweep_dir: Path) -> dict:
    """The sweep spec saved in the sweep directory (empty if the runs were not made by ``oprl sweep``)."""
    spec_path = sweep_dir / "sweep.yaml"
    return (yaml.safe_load(spec_path.read_text()) if spec_path.is_file() else None) or {}


LAYOUT = ("preset", "setting", "seed")
"""Labels a table lays out itself (rows, columns, the spread over seeds); any other sweep axis joins the row."""


def row_label(labels: dict[str, str]) -> str:
    """A table row: the preset, then every other sweep axis of the run (``aspo lr=0.0001``), so that a sweep over
    learning rates (configs/sweeps/arena-lr.yaml) gets one row per rate instead of a mean over the rates."""
    return " ".join([labels["preset"], *(f"{k}={labels[k]}" for k in sorted(labels) if k not in LAYOUT)])


def _row_rank(label: str) -> list[tuple[int, float | str]]:
    """Rows by preset, then each axis value numerically where it is a number (3e-05 before 0.0001)."""
    rank: list[tuple[int, float | str]] = []
    for part in label.split(" "):
        value = part.partition("=")[2]
        try:
            rank.append((0, float(value)))
        except ValueError:
            rank.append((1, part))
    return rank


def _table(summaries, metric: str, fmt: str) -> list[str]:
    cells: dict[tuple[str, str], list[float]] = defaultdict(list)
    for labels, numbers in summaries:
        cells[(row_label(labels), labels["setting"])].append(numbers[metric])
    settings = sorted({s for _, s in cells}, key=_setting_rank)
    presets = sorted({p for p, _ in cells}, key=_row_rank)
    rows = ["| preset | " + " | ".join(settings) + " |", "|---|" + "---|" * len(settings)]
    for preset in presets:
        row = []
        for setting in settings:
            values = [v for v in cells.get((preset, setting), []) if not math.isnan(v)]
            if not values:
                row.append("—")
            elif "±" in fmt and len(values) == 1:  # one seed: no spread to show
                row.append(fmt.split(" ±")[0].format(values[0]) + " (1 seed)")
            elif "±" in fmt:
                row.append(fmt.format(statistics.mean(values), statistics.pstdev(values)))
            else:
                row.append(
                    fmt.format(statistics.mean(values)) + ("" if len(values) == len(cells[(preset, setting)]) else "*")
                )
        rows.append(f"| {preset} | " + " | ".join(row) + " |")
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="oprl report", description="Figures and a markdown report of a sweep.")
    parser.add_argument("sweep_dir", type=Path)
    args = parser.parse_args(argv)
    print(build_report(args.sweep_dir))
    return 0
