"""Benchmark: the default job (`oprl train`, no arguments) from a cold cache, as a newcomer runs it.

Measures wall time including the first-time warm start, and eval accuracy before -> after, for a few seeds.
Each seed runs in a fresh process with a fresh cache directory, so every run pays for the warm start. Since #71 a
run whose warm-start recipe is the committed one (src/oprl/models/tiny_default) copies those weights instead of
training, as `make demo` does: its ``warmstart_seconds`` is then the committed build's record, not time this run
spent. To time a real warm start, run with ``OPRL_SHIPPED_WARM_START=0`` in the environment (inherited by each
run's process).

    python benchmarks/default_job.py --seeds 0 1 2 [--out benchmarks/results/default_job.json]

The results file names the commit and the CPU (model, cores, avx512_bf16, AMX): the warm start's step count and
accuracy depend on the CPU's float kernels, and the RL gain with them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# benchmarks/ is the script's directory, so on sys.path
from _common import cli_job, seed_runs, warm_start


def run_once(seed: int, workdir: Path) -> dict:
    wall = cli_job(["train", f"seed={seed}"], workdir, "default")
    summary = json.loads((workdir / "runs" / "default" / "summary.json").read_text())
    warm = warm_start(workdir / "cache")
    return {
        "seed": seed,
        "wall_seconds": wall,
        "warmstart_seconds": warm["seconds"],
        "warmstart_steps": warm["steps"],
        "accuracy_before": summary["eval_accuracy_before"],
        "accuracy_after": summary["eval_accuracy_after"],
        "gain": summary["eval_accuracy_after"] - summary["eval_accuracy_before"],
    }


if __name__ == "__main__":
    sys.exit(seed_runs(__doc__.splitlines()[0], run_once, seeds=[0, 1, 2]))
