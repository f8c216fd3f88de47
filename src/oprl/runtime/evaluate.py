"""Evaluation: pass@1 on a task's test split (one sample per problem at the eval temperature)."""

from __future__ import annotations

from oprl.models.chat import encode_problem
from oprl.runtime.episodes import run_episodes
from oprl.tasks.base import EpisodicTask


def evaluate(
    engine, task, tokenizer, *, num_problems: int, temperature: float, seed: int, batch_size: int = 512,
    top_p: float | None = None, max_turns: int = 1, max_episode_tokens: int = 256,
):
    """``{"accuracy", "format", "response_length"}`` averaged over the first ``num_problems`` test problems
    (multi-turn tasks: one episode each, ``response_length`` counting every token after the prompt)."""
    problems = list(task.problems("test"))[:num_problems]
    n = len(problems)
    if isinstance(task, EpisodicTask):
        episodes = run_episodes(engine, tokenizer, task, problems, seed=seed, max_turns=max_turns,
                                max_tokens=max_episode_tokens, temperature=temperature, top_p=top_p)
        rewards, lengths = [e.reward for e in episodes], [len(e.response_ids) for e in episodes]
    else:
        prompts = [encode_problem(tokenizer, p) for p in problems]
        rollout = engine.generate(prompts, seed=seed, temperature=temperature, top_p=top_p, batch_size=batch_size)
        rewards, lengths = task.score(problems, rollout.texts), [len(r) for r in rollout.response_ids]
    return {
        "accuracy": sum(r.components.get("correct", r.total) for r in rewards) / n,
        "reward": sum(r.total for r in rewards) / n,
        "format": sum(r.components.get("format", 1.0) for r in rewards) / n,
        "response_length": sum(lengths) / n,
        "num_problems": float(n),
    }
