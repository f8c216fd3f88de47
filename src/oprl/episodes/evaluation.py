"""Evaluation: pass@1 on a task's test split (one sample per problem at the eval temperature), as a function
the trainer (during training), the evaluator role (``mode=eval``) and the warm start call.
"""

from __future__ import annotations

import time

from oprl.config import RunConfig
from oprl.episodes.agents import close_task, endpoint_of, task_episodes
from oprl.models.chat import encode_problem
from oprl.models.truncation import Sampling
from oprl.schedule import stream_seed
from oprl.tasks.base import EpisodicTask

EVAL_SEED_OFFSET = 7_777_777
"""Evaluation draws from a stream of its own, apart from the explorers' (which use the step alone)."""


def evaluate(
    engine,
    task,
    tokenizer,
    *,
    num_problems: int,
    sampling: Sampling,
    seed: int,
    samples: int = 1,
    batch_size: int = 512,
    max_turns: int = 1,
    max_episode_tokens: int = 256,
    episode_timeout: float = 300.0,
):
    """``{"accuracy", "reward", "format", "response_length", "num_problems"}`` averaged over ``samples`` (k)
    samples of each of the first ``num_problems`` (n) test problems (multi-turn tasks: one episode each,
    ``response_length`` counting every token after the prompt). With c_i of problem i's k samples correct,

        accuracy = (1/n) Σ_i c_i / k     pass_at_k = (1/n) Σ_i [c_i > 0]     majority = (1/n) Σ_i [c_i > k/2]

    (the last two only for k > 1). The k samples of a problem are k consecutive rows of one call, so k = 1
    samples exactly the rows it always did. They are drawn from ``sampling`` in place of the engine's own
    (``Sampling.of(config.eval)``: eval.temperature, eval.top_p and no top-k, never the rollouts'). Evaluates
    the engine's model as it is now: the trainer's optimizer (or a checkpoint load) changed it in place without
    telling the engine."""
    engine.weights_changed()
    problems = list(task.problems("test"))[:num_problems]
    n = len(problems)
    problems = [p for p in problems for _ in range(samples)]
    if isinstance(task, EpisodicTask):
        episodes = []  # batch_size episodes at a time; each chunk seeds its turns apart from the others
        for chunk, first in enumerate(range(0, len(problems), batch_size)):
            episodes += task_episodes(
                engine,
                tokenizer,
                task,
                problems[first : first + batch_size],
                seed=stream_seed(chunk, seed),  # chunks apart by stream_seed's constant (one home)
                max_turns=max_turns,
                max_tokens=max_episode_tokens,
                sampling=sampling,
                episode_timeout=episode_timeout,
            )
        rewards, lengths = [e.outcome for e in episodes], [len(e.response_ids) for e in episodes]
    else:
        prompts = [encode_problem(tokenizer, p) for p in problems]
        rollout = engine.generate(prompts, seed=seed, sampling=sampling, batch_size=batch_size)
        rewards, lengths = task.score(problems, rollout.texts), [len(r) for r in rollout.response_ids]
    rows = len(rewards)  # n * k
    correct = [r.components.get("correct", r.total) for r in rewards]
    result = {
        "accuracy": sum(correct) / rows,
        "reward": sum(r.total for r in rewards) / rows,
        "format": sum(r.components.get("format", 1.0) for r in rewards) / rows,
        "response_length": sum(lengths) / rows,
        "num_problems": float(n),
    }
    if samples > 1:
        solved = [sum(correct[i * samples : (i + 1) * samples]) for i in range(n)]  # c_i
        result["pass_at_k"] = sum(c > 0 for c in solved) / n
        result["majority"] = sum(c > samples / 2 for c in solved) / n
    return result


def evaluation_row(config: RunConfig, engine, task, tokenizer, step: int) -> dict[str, float]:
    """The ``eval/*`` metrics of ``step`` as ``metrics.jsonl`` logs them, plus ``perf/eval_s``. Sampling is
    seeded per step (``eval.seed`` fixes one seed for every evaluation instead)."""
    cfg = config.eval
    start = time.perf_counter()
    agent = getattr(task, "name", "") == "agent"
    if agent and config.mode != "eval":  # task.port is the explorer's endpoint: evaluation's takes a free one
        endpoint_of(task, tokenizer, port=0)
    try:
        result = evaluate(
            engine,
            task,
            tokenizer,
            num_problems=cfg.num_problems,
            sampling=Sampling.of(cfg),
            samples=cfg.samples,
            batch_size=cfg.batch_size,
            max_turns=config.rollout.max_turns,
            max_episode_tokens=config.rollout.max_episode_tokens,
            episode_timeout=config.rollout.episode_timeout,
            seed=stream_seed(config.seed, EVAL_SEED_OFFSET + step) if cfg.seed is None else cfg.seed,
        )
    finally:  # an agent task's endpoint listens only while its evaluation runs
        if agent:
            close_task(task)
    return {f"eval/{k}": v for k, v in result.items()} | {"perf/eval_s": time.perf_counter() - start}
