"""Partial-rollouts benchmark: the bubble (time the trainer or the explorer waits on the other, i.e. on the
slowest response or on the next version) and the time per step, with and without in-flight weight updates, on
a long-tail workload, all settings in one run (docs/performance.md section 11).

Workload: the embedded tiny model, barely warm-started, sampling at a high temperature with a large
``max_new_tokens``, so most responses end after a few tokens and a few run on for tens (the long tail a
batch waits on). Settings, run
in rotation ``--repeats`` times (medians reported, so a noisy machine hurts all alike):

- ``on-policy``: k=1, m=0, whole batches: every token is sampled by the trainer's current version, and the
  two sides alternate (the trainer waits for the whole batch, its slowest row included; the explorer waits
  for the step). The bubble partial rollouts are for.
- ``partial@J``: k=1, m=1 with the deterministic switch at decode step J (``sync.partial``, one setting per
  ``--switch-steps`` value): the first J decode steps of batch b run while the trainer trains step b-1, the
  rest (the long tail) with version b-1, which is then on-policy.
- ``partial-free``: sync.mode=async, max_staleness=1, free-running switch: the newest version is taken
  between two decode steps as soon as it is posted; nothing waits at a fixed point.
- ``one-step-off``: k=1, m=1, whole batches: overlapped and never waiting, but every token one version old.

The bubble is ``perf/trainer_idle_s`` (waiting for its batch) plus ``perf/explorer_idle_s`` (waiting for
weights, between batches or, ``perf/switch_wait_s``, at a scheduled switch inside one), per step between
the first and the last trainer step; worker threads or processes (``runtime.workers=processes``) alike.
``lag/token_mean`` and ``lag/token_frac_0`` say how on-policy the trained
tokens were.

Run:  flock /tmp/oprl-bench.lock python benchmarks/partial_bubble.py [--steps 12] [--repeats 3]
      [--switch-steps 8 16] [--json FILE] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from oprl.config import load_config
from oprl.runtime.run import run

RECIPE = [
    "task.train_size=600",
    "task.test_size=64",
    "warmstart.max_steps=8",  # barely warm: EOS is likely enough that most rows stop early, not all
    "warmstart.check_interval=8",
    "warmstart.val_problems=64",
    "warmstart.target_accuracy=0.99",
    "rollout.prompts_per_step=2",  # few rows: training is cheap, the batch's time is its longest row's decode
    "rollout.group_size=4",
    "rollout.temperature=2.2",  # a long tail: lengths 1-79, mean ~16 (measured over 6 batches)
    "rollout.max_new_tokens=96",
    "eval.interval=0",
    "progress=false",
    "tensorboard=false",
    "checkpoint.interval=0",
    "buffer.persist=false",
    "runtime.torch_threads=1",
]
SETTINGS = {
    "on-policy": ["sync.offset=0"],
    "partial": ["sync.offset=1", "sync.partial=true"],  # at each of --switch-steps: partial@J
    "partial-free": ["sync.mode=async", "sync.max_staleness=1", "sync.partial=true"],
    "one-step-off": ["sync.offset=1"],
}


def measure(name: str, overrides: list[str], out: Path, repeat: int) -> dict:
    config = load_config(None, [*RECIPE, *overrides, f"output_dir={out}", f"run_name={name}-{repeat}"])
    summary = run(config, log=lambda *_: None)
    from oprl.metrics import read_metrics

    rows = [r for r in read_metrics(summary.run_dir / "metrics.jsonl") if "reward/mean" in r]
    span, steps = rows[-1]["perf/elapsed_s"] - rows[0]["perf/elapsed_s"], len(rows) - 1

    def per_step(key: str) -> float:
        return sum(r.get(key, 0.0) for r in rows[1:]) / steps

    trainer_idle, explorer_idle = per_step("perf/trainer_idle_s"), per_step("perf/explorer_idle_s")
    lengths = [r["response/length_mean"] for r in rows]
    return {
        "per_step_s": span / steps,
        "bubble_s": trainer_idle + explorer_idle,
        "trainer_idle_s": trainer_idle,
        "explorer_idle_s": explorer_idle,
        "switch_wait_s": per_step("perf/switch_wait_s"),  # part of explorer_idle_s
        "generate_s": per_step("perf/generate_s"),
        "train_s": per_step("perf/train_s"),
        "token_lag_mean": statistics.mean(r.get("lag/token_mean", 0.0) for r in rows),
        "fresh_token_frac": statistics.mean(r.get("lag/token_frac_0", 0.0) for r in rows),
        "switched_frac": statistics.mean(r.get("batch/switched_frac", 0.0) for r in rows),
        "length_mean": statistics.mean(lengths),
        "length_max": max(r.get("response/length_max", 0.0) for r in rows),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--switch-steps", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("overrides", nargs="*", help="extra key=value config overrides")
    args = parser.parse_args(argv)
    if "on-policy" not in args.settings:
        parser.error("--settings must include on-policy (the ratios are against it)")
    extra = [f"steps={args.steps}", *args.overrides]
    runs = {}
    for name in args.settings:
        for j in args.switch_steps if name == "partial" else [None]:
            label = name if j is None else f"partial@{j}"
            runs[label] = SETTINGS[name] + ([] if j is None else [f"sync.switch_step={j}"])
    load = os.getloadavg()[0]
    results: dict[str, list[dict]] = {name: [] for name in runs}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name, overrides in runs.items():
                results[name].append(measure(name.replace("@", "-"), [*overrides, *extra], Path(tmp), repeat))
                got = results[name][-1]
                print(f"repeat {repeat} {name}: {got['per_step_s']:.3f} s/step bubble {got['bubble_s']:.3f} s")
    table = {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for name, runs in results.items()}
    base = table["on-policy"]
    print(
        f"\nload average before/after: {load:.2f}/{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; "
        f"{args.steps} steps, medians of {args.repeats}\n"
    )
    print(
        "| setting | s/step | vs on-policy | bubble s/step | vs on-policy | trainer idle | explorer idle | "
        "of it switch wait | generate s | train s | token lag | fresh tokens | rows switched | length mean/max |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, r in table.items():
        print(
            f"| {name} | {r['per_step_s']:.3f} | {r['per_step_s'] / base['per_step_s']:.2f} | "
            f"{r['bubble_s']:.3f} | {r['bubble_s'] / base['bubble_s']:.2f} | {r['trainer_idle_s']:.3f} | "
            f"{r['explorer_idle_s']:.3f} | {r['switch_wait_s']:.3f} | {r['generate_s']:.3f} | {r['train_s']:.3f} | "
            f"{r['token_lag_mean']:.2f} | {r['fresh_token_frac']:.2f} | {r['switched_frac']:.2f} | "
            f"{r['length_mean']:.1f}/{r['length_max']:.0f} |"
        )
    if args.json:
        record = {"argv": sys.argv[1:], "load_before": load, "load_after": os.getloadavg()[0], "medians": table}
        args.json.write_text(json.dumps(record | {"settings": runs, "runs": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
