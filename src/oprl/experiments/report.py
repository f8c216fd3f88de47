"""``oprl report SWEEP_DIR``: figures plus a markdown report with the sweep's tables.

Tables: final eval accuracy (mean ± std over seeds), area under the eval-accuracy curve (a mean accuracy
over training), and the first step reaching initial accuracy + 0.05, each preset × setting.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections import defaultdict
from pathlib import Path

from oprl.errors import OprlError
from oprl.experiments.curves import _setting_rank, plot_all
from oprl.experiments.results import THRESHOLD_GAIN, collect_results, load_run, summarize, write_table


def build_report(sweep_dir: Path) -> Path:
    sweep_dir = Path(sweep_dir)
    run_dirs = [d for d in sorted(sweep_dir.iterdir()) if (d / "summary.json").is_file()] if sweep_dir.is_dir() else []
    if not run_dirs:
        raise OprlError(f"report: no finished runs (directories with summary.json) in {sweep_dir}")
    records = [load_run(d) for d in run_dirs]
    table = collect_results(sweep_dir)
    write_table(table, sweep_dir / "results.csv")
    figures = plot_all(records, sweep_dir / "figures")
    summaries = [(r.labels, summarize(r)) for r in records]
    lines = [f"# Sweep report: {sweep_dir.name}", "", f"{len(records)} finished runs.", ""]
    for metric, title, fmt in (
        ("final_accuracy", "Final eval accuracy (mean ± std over seeds)", "{:.3f} ± {:.3f}"),
        ("accuracy_auc", "Area under the eval-accuracy curve (mean accuracy over training)", "{:.3f} ± {:.3f}"),
        ("steps_to_threshold", f"First eval step with accuracy ≥ initial + {THRESHOLD_GAIN} (mean; — = never)", "{:.0f}"),
    ):
        lines += [f"## {title}", "", *_table(summaries, metric, fmt), ""]
    lines += ["## Figures", ""]
    lines += [f"![{f.stem}](figures/{f.name})" for f in figures]
    out = sweep_dir / "report.md"
    out.write_text("\n".join(lines) + "\n")
    return out


def _table(summaries, metric: str, fmt: str) -> list[str]:
    cells: dict[tuple[str, str], list[float]] = defaultdict(list)
    for labels, numbers in summaries:
        cells[(labels["preset"], labels["setting"])].append(numbers[metric])
    settings = sorted({s for _, s in cells}, key=_setting_rank)
    presets = sorted({p for p, _ in cells})
    rows = ["| preset | " + " | ".join(settings) + " |", "|---|" + "---|" * len(settings)]
    for preset in presets:
        row = []
        for setting in settings:
            values = [v for v in cells.get((preset, setting), []) if not math.isnan(v)]
            if not values:
                row.append("—")
            elif "±" in fmt:
                row.append(fmt.format(statistics.mean(values), statistics.pstdev(values)))
            else:
                row.append(fmt.format(statistics.mean(values)) + ("" if len(values) == len(cells[(preset, setting)]) else "*"))
        rows.append(f"| {preset} | " + " | ".join(row) + " |")
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="oprl report", description="Figures and a markdown report of a sweep.")
    parser.add_argument("sweep_dir", type=Path)
    args = parser.parse_args(argv)
    print(build_report(args.sweep_dir))
    return 0
