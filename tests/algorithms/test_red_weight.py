"""Adaptive RED-Weight (``red_weight``) against a plain-Python transcription of the rule as the issue (#70) writes it.

The reference below is written from the rule's text, a loop per set of responses with Python floats, independent
of ``oprl.algorithms.red_weight`` (which bisects every set at once on tensors). Edge cases: no negative sum, no root
above 0.8, one-response groups, all-equal rewards, RED-Drop's dropped rows; then the preset, its bad settings and
two steps of the real trainer on the tiny model.
"""

import copy
import math
import random

import pytest
import torch

from oprl.algorithms import (
    PRESETS,
    SettingError,
    advantage_settings,
    group_advantages,
    red_weight_advantages,
    resolve_preset,
    trainer_only,
)
from oprl.algorithms.red_weight import BISECTION_STEPS


def reference(rewards, groups, lengths, rule, level):
    """``(advantages, {set: T or None}, {set: fired})`` of the rule, one set at a time."""
    scores = []
    for r, g in zip(rewards, groups, strict=True):
        members = [rewards[j] for j in range(len(rewards)) if groups[j] == g]
        mean = sum(members) / len(members)
        scores.append(0.0 if max(members) == min(members) else r - mean)  # equal rewards: exactly 0
    sets = groups if level == "group" else [0] * len(rewards)
    advantages, temperatures, fired = list(scores), {}, {}
    for key in dict.fromkeys(sets):
        rows = [i for i in range(len(rewards)) if sets[i] == key]
        weighted = sum(scores[i] * lengths[i] for i in rows)
        fired[key], temperatures[key] = weighted < 0, None
        if not weighted < 0:
            continue
        if rule == "shift":
            mean = weighted / sum(lengths[i] for i in rows)
            for i in rows:
                advantages[i] = scores[i] - mean
            continue
        lo, hi = 0.8, 100.0
        for _ in range(20):
            mid = (lo + hi) / 2
            f = sum(scores[i] * math.exp(scores[i] / mid) * lengths[i] for i in rows)
            if f < 0:
                hi = mid
            else:
                lo = mid
            if hi - lo < 0.05:
                break
        temperatures[key] = mid
        for i in rows:
            advantages[i] = scores[i] * math.exp(scores[i] / mid)
    return advantages, temperatures, fired


def oprl(rewards, groups, lengths, rule, level, **settings):
    return group_advantages(
        torch.tensor(rewards, dtype=torch.float64),
        torch.tensor(groups),
        red_weight=rule,
        red_weight_level=level,
        response_lengths=torch.tensor(lengths),
        **settings,
    )


def random_case(seed):
    """Binary or graded rewards, groups of 1..6 responses, lengths 1..60, so some sets fire and some do not."""
    rng = random.Random(seed)
    rewards, groups, lengths = [], [], []
    for g in range(rng.randint(1, 5)):
        for _ in range(rng.randint(1, 6)):
            rewards.append(float(rng.random() < 0.4) if seed % 2 else round(rng.random(), 2))
            groups.append(10 * g + 3)  # neither contiguous ids nor starting at 0
            lengths.append(rng.randint(1, 60))
    return rewards, groups, lengths


@pytest.mark.parametrize("rule", ["adaptive", "shift"])
@pytest.mark.parametrize("level", ["batch", "group"])
@pytest.mark.parametrize("seed", range(12))
def test_matches_the_plain_python_reference(rule, level, seed):
    rewards, groups, lengths = random_case(seed)
    expected, temperatures, fired = reference(rewards, groups, lengths, rule, level)
    result = oprl(rewards, groups, lengths, rule, level)
    assert result.advantages.tolist() == pytest.approx(expected, abs=1e-12)
    active = [t for t in temperatures.values() if t is not None]
    assert result.metrics["red_weight_fired_frac"].item() == pytest.approx(sum(fired.values()) / len(fired))
    assert result.metrics["red_weight_temperature"].item() == pytest.approx(sum(active) / max(len(active), 1))


def test_the_cases_fire_and_not():
    """The random cases above cover both branches of the rule at both levels."""
    outcomes = set()
    for seed in range(12):
        for level in ("batch", "group"):
            _, _, fired = reference(*random_case(seed), "adaptive", level)
            outcomes |= set(fired.values())
    assert outcomes == {True, False}


def test_no_negative_sum_leaves_the_advantages():
    # Group 0: the correct response is the long one, Σ s·L = (2/3)·30 − (1/3)·(5 + 5) > 0.
    rewards, groups, lengths = [1.0, 0.0, 0.0], [0, 0, 0], [30, 5, 5]
    plain = group_advantages(torch.tensor(rewards, dtype=torch.float64), torch.tensor(groups)).advantages
    for rule in ("adaptive", "shift"):
        result = oprl(rewards, groups, lengths, rule, "batch")
        assert torch.equal(result.advantages, plain)
        assert result.metrics["red_weight_fired_frac"].item() == 0.0
        assert result.metrics["red_weight_temperature"].item() == 0.0  # Trinity-RFT logs 0 when no set fired


def test_the_weighted_sum_is_brought_to_about_zero():
    # s = (3/4, −1/4 ×3), L = (10, 30, 30, 30): Σ s·L = −15 < 0; the root T* ≈ 0.90 lies in [0.8, 100].
    rewards, groups, lengths = [1.0, 0.0, 0.0, 0.0], [0, 0, 0, 0], [10, 30, 30, 30]
    result = oprl(rewards, groups, lengths, "adaptive", "batch")
    temperature = result.metrics["red_weight_temperature"].item()
    weighted = sum(a * n for a, n in zip(result.advantages.tolist(), lengths, strict=True))
    assert 0.8 < temperature < 1.0 and abs(weighted) < 1.0  # T within 0.05 of the root, from 15 to under 1
    assert result.advantages[0] == pytest.approx(0.75 * math.exp(0.75 / temperature))
    shifted = oprl(rewards, groups, lengths, "shift", "batch")
    assert sum(a * n for a, n in zip(shifted.advantages.tolist(), lengths, strict=True)) == pytest.approx(0, abs=1e-12)
    assert shifted.advantages.tolist() == pytest.approx([0.75 + 0.15, -0.1, -0.1, -0.1])  # mean −15/100


def test_no_root_above_the_lower_end_ends_near_it():
    # One short correct response against seven long wrong ones: f(0.8) = 0.875·e^(0.875/0.8) − 0.125·e^(−0.125/0.8)
    # ·700 < 0, so the bisection only ever lowers hi and stops within 0.05 of 0.8.
    rewards, groups, lengths = [1.0] + [0.0] * 7, [0] * 8, [1] + [100] * 7
    result = oprl(rewards, groups, lengths, "adaptive", "batch")
    temperature = result.metrics["red_weight_temperature"].item()
    assert 0.8 < temperature < 0.85
    assert temperature == pytest.approx(reference(rewards, groups, lengths, "adaptive", "batch")[1][0], abs=1e-12)
    assert sum(a * n for a, n in zip(result.advantages.tolist(), lengths, strict=True)) < 0  # still negative


def test_the_bisection_makes_eleven_halvings():
    assert BISECTION_STEPS == 11  # 99.2 / 2^11 = 0.048 < 0.05 <= 99.2 / 2^10: the cap of 20 never binds


def test_one_response_groups_and_equal_rewards():
    # Singletons and an all-equal group have s = 0: never a negative sum of their own, A stays 0 under adaptive
    # (0·exp(0)); in the batch set, shift moves them too (as Trinity-RFT does: every response of the set).
    rewards, groups, lengths = (
        [1.0, 0.0, 0.5, 0.5, 0.5, 1.0, 0.0, 0.0],
        [0, 1, 2, 2, 2, 3, 3, 3],
        [4, 9, 7, 7, 7, 2, 9, 9],
    )
    for level in ("batch", "group"):
        result = oprl(rewards, groups, lengths, "adaptive", level)
        assert result.advantages[:5].tolist() == [0.0] * 5
        shifted = oprl(rewards, groups, lengths, "shift", level)
        expected = reference(rewards, groups, lengths, "shift", level)[0]
        assert shifted.advantages.tolist() == pytest.approx(expected, abs=1e-12)
        assert (shifted.advantages[:5] != 0).all() == (level == "batch")
    equal = oprl([0.3] * 4, [0, 0, 1, 1], [5, 50, 1, 7], "adaptive", "batch")
    assert equal.advantages.tolist() == [0.0] * 4 and equal.metrics["red_weight_fired_frac"].item() == 0.0


def test_the_group_level_balances_each_prompt():
    # Group 0 fires (short positive), group 1 does not (long positive), group 2 fires: 2 of 3 sets.
    rewards, groups, lengths = (
        [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0],
        [0, 0, 0, 1, 1, 1, 2, 2],
        [2, 20, 20, 40, 3, 3, 1, 50],
    )
    result = oprl(rewards, groups, lengths, "adaptive", "group")
    _, temperatures, fired = reference(rewards, groups, lengths, "adaptive", "group")
    assert list(fired.values()) == [True, False, True]
    assert result.metrics["red_weight_fired_frac"].item() == pytest.approx(2 / 3)
    assert result.metrics["red_weight_temperature"].item() == pytest.approx((temperatures[0] + temperatures[2]) / 2)
    plain = group_advantages(torch.tensor(rewards, dtype=torch.float64), torch.tensor(groups)).advantages
    assert torch.equal(result.advantages[3:6], plain[3:6])


def test_red_drops_dropped_rows_take_no_part():
    """With drop=balance the dropped rows keep A = 0 and count in no sum: the rule on the kept rows alone."""
    rewards, groups, lengths = [1.0, 0.0, 0.0, 0.0, 0.0], [0] * 5, [3, 10, 20, 30, 40]
    result = oprl(
        rewards, groups, lengths, "adaptive", "batch", drop="balance", generator=torch.Generator().manual_seed(0)
    )
    kept = result.keep.nonzero().squeeze(-1).tolist()
    assert len(kept) == 2 and result.advantages[~result.keep].tolist() == [0.0] * 3
    expected, _, _ = reference([rewards[i] for i in kept], [0, 0], [lengths[i] for i in kept], "adaptive", "batch")
    assert result.advantages[kept].tolist() == pytest.approx(expected, abs=1e-12)


def test_float32_rewards_give_float32_advantages():
    rewards, groups, lengths = [1.0, 0.0, 0.0, 0.0], [0] * 4, [10, 30, 30, 30]
    result = group_advantages(torch.tensor(rewards), torch.tensor(groups), red_weight="adaptive",
                              response_lengths=torch.tensor(lengths))  # fmt: skip
    assert result.advantages.dtype == torch.float32
    expected = reference(rewards, groups, lengths, "adaptive", "batch")[0]
    assert result.advantages.tolist() == pytest.approx(expected, rel=1e-6)


def test_missing_or_bad_inputs_say_what_is_wrong():
    rewards, groups = torch.tensor([1.0, 0.0]), torch.tensor([0, 0])
    with pytest.raises(ValueError, match="needs response_lengths"):
        group_advantages(rewards, groups, red_weight="adaptive")
    with pytest.raises(ValueError, match=r"red_weight_level 'task'.*batch, group"):
        group_advantages(rewards, groups, red_weight="adaptive", red_weight_level="task",
                         response_lengths=torch.tensor([1, 2]))  # fmt: skip
    with pytest.raises(ValueError, match="needs response_lengths"):
        red_weight_advantages(rewards, torch.tensor([1]), groups, rule="shift", level="batch")


def test_the_presets():
    adaptive = resolve_preset("red-weight-adaptive")
    assert adaptive == {**PRESETS["rec-oneside-nois"], "red_weight": "adaptive"}  # the authors' runs' loss
    assert (adaptive["eps_low"], adaptive["eps_high"], adaptive["std_normalize"]) == (0.2, 0.2, False)
    assert advantage_settings(adaptive)["red_weight_level"] == "batch"
    assert resolve_preset("red-weight-shift") == {**PRESETS["rec-oneside-nois"], "red_weight": "shift"}
    assert resolve_preset("red-weight-adaptive", red_weight_level="group")["red_weight_level"] == "group"
    assert PRESETS["red-weight"]["red_weight"] == "none"  # the fixed-T RED-Weight stays the loss weight exp(A/T)
    # TRL's and verl's advantage hooks get no response lengths: they refuse it rather than drop it.
    assert trainer_only(adaptive) == ["red_weight=adaptive"]


@pytest.mark.parametrize(
    "overrides, key, message",
    [
        ({"red_weight": "adaptve"}, "red_weight", "did you mean 'adaptive'"),
        ({"red_weight_level": "task"}, "red_weight_level", "batch, group"),
        ({"weight": "advantage"}, "red_weight", "use one of them"),
    ],
)
def test_bad_settings_name_the_key(overrides, key, message):
    with pytest.raises(SettingError, match=message) as error:
        resolve_preset("red-weight-adaptive", **overrides)
    assert error.value.key == key


def test_the_preset_trains_two_steps_and_logs_the_rule():
    """Through the real ``Trainer`` on the tiny model: it passes each response's token count and logs the rule."""
    from trainer_helpers import make_batch, make_trainer

    trainer, tokenizer = make_trainer("red-weight-adaptive")
    before = copy.deepcopy(trainer.model.state_dict())
    fired = []
    for seed in range(2):
        batch = make_batch(tokenizer, seed=seed)
        # Step 1: every second response (each first, correct one among them) ends at once, so the wrong ones carry
        # more tokens and the rule fires; step 2: every response, equal lengths give Σ s·L = Σ s = 0.
        for row in batch[::2] if seed == 0 else batch:
            row.response_ids, row.behavior_logprobs = row.response_ids[-1:], row.behavior_logprobs[-1:]
        metrics = trainer.step(batch)
        assert all(math.isfinite(value) for value in metrics.values())
        rows = ([e.reward for e in batch], [e.group_id for e in batch], [len(e.response_ids) for e in batch])
        _, temperatures, _ = reference(*rows, "adaptive", "batch")
        assert metrics["adv/red_weight_fired_frac"] == float(temperatures[0] is not None)
        assert metrics["adv/red_weight_temperature"] == pytest.approx(temperatures[0] or 0.0, rel=1e-6)
        fired.append(temperatures[0] is not None)
    assert fired == [True, False]
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.state_dict().items())


def test_the_preset_trains_the_default_job_through_the_config(small_overrides, tmp_path):
    """``oprl train algorithm.preset=red-weight-adaptive algorithm.red_weight_level=group``: config -> trainer."""
    from oprl.cli import main
    from oprl.metrics import read_metrics

    args = [*small_overrides, "steps=2", "eval.interval=0", "tensorboard=false", "run_name=red"]
    assert main(["train", *args, "algorithm.preset=red-weight-adaptive", "algorithm.red_weight_level=group"]) == 0
    rows = [r for r in read_metrics(tmp_path / "runs" / "red" / "metrics.jsonl") if "loss/total" in r]
    assert [r["step"] for r in rows] == [1, 2] and all(math.isfinite(r["loss/total"]) for r in rows)
    assert all(0 <= r["adv/red_weight_fired_frac"] <= 1 for r in rows)
    assert all(r["adv/red_weight_temperature"] == 0 or 0.8 < r["adv/red_weight_temperature"] < 100 for r in rows)


def test_a_bad_setting_is_one_line_and_a_non_zero_exit(small_overrides, capsys):
    from oprl.cli import main

    assert main(["train", *small_overrides, "algorithm.preset=red-weight-adaptive", "algorithm.red_weight=adaptiv"])
    err = capsys.readouterr().err
    assert "algorithm.red_weight" in err and "'adaptive'" in err and "Traceback" not in err
