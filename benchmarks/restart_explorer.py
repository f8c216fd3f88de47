"""Seconds lost per restart of an explorer (issue 57): the tiny job on worker processes, undisturbed against the
same run with its explorer killed (``OPRL_FAULT``, a SIGKILL) part way into batch ``--kill-step``, in rotation,
``--repeats`` rounds; ``--worker trainer``: the trainer killed instead, which starts every worker again from
the newest checkpoint (``--checkpoint-interval``). docs/runtime.md#self-healing-runs has the figures.

Reported per round: each run's wall seconds (``summary.json``), the killed run's extra seconds over the
undisturbed run of its round, the driver's own account of the restart (``ready_s``: death noticed -> new
process ready; ``seconds_lost``: that plus the lost call's seconds), and the median step time, so the loss
reads as a number of steps. Each killed run is checked against its undisturbed one: every ``metrics.jsonl``
column but ``perf/*`` and ``final/model.safetensors`` byte for byte (a round whose numbers differ fails).

Run:  flock /tmp/oprl-bench.lock python benchmarks/restart_explorer.py [--steps 24] [--kill-step 12]
      [--kill-after 0] [--explorers 1] [--repeats 3] [--worker explorer|trainer] [--checkpoint-interval 24]
      [--out benchmarks/results/restart_explorer.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from oprl.metrics import deterministic_view, read_metrics

SMALL = [  # the test suite's small recipe (tests/conftest.py), with its warm start
    "task.train_size=600",
    "task.test_size=64",
    "warmstart.max_steps=40",
    "warmstart.check_interval=20",
    "warmstart.val_problems=64",
    "warmstart.target_accuracy=0.99",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "eval.num_problems=32",
    "progress=false",
    "tensorboard=false",
    "runtime.workers=processes",
    "runtime.torch_threads=1",
]


def train(root: Path, name: str, settings: list[str], fault: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OPRL_FAULT"} | ({"OPRL_FAULT": fault} if fault else {})
    command = [sys.executable, "-m", "oprl.cli", "train", *settings, f"output_dir={root}", f"run_name={name}"]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{name}: oprl train exited {done.returncode}: {done.stderr.strip()[-400:]}")
    summary = json.loads((root / name / "summary.json").read_text())
    rows = read_metrics(root / name / "metrics.jsonl")
    steps = [r["perf/step_s"] for r in rows if "perf/step_s" in r]
    return {"wall_s": wall, "run_s": summary["seconds"], "restarts": summary["restarts"], "step_s": steps}


def same_numbers(root: Path, a: str, b: str) -> bool:
    rows_a, rows_b = read_metrics(root / a / "metrics.jsonl"), read_metrics(root / b / "metrics.jsonl")
    weights = [(root / n / "final" / "model.safetensors").read_bytes() for n in (a, b)]
    return deterministic_view(rows_a) == deterministic_view(rows_b) and weights[0] == weights[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--kill-step", type=int, default=12)
    parser.add_argument("--kill-after", type=float, default=0.0, help="seconds into the batch")
    parser.add_argument("--explorers", type=int, default=1)
    parser.add_argument("--offset", type=int, default=1, help="sync.offset: 1 overlaps generation and training")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", choices=["explorer", "trainer"], default="explorer")
    parser.add_argument("--checkpoint-interval", type=int, default=None, help="default: --steps (none before)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    settings = [
        *SMALL,
        f"steps={args.steps}",
        f"sync.offset={args.offset}",
        f"runtime.explorers={args.explorers}",
        f"eval.interval={args.steps}",
        f"checkpoint.interval={args.checkpoint_interval or args.steps}",
    ]
    fault = f"{args.worker}@step={args.kill_step}+{args.kill_after}"
    load = os.getloadavg()[0]
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        train(root, "warm", [*settings, "steps=1"], None)  # builds the warm-started model once, untimed
        for index in range(args.repeats):
            whole = train(root, f"whole-{index}", settings, None)
            killed = train(root, f"killed-{index}", settings, fault)
            if len(killed["restarts"]) != 1 or not same_numbers(root, f"whole-{index}", f"killed-{index}"):
                raise SystemExit(f"round {index}: not one restart with the undisturbed numbers: {killed['restarts']}")
            restart = killed["restarts"][0]
            step_s = statistics.median(whole["step_s"])
            extra = killed["run_s"] - whole["run_s"]
            rounds.append(
                {
                    "whole_s": whole["run_s"],
                    "killed_s": killed["run_s"],
                    "extra_s": extra,
                    "ready_s": restart["ready_s"],
                    "seconds_lost": restart["seconds_lost"],
                    "batches": restart["batches"],
                    "step_s": step_s,
                    "extra_steps": extra / step_s,
                }
            )
            print(
                f"round {index}: undisturbed {whole['run_s']:.1f} s, killed {killed['run_s']:.1f} s "
                f"(+{extra:.1f} s = {extra / step_s:.1f} steps of {step_s:.2f} s); restart ready in "
                f"{restart['ready_s']:.1f} s, driver's seconds lost {restart['seconds_lost']:.1f}, "
                f"batches {restart['batches']}; numbers equal",
                flush=True,
            )
    medians = {key: statistics.median(r[key] for r in rounds) for key in ("extra_s", "ready_s", "seconds_lost")}
    print(
        f"median over {len(rounds)} rounds: +{medians['extra_s']:.1f} s wall per restart, new process ready in "
        f"{medians['ready_s']:.1f} s, driver's seconds lost {medians['seconds_lost']:.1f} (load {load:.1f} at start)"
    )
    if args.out:
        result = {
            "settings": settings,
            "fault": fault,
            "machine": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "load_at_start": load,
            "rounds": rounds,
            "medians": medians,
        }
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
