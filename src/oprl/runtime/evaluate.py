"""Evaluation: pass@1 on a task's test split (one sample per problem at the eval temperature)."""

from __future__ import annotations

from oprl.models.chat import encode_prompt


def evaluate(
    engine, task, tokenizer, *, num_problems: int, temperature: float, seed: int, batch_size: int = 512,
    top_p: float | None = None,
):
    """``{"accuracy", "format", "response_length"}`` averaged over the first ``num_problems`` test problems."""
    problems = list(task.problems("test"))[:num_problems]
    prompts = [encode_prompt(tokenizer, p.messages) for p in problems]
    rollout = engine.generate(prompts, seed=seed, temperature=temperature, top_p=top_p, batch_size=batch_size)
    rewards = task.score(problems, rollout.texts)
    n = len(problems)
    return {
        "accuracy": sum(r.components.get("correct", r.total) for r in rewards) / n,
        "reward": sum(r.total for r in rewards) / n,
        "format": sum(r.components.get("format", 1.0) for r in rewards) / n,
        "response_length": sum(len(r) for r in rollout.response_ids) / n,
        "num_problems": float(n),
    }
