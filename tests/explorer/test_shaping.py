"""Data shaping (oprl.explorer.shaping): DAPO's dynamic sampling and overlong soft penalty, in closed form."""

import dataclasses

import pytest

from oprl.config import load_config
from oprl.errors import OprlError
from oprl.explorer.explorer import Explorer, Timing
from oprl.explorer.shaping import (
    ROUND_STRIDE,
    Shaping,
    dynamic_batch,
    extra_problems,
    is_degenerate,
    round_seed,
)
from oprl.messages import Experience
from oprl.models.tiny import build_tokenizer
from oprl.rollout import Rollout
from oprl.schedule import stream_seed
from oprl.tasks.arithmetic import ArithmeticTask
from oprl.tasks.rewards.builtin import overlong_penalty


@dataclasses.dataclass(frozen=True)
class Problem:
    task_id: str


def fake_sampler(rewards_of: dict[str, list[float]], calls: list):
    """``sample(problems, round)`` returning each problem's fixed rewards as one group; records the calls."""

    def sample(problems, index):
        calls.append(([p.task_id for p in problems], index))
        rows = [
            Experience([1], [2], [-1.0], reward, {}, -1, p.task_id, 3, "")
            for p in problems
            for reward in rewards_of[p.task_id]
        ]
        return rows, Timing(1.0, 0.5, float(len(rows)))

    return sample


REWARDS = {"a": [1, 1], "b": [0, 1], "c": [0, 0], "d": [1, 0], "e": [1, 1], "f": [0.5, 0], "g": [0, 0]}


def test_degenerate_groups_are_replaced_in_rounds_of_the_missing_count():
    calls: list = []
    own, extras = [Problem("a"), Problem("b"), Problem("c")], [Problem(x) for x in "defg"]
    batch, timing, metrics = dynamic_batch(fake_sampler(REWARDS, calls), own, extras, group_size=2, first_group_id=30)
    # Round 0: a, c all-equal -> 2 missing; round 1 draws d (mixed), e (equal) -> 1 missing; round 2 draws f.
    assert calls == [(["a", "b", "c"], 0), (["d", "e"], 1), (["f"], 2)]
    assert [e.task_id for e in batch] == ["b", "b", "d", "d", "f", "f"]
    assert [e.group_id for e in batch] == [30, 30, 31, 31, 32, 32]
    assert all(e.policy_version == 3 for e in batch)  # the same policy version throughout
    assert metrics == {"dynamic/extra_prompts": 3, "dynamic/degenerate_groups": 3, "dynamic/degenerate_kept": 0}
    assert (timing.generate_s, timing.reward_s, timing.generated_tokens) == (3.0, 1.5, 12.0)


def test_the_cap_keeps_dropped_groups_in_sampling_order():
    calls: list = []
    own, extras = [Problem("a"), Problem("c"), Problem("b")], [Problem("e")]  # the cap: one replacement
    batch, _, metrics = dynamic_batch(fake_sampler(REWARDS, calls), own, extras, group_size=2, first_group_id=0)
    assert calls == [(["a", "c", "b"], 0), (["e"], 1)]
    assert [e.task_id for e in batch[::2]] == ["b", "a", "c"]  # informative first, then the dropped a, c
    assert metrics == {"dynamic/extra_prompts": 1, "dynamic/degenerate_groups": 3, "dynamic/degenerate_kept": 2}


def test_no_degenerate_group_means_no_extra_round():
    calls: list = []
    batch, _, metrics = dynamic_batch(
        fake_sampler(REWARDS, calls), [Problem("b"), Problem("d")], [Problem("f")], group_size=2, first_group_id=0
    )
    assert len(calls) == 1 and [e.task_id for e in batch] == ["b", "b", "d", "d"]
    assert metrics["dynamic/extra_prompts"] == 0


def test_replacement_prompts_are_a_seeded_order_without_the_steps_own():
    problems = [Problem(str(i)) for i in range(50)]
    own = problems[:5]
    first = extra_problems(problems, own, seed=1, step=4, count=10)
    assert first == extra_problems(problems, own, seed=1, step=4, count=10)
    assert first[:3] == extra_problems(problems, own, seed=1, step=4, count=3)  # replacement j is fixed
    assert not set(first) & set(own) and len(set(first)) == 10
    assert first != extra_problems(problems, own, seed=1, step=5, count=10)
    assert first != extra_problems(problems, own, seed=2, step=4, count=10)
    assert round_seed(7, 3, 0) == stream_seed(7, 3) and round_seed(7, 3, 2) == stream_seed(7, 3) + 2 * ROUND_STRIDE


def test_is_degenerate():
    group = [Experience([1], [2], [0.0], r, {}, 0, "t", 0, "") for r in (0.5, 0.5)]
    assert is_degenerate(group) and not is_degenerate([*group, dataclasses.replace(group[0], reward=0.4)])


@pytest.mark.parametrize(("length", "expected"), [(0, 0.0), (12, 0.0), (13, -0.25), (14, -0.5), (16, -1.0), (20, -1.0)])
def test_overlong_penalty_ramps_over_the_buffer(length, expected):
    assert overlong_penalty(length, max_tokens=16, buffer=4) == pytest.approx(expected)
    assert overlong_penalty(length, max_tokens=16, buffer=4, penalty=0.5) == pytest.approx(expected / 2)
    assert overlong_penalty(length, max_tokens=16, buffer=0) == 0.0


def test_shaping_reward_adds_the_penalty_or_replaces_a_cut_score():
    soft = Shaping(max_new_tokens=8, overlong_buffer=2, overlong_penalty=0.2)
    assert soft.reward(1.0, 6, cut=False) == 1.0
    assert soft.reward(1.0, 7, cut=False) == pytest.approx(0.9)
    assert soft.reward(1.0, 8, cut=True) == pytest.approx(0.8)
    assert Shaping(truncated_reward=-0.1, max_new_tokens=8).reward(1.0, 8, cut=True) == -0.1


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["rollout.overlong_buffer=9", "rollout.max_new_tokens=8"], r"^rollout.overlong_buffer=9 exceeds rollout"),
        (["rollout.overlong_buffer=2", "rollout.truncated_reward=-0.1"], r"^rollout.overlong_buffer and rollout"),
    ],
)
def test_shaping_errors_are_one_line(overrides, message):
    with pytest.raises(OprlError, match=message) as error:
        load_config(overrides=overrides)  # a validator of the rollout section: refused at load
    assert "\n" not in str(error.value)
    with pytest.raises(OprlError, match=r"rollout.dynamic_max_extra_prompts"):
        load_config(overrides=["rollout.dynamic_max_extra_prompts=0"])


class ParityEngine:
    """Right answers for problems whose answer is even, wrong for odd ones: groups are all-correct or all-wrong
    unless the seed says otherwise (one row in two of round seeds that are odd gets the other verdict)."""

    def __init__(self, tokenizer, answers):
        self.tokenizer, self.answers, self.seeds = tokenizer, answers, []

    def generate(self, prompt_ids, *, seed, sampling=None, batch_size=None):
        self.seeds.append(seed)
        texts = []
        for row, p in enumerate(prompt_ids):
            answer = self.answers[self.tokenizer.decode(p)]
            right = (int(answer) % 2 == 0) != (row % 2 == 1 and int(answer) % 3 == 0)
            texts.append(answer if right else "x")
        ids = [[*self.tokenizer(t, add_special_tokens=False).input_ids, self.tokenizer.eos_token_id] for t in texts]
        return Rollout(ids, [[-0.5] * len(i) for i in ids], texts, [False] * len(ids))


def test_explorer_under_dynamic_sampling_keeps_the_batch_size_and_is_deterministic():
    tokenizer, task = build_tokenizer(), ArithmeticTask(train_size=60, test_size=4, seed=3)

    def explore():
        explorer = Explorer(
            task,
            tokenizer,
            None,
            prompts_per_step=4,
            group_size=2,
            seed=0,
            shaping=Shaping(dynamic_sampling=True, max_extra_prompts=40),
        )
        answers = {tokenizer.decode(explorer._encode(p)): p.answer for p in explorer.problems}
        explorer.engine = ParityEngine(tokenizer, answers)
        return explorer.explore(step=2, version=1), explorer.engine.seeds

    (batch, timing), seeds = explore()
    assert len(batch) == 8 and [e.group_id for e in batch] == [4, 4, 5, 5, 6, 6, 7, 7]
    groups = [batch[i : i + 2] for i in range(0, 8, 2)]
    assert not any(is_degenerate(g) for g in groups)
    assert timing.shaping["dynamic/extra_prompts"] > 0 and timing.shaping["dynamic/degenerate_kept"] == 0
    assert seeds == [round_seed(0, 2, r) for r in range(len(seeds))]
    (again, _), _ = explore()
    assert [(e.task_id, e.reward, e.group_id) for e in again] == [(e.task_id, e.reward, e.group_id) for e in batch]
