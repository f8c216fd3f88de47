"""Data shaping on the explorer's side, from DAPO (Yu et al. 2025, arXiv 2503.14476): what a batch is made of.

**Dynamic sampling** (``rollout.dynamic_sampling``). A group whose K rewards are all equal has every advantage
zero under a group baseline: it costs a batch slot and teaches nothing. The explorer drops such groups and
samples replacement prompts with the *same* weights (the batch's policy version), until the batch again holds
``prompts_per_step`` groups with mixed rewards, so the step keeps its batch size and the off-policy schedule is
unchanged (the lag of every row is the batch's). Deterministic, so a batch stays a function of (seed, step,
weights):

- the replacement prompts of step t are the train problems in the order of a permutation seeded by (run seed,
  t), skipping the step's own prompts (``extra_problems``): replacement j is always the same problem;
- round r of step t (r = 0: the step's own prompts) samples with seed ``round_seed(seed, t, r)``
  (r = 0 is the ordinary ``stream_seed(seed, t)``), each round drawing as many prompts as groups are missing;
- at most ``rollout.dynamic_max_extra_prompts`` replacements are drawn per step; if the batch is still short,
  the remaining slots take the dropped groups in the order they were sampled (their advantages are zero, as
  without dynamic sampling), and the row says how many (``dynamic/degenerate_kept``);
- kept groups keep their sampling order (the step's own first) and get the slots' group ids.

Metrics: ``dynamic/extra_prompts`` (replacements drawn), ``dynamic/degenerate_groups`` (all-equal groups
sampled, every round), ``dynamic/degenerate_kept`` (left in the batch because the cap was reached).

**Overlong soft penalty** (``rollout.overlong_buffer``, ``rollout.overlong_penalty``): the training reward of a
single-turn reply of L tokens, with limit L_max = max_new_tokens and buffer B, adds
``-penalty * clip(L - (L_max - B), 0, B) / B``: 0 up to L_max - B tokens, linear down to -penalty at the
limit (a cut reply). An alternative to ``rollout.truncated_reward``, which replaces the score of a cut reply
only. The formula is ``oprl.tasks.rewards.builtin.overlong_penalty``.

Not here: sampling itself (``Explorer.sample``), advantages and the trainer's drop rules (RED-Drop).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from typing import Any

from oprl.messages import Experience
from oprl.schedule import stream_seed
from oprl.tasks.rewards.builtin import overlong_penalty

ROUND_STRIDE = 1 << 32
"""Seed distance between dynamic-sampling rounds of a step: no extra round reuses any step's first-round seed."""


@dataclasses.dataclass(frozen=True)
class Shaping:
    """The data-shaping settings of ``rollout`` (see the module docstring)."""

    truncated_reward: float | None = None
    max_new_tokens: int = 1
    overlong_buffer: int = 0
    overlong_penalty: float = 1.0
    dynamic_sampling: bool = False
    max_extra_prompts: int = 0

    @classmethod
    def of(cls, rollout) -> Shaping:
        """From the ``rollout`` config section."""
        return cls(
            truncated_reward=rollout.truncated_reward,
            max_new_tokens=rollout.max_new_tokens,
            overlong_buffer=rollout.overlong_buffer,
            overlong_penalty=rollout.overlong_penalty,
            dynamic_sampling=rollout.dynamic_sampling,
            max_extra_prompts=rollout.dynamic_max_extra_prompts,
        )

    def reward(self, task_reward: float, length: int, cut: bool) -> float:
        """The training reward of a single-turn reply of ``length`` tokens (``cut`` at max_new_tokens) that the
        task scored ``task_reward``."""
        if cut and self.truncated_reward is not None:
            return self.truncated_reward
        return task_reward + overlong_penalty(length, self.max_new_tokens, self.overlong_buffer, self.overlong_penalty)


def round_seed(seed: int, step: int, round_index: int) -> int:
    """Sampling seed of dynamic-sampling round ``round_index`` of ``step`` (round 0 = the step's own seed)."""
    return stream_seed(seed, step) + round_index * ROUND_STRIDE


def extra_problems(problems: Sequence, own: Sequence, seed: int, step: int, count: int) -> list:
    """The first ``count`` replacement prompts of ``step``: ``problems`` in an order seeded by (seed, step),
    without the step's ``own`` prompts (compared by ``task_id``)."""
    taken = {p.task_id for p in own}
    order = list(range(len(problems)))
    random.Random(f"oprl-dynamic-sampling:{seed}:{step}").shuffle(order)
    return [problems[i] for i in order if problems[i].task_id not in taken][:count]


def is_degenerate(group: Sequence[Experience]) -> bool:
    """Whether every reward of ``group`` is the same (every group-relative advantage is then zero)."""
    return len({e.reward for e in group}) == 1


SampleFn = Callable[[list, int], tuple[list[Experience], Any]]
"""``sample(problems, round_index) -> (experiences, timing)``: K responses per problem, rows grouped in order."""


def _groups(experiences: list[Experience], group_size: int) -> list[list[Experience]]:
    """A sampling round's groups: consecutive rows of one group id, at most ``group_size`` (K) of them (fewer
    when episodes were lost to the infrastructure: ``oprl.explorer.explorer``)."""
    groups: list[list[Experience]] = []
    for e in experiences:
        if not groups or groups[-1][0].group_id != e.group_id or len(groups[-1]) == group_size:
            groups.append([])
        groups[-1].append(e)
    return groups


def dynamic_batch(
    sample: SampleFn,
    own: list,
    extras: list,
    *,
    group_size: int,
    first_group_id: int,
) -> tuple[list[Experience], Any, dict[str, float]]:
    """The step's batch under dynamic sampling: ``len(own)`` groups, all-equal groups replaced by groups of
    ``extras`` (the step's replacement prompts, at most ``len(extras)`` drawn) sampled in rounds.

    Returns the experiences (group ids ``first_group_id + slot``), the rounds' timings added up (``+``), and
    the ``dynamic/*`` metrics."""
    wanted = len(own)
    experiences, timing = sample(own, 0)
    kept: list[list[Experience]] = []
    dropped: list[list[Experience]] = []
    drawn = rounds = 0
    while True:
        for group in _groups(experiences, group_size):  # a group may have lost rows (agents' lost episodes)
            (dropped if is_degenerate(group) else kept).append(group)
        missing = wanted - len(kept)
        if missing <= 0 or drawn >= len(extras):
            break
        chosen = extras[drawn : drawn + missing]
        drawn, rounds = drawn + len(chosen), rounds + 1
        experiences, more = sample(chosen, rounds)
        timing = timing + more
    groups = (kept + dropped)[:wanted]
    batch = [dataclasses.replace(e, group_id=first_group_id + slot) for slot, group in enumerate(groups) for e in group]
    metrics = {
        "dynamic/extra_prompts": float(drawn),
        "dynamic/degenerate_groups": float(len(dropped)),
        "dynamic/degenerate_kept": float(max(wanted - len(kept), 0)),
    }
    return batch, timing, metrics
