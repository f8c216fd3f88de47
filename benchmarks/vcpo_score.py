"""VCPO's score pass on a real default-job batch: the per-response loop (``Inputs.looped_score_statistics``, one
forward and backward per response) against the batched pass (``Inputs.score_statistics``, oprl.trainer.score_norms),
A/B in one process, alternating, so a machine shared with other work loads both alike.

The batch and the weights are those of a real run: ``oprl train algorithm.preset=vcpo steps=1`` (the embedded tiny
model, warm-started and cached as every run does; extra ``key=value`` arguments override the config) is run in
this process and the trainer and batch of its first score pass are kept. Then ``--rounds`` rounds each time both
passes on that batch (the first round is a warm-up, not counted) and report medians, their ratio, and the largest
relative difference between the two passes' norms. Recorded: commit, CPU name, bf16/AMX flags, load average
before and after, torch threads.

    nice -n 10 python benchmarks/vcpo_score.py --rounds 6 --threads 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

# benchmarks/ is the script's directory, so on sys.path
from _common import commit, cpu, job_args, load_average, run_job, write_json

from oprl.models.precision import cpu_flags
from oprl.trainer.inputs import Inputs


def capture(overrides: list[str], out: Path):
    """(the trainer's ``Inputs``, batch) of the first score pass of a one-step ``vcpo`` run."""
    kept: dict = {}
    original = Inputs.score_statistics

    def spy(self, rows):
        kept.setdefault("trainer", self)
        kept.setdefault("rows", rows)
        return original(self, rows)

    Inputs.score_statistics = spy  # type: ignore[method-assign]
    try:
        job = ["algorithm.preset=vcpo", "steps=1", "progress=false", "tensorboard=false", "eval.interval=0"]
        run_job(None, [*job, *overrides], out, "vcpo")
    finally:
        Inputs.score_statistics = original  # type: ignore[method-assign]
    return kept["trainer"], kept["rows"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    args = job_args(parser, argv)
    load_before, head = load_average(), commit()  # HEAD as the run starts: the code it measures
    with tempfile.TemporaryDirectory() as tmp:
        trainer, rows = capture([f"runtime.torch_threads={args.threads}", *args.overrides], Path(tmp))
    torch.set_num_threads(args.threads)
    times: dict[str, list[float]] = {"loop": [], "batched": []}
    worst = 0.0
    for round_ in range(args.rounds):
        start = time.perf_counter()
        _, looped = trainer.looped_score_statistics(rows)
        loop_s = time.perf_counter() - start
        start = time.perf_counter()
        _, batched = trainer.score_statistics(rows)
        batched_s = time.perf_counter() - start
        assert trainer.scores.batched, "the batched pass fell back to the loop"
        worst = max(worst, float(((batched - looped).abs() / looped.abs().clamp(min=1e-30)).max()))
        if round_ > 0:  # the first round warms both up (and verifies the batched pass)
            times["loop"].append(loop_s)
            times["batched"].append(batched_s)
    medians = {key: statistics.median(values) for key, values in times.items()}
    ratios = [a / b for a, b in zip(times["loop"], times["batched"], strict=True)]
    report = {
        "commit": head,
        "cpu": cpu()["model"],
        "cpu_cores": os.cpu_count(),
        "bf16_cpu_flags": sorted(flag for flag in cpu_flags() if flag.startswith("amx") or flag == "avx512_bf16"),
        "torch_threads": args.threads,
        "overrides": args.overrides,
        "responses": len(rows),
        "response_tokens_mean": sum(len(e.response_ids) for e in rows) / len(rows),
        "prompt_tokens_mean": sum(len(e.prompt_ids) for e in rows) / len(rows),
        "loadavg_before": load_before,
        "loadavg_after": load_average(),
        "seconds": times,
        "medians_s": medians,
        "ratio_median": statistics.median(ratios),
        "ratio_range": [min(ratios), max(ratios)],
        "max_relative_difference": worst,
    }
    print(
        f"{report['cpu']} ({report['cpu_cores']} cores; {', '.join(report['bf16_cpu_flags']) or 'no bf16/AMX flags'}), "
        f"commit {head}, {args.threads} torch thread(s); load average {load_before:.2f} before, "
        f"{report['loadavg_after']:.2f} after\n{len(rows)} responses, {report['response_tokens_mean']:.1f} response "
        f"and {report['prompt_tokens_mean']:.1f} prompt tokens on average; {len(ratios)} rounds after a warm-up\n"
        f"loop {medians['loop']:.3f} s, batched {medians['batched']:.3f} s (medians): {report['ratio_median']:.1f}x "
        f"(rounds {min(ratios):.1f}-{max(ratios):.1f}x); largest relative difference of the norms {worst:.2e}"
    )
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
