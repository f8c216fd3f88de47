"""What one in-flight weight switch costs each engine: a generate call that switches weights at decode step
``--switch-step`` against the same call without a switch, per engine and KV setting, in one run (medians of
``--repeats`` rotated rounds). docs/performance.md section 11 has the figures.

- ``lean keep``: the stale cache stays; the switch costs a weights load only.
- ``lean recompute``: one prefill of prompt + tokens so far under the new weights.
- ``vllm recompute``: abort and resume (``VLLMEngine._switching``): the call ends at the switch step, the
  weights are reloaded into vLLM, and the unfinished rows are resubmitted with their prefixes (a prefill).

Both policies are the embedded tiny model's architecture with random weights (seeds 3 and 4): they rarely
emit EOS, but not never, and the new policy stops rows at other points than the old one, so the table also
gives the time per sampled token.

Run:  flock /tmp/oprl-bench.lock python benchmarks/partial_switch_cost.py [--rows 64] [--max-new-tokens 48]
      [--switch-step 8] [--repeats 5] [--engines lean vllm] (one engine per run: see section 11)
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from oprl.checkpoint.board import post_weights
from oprl.explorer.switcher import Switcher
from oprl.models.chat import encode_prompt
from oprl.models.tiny import build_model, build_tokenizer


def engines(names: list[str], model, tokenizer, limit: int) -> dict:
    built = {}
    for name in names:
        if name == "lean":
            from oprl.rollout import LeanEngine

            built[name] = LeanEngine(copy.deepcopy(model), tokenizer, max_new_tokens=limit)
        else:
            from oprl.rollout import VLLMEngine

            built[name] = VLLMEngine(copy.deepcopy(model), tokenizer, max_new_tokens=limit)
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--switch-step", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--engines", nargs="+", default=["lean", "vllm"], choices=["lean", "vllm"])
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    tokenizer = build_tokenizer()
    old = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, seed=3)
    new = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, seed=4)
    texts = ["1+2=", "35+47-9=", "7=", "123*4-56+7="]
    prompts = [encode_prompt(tokenizer, [{"role": "user", "content": texts[i % 4]}]) for i in range(args.rows)]
    built = engines(args.engines, old, tokenizer, args.max_new_tokens)
    settings = {"lean": ("none", "keep", "recompute"), "vllm": ("none", "recompute")}  # vLLM cannot keep
    cases = [(e, kv) for e in args.engines for kv in settings[e]]
    times: dict[tuple[str, str], list[float]] = {case: [] for case in cases}
    steps: dict[tuple[str, str], list[int]] = {case: [] for case in cases}
    with tempfile.TemporaryDirectory() as tmp:
        board = Path(tmp)
        post_weights(board, 1, new.state_dict())
        for engine in built.values():
            engine.generate(prompts, seed=0)  # warm-up (vLLM's first call, allocator)
        for repeat in range(args.repeats):
            for name, kv in cases:
                engine = built[name]
                engine.load_weights(old.state_dict())  # every call starts from the old policy
                switch = None if kv == "none" else Switcher(engine, board, 0, at_step=args.switch_step, target=1, kv=kv)
                start = time.perf_counter()
                rollout = engine.generate(prompts, seed=repeat, switch=switch)
                times[(name, kv)].append(time.perf_counter() - start)
                steps[(name, kv)].append(sum(map(len, rollout.response_ids)))
                assert switch is None or max(max(v) for v in rollout.behavior_versions) == 1
    print(
        f"load average before/after: {load:.2f}/{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; {args.rows} rows x "
        f"{args.max_new_tokens} tokens, switch at step {args.switch_step}, medians of {args.repeats}\n"
    )
    print("| engine | switch | s/call | vs no switch | tokens/call | ms per 1k tokens | vs no switch |")
    print("|---|---|---|---|---|---|---|")
    for name, kv in cases:
        median, base = statistics.median(times[(name, kv)]), statistics.median(times[(name, "none")])
        per = statistics.median(1e6 * t / n for t, n in zip(times[(name, kv)], steps[(name, kv)], strict=True))
        per_base = statistics.median(
            1e6 * t / n for t, n in zip(times[(name, "none")], steps[(name, "none")], strict=True)
        )  # per token: the new weights may stop rows at other points
        print(
            f"| {name} | {kv} | {median:.3f} | {median / base:.2f} | {statistics.mean(steps[(name, kv)]):.0f} | "
            f"{per:.1f} | {per / per_base:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
