"""The ESS warning against the accuracy of the runs it watches: docs/metrics.md's table, from committed run files.

For each run directory under ``DIR/runs``: its start and final eval accuracy, the first evaluation 5 and 10 points
below the start, the lowest 5-step mean of ``rho/ess``, and the step at which ``oprl.runtime.health.EssWatch``
(the rule a run applies) warns, replayed on the run's own rows.

    python benchmarks/ess_warning.py docs/reproduction/ess-warning
"""

from __future__ import annotations

import sys
from pathlib import Path

from oprl.metrics import read_metrics
from oprl.runtime.health import ESS_STEPS, EssWatch


def summarize(run: Path) -> str:
    rows = read_metrics(run / "metrics.jsonl")
    evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    start = evals[0][1]
    drop5 = next((s for s, a in evals if a < start - 0.05), None)
    drop10 = next((s for s, a in evals if a < start - 0.10), None)
    ess = [r["rho/ess"] for r in rows if "rho/ess" in r]
    lowest = min(sum(ess[i - ESS_STEPS + 1 : i + 1]) / ESS_STEPS for i in range(ESS_STEPS - 1, len(ess)))
    watch = EssWatch(lambda _: None)
    for row in rows:
        watch.observe(row)
    return (
        f"| {run.name} | {start:.3f} -> {evals[-1][1]:.3f} | {drop5 or '-'} / {drop10 or '-'} | {lowest:.2f} | "
        f"{watch.first_step or 'none'} |"
    )


def main(root: str) -> None:
    print("| run | eval accuracy start -> final | first eval 5 / 10 points below | lowest 5-step rho/ess | warns at |")
    print("|---|---|---|---|---|")
    for run in sorted((Path(root) / "runs").iterdir()):
        print(summarize(run))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "docs/reproduction/ess-warning")
