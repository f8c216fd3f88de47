"""Benchmark: the cost of HTTP per turn, agent endpoint (``task.name=agent``) against the built-in episodic path.

The same tool-arithmetic episodes, the same lean engine and seed, side by side in one process: the built-in
``run_episodes`` loop, and ``examples/calculator_agent.py`` (an openai-client loop, one thread per episode)
through the endpoint. Every agent asks every turn, so both make the same engine calls (the rows are equal:
tests/episodes/endpoint/test_agent_endpoint.py); the difference is HTTP, JSON, the agents' threads and the batching
barrier. ``--engine instant`` replaces the model by a scripted engine that answers at once (a calculator call,
then the tool's answer: two turns per episode), so what is left is the endpoint's own cost per turn. Also
counts vLLM prefill tokens with and without ``rollout.prefix_reuse`` (``--vllm``).

    flock /tmp/oprl-bench.lock python benchmarks/agent_endpoint.py --episodes 16 --repeats 5 [--engine instant] [--vllm]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from oprl.episodes.agents import task_episodes  # run_episodes itself runs an agent task's inner environment
from oprl.episodes.episode import run_episodes
from oprl.models.tiny import build_model, build_tokenizer
from oprl.rollout import Sampling
from oprl.rollout.lean_engine import LeanEngine
from oprl.tasks.agent import AgentTask
from oprl.tasks.tool_arithmetic import ToolArithmeticTask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--vllm", action="store_true")
    parser.add_argument("--engine", choices=["lean", "instant"], default="lean")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    lean = args.engine == "lean"
    engine = LeanEngine(build_model(tokenizer), tokenizer, max_new_tokens=10) if lean else InstantEngine(tokenizer)
    built_in = ToolArithmeticTask(train_size=64, test_size=8)
    agent = AgentTask(
        agent="examples/calculator_agent.py:rollout",
        problems={"name": "tool-arithmetic", "train_size": 64, "test_size": 8},
        batch_wait_s=5.0,
    )
    problems = list(built_in.problems("train"))[: args.episodes]
    limits = {"max_turns": 3, "max_tokens": 48}
    task_episodes(engine, tokenizer, agent, problems, seed=0, **limits)  # starts the endpoint
    times: dict[str, list[float]] = {"built_in": [], "endpoint": []}
    turns = 0
    for repeat in range(args.repeats):
        start = time.perf_counter()
        episodes = run_episodes(engine, tokenizer, built_in, problems, seed=repeat, **limits)
        times["built_in"].append(time.perf_counter() - start)
        start = time.perf_counter()
        served = task_episodes(engine, tokenizer, agent, problems, seed=repeat, **limits)
        times["endpoint"].append(time.perf_counter() - start)
        turns += sum(e.turns for e in episodes)
        assert [e.response_ids for e in served] == [e.response_ids for e in episodes], "the endpoint's rows differ"
    turns_per_repeat = turns / args.repeats
    built, served = (sorted(times[k])[len(times[k]) // 2] for k in ("built_in", "endpoint"))
    result = {
        "engine": args.engine,
        "episodes": args.episodes,
        "turns_per_batch": turns_per_repeat,
        "built_in_s": built,
        "endpoint_s": served,
        "ratio": served / built,
        "http_ms_per_turn": 1000 * (served - built) / turns_per_repeat,
        "load_before": os.getloadavg()[0],
    }
    if args.vllm:
        result |= prefill_counts(tokenizer)
    print(json.dumps(result, indent=1))


class InstantEngine:
    """Replies ``[2*3]`` to a question and the tool's answer to a tool turn, each ended by EOS, at once."""

    sampling, max_new_tokens = Sampling(), 10

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, prompt_ids, *, seed, sampling=None, batch_size=None, row_seeds=None):
        from oprl.rollout import Rollout

        rows = []
        for context in prompt_ids:
            text = self.tokenizer.decode(context)
            reply = text.split("<|tool|>")[-1].split("</s>")[0] if "<|tool|>" in text else "[2*3]"
            rows.append([*self.tokenizer(reply, add_special_tokens=False).input_ids, self.tokenizer.eos_token_id])
        texts = self.tokenizer.batch_decode(rows, skip_special_tokens=True)
        return Rollout(rows, [[-0.25] * len(r) for r in rows], texts, [False] * len(rows))


def prefill_counts(tokenizer) -> dict:
    """Prompt tokens handed to vLLM and those it computed, over 4-turn episodes of 300-token prompts."""
    from oprl.rollout.vllm_engine import VLLMEngine

    model = build_model(tokenizer, max_positions=1024)
    out = {}
    for reuse in (False, True):
        engine = VLLMEngine(model, tokenizer, max_new_tokens=12, prefix_reuse=reuse)
        contexts = [[4] + [10 + (i * 7 + r) % 80 for i in range(300)] for r in range(4)]
        needed = sum(len(c) for c in contexts)
        for turn in range(4):
            replies = engine.generate(contexts, seed=turn).response_ids
            contexts = [c + ids + [12 + turn] * 20 for c, ids in zip(contexts, replies, strict=True)]
            needed += 0 if turn == 3 else sum(len(ids) + 20 for ids in replies)
        out[f"prefill_reuse_{reuse}"] = engine.prefill_tokens
        out["prefill_needed"] = needed
    return out


if __name__ == "__main__":
    main()
