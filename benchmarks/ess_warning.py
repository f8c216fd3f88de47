"""The ESS warning against the accuracy of the runs it watches: docs/metrics.md's table, from run files.

For each run directory under ``DIR/runs`` (or directly under ``DIR``, as a sweep lays them out): its start and final
eval accuracy, the first evaluation 5 and 10 points below the start, the lowest 5-step mean of ``rho/ess``, and the
step at which ``oprl.runtime.health.EssWatch`` (the rule a run applies) warns, replayed on the run's own rows.
Extra arguments keep only the runs whose name contains one of them; ``--csv FILE`` also writes the rows as CSV
(a sweep's run files are too heavy to commit, the CSV is not); ``--series`` shows every evaluation's accuracy
instead of start -> final (docs/reproduction.md's stale-arena run table).

    python benchmarks/ess_warning.py docs/reproduction/ess-warning
    python benchmarks/ess_warning.py runs/arena2 --csv docs/reproduction/arena2/ess.csv
    python benchmarks/ess_warning.py docs/reproduction/smollm2-stale-arena --series
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from oprl.metrics import read_metrics
from oprl.runtime.health import ESS_STEPS, EssWatch

COLUMNS = ["run", "start", "final", "first_eval_5_below", "first_eval_10_below", "lowest_5step_ess", "warns_at"]


def summarize(run: Path) -> dict:
    rows = read_metrics(run / "metrics.jsonl")
    evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    start = evals[0][1]
    ess = [r["rho/ess"] for r in rows if "rho/ess" in r]
    watch = EssWatch(lambda _: None)
    for row in rows:
        watch.observe(row)
    return {
        "run": run.name,
        "start": start,
        "final": evals[-1][1],
        "first_eval_5_below": next((s for s, a in evals if a < start - 0.05), None),
        "first_eval_10_below": next((s for s, a in evals if a < start - 0.10), None),
        "lowest_5step_ess": min(
            sum(ess[i - ESS_STEPS + 1 : i + 1]) / ESS_STEPS for i in range(ESS_STEPS - 1, len(ess))
        ),
        "warns_at": watch.first_step,
        "series": [a for _, a in evals],
    }


def runs_under(root: Path, keep: list[str]) -> list[Path]:
    base = root / "runs" if (root / "runs").is_dir() else root
    runs = [p for p in sorted(base.iterdir()) if (p / "metrics.jsonl").is_file() and (p / "summary.json").is_file()]
    return [p for p in runs if not keep or any(k in p.name for k in keep)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default="docs/reproduction/ess-warning")
    parser.add_argument("keep", nargs="*", help="keep only runs whose name contains one of these")
    parser.add_argument("--csv", help="also write the rows to this CSV file")
    parser.add_argument("--series", action="store_true", help="every evaluation's accuracy, not start -> final")
    args = parser.parse_intermixed_args()  # options before, between or after the positionals
    rows = [summarize(run) for run in runs_under(Path(args.root), args.keep)]
    accuracy = "eval accuracy at each evaluation" if args.series else "eval accuracy start -> final"
    print(f"| run | {accuracy} | first eval 5 / 10 points below | lowest 5-step rho/ess | warns at |")
    print("|---|---|---|---|---|")
    for r in rows:
        shown = " / ".join(f"{a:.3f}" for a in r["series"]) if args.series else f"{r['start']:.3f} -> {r['final']:.3f}"
        print(
            f"| {r['run']} | {shown} | {r['first_eval_5_below'] or '-'} / "
            f"{r['first_eval_10_below'] or '-'} | {r['lowest_5step_ess']:.2f} | {r['warns_at'] or 'none'} |"
        )
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, COLUMNS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
