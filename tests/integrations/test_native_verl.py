"""oprl's presets against verl 0.9.1's own policy losses, rollout corrections and GRPO advantages (#70): on identical
tensors verl's functions (``verl.trainer.ppo.core_algos``, ``rollout_corr_helper``, unchanged, with verl's own
``ActorConfig``) and ``oprl.algorithms`` give the same gradient, or differ exactly as docs/algorithms.md#native-
cross-checks says (each difference is asserted here, so the table cannot go stale).

verl's PPO-style losses write −max(−ρA, −clip(ρ)A) with ρ carrying the gradient, oprl −M·w·A·log π with w detached:
their values differ, their gradients must not. test_verl.py is the other direction (oprl's loss inside verl).
"""

import math

import pytest
import torch
from verl.trainer.config.algorithm import RolloutCorrectionConfig
from verl.trainer.ppo import core_algos
from verl.workers.config import ActorConfig, PolicyLossConfig

from oprl.algorithms import LossParams, advantage_settings, group_advantages, policy_loss, resolve_preset

B, T = 6, 5


def batch(seed=0):
    """(old, new with grad, advantages (B,), mask): ρ on both sides of every band; the last response, A < 0, moved
    by ρ = e^1.2 = 3.3 on every token (past the dual clip's 3, and rejected as a whole sequence)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(B, T)
    mask[1, 3:] = 0
    mask[4, 1:] = 0
    old = -torch.rand(B, T, generator=g) * 2 - 1.3
    new = old + 0.6 * torch.randn(B, T, generator=g)
    new[-1] = old[-1] + 1.2
    advantages = torch.randn(B, generator=g)
    advantages[-1] = -0.8
    return old, new.clamp(max=-1e-3).requires_grad_(), advantages, mask


def actor(**settings) -> ActorConfig:
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, **settings)


def gradients(verl_fn, preset, overrides=None, config=None, agg="token-mean", seed=0):
    """(verl's loss, oprl's loss, verl's gradient, oprl's gradient) on one batch; verl gets A on every token."""
    old, new, advantages, mask = batch(seed)
    theirs, _ = verl_fn(old, new, advantages[:, None] * mask, mask, agg, config)
    mine_new = new.detach().clone().requires_grad_()
    params = LossParams.of({**resolve_preset(preset, **(overrides or {})), "loss_agg": agg}, normalizer=float(T))
    mine, _ = policy_loss(mine_new, old, advantages, mask, params)
    theirs.backward()
    mine.backward()
    assert new.grad.abs().sum() > 0
    return theirs, mine, new.grad, mine_new.grad


# (id, verl's loss, verl's ActorConfig settings, oprl's preset and overrides). verl's clip_ratio_c is dual-clip PPO's
# c = 3 on by default in "vanilla"; oprl's presets leave it off (dual_clip=None), so it is set here for the equality
# and test_vanillas_dual_clip_is_the_one_difference measures it.
CASES = [
    ("vanilla", "vanilla", {"clip_ratio": 0.2}, "rec-oneside-is", {"dual_clip": 3.0}),
    ("vanilla-grpo", "vanilla", {"clip_ratio": 0.2}, "grpo", {"dual_clip": 3.0}),
    ("vanilla-clip-higher", "vanilla", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}, "grpo",
     {"dual_clip": 3.0, "eps_high": 0.28}),
    ("gspo", "gspo", {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4}, "gspo", {}),
    ("sapo", "sapo", {}, "sapo", {}),
    ("cispo", "cispo", {"clip_ratio_low": 1.0, "clip_ratio_high": 1.0}, "cispo", {}),
    # verl's DPPO reads its divergence bound from clip_ratio_low/high (ActorConfig's default 0.2 each, not None, so
    # clip_ratio alone is ignored) and truncates ρ at clip_ratio_c (the config's default is PPO's 3, DPPO's is 20).
    ("dppo_tv", "dppo_tv", {"clip_ratio_low": 0.15, "clip_ratio_high": 0.15, "clip_ratio_c": 20.0}, "dppo-tv", {}),
    ("dppo_kl", "dppo_kl", {"clip_ratio_low": 0.05, "clip_ratio_high": 0.05, "clip_ratio_c": 20.0}, "dppo-kl", {}),
]  # fmt: skip


@pytest.mark.parametrize(("loss", "settings", "preset", "overrides"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_verl_policy_loss_has_oprls_gradient(loss, settings, preset, overrides, agg):
    verl_fn = core_algos.get_policy_loss_fn(loss)
    _, _, theirs, mine = gradients(verl_fn, preset, overrides, actor(**settings), agg)
    # verl's SAPO aggregates seq-mean-token-mean whatever loss_agg_mode says (core_algos.py, compute_policy_loss_sapo)
    if loss == "sapo" and agg != "seq-mean-token-mean":
        _, _, theirs, mine = gradients(verl_fn, preset, overrides, actor(**settings), "seq-mean-token-mean")
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("loss", ["cispo", "dppo_tv"])
def test_the_forms_with_a_detached_weight_have_oprls_value_too(loss):
    settings, preset = next((c[2], c[3]) for c in CASES if c[0] == loss)
    theirs, mine, _, _ = gradients(core_algos.get_policy_loss_fn(loss), preset, config=actor(**settings))
    torch.testing.assert_close(mine, theirs)


def test_vanillas_dual_clip_is_the_one_difference():
    """verl's "vanilla" always applies dual-clip PPO (clip_ratio_c = 3, asserted > 1): tokens with A < 0 and ρ > 3 get
    no gradient there, and the full −ρ·A·∇log π in oprl's rec-oneside-is / grpo (dual_clip unset)."""
    old, new, advantages, _ = batch()
    _, _, theirs, mine = gradients(core_algos.get_policy_loss_fn("vanilla"), "grpo", {}, actor(clip_ratio=0.2))
    ratio = (new.detach() - old).exp()
    capped = (advantages[:, None] < 0) & (ratio > 3)
    assert capped.any()
    torch.testing.assert_close(mine[~capped], theirs[~capped], rtol=1e-5, atol=1e-7)
    assert (theirs[capped] == 0).all() and (mine[capped] != 0).all()


def test_gspos_clamp_at_log_ratio_10_is_the_one_difference():
    """verl clamps GSPO's log s_i at 10 from above (no gradient past it), oprl at 20: only a response whose geometric
    mean ratio exceeds e^10 with A < 0 (the one side of the clip with no bound) differs."""
    old, new, advantages, mask = batch()
    with torch.no_grad():
        new[2] = old[2] + 11.0  # s_2 = e^11
        new[3] = old[3] + 9.0  # s_3 = e^9: inside both clamps
    advantages[2] = advantages[3] = -1.0
    verl_fn, config = core_algos.get_policy_loss_fn("gspo"), actor(clip_ratio_low=3e-4, clip_ratio_high=4e-4)
    theirs, _ = verl_fn(old, new, advantages[:, None] * mask, mask, "seq-mean-token-mean", config)
    mine_new = new.detach().clone().requires_grad_()
    mine, _ = policy_loss(mine_new, old, advantages, mask, LossParams.of(resolve_preset("gspo")))
    theirs.backward()
    mine.backward()
    assert (new.grad[2] == 0).all() and (mine_new.grad[2] != 0).all()
    others = torch.arange(B) != 2
    torch.testing.assert_close(mine_new.grad[others], new.grad[others], rtol=1e-5, atol=1e-7)


def bypass(rollout_is=None, threshold=2.0, rollout_rs=None, rs_threshold=None):
    """verl's bypass mode with its REINFORCE loss: w = rollout_is_weights, the rejection folded into the mask."""
    correction = RolloutCorrectionConfig(
        rollout_is=rollout_is,
        rollout_is_threshold=threshold,
        rollout_rs=rollout_rs,
        rollout_rs_threshold=rs_threshold,
        bypass_mode=True,
        loss_type="reinforce",
    )
    return actor(policy_loss=PolicyLossConfig(loss_mode="bypass_mode", rollout_correction=correction))


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_verl_rollout_is_token_is_oprls_tis_token(agg):
    verl_fn = core_algos.get_policy_loss_fn("bypass_mode")
    theirs, mine, theirs_grad, mine_grad = gradients(verl_fn, "tis-token", config=bypass("token"), agg=agg)
    torch.testing.assert_close(mine, theirs)
    torch.testing.assert_close(mine_grad, theirs_grad)


def test_verl_rollout_is_sequence_is_the_product_of_ratios():
    """verl's sequence-level IS weight is the whole response's ratio Π_t ρ_t (``compute_rollout_correction_weights``:
    exp of the masked sum). oprl's ``tis-seq`` truncates the geometric mean (ratio_level=sequence); verl's weight is
    oprl's truncated-is at ratio_level=sequence-sum, and differs from tis-seq."""
    verl_fn = core_algos.get_policy_loss_fn("bypass_mode")
    product = {"ratio_level": "sequence-sum"}
    theirs, mine, theirs_grad, mine_grad = gradients(verl_fn, "tis-seq", product, config=bypass("sequence"))
    torch.testing.assert_close(mine, theirs)
    torch.testing.assert_close(mine_grad, theirs_grad)
    _, geometric, _, _ = gradients(verl_fn, "tis-seq", config=bypass("sequence"))
    assert not torch.isclose(geometric, theirs)


@pytest.mark.parametrize(("rollout_rs", "preset"), [("token_k1", "masked-is-token"), ("seq_mean_k1", "masked-is-seq")])
def test_verl_rejection_renormalizes_over_the_kept_tokens(rollout_rs, preset):
    """verl's rejection (rollout_rs, band 0.5_2.0 on 1/ρ: symmetric in log ρ, so oprl's [0.5, 2] on ρ) removes the
    rejected tokens from the response mask, so a token mean divides by the kept tokens; oprl's clip_mode=mask gives
    them M = 0 and keeps them in the denominator, like every clip. The token-mean losses differ by exactly
    kept/valid tokens; the masks agree."""
    old, new, _, mask = batch()
    verl_fn = core_algos.get_policy_loss_fn("bypass_mode")
    theirs, mine, _, _ = gradients(verl_fn, preset, config=bypass(None, None, rollout_rs, "0.5_2.0"))
    log_ratio = new.detach() - old
    if rollout_rs == "seq_mean_k1":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1))[:, None].expand_as(mask)
    kept = ((log_ratio.abs() <= math.log(2.0)).float() * mask).sum()
    assert 0 < kept < mask.sum()
    torch.testing.assert_close(mine, theirs * kept / mask.sum())


@pytest.mark.parametrize("norm_by_std", [False, True])
def test_verl_grpo_advantages(norm_by_std):
    """verl's GRPO advantage: r − mean equals oprl's; with the std it divides by the sample std (torch.std) + 1e-6,
    oprl by the population std + 1e-6, so verl's is oprl's times √((K − 1)/K) up to the eps (as TRL's); and a group
    of one response gets A = r (mean 0, std 1) where oprl gives 0."""
    k = 4
    rewards = torch.tensor([1.0, 0, 0, 1, 0.5, 0.25, 1, 0, 0.7])  # groups of 4 and 4 and one singleton
    groups = torch.tensor([0] * k + [1] * k + [2])
    token_rewards = torch.zeros(len(rewards), T)
    token_rewards[:, -1] = rewards
    theirs, _ = core_algos.compute_grpo_outcome_advantage(
        token_rewards, torch.ones(len(rewards), T), groups.numpy(), norm_adv_by_std_in_grpo=norm_by_std
    )
    preset = "grpo" if norm_by_std else "reinforce"
    mine = group_advantages(rewards, groups, **advantage_settings(resolve_preset(preset))).advantages
    scale = math.sqrt((k - 1) / k) if norm_by_std else 1.0
    torch.testing.assert_close(theirs[:-1, 0], mine[:-1] * scale, atol=1e-5, rtol=1e-5)
    assert theirs[-1, 0] == pytest.approx(float(rewards[-1]), rel=1e-5) and mine[-1] == 0
