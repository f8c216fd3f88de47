"""oprl's algorithms inside verl (0.9.1): register_verl() puts every preset into verl's policy-loss and
advantage-estimator registries; on the same tensors verl's registered functions give oprl.algorithms'
policy_loss and group_advantages exactly, and the global-batch rescaling matches verl's own agg_loss."""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo import core_algos

from oprl.algorithms import PRESETS, LossParams, advantage_settings, group_advantages, policy_loss, resolve_preset
from oprl.integrations.verl import register_verl

B, T = 6, 5


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(B, T)
    mask[1, 3:] = 0  # padded responses of different lengths
    mask[4, 1:] = 0
    old = -torch.rand(B, T, generator=g) * 2
    new = (old + 0.5 * torch.randn(B, T, generator=g)).requires_grad_()  # ratios on both sides of the clips
    adv_seq = torch.randn(B, generator=g)
    return old, new, adv_seq, mask


def test_every_preset_is_in_verls_registries():
    names = register_verl()
    # vcpo's step rule, aspo-entropy's token entropies, red-weight's response lengths and the Kondo gate's screening
    # forward live in oprl's trainer; score centering and the Top-K masks read the sampler's top-K, which only
    # oprl's rows carry
    trainer_only = ("vcpo", "aspo-entropy", "red-weight-adaptive", "red-weight-shift", "dg-kondo",
                    "dppo-tv-topk", "dppo-kl-topk", "reinforce-sc", "rec-oneside-nois-sc", "tis-token-sc")  # fmt: skip
    assert names == ["oprl-" + p for p in PRESETS if p not in trainer_only]
    with pytest.raises(ValueError, match="ess_lr=sqrt, baseline=off-policy-optimal"):
        register_verl(["vcpo"])
    for name in names:
        assert core_algos.get_policy_loss_fn(name) is core_algos.POLICY_LOSS_REGISTRY[name]
        assert callable(core_algos.get_adv_estimator_fn(name))
    assert register_verl(["opmd"]) == ["oprl-opmd"]  # a second registration replaces, never raises


@pytest.mark.parametrize("preset", ["rec-oneside-nois", "grpo", "opmd", "red-weight", "tis-seq", "masked-is-token"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_policy_loss_equals_oprl(preset, agg):
    register_verl([preset])
    old, new, adv_seq, mask = batch()
    loss_fn = core_algos.get_policy_loss_fn("oprl-" + preset)
    loss, metrics = loss_fn(old, new, adv_seq[:, None] * mask, mask, agg, None)  # verl's token-level A
    loss_kwargs = resolve_preset(preset)
    ref_new = new.detach().clone().requires_grad_()
    expected, ref_metrics = policy_loss(ref_new, old, adv_seq, mask, LossParams.of({**loss_kwargs, "loss_agg": agg}))
    torch.testing.assert_close(loss, expected)
    loss.backward()
    expected.backward()
    torch.testing.assert_close(new.grad, ref_new.grad)
    assert metrics == pytest.approx({f"actor/oprl/{k}": float(v) for k, v in ref_metrics.items()}, rel=1e-5)
    assert loss.abs() > 0


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_micro_batches_with_verls_global_counts_sum_to_the_full_batch_loss(agg):
    """verl calls the loss per micro-batch with global_batch_info; the sum is the full-batch loss (dp=1)."""
    register_verl(["rec-oneside-nois"])
    loss_fn = core_algos.get_policy_loss_fn("oprl-rec-oneside-nois")
    old, new, adv_seq, mask = batch(1)
    adv = adv_seq[:, None] * mask
    full, _ = loss_fn(old, new, adv, mask, agg, None)
    info = {"dp_size": 1, "batch_num_tokens": mask.sum(), "global_batch_size": float(B)}
    config = OmegaConf.create({"global_batch_info": {k: float(v) for k, v in info.items()}})
    parts = [loss_fn(old[s], new[s], adv[s], mask[s], agg, config)[0] for s in (slice(0, 2), slice(2, B))]
    torch.testing.assert_close(sum(parts), full)


def test_rollout_correction_weights_are_refused():
    register_verl(["rec-oneside-nois"])
    old, new, adv_seq, mask = batch()
    with pytest.raises(ValueError, match="rollout_correction"):
        core_algos.get_policy_loss_fn("oprl-rec-oneside-nois")(
            old, new, adv_seq[:, None], mask, "token-mean", None, torch.ones(B, T)
        )


@pytest.mark.parametrize("preset", ["rec-oneside-nois", "grpo", "opmd", "asymre", "red-drop"])
def test_advantage_estimator_equals_oprl(preset):
    register_verl([preset], seed=3)
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.5, 0.0])
    index = np.array(["b", "a", "b", "a", "c", "c", "b", "a"], dtype=object)  # verl's uids, interleaved
    mask = torch.ones(8, T)
    mask[2, 2:] = 0
    token_rewards = torch.zeros(8, T)
    token_rewards[torch.arange(8), mask.sum(-1).long() - 1] = rewards  # verl puts the score on the last token
    adv, returns = core_algos.get_adv_estimator_fn("oprl-" + preset)(
        token_level_rewards=token_rewards, response_mask=mask, index=index, config=None
    )
    advantage_kwargs = advantage_settings(resolve_preset(preset))
    group_ids = torch.tensor([1, 0, 1, 0, 2, 2, 1, 0])
    expected = group_advantages(rewards, group_ids, generator=torch.Generator().manual_seed(3), **advantage_kwargs)
    torch.testing.assert_close(adv, expected.advantages[:, None] * mask)
    torch.testing.assert_close(returns, adv)
    assert adv.abs().sum() > 0


@pytest.mark.parametrize(("kind", "warmup"), [("cosine", {"warmup_ratio": 0.25}), ("constant", {"warmup_steps": 3})])
def test_verl_schedule_gives_oprls_rates_in_verls_fsdp_actor(kind, warmup):
    from types import SimpleNamespace

    from verl.workers.config.optimizer import FSDPOptimizerConfig
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    from oprl.algorithms.lr_schedule import LrSchedule
    from oprl.config import OptimConfig
    from oprl.integrations.verl import VERL_OPTIM, verl_schedule

    steps = 10
    overrides = verl_schedule(kind, total_steps=steps, **warmup)
    fields = {key.removeprefix(VERL_OPTIM): value for key, value in (o.split("=", 1) for o in overrides)}
    config = OmegaConf.merge(OmegaConf.structured(FSDPOptimizerConfig(lr=0.1, total_training_steps=steps)), fields)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    engine = SimpleNamespace(optimizer_config=OmegaConf.to_object(config), rank=1)
    scheduler = FSDPEngine._build_lr_scheduler(engine, optimizer)  # verl's own construction from its config
    ours = LrSchedule.of(OptimConfig(lr=0.1, lr_schedule=kind, **warmup), steps)
    rates = []
    for _ in range(steps):
        rates.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert rates == pytest.approx([0.1 * ours.factor(t) for t in range(steps)], abs=1e-12)
    with pytest.raises(ValueError, match="constant and cosine"):
        verl_schedule("linear")
