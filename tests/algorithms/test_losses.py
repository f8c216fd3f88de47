"""policy_loss and aggregate: PPO equivalence, clip-mode properties, denominators, extremes, errors."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oprl.algorithms import (
    LOSS_AGGREGATIONS,
    PRESETS,
    LossParams,
    advantage_settings,
    aggregate,
    aggregation_count,
    group_advantages,
    policy_loss,
)
from oprl.algorithms.topk_divergence import TOP_K_MASKS

FAST = settings(max_examples=40, deadline=None)
LOSS_ONLY = sorted(name for name in PRESETS if PRESETS[name]["clip_mode"] not in TOP_K_MASKS)
"""The presets whose loss reads nothing these tests do not give: the Top-K masks read the sampler's top-K
(tests/algorithms/test_topk_divergence.py)."""
METRIC_KEYS = {
    "clip_frac", "clip_frac_low", "clip_frac_high", "ratio_mean", "ratio_min", "ratio_max",
    "ratio_outside_frac", "pg_loss", "reg_loss", "weight_mean",
}  # fmt: skip


def random_batch(seed, batch=6, length=5, log_ratio_scale=3.0):
    generator = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(batch, length, generator=generator, dtype=torch.float64) * 3
    log_ratio = torch.randn(batch, length, generator=generator, dtype=torch.float64) * log_ratio_scale
    advantages = torch.randn(batch, generator=generator, dtype=torch.float64)
    mask = torch.rand(batch, length, generator=generator) > 0.3
    return logprobs.requires_grad_(True), logprobs.detach() - log_ratio, advantages, mask


def grad_of(loss, logprobs):
    return torch.autograd.grad(loss, logprobs)[0]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("eps", [(0.2, 0.2), (0.6, 2.0)])
def test_grpo_gradient_is_ppo_clip_gradient(seed, eps):
    eps_low, eps_high = eps
    logprobs, behavior, advantages, mask = random_batch(seed)  # log-ratios ~ N(0, 3²): far outside the band
    loss, _ = policy_loss(
        logprobs,
        behavior,
        advantages,
        mask,
        LossParams(clip_mode="one-side", weight="importance-sampling", eps_low=eps_low, eps_high=eps_high),
    )
    ratio = torch.exp(logprobs - behavior)  # not detached: the textbook objective
    a = advantages[:, None]
    clipped = torch.minimum(ratio * a, ratio.clamp(1 - eps_low, 1 + eps_high) * a)
    ppo = -(clipped * mask).sum() / mask.sum()
    assert torch.allclose(grad_of(loss, logprobs), grad_of(ppo, logprobs), atol=1e-12)


log_ratios = st.floats(-20, 20, allow_nan=False)
shapes = st.tuples(st.integers(1, 4), st.integers(1, 5))


@st.composite
def token_batches(draw, log_ratio=log_ratios):
    batch, length = draw(shapes)
    cells = batch * length
    lps = draw(st.lists(st.floats(-10, -0.01), min_size=cells, max_size=cells))
    ratios = draw(st.lists(log_ratio, min_size=cells, max_size=cells))
    # No subnormal advantages: the loss's token mean divides them to 0, the unnormalised references do not.
    advantages = draw(st.lists(st.floats(-3, 3, allow_subnormal=False), min_size=batch, max_size=batch))
    mask = draw(st.lists(st.booleans(), min_size=cells, max_size=cells))
    logprobs = torch.tensor(lps, dtype=torch.float64).view(batch, length).requires_grad_(True)
    behavior = logprobs.detach() - torch.tensor(ratios, dtype=torch.float64).view(batch, length)
    return logprobs, behavior, torch.tensor(advantages, dtype=torch.float64), torch.tensor(mask).view(batch, length)


@FAST
@given(token_batches())
def test_no_clip_no_weight_is_plain_reinforce(tokens):
    logprobs, behavior, advantages, mask = tokens
    loss, metrics = policy_loss(logprobs, behavior, advantages, mask)
    expected = -advantages[:, None] * mask / max(int(mask.sum()), 1)
    assert torch.allclose(grad_of(loss, logprobs), expected.expand_as(logprobs), atol=1e-12)
    assert metrics["clip_frac"] == 0


def support(clip_mode, tokens, **eps):
    logprobs, behavior, advantages, mask = tokens
    loss, _ = policy_loss(logprobs, behavior, advantages, mask, LossParams.of(eps, clip_mode=clip_mode))
    return grad_of(loss, logprobs) != 0


@FAST
@given(token_batches(st.floats(-3, 3)))
def test_one_side_mask_is_the_support_of_the_ppo_gradient(tokens):
    logprobs, behavior, advantages, mask = tokens
    ratio = torch.exp(logprobs - behavior)
    a = advantages[:, None]
    ppo = -(torch.minimum(ratio * a, ratio.clamp(0.8, 1.2) * a) * mask).sum()
    ppo_support = grad_of(ppo, logprobs) != 0
    assert torch.equal(support("one-side", tokens), ppo_support)


@FAST
@given(token_batches(st.floats(-3, 3)), st.sampled_from([(0.2, 0.2, 0.6, 2.0), (0.6, 2.0, 0.6, 2.0)]))
def test_ring_and_one_side_keep_a_superset_of_two_side(tokens, eps):
    band = dict(zip(("eps_low", "eps_high", "eps_low_prime", "eps_high_prime"), eps, strict=True))
    two_side = support("two-side", tokens, **band)
    assert not (two_side & ~support("ring", tokens, **band)).any()
    assert not (two_side & ~support("one-side", tokens, **band)).any()


@FAST
@given(token_batches(), st.sampled_from(LOSS_ONLY), st.sampled_from(sorted(LOSS_AGGREGATIONS)))
def test_extreme_ratios_stay_finite(tokens, preset, loss_agg):
    logprobs, behavior, advantages, mask = tokens
    loss_settings = PRESETS[preset] | {"loss_agg": loss_agg}
    entropy = logprobs.detach().abs()  # any non-negative token entropies: aspo-entropy's band reads them
    loss, metrics = policy_loss(logprobs, behavior, advantages, mask, LossParams.of(loss_settings), entropy=entropy)
    assert torch.isfinite(loss) and torch.isfinite(grad_of(loss, logprobs)).all()
    assert set(metrics) >= METRIC_KEYS
    for value in metrics.values():
        assert value.dim() == 0 and not value.requires_grad and torch.isfinite(value)
    assert metrics["clip_frac"] == pytest.approx((metrics["clip_frac_low"] + metrics["clip_frac_high"]).item())


def test_empty_mask_gives_zero_loss_and_gradient():
    logprobs, behavior, advantages, _ = random_batch(0)
    for loss_agg in LOSS_AGGREGATIONS:
        loss, metrics = policy_loss(
            logprobs,
            behavior,
            advantages,
            torch.zeros(6, 5, dtype=torch.bool),
            LossParams(regularizer="squared-log-ratio", regularizer_coef=0.1, loss_agg=loss_agg),
        )
        assert loss.item() == 0.0 and (grad_of(loss, logprobs) == 0).all()
        assert metrics["ratio_mean"] == 1 and metrics["clip_frac"] == 0


def test_aggregations_by_hand():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])  # the last row is empty: it counts nowhere
    assert aggregate(values, mask, "token-mean").item() == pytest.approx((1 + 2 + 4) / 3)
    assert aggregate(values, mask, "seq-mean-token-mean").item() == pytest.approx((1.5 + 4) / 2)
    assert aggregate(values, mask, "seq-mean-token-sum").item() == pytest.approx((3 + 4) / 2)
    assert aggregate(values, mask, "seq-mean-token-sum-norm").item() == pytest.approx((3 / 3 + 4 / 3) / 2)
    assert aggregate(values, mask, "seq-mean-token-sum-norm", normalizer=10).item() == pytest.approx(0.35)
    with pytest.raises(ValueError, match="token-mean, seq-mean-token-mean"):
        aggregate(values, mask, "mean")


@pytest.mark.parametrize("loss_agg", sorted(LOSS_AGGREGATIONS))
@pytest.mark.parametrize("preset", ["red-drop", "grpo", "opmd"])
def test_dropped_rows_leave_every_denominator(loss_agg, preset):
    """A batch whose dropped rows are masked out ≡ the batch without those rows (value and gradient)."""
    loss_settings = PRESETS[preset] | {"loss_agg": loss_agg}
    adv_settings = advantage_settings(loss_settings)
    logprobs, behavior, _, mask = random_batch(3, batch=8)
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.2, 0.0, 1.0, 0.0], dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    grouped = group_advantages(rewards, groups, generator=torch.Generator().manual_seed(0), **adv_settings)
    keep = grouped.keep
    if preset == "red-drop":
        assert not keep.all()
    else:
        keep = torch.tensor([True, False, True, True, False, True, True, True])

    full, _ = policy_loss(logprobs, behavior, grouped.advantages, mask & keep[:, None], LossParams.of(loss_settings))
    sub_logprobs = logprobs.detach()[keep].requires_grad_(True)
    sub, _ = policy_loss(
        sub_logprobs, behavior[keep], grouped.advantages[keep], mask[keep], LossParams.of(loss_settings)
    )
    assert full.item() == pytest.approx(sub.item(), abs=1e-12)
    full_grad = grad_of(full, logprobs)
    assert torch.allclose(full_grad[keep], grad_of(sub, sub_logprobs), atol=1e-12)
    assert (full_grad[~keep] == 0).all()


@pytest.mark.parametrize("loss_agg", sorted(LOSS_AGGREGATIONS))
def test_micro_batches_reproduce_the_full_batch(loss_agg):
    logprobs, behavior, advantages, mask = random_batch(4, batch=8)
    options = {"clip_mode": "ring", "regularizer": "squared-log-ratio", "regularizer_coef": 0.1, "loss_agg": loss_agg}
    full, _ = policy_loss(logprobs, behavior, advantages, mask, LossParams.of(options))
    total = aggregation_count(mask, loss_agg)
    accumulated = 0
    for rows in (slice(0, 3), slice(3, 4), slice(4, 8)):
        micro, _ = policy_loss(logprobs[rows], behavior[rows], advantages[rows], mask[rows], LossParams.of(options))
        accumulated = accumulated + micro * aggregation_count(mask[rows], loss_agg) / total
    assert accumulated.item() == pytest.approx(full.item(), abs=1e-12)
    assert torch.allclose(grad_of(accumulated, logprobs), grad_of(full, logprobs), atol=1e-12)


def test_asymre_regularizer_equals_baseline_shift():
    """−c·logprobs on every token has the gradient of REINFORCE with the baseline lowered by c."""
    logprobs, behavior, _, mask = random_batch(5, batch=6)
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5, 0.5, 0.0], dtype=torch.float64)  # group 1 has zero variance
    groups = torch.tensor([0, 0, 0, 1, 1, 2])
    plain = group_advantages(rewards, groups).advantages
    shifted = group_advantages(rewards, groups, baseline_shift=0.1).advantages
    regularized, _ = policy_loss(
        logprobs, behavior, plain, mask, LossParams(regularizer="forward-kl", regularizer_coef=0.1)
    )
    baseline_shift, _ = policy_loss(logprobs, behavior, shifted, mask)
    assert torch.allclose(grad_of(regularized, logprobs), grad_of(baseline_shift, logprobs), atol=1e-12)


def test_red_weight_scales_by_exp_advantage():
    logprobs, behavior, advantages, mask = random_batch(6)
    loss, metrics = policy_loss(
        logprobs, behavior, advantages, mask, LossParams(weight="advantage", weight_temperature=0.5)
    )
    expected = -torch.exp(advantages / 0.5)[:, None] * advantages[:, None] * mask / mask.sum()
    assert torch.allclose(grad_of(loss, logprobs), expected, atol=1e-12)
    expected_mean = (torch.exp(advantages / 0.5)[:, None] * mask).sum() / mask.sum()
    assert metrics["weight_mean"].item() == pytest.approx(expected_mean.item())


def test_float_masks_weight_tokens():
    logprobs, behavior, advantages, mask = random_batch(7)
    loss, _ = policy_loss(logprobs, behavior, advantages, mask)
    uniform, _ = policy_loss(logprobs, behavior, advantages, mask.double() * 0.25)
    assert uniform.item() == pytest.approx(loss.item())  # token-mean only sees relative weights
    row_weights = torch.tensor([2.0, 1.0, 1.0, 1.0, 1.0, 1.0], dtype=torch.float64)[:, None]
    weighted, _ = policy_loss(logprobs, behavior, advantages, mask * row_weights)
    repeated, _ = policy_loss(
        torch.cat([logprobs[:1], logprobs]), torch.cat([behavior[:1], behavior]),
        torch.cat([advantages[:1], advantages]), torch.cat([mask[:1], mask]),
    )  # fmt: skip
    assert weighted.item() == pytest.approx(repeated.item())  # weight 2 ≡ the row counted twice


@pytest.mark.parametrize(
    "option, message",
    [
        ({"clip_mode": "oneside"}, "did you mean 'one-side'"),
        ({"weight": "is"}, "importance-sampling"),
        ({"regularizer": "kl"}, "forward-kl"),
        ({"loss_agg": "sum"}, "seq-mean-token-sum"),
    ],
)
def test_unknown_options_list_the_valid_values(option, message):
    logprobs, behavior, advantages, mask = random_batch(0)
    with pytest.raises(ValueError, match=message):
        policy_loss(logprobs, behavior, advantages, mask, LossParams.of(option))


def test_effective_sample_size_is_kongs_formula_at_both_levels():
    """rho/ess (#55): (Σw)²/(N·Σw²) of w = ρ_t over valid tokens and of w_i = Π_t ρ_t over responses; 1 on-policy,
    → 1/N when one weight dominates, padding ignored even when it holds ±inf or NaN, no overflow at Π ρ = e^60."""
    from oprl.algorithms import effective_sample_size

    logprobs, behavior, _, mask = random_batch(4)
    mask[1, 3:] = False
    ess = effective_sample_size(logprobs, behavior, mask)
    w = torch.exp((logprobs - behavior).clamp(-20, 20))[mask]
    assert ess["token"].item() == pytest.approx((w.sum() ** 2 / (len(w) * (w**2).sum())).item(), rel=1e-9)
    rows = torch.stack([torch.exp(((logprobs - behavior).clamp(-20, 20) * mask)[b].sum()) for b in range(6)])
    assert ess["sequence"].item() == pytest.approx((rows.sum() ** 2 / (6 * (rows**2).sum())).item(), rel=1e-9)
    garbage = torch.where(mask, behavior, torch.full_like(behavior, float("nan")))
    assert effective_sample_size(logprobs, garbage, mask)["token"] == ess["token"]
    on_policy = effective_sample_size(logprobs, logprobs, mask)
    assert on_policy["token"].item() == pytest.approx(1.0) and on_policy["sequence"].item() == pytest.approx(1.0)
    spike = torch.zeros(4, 3, dtype=torch.float64)
    spike[0] = 20.0  # one response's ratio e^60 (three tokens at the clamp), the rest 1
    one = effective_sample_size(spike, torch.zeros_like(spike), torch.ones(4, 3, dtype=torch.bool))
    assert one["sequence"].item() == pytest.approx(1 / 4) and torch.isfinite(one["sequence"])
