"""The explorer: picks prompts, samples K responses per prompt, scores them, and emits experiences; and
``ExplorerWorker``, the role a backend hosts (loads the weights it is sent, then explores one batch).

It walks the train split in seeded epoch-wise permutations (so every problem is seen once per epoch) and
seeds each batch's sampling from (run seed, trainer step), which makes a batch independent of when it is
generated: the same step gets the same prompts and random stream in any execution order.
"""

from __future__ import annotations

import random
import time
from typing import Any

from oprl.config import RunConfig
from oprl.models.chat import encode_problem
from oprl.runtime.episodes import run_episodes
from oprl.runtime.experience import Experience, batch_metrics
from oprl.runtime.schedule import stream_seed
from oprl.runtime.transport import Clock, load_model, make_engine
from oprl.tasks import build_task
from oprl.tasks.base import EpisodicTask


class Explorer:
    def __init__(
        self,
        task,
        tokenizer,
        engine,
        *,
        prompts_per_step: int,
        group_size: int,
        seed: int,
        max_turns: int = 1,
        max_episode_tokens: int = 256,
    ):
        self.task = task
        self.tokenizer = tokenizer
        self.engine = engine
        self.prompts_per_step = prompts_per_step
        self.group_size = group_size
        self.seed = seed
        self.max_turns, self.max_episode_tokens = max_turns, max_episode_tokens
        self.problems = task.problems("train")
        self._prompt_cache: dict[str, list[int]] = {}

    def problems_for_step(self, step: int):
        """The prompts of trainer step ``step``: a contiguous slice of that epoch's permutation."""
        count = len(self.problems)
        first = (step - 1) * self.prompts_per_step
        chosen = []
        for position in range(first, first + self.prompts_per_step):
            epoch, index = divmod(position, count)
            chosen.append(self.problems[self._permutation(epoch)[index]])
        return chosen

    def _permutation(self, epoch: int) -> list[int]:
        if getattr(self, "_perm_epoch", None) != epoch:
            order = list(range(len(self.problems)))
            random.Random(stream_seed(self.seed, epoch)).shuffle(order)
            self._perm_epoch, self._perm = epoch, order
        return self._perm

    def explore(self, step: int, version: int) -> tuple[list[Experience], dict[str, float]]:
        """Experiences for trainer step ``step`` sampled from the current weights (``version``)."""
        start = time.perf_counter()
        problems = self.problems_for_step(step)
        rows = [p for p in problems for _ in range(self.group_size)]
        if isinstance(self.task, EpisodicTask):
            return self._explore_episodes(step, version, rows, start)
        prompt_ids = [self._encode(p) for p in rows]
        rollout = self.engine.generate(prompt_ids, seed=stream_seed(self.seed, step))
        generated = time.perf_counter()
        rewards = self.task.score(rows, rollout.texts)
        experiences = [
            Experience(
                prompt_ids=prompt_ids[i],
                response_ids=rollout.response_ids[i],
                behavior_logprobs=rollout.behavior_logprobs[i],
                reward=rewards[i].total,
                reward_components=dict(rewards[i].components),
                group_id=(step - 1) * self.prompts_per_step + i // self.group_size,
                task_id=rows[i].task_id,
                policy_version=version,
                response_text=rollout.texts[i],
                truncated=rollout.truncated[i],
            )
            for i in range(len(rows))
        ]
        tokens = sum(len(r) for r in rollout.response_ids)
        timing = {
            "generate_s": generated - start,
            "reward_s": time.perf_counter() - generated,
            "generated_tokens": float(tokens),
        }
        return experiences, timing

    def _explore_episodes(self, step: int, version: int, rows, start: float):
        """Multi-turn: K episodes per problem against the task's environment (``oprl.runtime.episodes``)."""
        episodes = run_episodes(
            self.engine,
            self.tokenizer,
            self.task,
            rows,
            seed=stream_seed(self.seed, step),
            max_turns=self.max_turns,
            max_tokens=self.max_episode_tokens,
        )
        experiences = [
            Experience(
                prompt_ids=e.prompt_ids,
                response_ids=e.response_ids,
                behavior_logprobs=e.behavior_logprobs,
                reward=e.outcome.total,
                reward_components=dict(e.outcome.components),
                group_id=(step - 1) * self.prompts_per_step + i // self.group_size,
                task_id=rows[i].task_id,
                policy_version=version,
                response_text=self.tokenizer.decode(e.response_ids, skip_special_tokens=True),
                truncated=e.truncated,
                loss_mask=e.loss_mask,
                extra={"turns": e.turns},
            )
            for i, e in enumerate(episodes)
        ]
        timing = {
            "generate_s": time.perf_counter() - start,
            "reward_s": 0.0,  # rewards come with the episodes
            "generated_tokens": float(sum(sum(e.loss_mask) for e in episodes)),
        }
        return experiences, timing

    def _encode(self, problem) -> list[int]:
        if problem.task_id not in self._prompt_cache:
            self._prompt_cache[problem.task_id] = encode_problem(self.tokenizer, problem)
        return self._prompt_cache[problem.task_id]


class ExplorerWorker:
    """The explorer role: its own copy of the policy, loaded with the weights the driver sends along."""

    def __init__(self, config: RunConfig, model_path: str, index: int):
        self.clock = Clock()
        self.index = index
        task = build_task(config.task)
        self.model, tokenizer = load_model(config, model_path, dtype=config.rollout.dtype)  # the sampler's precision
        self.engine = make_engine(config, self.model, tokenizer)
        self.explorer = Explorer(
            task,
            tokenizer,
            self.engine,
            prompts_per_step=config.rollout.prompts_per_step,
            group_size=config.rollout.group_size,
            seed=config.seed,
            max_turns=config.rollout.max_turns,
            max_episode_tokens=config.rollout.max_episode_tokens,
        )

    def ping(self) -> int:
        return self.index

    def explore(self, batch: int, version: int, weights: dict | None = None):
        """``(experiences, info)`` for batch ``batch``, loading ``weights`` (version ``version``) first if given."""
        with self.clock.work():
            start = time.perf_counter()
            if weights is not None:
                self.engine.load_weights(weights)
            synced = time.perf_counter()
            experiences, timing = self.explorer.explore(batch, version)
            for exp in experiences:
                exp.extra["explorer"] = self.index
        info: dict[str, Any] = timing | {
            "sync_s": synced - start,
            "explorer": self.index,
            "batch": batch,
            "version": version,
        }
        info["summary"] = batch_metrics(experiences)
        return experiences, info | {"clock": self.clock.totals()}
