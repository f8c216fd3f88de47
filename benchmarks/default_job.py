"""Benchmark: the default job (`oprl train`, no arguments) from a cold cache, as a newcomer runs it.

Measures wall time including the first-time warm start, and eval accuracy before -> after, for a few seeds.
Each seed runs in a fresh process with a fresh cache directory, so every run pays for the warm start.

    python benchmarks/default_job.py --seeds 0 1 2 [--out benchmarks/results/default_job.json]

The results file names the commit and the CPU (model, cores, avx512_bf16, AMX): the warm start's step count and
accuracy depend on the CPU's float kernels, and the RL gain with them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from restart_explorer import cpu  # benchmarks/ is the script's directory, so on sys.path


def run_once(seed: int, workdir: Path) -> dict:
    env = dict(os.environ, OPRL_CACHE_DIR=str(workdir / "cache"))
    start = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "oprl.cli",
            "train",
            f"seed={seed}",
            f"output_dir={workdir / 'runs'}",
            "run_name=default",
            "progress=false",
        ],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - start
    summary = json.loads((workdir / "runs" / "default" / "summary.json").read_text())
    recipe = next((workdir / "cache" / "models").glob("tiny-*/oprl_recipe.json"))
    warm = json.loads(recipe.read_text())["result"]
    return {
        "seed": seed,
        "wall_seconds": wall,
        "warmstart_seconds": warm["seconds"],
        "warmstart_steps": warm["steps"],
        "accuracy_before": summary["eval_accuracy_before"],
        "accuracy_after": summary["eval_accuracy_after"],
        "gain": summary["eval_accuracy_after"] - summary["eval_accuracy_before"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results = []
    for seed in args.seeds:
        with tempfile.TemporaryDirectory() as tmp:
            results.append(run_once(seed, Path(tmp)))
        print(json.dumps(results[-1]), flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    report = {
        "machine": f"{platform.machine()} {os.cpu_count()} cores, {platform.python_version()}",
        "cpu": cpu(),
        "commit": commit,
        "runs": results,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
