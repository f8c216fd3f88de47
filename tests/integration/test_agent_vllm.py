"""Agent episodes on vLLM: each request is seeded per row from (batch seed, turn, episode), so the episodes
do not depend on how the agents' requests were batched (every agent per call, or each as it comes)."""

import pytest
import torch

pytest.importorskip("vllm")

from oprl.episodes.agents import task_episodes
from oprl.models.tiny import build_model, build_tokenizer
from oprl.rollout.vllm_engine import VLLMEngine
from oprl.tasks import build_task
from oprl.tasks.agent import AgentTaskConfig


def test_vllm_agent_episodes_do_not_depend_on_batching():
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    engine = VLLMEngine(build_model(tokenizer, max_positions=256), tokenizer, max_new_tokens=10)
    results = []
    for wait in (5.0, 0.0):  # every agent in one call per turn; then requests as they arrive
        task = build_task(
            AgentTaskConfig(
                agent="examples/calculator_agent.py:rollout",
                batch_wait_s=wait,
                problems={"name": "tool-arithmetic", "train_size": 16, "test_size": 4},
            )
        )
        episodes = task_episodes(
            engine, tokenizer, task, list(task.problems("train"))[:8], seed=11, max_turns=3, max_tokens=96
        )
        results.append([(e.response_ids, e.loss_mask, e.behavior_logprobs, e.outcome.total) for e in episodes])
    assert results[0] == results[1]
