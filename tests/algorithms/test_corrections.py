"""The off-policy corrections (truncated / masked IS, decoupled PPO, GSPO, CISPO) and the RED-Drop variants:
closed-form gradients on hand-made batches, limiting cases, and bad settings as one line naming the key."""

import math

import pytest
import torch

from oprl.algorithms import PRESETS, LossParams, group_advantages, policy_loss, resolve_preset

# One response of four tokens, A = 1 (and a second, padded one with A = −1 in the two-row batches).
RHO = [0.5, 1.5, 3.0, 1.0]
LOGPROBS = [-0.4, -1.1, -0.3, -2.0]


def one_row(rho=RHO, advantage=1.0):
    logprobs = torch.tensor([LOGPROBS], dtype=torch.float64, requires_grad=True)
    behavior = logprobs.detach() - torch.tensor([rho], dtype=torch.float64).log()
    return logprobs, behavior, torch.tensor([advantage], dtype=torch.float64), torch.ones(1, 4, dtype=torch.bool)


def gradient(settings, proximal=None, rho=RHO, advantage=1.0):
    logprobs, behavior, advantages, mask = one_row(rho, advantage)
    loss, metrics = policy_loss(
        logprobs, behavior, advantages, mask, LossParams.of(settings), proximal_logprobs=proximal
    )
    loss.backward()
    return logprobs.grad[0].tolist(), loss, metrics


def loss_settings(name, **overrides):
    return resolve_preset(name, **overrides)


def test_truncated_is_token_gradient():
    # ℓ = −min(ρ, 2)·A·lp per token, token mean over 4: ∂/∂lp = −min(ρ, 2)/4.
    grad, _, metrics = gradient(loss_settings("tis-token"))
    assert grad == pytest.approx([-0.5 / 4, -1.5 / 4, -2.0 / 4, -1.0 / 4])
    assert metrics["clip_frac"].item() == 0  # nothing is masked, the weight only shrinks


def test_truncated_is_sequence_gradient():
    # Geometric mean ρ_seq = (0.5·1.5·3·1)^(1/4) = 2.25^(1/4) ≈ 1.2247 < 2: every token weighs ρ_seq.
    rho_seq = 2.25**0.25
    grad, _, metrics = gradient(loss_settings("tis-seq"))
    assert grad == pytest.approx([-rho_seq / 4] * 4)
    assert metrics["ratio_mean"].item() == pytest.approx(rho_seq)
    grad, _, _ = gradient(loss_settings("tis-seq", is_cap=1.1))
    assert grad == pytest.approx([-1.1 / 4] * 4)


def test_masked_is_token_and_sequence_gradients():
    # Band [0.5, 2]: ρ = 3 is rejected; ρ = 0.5 sits on the edge and stays. No weight.
    grad, _, metrics = gradient(loss_settings("masked-is-token"))
    assert grad == pytest.approx([-1 / 4, -1 / 4, 0.0, -1 / 4])
    assert metrics["clip_frac"].item() == pytest.approx(1 / 4)
    assert metrics["clip_frac_high"].item() == pytest.approx(1 / 4)
    # Sequence level: ρ_seq ≈ 1.22 is inside, so the whole response stays; with a band [0.8, 1.2] it goes.
    assert gradient(loss_settings("masked-is-seq"))[0] == pytest.approx([-1 / 4] * 4)
    assert gradient(loss_settings("masked-is-seq", mask_low=0.8, mask_high=1.2))[0] == [0.0] * 4


def test_cispo_clips_the_weight_and_masks_nothing():
    # w = clip(ρ, 1 − ε_low, 1 + ε_high) = clip(ρ, 0.9, 1.2) with the band narrowed here; A·lp for every token.
    grad, _, metrics = gradient(loss_settings("cispo", eps_low=0.1, eps_high=0.2), advantage=-1.0)
    assert grad == pytest.approx([0.9 / 4, 1.2 / 4, 1.2 / 4, 1.0 / 4])  # A = −1: ∂/∂lp = +w/4
    assert metrics["clip_frac"].item() == 0


def test_gspo_gradient():
    # s = 2.25^(1/4) ≈ 1.2247 > 1 + 4e-4 with A > 0: the one-sided clip drops the response entirely; with
    # A < 0 it keeps it, weight s on each token, mean over its tokens then over responses.
    s = 2.25**0.25
    assert gradient(loss_settings("gspo"))[0] == [0.0] * 4
    grad, _, _ = gradient(loss_settings("gspo"), advantage=-1.0)
    assert grad == pytest.approx([s / 4] * 4)
    # Two responses of different lengths: seq-mean-token-mean gives each response weight 1/2.
    logprobs = torch.tensor([[-0.5, -1.0, 0.0], [-0.2, -0.3, -0.4]], dtype=torch.float64, requires_grad=True)
    behavior = logprobs.detach().clone()
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    loss, _ = policy_loss(
        logprobs, behavior, torch.tensor([1.0, -2.0], dtype=torch.float64), mask, LossParams.of(loss_settings("gspo"))
    )
    loss.backward()
    assert logprobs.grad.tolist() == [pytest.approx([-1 / 4, -1 / 4, 0]), pytest.approx([2 / 6] * 3)]


def test_decoupled_ppo_gradient():
    # π_prox/π_b = v, r = π/π_prox; ∂/∂lp = −M_one-side(r)·r·min(v, C)·A/4 (A = 1, ε = 0.2, C = 2).
    logprobs, _, _, _ = one_row()
    v = [0.5, 4.0, 1.0, 1.1]
    r = [1.0, 1.1, 1.3, 0.7]
    proximal = logprobs.detach() - torch.tensor([r], dtype=torch.float64).log()
    behavior_for_v = proximal - torch.tensor([v], dtype=torch.float64).log()
    loss, metrics = policy_loss(
        logprobs,
        behavior_for_v,
        torch.tensor([1.0], dtype=torch.float64),
        torch.ones(1, 4),
        LossParams.of(loss_settings("decoupled-ppo")),
        proximal_logprobs=proximal,
    )
    loss.backward()
    # r = 1.3 > 1.2 with A > 0 is clipped; the others keep r·min(v, 2).
    expected = [-1.0 * 0.5 / 4, -1.1 * 2.0 / 4, 0.0, -0.7 * 1.1 / 4]
    assert logprobs.grad[0].tolist() == pytest.approx(expected)
    assert metrics["ratio_max"].item() == pytest.approx(1.3)  # the loss's ratio is π/π_prox


def test_rho_one_limits():
    # ρ ≡ 1: truncated IS is REINFORCE.
    ones = [1.0] * 4
    assert gradient(loss_settings("tis-token"), rho=ones)[0] == pytest.approx(
        gradient(loss_settings("reinforce"), rho=ones)[0]
    )
    assert gradient(loss_settings("tis-seq"), rho=ones)[0] == pytest.approx(
        gradient(loss_settings("reinforce"), rho=ones)[0]
    )
    # π_prox = π_b (behaviour→proximal ratio 1): decoupled PPO is GRPO's clipped loss, whatever π/π_b is.
    logprobs, behavior, advantages, mask = one_row()
    decoupled = policy_loss(
        logprobs, behavior, advantages, mask, LossParams.of(loss_settings("decoupled-ppo")), proximal_logprobs=behavior
    )[0]
    (grad_decoupled,) = torch.autograd.grad(decoupled, logprobs)
    grpo = policy_loss(logprobs, behavior, advantages, mask, LossParams.of(loss_settings("grpo")))[0]
    (grad_grpo,) = torch.autograd.grad(grpo, logprobs)
    assert decoupled.item() == pytest.approx(grpo.item())
    assert torch.allclose(grad_decoupled, grad_grpo)


def test_large_cap_is_plain_importance_sampling():
    tis = gradient(loss_settings("tis-token", is_cap=1e9))[0]
    plain = gradient(loss_settings("reinforce", weight="importance-sampling"))[0]
    assert tis == pytest.approx(plain)
    assert tis == pytest.approx([-r / 4 for r in RHO])


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"is_cap": 0.0}, "is_cap must be > 0"),
        ({"is_cap": -1.0}, "is_cap must be > 0"),
        ({"mask_low": 2.0, "mask_high": 2.0}, "mask_low must be < mask_high"),
        ({"mask_low": 3.0}, "mask_low must be < mask_high"),
        ({"mask_low": -0.1}, "mask_low must be >= 0"),
        ({"ratio_level": "sentence"}, "did you mean 'sequence'"),
        ({"recompute_proximal": "yes"}, "recompute_proximal must be true or false"),
    ],
)
def test_bad_settings_name_the_key(overrides, message):
    with pytest.raises(ValueError, match=message) as error:
        resolve_preset("tis-token", **overrides)
    assert error.value.key == next(iter(overrides))
    assert "\n" not in str(error.value)


# RED-Drop variants. Group 0: one positive, four negatives; group 1: two positives, one negative.
DROP_REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0], dtype=torch.float64)
DROP_GROUPS = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1])


def test_probabilistic_drop_keeps_the_whole_group_baseline():
    result = group_advantages(
        DROP_REWARDS, DROP_GROUPS, drop="probabilistic", generator=torch.Generator().manual_seed(3)
    )
    kept = result.keep
    assert kept[0] and kept[5:].all()  # positives always; group 1 has fewer negatives than positives
    # Baseline over all K (not the kept rows): A = r − 0.2 in group 0, r − 2/3 in group 1.
    expected = torch.tensor([0.8, -0.2, -0.2, -0.2, -0.2, 1 / 3, 1 / 3, -2 / 3], dtype=torch.float64)
    assert torch.allclose(result.advantages[kept], expected[kept])
    assert (result.advantages[~kept] == 0).all() and torch.equal(result.dropped, ~kept)


def test_probabilistic_drop_keeps_each_negative_with_probability_pos_over_neg():
    copies = 4000
    rewards = DROP_REWARDS[:5].repeat(copies)
    groups = torch.arange(copies).repeat_interleave(5)
    result = group_advantages(rewards, groups, drop="probabilistic", generator=torch.Generator().manual_seed(0))
    survival = result.keep.view(copies, 5)[:, 1:].double().mean().item()
    assert survival == pytest.approx(1 / 4, abs=0.02)  # #pos/#neg = 1/4
    # Not re-centred: the kept advantages sum to a positive amount on average (AsymRE-like shift).
    assert result.advantages.view(copies, 5).sum(dim=1).mean().item() == pytest.approx(0.8 - 4 * 0.2 / 4, abs=0.02)


def test_keep_dropped_rows_count_in_the_denominator():
    generator = torch.Generator().manual_seed(1)
    removed = group_advantages(DROP_REWARDS, DROP_GROUPS, drop="balance", generator=generator)
    kept = group_advantages(
        DROP_REWARDS, DROP_GROUPS, drop="balance", keep_dropped=True, generator=torch.Generator().manual_seed(1)
    )
    assert kept.keep.all() and torch.equal(kept.dropped, removed.dropped) and removed.dropped.sum() == 3
    assert torch.equal(kept.advantages, removed.advantages)  # same drop, same re-centred values, 0 if dropped
    logprobs = torch.full((8, 2), -1.0, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(8, 2, dtype=torch.bool)
    with_rows, _ = policy_loss(logprobs, logprobs.detach(), kept.advantages, mask & kept.keep[:, None])
    without, _ = policy_loss(logprobs, logprobs.detach(), removed.advantages, mask & removed.keep[:, None])
    assert with_rows.item() == pytest.approx(without.item() * 10 / 16)  # token mean over 16 tokens, not 10


def test_new_presets_exist_with_their_settings():
    assert PRESETS["asymre-0.2"]["regularizer_coef"] == 0.2
    wide_std = PRESETS["rec-oneside-nois-wide-std"]
    assert wide_std["std_normalize"] and (wide_std["eps_low"], wide_std["eps_high"]) == (0.6, 2.0)
    assert PRESETS["red-drop-probabilistic"]["drop"] == "probabilistic"
    assert PRESETS["red-drop-keep"]["keep_dropped"] and PRESETS["red-drop-keep"]["drop"] == "balance"
    assert PRESETS["dr-grpo"]["loss_agg"] == "seq-mean-token-sum-norm" and not PRESETS["dr-grpo"]["std_normalize"]
    assert PRESETS["decoupled-ppo"]["recompute_proximal"]
    assert math.isclose(PRESETS["gspo"]["eps_high"], 4e-4)
