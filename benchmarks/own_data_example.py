"""Benchmark: the own-data example (`oprl train examples/arithmetic.yaml`: data, reward and config in examples/)
from a cold cache, as a user runs it after reading docs/tasks.md.

Records the warm start (steps, seconds, its held-out validation pass@1), eval accuracy on the test file at every
evaluation (none of its problems is a training one), the training reward at the first and last steps, the wall
time, and the machine's load average at the start and the end (a loaded machine stretches the times, never the
accuracies: a CPU run is repeatable to the bit).

    python benchmarks/own_data_example.py --seeds 0 --out benchmarks/results/own_data_example.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# benchmarks/ is the script's directory, so on sys.path
from _common import cli_job, load_average, seed_runs, warm_start

COMMAND = ["train", "examples/arithmetic.yaml"]


def read_run(run_dir: Path, cache: Path) -> dict:
    """The example's numbers from a finished run directory and the cache its warm start went to."""
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    warm = warm_start(cache)
    evals = {int(r["step"]): r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    train = [r for r in rows if "reward/correct" in r]
    first, last = train[:10], train[-10:]
    mean = lambda part: sum(r["reward/correct"] for r in part) / len(part)  # noqa: E731
    return {
        "warmstart_steps": warm["steps"],
        "warmstart_seconds": warm["seconds"],
        "warmstart_val_accuracy": warm["val_accuracy"],
        "eval_accuracy": evals,
        "accuracy_before": summary["eval_accuracy_before"],
        "accuracy_after": summary["eval_accuracy_after"],
        "gain_points": 100 * (summary["eval_accuracy_after"] - summary["eval_accuracy_before"]),
        "train_correct_first_10_steps": mean(first),
        "train_correct_last_10_steps": mean(last),
        "test_problems": int(next(r["eval/num_problems"] for r in rows if "eval/num_problems" in r)),
    }


def run_once(seed: int, workdir: Path) -> dict:
    load = load_average()
    wall = cli_job([*COMMAND, f"seed={seed}"], workdir, "example")
    result = read_run(workdir / "runs" / "example", workdir / "cache")
    return {"seed": seed, "wall_seconds": wall, "load_average_start_end": [load, load_average()], **result}


if __name__ == "__main__":
    command = "oprl train examples/arithmetic.yaml seed=S (fresh OPRL_CACHE_DIR)"
    sys.exit(seed_runs(__doc__.splitlines()[0], run_once, seeds=[0], command=command))
