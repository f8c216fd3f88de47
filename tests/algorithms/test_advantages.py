"""group_advantages: hand-computed values, limiting cases, RED-Drop invariants, vectorised ≡ loop form."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oprl.algorithms import group_advantages

FAST = settings(max_examples=40, deadline=None)

REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.5, 1.0], dtype=torch.float64)
GROUPS = torch.tensor([3, 3, 3, 9, 9])


def test_mean_baseline_by_hand():
    result = group_advantages(REWARDS, GROUPS)
    # group 3: mean 1/3; group 9: mean 0.75
    expected = [2 / 3, -1 / 3, -1 / 3, -0.25, 0.25]
    assert result.advantages.tolist() == pytest.approx(expected)
    assert result.keep.all()


def test_std_normalize_uses_population_std():
    result = group_advantages(REWARDS, GROUPS, std_normalize=True)
    std_3 = math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 3)  # = sqrt(2/9)
    expected = [
        a / (s + 1e-6) for a, s in zip([2 / 3, -1 / 3, -1 / 3, -0.25, 0.25], [std_3] * 3 + [0.25] * 2, strict=True)
    ]
    assert result.advantages.tolist() == pytest.approx(expected, abs=1e-12)


def test_mean_normalize_is_maxrl():
    """MaxRL (#55): A_i = r_i/mean_G(r) − 1 (rare successes weigh more); a group whose mean is ≤ 0 (no success, or
    only negative rewards) gets 0; refused together with std_normalize."""
    result = group_advantages(REWARDS, GROUPS, mean_normalize=True)
    expected = [1 / (1 / 3) - 1, 0 - 1, 0 - 1, 0.5 / 0.75 - 1, 1 / 0.75 - 1]
    assert result.advantages.tolist() == pytest.approx(expected, abs=1e-12)
    failing = group_advantages(torch.tensor([0.0, 0.0, -0.1, 0.0]), torch.tensor([0, 0, 0, 0]), mean_normalize=True)
    assert failing.advantages.tolist() == [0.0] * 4
    with pytest.raises(ValueError, match="alternatives"):
        group_advantages(REWARDS, GROUPS, mean_normalize=True, std_normalize=True)


def test_baseline_shift_lowers_the_baseline():
    result = group_advantages(REWARDS, GROUPS, baseline_shift=0.1)
    assert result.advantages.tolist() == pytest.approx([2 / 3 + 0.1, -1 / 3 + 0.1, -1 / 3 + 0.1, -0.15, 0.35])


def test_logavgexp_baseline_by_hand():
    tau = 0.5
    result = group_advantages(REWARDS, GROUPS, baseline="logavgexp", tau=tau)
    b3 = tau * math.log((math.exp(2.0) + 2) / 3)
    b9 = tau * math.log((math.exp(1.0) + math.exp(2.0)) / 2)
    assert result.advantages.tolist() == pytest.approx([1 - b3, -b3, -b3, 0.5 - b9, 1 - b9])


def test_logavgexp_does_not_overflow():
    rewards = torch.tensor([1000.0, 999.0, 0.0])
    result = group_advantages(rewards, torch.zeros(3, dtype=torch.long), baseline="logavgexp", tau=0.01)
    assert torch.isfinite(result.advantages).all()
    assert result.advantages[0] == pytest.approx(0.01 * math.log(3), abs=1e-3)  # b = 1000 − τ·log 3


@pytest.mark.parametrize("options", [{}, {"std_normalize": True}, {"baseline": "logavgexp"}, {"drop": "balance"}])
def test_singleton_and_all_equal_groups_get_zero(options):
    rewards = torch.tensor([0.1, 0.1, 0.1, 7.0, -2.0, -2.0])
    groups = torch.tensor([0, 0, 0, 1, 2, 2])
    result = group_advantages(rewards, groups, **options)
    assert torch.equal(result.advantages, torch.zeros(6))
    assert result.keep.all()


def test_zero_variance_group_gets_exactly_the_shift():
    rewards = torch.tensor([0.1, 0.1, 0.1, 5.0])
    result = group_advantages(rewards, torch.tensor([0, 0, 0, 1]), baseline_shift=0.2, std_normalize=True)
    assert result.advantages.tolist() == pytest.approx([0.2] * 4)


def test_empty_input():
    result = group_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long), drop="balance")
    assert result.advantages.shape == (0,) and result.keep.shape == (0,)


@pytest.mark.parametrize(
    "options, message",
    [({"drop": "bal"}, "balance"), ({"baseline": "median"}, "logavgexp"), ({"tau": 0.0}, "tau")],
)
def test_invalid_options_name_the_valid_ones(options, message):
    with pytest.raises(ValueError, match=message):
        group_advantages(REWARDS, GROUPS, **options)


def test_drop_none_and_string_none_agree():
    a = group_advantages(REWARDS, GROUPS, drop="none")
    b = group_advantages(REWARDS, GROUPS, drop="none")
    assert torch.equal(a.advantages, b.advantages)


def test_red_drop_by_hand():
    # group 3 has 1 positive (r=1) and 2 negatives: one negative goes; kept mean 0.5 -> A = ±0.5.
    result = group_advantages(REWARDS, GROUPS, drop="balance", generator=torch.Generator().manual_seed(0))
    assert result.keep.tolist()[0] and result.keep.tolist()[3:] == [True, True]
    assert result.keep[1:3].sum() == 1
    kept_negative = 1 if result.keep[1] else 2
    assert result.advantages[0] == pytest.approx(0.5) and result.advantages[kept_negative] == pytest.approx(-0.5)
    assert result.advantages[3 - kept_negative] == 0.0
    assert result.advantages[3:].tolist() == pytest.approx([-0.25, 0.25])  # balanced group untouched


def test_red_drop_picks_negatives_uniformly():
    # 4000 copies of a group with one positive and four negatives: each negative survives w.p. 1/4.
    copies = 4000
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0]).repeat(copies)
    groups = torch.arange(copies).repeat_interleave(5)
    keep = group_advantages(rewards, groups, drop="balance", generator=torch.Generator().manual_seed(1)).keep
    survival = keep.view(copies, 5)[:, 1:].double().mean(dim=0)
    assert torch.allclose(survival, torch.full((4,), 0.25, dtype=torch.float64), atol=0.03)


group_batches = st.lists(
    st.tuples(st.integers(0, 5), st.sampled_from([0.0, 0.1, 0.5, 0.8, 1.0, 1.1, -1.0])), min_size=1, max_size=24
)


def _loop_advantages(rewards, groups, keep, std_normalize, shift):
    """The obvious per-group loop, over the kept responses."""
    out = torch.zeros_like(rewards)
    for group in groups.unique():
        members = ((groups == group) & keep).nonzero().flatten()
        values = rewards[members]
        centered = values - values.mean() if values.max() > values.min() else torch.zeros_like(values)
        if std_normalize:
            centered = centered / (values.var(unbiased=False).sqrt() + 1e-6)
        out[members] = centered + shift
    return out


@FAST
@given(group_batches, st.booleans(), st.sampled_from([0.0, 0.3]), st.sampled_from(["none", "balance"]))
def test_vectorised_equals_loop(batch, std_normalize, shift, drop):
    groups = torch.tensor([g for g, _ in batch])
    rewards = torch.tensor([r for _, r in batch], dtype=torch.float64)
    result = group_advantages(rewards, groups, std_normalize=std_normalize, baseline_shift=shift, drop=drop)
    expected = _loop_advantages(rewards, groups, result.keep, std_normalize, shift)
    assert torch.allclose(result.advantages, expected, atol=1e-9)


@FAST
@given(group_batches, st.integers(0, 2**31 - 1))
def test_red_drop_balances_each_group(batch, seed):
    groups = torch.tensor([g for g, _ in batch])
    rewards = torch.tensor([r for _, r in batch])
    result = group_advantages(rewards, groups, drop="balance", generator=torch.Generator().manual_seed(seed))
    again = group_advantages(rewards, groups, drop="balance", generator=torch.Generator().manual_seed(seed))
    assert torch.equal(result.keep, again.keep) and torch.equal(result.advantages, again.advantages)
    for group in groups.unique():
        members = groups == group
        positive = members & (rewards >= rewards[members].mean() - 1e-6)
        negative = members & ~positive
        assert result.keep[positive].all()
        kept_negatives = int((result.keep & negative).sum())
        assert kept_negatives == min(int(negative.sum()), int(positive.sum()))
    assert (result.advantages[~result.keep] == 0).all()
    assert torch.isfinite(result.advantages).all()
