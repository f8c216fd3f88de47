"""The explorer: picks prompts, samples K responses per prompt, scores them, and emits experiences; and
``ExplorerWorker``, the role a backend hosts (loads the weights it is sent, then explores one batch).

It walks the train split in seeded epoch-wise permutations (so every problem is seen once per epoch) and
seeds each batch's sampling from (run seed, trainer step), which makes a batch independent of when it is
generated: the same step gets the same prompts and random stream in any execution order.

A batch comes back as its experiences plus an ``ExploreResult`` (where, when and how fast it was generated,
its summary), which the driver turns into the row's ``perf/*``, ``reward/*`` and ``response/*`` columns.
Both are plain dataclasses, so they pickle across process and Ray workers.
"""

from __future__ import annotations

import random
import time

from oprl.config import RunConfig
from oprl.episodes.agents import close_task, task_episodes
from oprl.episodes.judge import JudgedTask, JudgeSource, judged
from oprl.explorer.shaping import Shaping, dynamic_batch, extra_problems, round_seed
from oprl.explorer.switcher import Switcher
from oprl.messages import Experience, ExploreResult, SwitchPlan, Timing, batch_metrics
from oprl.models.chat import encode_problem
from oprl.models.loading import resolve_device
from oprl.models.precision import resolve_dtype
from oprl.schedule import stream_seed
from oprl.tasks import build_task
from oprl.tasks.base import EpisodicTask
from oprl.worker_parts import SAMPLING_LOCK, Clock, load_model, make_engine


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
        truncated_reward: float | None = None,
        shaping: Shaping | None = None,
        episode_timeout: float = 300.0,
    ):
        self.task = task
        self._switcher: Switcher | None = None
        """Partial rollouts: the batch's ``Switcher``, which may load newer weights between decode steps."""
        self.tokenizer = tokenizer
        self.engine = engine
        self.prompts_per_step = prompts_per_step
        self.group_size = group_size
        self.seed = seed
        self.max_turns, self.max_episode_tokens = max_turns, max_episode_tokens
        self.shaping = shaping or Shaping(truncated_reward=truncated_reward)
        self.episode_timeout = episode_timeout
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

    def explore(self, step: int, version: int, switch: SwitchPlan | None = None) -> tuple[list[Experience], Timing]:
        """Experiences for trainer step ``step`` sampled from the current weights (``version``); ``switch``:
        the weights that take over mid-batch under partial rollouts (the synchronizer's plan for this batch)."""
        problems = self.problems_for_step(step)
        self._switcher = None if switch is None else Switcher.of(switch, self.engine, version, SAMPLING_LOCK)
        if not self.shaping.dynamic_sampling:
            return self._waits(*self.sample(step, version, problems, stream_seed(self.seed, step)))
        extras = extra_problems(self.problems, problems, self.seed, step, self.shaping.max_extra_prompts)
        experiences, timing, counts = dynamic_batch(
            lambda chosen, index: self.sample(step, version, chosen, round_seed(self.seed, step, index)),
            problems,
            extras,
            group_size=self.group_size,
            first_group_id=(step - 1) * self.prompts_per_step,
        )
        timing.shaping = timing.shaping | counts  # the rounds' episode/lost, summed by Timing.__add__
        return self._waits(experiences, timing)

    def _waits(self, experiences: list[Experience], timing: Timing) -> tuple[list[Experience], Timing]:
        """``timing`` with the batch's switch waits (its one switcher's, every round), under partial rollouts."""
        if self._switcher is not None:
            timing.switch_wait_s = self._switcher.waited
        return experiences, timing

    def sample(self, step: int, version: int, problems: list, seed: int) -> tuple[list[Experience], Timing]:
        """K responses to each of ``problems``, sampled with ``seed``, scored, as the experiences of ``step``."""
        start = time.perf_counter()
        rows = [p for p in problems for _ in range(self.group_size)]
        if isinstance(self.task, EpisodicTask):
            return self._explore_episodes(step, version, rows, start, seed)
        prompt_ids = [self._encode(p) for p in rows]
        rollout = self.engine.generate(prompt_ids, seed=seed, **self._switch())
        generated = time.perf_counter()
        rewards = self.task.score(rows, rollout.texts)
        totals = [
            self.shaping.reward(reward.total, len(ids), cut)
            for reward, ids, cut in zip(rewards, rollout.response_ids, rollout.truncated, strict=True)
        ]
        experiences = [
            Experience(
                prompt_ids=prompt_ids[i],
                response_ids=rollout.response_ids[i],
                behavior_logprobs=rollout.behavior_logprobs[i],
                reward=totals[i],
                reward_components=dict(rewards[i].components),
                group_id=(step - 1) * self.prompts_per_step + i // self.group_size,
                task_id=rows[i].task_id,
                policy_version=self._oldest(version, rollout.behavior_versions, i),
                response_text=rollout.texts[i],
                truncated=rollout.truncated[i],
                behavior_versions=rollout.behavior_versions[i] if rollout.behavior_versions else None,
                top_k_ids=rollout.top_k_ids[i] if rollout.top_k_ids is not None else None,
                top_k_logprobs=rollout.top_k_logprobs[i] if rollout.top_k_logprobs is not None else None,
            )
            for i in range(len(rows))
        ]
        tokens = sum(len(r) for r in rollout.response_ids)
        judge_s = self.task.judge_s if isinstance(self.task, JudgedTask) else None
        return experiences, Timing(generated - start, time.perf_counter() - generated, float(tokens), judge_s=judge_s)

    def _explore_episodes(
        self, step: int, version: int, rows, start: float, seed: int
    ) -> tuple[list[Experience], Timing]:
        """Multi-turn: K episodes per problem against the task's environment (``oprl.episodes.episode``)."""
        episodes = task_episodes(
            self.engine,
            self.tokenizer,
            self.task,
            rows,
            seed=seed,
            max_turns=self.max_turns,
            max_tokens=self.max_episode_tokens,
            episode_timeout=self.episode_timeout,
            **self._switch(),
        )
        # An episode lost to the infrastructure (an agent's connection error) measures no policy: it leaves its
        # group, so the others' advantages are computed on real rewards (all lost: kept, every reward 0).
        kept = [i for i, e in enumerate(episodes) if not e.lost] or list(range(len(episodes)))
        experiences = [
            Experience(
                prompt_ids=e.prompt_ids,
                response_ids=e.response_ids,
                behavior_logprobs=e.behavior_logprobs,
                reward=e.outcome.total,
                reward_components=dict(e.outcome.components),
                group_id=(step - 1) * self.prompts_per_step + i // self.group_size,
                task_id=rows[i].task_id,
                policy_version=self._oldest(version, [e.behavior_versions for e in episodes], i),
                response_text=self.tokenizer.decode(e.response_ids, skip_special_tokens=True),
                truncated=e.truncated,
                loss_mask=e.loss_mask,
                extra={"turns": e.turns, **e.info},
                behavior_versions=e.behavior_versions or None,
                top_k_ids=e.top_k_ids if e.top_k else None,  # episodes under rollout.record_top_k
                top_k_logprobs=e.top_k_logprobs if e.top_k else None,
            )
            for i, e in ((i, episodes[i]) for i in kept)
        ]
        tokens = float(sum(sum(e.loss_mask) for e in episodes))
        # Counted where episodes can be lost (the agent task), so a built-in environment's rows equal the same
        # rows read back from a store (mode=offline), which has no such count.
        lost = (
            {"episode/lost": float(sum(e.lost for e in episodes))}
            if getattr(self.task, "loses_episodes", False)
            else {}
        )
        return experiences, Timing(time.perf_counter() - start, 0.0, tokens, lost)  # rewards come with the episodes

    def _oldest(self, version: int, versions: list[list[int]] | None, row: int) -> int:
        """A row's ``policy_version``: the version of its oldest token. That is the batch's ``version`` except
        when free-running (sync.mode=async) loaded a newer one before the row's first token; the scheduled
        rule never switches before decode step ``switch_step`` > 0, and the driver checks that its rows
        start from the scheduled version."""
        if self._switcher is None or not self._switcher.free or not versions or not versions[row]:
            return version
        return min(versions[row])

    def _switch(self) -> dict:
        """``{"switch": Switcher}`` for ``engine.generate`` under partial rollouts (the batch's one switcher:
        its decode steps add up over every call, dynamic-sampling rounds included), else nothing."""
        return {} if self._switcher is None else {"switch": self._switcher}

    def _encode(self, problem) -> list[int]:
        if problem.task_id not in self._prompt_cache:
            self._prompt_cache[problem.task_id] = encode_problem(self.tokenizer, problem)
        return self._prompt_cache[problem.task_id]


class ExplorerWorker:
    """The explorer role: its own copy of the policy, loaded with the weights the driver sends along; with
    ``judge.path``, ``judge`` is its line to the run's judge (None: a judge of its own, built here)."""

    def __init__(
        self,
        config: RunConfig,
        model_path: str,
        index: int,
        judge: JudgeSource | None = None,
    ):
        self.clock = Clock()
        self.index = index
        task = judged(build_task(config.task), config, model_path, judge)  # judge.path: a model adds its verdict
        # The sampler's precision; ``auto`` resolves on the machine this explorer runs on.
        dtype = resolve_dtype(config.rollout.dtype, resolve_device(config.model.device))
        self.model, tokenizer = load_model(config, model_path, dtype=dtype)
        # Every row carries the top-K: single-turn rollouts, built-in multi-turn episodes and agent episodes alike.
        self.engine = make_engine(config, self.model, tokenizer, record_top_k=config.rollout.record_top_k)
        self.explorer = Explorer(
            task,
            tokenizer,
            self.engine,
            prompts_per_step=config.rollout.prompts_per_step,
            group_size=config.rollout.group_size,
            seed=config.seed,
            max_turns=config.rollout.max_turns,
            max_episode_tokens=config.rollout.max_episode_tokens,
            shaping=Shaping.of(config.rollout),
            episode_timeout=config.rollout.episode_timeout,
        )

    def ping(self) -> int:
        return self.index

    def release(self) -> None:
        """End of the run (``backends.actor.release``): an agent task's endpoint stops listening."""
        close_task(self.explorer.task)

    def explore(
        self, batch: int, version: int, weights: dict | None = None, switch: SwitchPlan | None = None
    ) -> tuple[list[Experience], ExploreResult]:
        """The experiences of batch ``batch`` and their ``ExploreResult``, loading ``weights`` (version
        ``version``) first if given."""
        with self.clock.work():
            start = time.perf_counter()
            if weights is not None:
                self.engine.load_weights(weights)
            synced = time.perf_counter()
            experiences, timing = self.explorer.explore(batch, version, switch)
            if timing.switch_wait_s:  # waiting at a switch for the trainer's version is idle time, not work
                self.clock.busy -= timing.switch_wait_s
                self.clock.idle += timing.switch_wait_s
            for exp in experiences:
                exp.extra["explorer"] = self.index
        summary = batch_metrics(experiences)
        clock = self.clock.totals()
        result = ExploreResult(
            explorer=self.index,
            batch=batch,
            version=version,
            timing=timing,
            sync_s=synced - start,
            summary=summary,
            busy_s=clock["busy_s"],
            idle_s=clock["idle_s"],
        )
        return experiences, result
