"""The ESS warning against the accuracy of the runs it watches: docs/metrics.md's table, from run files.

For each run directory under ``DIR/runs`` (or directly under ``DIR``, as a sweep lays them out): its start and final
eval accuracy, the first evaluation 5 and 10 points below the start, the lowest 5-step mean of ``rho/ess``, and the
step at which ``oprl.runtime.health.EssWatch`` (the rule a run applies) warns, replayed on the run's own rows.
Extra arguments keep only the runs whose name contains one of them; ``--csv FILE`` also writes the rows as CSV
(a sweep's run files are too heavy to commit, the CSV is not); ``--series`` shows every evaluation's accuracy
instead of start -> final (docs/reproduction.md's stale-arena run table); ``--drift`` adds how far each run's policy
drifted from its samplers: the steps with ``kl/behavior_k3`` above 1 and above 100, its largest value, and the mean and
largest ``loss/clip_frac`` (the counts the stale-arena paragraphs quote).

    python benchmarks/ess_warning.py docs/reproduction/ess-warning
    python benchmarks/ess_warning.py runs/arena2 --csv docs/reproduction/arena2/ess.csv
    python benchmarks/ess_warning.py docs/reproduction/smollm2-stale-arena --series --drift
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from oprl.metrics import read_metrics
from oprl.runtime.health import ESS_STEPS, EssWatch

COLUMNS = ["run", "start", "final", "first_eval_5_below", "first_eval_10_below", "lowest_5step_ess", "warns_at"]
DRIFT = ["kl_steps_over_1", "kl_steps_over_100", "kl_max", "clip_frac_mean", "clip_frac_max"]


def summarize(run: Path) -> dict:
    rows = read_metrics(run / "metrics.jsonl")
    evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    start = evals[0][1]
    ess = [r["rho/ess"] for r in rows if "rho/ess" in r]
    watch = EssWatch(lambda _: None)
    for row in rows:
        watch.observe(row)
    kl = [r["kl/behavior_k3"] for r in rows if "kl/behavior_k3" in r]
    clip = [r["loss/clip_frac"] for r in rows if "loss/clip_frac" in r]
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
        "kl_steps_over_1": sum(k > 1 for k in kl),
        "kl_steps_over_100": sum(k > 100 for k in kl),
        "kl_max": max(kl, default=None),
        "clip_frac_mean": sum(clip) / len(clip) if clip else None,
        "clip_frac_max": max(clip, default=None),
    }


def _num(value: float | None, spec: str) -> str:
    """A number for the table, or "-" where the run never logged the metric (an old or on-policy-only run)."""
    return "-" if value is None else format(value, spec)


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
    parser.add_argument("--drift", action="store_true", help="also behaviour-KL counts and clip fractions")
    args = parser.parse_intermixed_args()  # options before, between or after the positionals
    rows = [summarize(run) for run in runs_under(Path(args.root), args.keep)]
    accuracy = "eval accuracy at each evaluation" if args.series else "eval accuracy start -> final"
    drift = " steps KL > 1 / > 100 | max KL | clip frac mean / max |" if args.drift else ""
    print(f"| run | {accuracy} | first eval 5 / 10 points below | lowest 5-step rho/ess | warns at |{drift}")
    print("|---|---|---|---|---|" + "---|---|---|" * args.drift)
    for r in rows:
        shown = " / ".join(f"{a:.3f}" for a in r["series"]) if args.series else f"{r['start']:.3f} -> {r['final']:.3f}"
        line = (
            f"| {r['run']} | {shown} | {r['first_eval_5_below'] or '-'} / "
            f"{r['first_eval_10_below'] or '-'} | {r['lowest_5step_ess']:.2f} | {r['warns_at'] or 'none'} |"
        )
        if args.drift:
            line += f" {r['kl_steps_over_1']} / {r['kl_steps_over_100']} | {_num(r['kl_max'], '.3g')} |"
            line += f" {_num(r['clip_frac_mean'], '.4f')} / {_num(r['clip_frac_max'], '.4f')} |"
        print(line)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, COLUMNS + DRIFT * args.drift, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
