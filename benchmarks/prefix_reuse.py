"""Benchmark: prefill tokens per episode with and without ``rollout.prefix_reuse`` on ``bfcl-multi-turn``
demonstrations (counts, not time).

Each of the task's 25 ground-truth episodes (teacher-forced, SmolLM2's tokenizer and chat template) is replayed
turn by turn through an engine: at every model turn the engine gets the episode's context up to that turn,
as ``run_episodes`` hands it, and samples one token (discarded: the demonstration's reply follows). Counted:
the context tokens handed to the engine and those it prefilled. The model is a random 2-layer Llama with
SmolLM2's vocabulary and 8,192 positions: what is prefilled depends on the tokens and the engine's cache, not on
the weights, and a 135M model over 760k prefill tokens is beyond this 2-core machine. ``needed``: the prompt
and every environment token once (what one incremental pass prefills when the replies come from the decode
loop); here the demonstration's replies are not sampled, so reuse also prefills them (``model_tokens``).

    nice python benchmarks/prefix_reuse.py [--vllm] [--episodes N] [--json out.json]   # counts: no lock needed
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from oprl.episodes.episode import teacher_forced
from oprl.models.loading import load_pretrained
from oprl.models.tiny import build_model
from oprl.rollout.lean_engine import LeanEngine
from oprl.tasks.bfcl.multi_turn import BfclMultiTurnTask


def turn_contexts(episode) -> list[list[int]]:
    """The context of each model turn: the prompt and the response up to the turn's first model token."""
    mask, starts = episode.loss_mask, []
    for i, m in enumerate(mask):
        if m == 1 and (i == 0 or mask[i - 1] == 0):
            starts.append(i)
    return [episode.prompt_ids + episode.response_ids[:s] for s in starts]


def replay(engine, episodes, alone: bool) -> dict:
    """Every episode's turns in order, one episode at a time: the engine's counts and what it sampled. ``alone``:
    drop the kept caches between episodes (only an episode's own turns reuse; else later episodes also reuse
    the prompt prefix they share with earlier ones: the system prompt and the tool descriptions)."""
    before = engine.prompt_tokens, engine.prefill_tokens
    samples = []
    for index, episode in enumerate(episodes):
        if alone:
            engine.weights_changed()
        for turn, context in enumerate(turn_contexts(episode)):
            out = engine.generate([context], seed=1000 * index + turn)
            samples.append((out.response_ids[0], out.behavior_logprobs[0][0]))
    counts = {"prompt_tokens": engine.prompt_tokens - before[0], "prefill_tokens": engine.prefill_tokens - before[1]}
    return counts | {"samples": samples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm", action="store_true", help="also count the vllm engine (rollout.engine=vllm)")
    parser.add_argument("--json", default="")
    parser.add_argument("--episodes", type=int, default=0, help="only the first N episodes (0 = all 25)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # counts, not time: one thread leaves the machine to timed runs
    _, tokenizer = load_pretrained("smollm2-135m-instruct", dtype="float32", device="cpu", lora=None, seed=0)
    task = BfclMultiTurnTask()
    problems = [*task.problems("train"), *task.problems("test")]
    problems = problems[: args.episodes or len(problems)]
    episodes = [teacher_forced(tokenizer, task, p, task.demonstration(p)) for p in problems]
    n = len(episodes)
    # needed: each turn's context once, less the model tokens in it (a sampler computes those in its decode steps)
    needed = sum(
        len(turn_contexts(e)[-1]) - e.loss_mask[: len(turn_contexts(e)[-1]) - len(e.prompt_ids)].count(1)
        for e in episodes
    )
    model_tokens = sum(e.loss_mask.count(1) for e in episodes)
    turns = sum(len(turn_contexts(e)) for e in episodes)
    model = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, max_positions=8192)
    result: dict = {
        "episodes": n,
        "turns_per_episode": turns / n,
        "needed_per_episode": needed / n,
        "model_tokens_per_episode": model_tokens / n,
        "load_before": os.getloadavg()[0],
    }
    engines = {"lean": lambda reuse: LeanEngine(model, tokenizer, max_new_tokens=1, prefix_reuse=reuse, kv_cache_gb=4)}
    if args.vllm:
        from oprl.rollout.vllm_engine import VLLMEngine

        engines["vllm"] = lambda reuse: VLLMEngine(model, tokenizer, max_new_tokens=1, prefix_reuse=reuse)
    for name, build in engines.items():
        without = replay(build(False), episodes, alone=True)
        result[f"{name}_without_per_episode"] = without["prefill_tokens"] / n
        result[f"{name}_without_ratio"] = without["prefill_tokens"] / needed
        result["prompt_tokens_per_episode"] = without["prompt_tokens"] / n
        for alone in (True, False):
            counts = replay(build(True), episodes, alone=alone)
            key = f"{name}_with{'' if alone else '_shared'}"
            result[f"{key}_per_episode"] = counts["prefill_tokens"] / n
            result[f"{key}_ratio"] = counts["prefill_tokens"] / needed
            pairs = list(zip(without["samples"], counts["samples"], strict=True))
            result[f"{key}_same_tokens"] = all(a[0] == b[0] for a, b in pairs)
            result[f"{key}_max_logprob_diff"] = max(abs(a[1] - b[1]) for a, b in pairs)
    result["load_after"] = os.getloadavg()[0]
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
