"""Overlap benchmark: wall time of a run whose generation and training overlap (sync.offset=1) against a
strictly sequential run of the same steps, the same work and the same numbers (runtime.overlap=false).

Settings, run in rotation ``--repeats`` times (medians reported, so a noisy machine hurts all alike):
- ``overlap``: k=1, m=1; the explorer generates batch t+1 while the trainer trains step t (worker threads).
- ``overlap-processes``: the same with worker processes (``runtime.workers=processes``): no shared GIL.
- ``sequential``: the same schedule with one worker busy at a time; its metrics are checked to be identical.
- ``on-policy``: k=1, m=0, where the schedule leaves nothing to overlap.
- ``on-policy-2t``: k=1, m=0 with 2 torch threads per worker: each phase may use both cores.

Every setting runs the embedded tiny model with the small test recipe (the model's quality does not matter
here) and a batch where generation and training take comparable time. Per-step seconds are measured between
the first and the last trainer step (start-up and the final evaluation excluded); "cores used" is the CPU
time of the run (driver and worker processes) over its wall time: on a shared machine it shows how much of
the cores the run actually got, which bounds what overlap can gain.

Run:  python benchmarks/overlap.py [--steps 12] [--repeats 3] [--backend local|ray] [--settings NAME ...]
      [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from oprl.config import load_config
from oprl.metrics import deterministic_view, read_metrics
from oprl.runtime.run import run

RECIPE = [
    "task.train_size=600",
    "task.test_size=64",
    "warmstart.max_steps=40",
    "warmstart.check_interval=20",
    "warmstart.val_problems=64",
    "warmstart.target_accuracy=0.99",
    "rollout.prompts_per_step=16",
    "rollout.group_size=8",
    "rollout.max_new_tokens=8",
    "eval.num_problems=32",
    "eval.interval=0",
    "progress=false",
    "tensorboard=false",
    "checkpoint.interval=0",
    "buffer.persist=false",
]
SETTINGS = {
    "overlap": ["sync.offset=1", "runtime.torch_threads=1"],
    "overlap-processes": ["sync.offset=1", "runtime.torch_threads=1", "runtime.workers=processes"],
    "sequential": ["sync.offset=1", "runtime.torch_threads=1", "runtime.overlap=false"],
    "on-policy": ["sync.offset=0", "runtime.torch_threads=1"],
    "on-policy-2t": ["sync.offset=0", "runtime.torch_threads=2"],
}


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (worker processes are joined at the end of a run)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def measure(name: str, overrides: list[str], out: Path, repeat: int) -> dict:
    config = load_config(None, [*RECIPE, *overrides, f"output_dir={out}", f"run_name={name}-{repeat}"])
    start, cpu = time.perf_counter(), cpu_seconds()
    summary = run(config, log=lambda *_: None)
    wall, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    rows = [r for r in read_metrics(summary.run_dir / "metrics.jsonl") if "reward/mean" in r]
    span = rows[-1]["perf/elapsed_s"] - rows[0]["perf/elapsed_s"]

    def total(key: str) -> float:
        return sum(r.get(key, 0.0) for r in rows[1:])

    return {
        "per_step_s": span / (len(rows) - 1),
        "run_s": wall,
        "cores_used": cpu / wall,
        "trainer_busy_s": total("perf/trainer_busy_s"),
        "trainer_idle_s": total("perf/trainer_idle_s"),
        "explorer_busy_s": total("perf/explorer_busy_s"),
        "explorer_idle_s": total("perf/explorer_idle_s"),
        "generate_s": total("perf/generate_s"),
        "train_s": total("perf/train_s"),
        "rows": deterministic_view(rows),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backend", default="local", choices=["local", "ray"])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("overrides", nargs="*", help="extra key=value config overrides")
    args = parser.parse_args(argv)
    extra = [f"steps={args.steps}", f"backend={args.backend}", *args.overrides]
    if "sequential" not in args.settings:
        parser.error("--settings must include sequential (the ratios are against it)")
    results: dict[str, list[dict]] = {name: [] for name in args.settings}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name in args.settings:
                results[name].append(measure(name, [*SETTINGS[name], *extra], Path(tmp), repeat))
                print(f"repeat {repeat} {name}: {results[name][-1]['per_step_s']:.3f} s/step", file=sys.stderr)
    # Same schedule (k=1, m=1), so these must log the same numbers; on-policy runs have another schedule.
    compared = [r for name in ("overlap", "overlap-processes", "sequential") for r in results.get(name, [])]
    same = all(r["rows"] == compared[0]["rows"] for r in compared)
    table = {
        name: {key: statistics.median(r[key] for r in runs) for key in runs[0] if key != "rows"}
        for name, runs in results.items()
    }
    base = table["sequential"]["per_step_s"]
    seq = table["sequential"]
    ideal = max(seq["generate_s"], seq["train_s"]) / (seq["generate_s"] + seq["train_s"])
    print(
        f"\nload average at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; backend {args.backend}; "
        f"{args.steps} steps, medians of {args.repeats}; overlap and sequential metrics identical: {same}; "
        f"best possible overlap ratio from the sequential run's sides: {ideal:.2f}\n"
    )
    print(
        "| setting | s/step | vs sequential | trainer busy / idle s | explorer busy / idle s | generate s | train s "
        "| cores used |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, row in table.items():
        print(
            f"| {name} | {row['per_step_s']:.3f} | {row['per_step_s'] / base:.2f} | "
            f"{row['trainer_busy_s']:.2f} / {row['trainer_idle_s']:.2f} | "
            f"{row['explorer_busy_s']:.2f} / {row['explorer_idle_s']:.2f} | {row['generate_s']:.2f} | "
            f"{row['train_s']:.2f} | {row['cores_used']:.2f} |"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "overrides": args.overrides,
                    "steps": args.steps,
                    "repeats": args.repeats,
                    "settings": {name: SETTINGS[name] for name in args.settings},
                    "medians": table,
                    "identical": same,
                },
                indent=2,
            )
        )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
