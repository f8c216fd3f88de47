"""The guard before the optimizer: a non-finite loss or gradient norm skips the update, leaves the weights and the
AdamW state bit for bit as they were, says so in one warning line, and the next step trains."""

import copy
import logging
import math

import pytest
import torch

from trainer_helpers import make_batch, make_trainer


def state_of(trainer):
    return copy.deepcopy(trainer.model.state_dict()), copy.deepcopy(trainer.optimizer.state_dict())


def assert_equal_states(before, after):
    (weights, optimizer), (weights_after, optimizer_after) = before, after
    assert all(torch.equal(weights[name], value) for name, value in weights_after.items())
    assert optimizer["param_groups"] == optimizer_after["param_groups"]
    for index, state in optimizer["state"].items():
        assert all(torch.equal(value, optimizer_after["state"][index][key]) for key, value in state.items())


def nan_reward(batch):
    batch[0].reward = float("nan")  # its group's mean, hence every advantage of the group, is NaN


def nan_behaviour_logprob(batch):
    batch[0].behavior_logprobs[0] = float("nan")  # ρ = exp(log π − NaN): the importance weight is NaN


@pytest.mark.parametrize("poison", [nan_reward, nan_behaviour_logprob])
def test_a_nan_loss_skips_the_update_and_the_run_continues(poison, caplog):
    trainer, tokenizer = make_trainer("grpo")
    first = trainer.step(make_batch(tokenizer))  # AdamW has moments to keep
    assert first["optim/skipped_updates"] == 0.0
    before = state_of(trainer)
    batch = make_batch(tokenizer, seed=1)
    poison(batch)
    with caplog.at_level(logging.WARNING, logger="oprl.trainer"):
        metrics = trainer.step(batch)
    assert_equal_states(before, state_of(trainer))
    assert all(p.grad is None for p in trainer.model.parameters())
    assert metrics["optim/skipped_updates"] == 1.0 and math.isnan(metrics["loss/total"])
    assert trainer.version == 2
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith("train step 2: non-finite loss nan") and "optimizer update skipped" in warning
    after = trainer.step(make_batch(tokenizer, seed=2))  # the next batch trains
    assert after["optim/skipped_updates"] == 0.0 and math.isfinite(after["loss/total"])
    assert any(not torch.equal(before[0][n], p) for n, p in trainer.model.state_dict().items())


def test_only_the_poisoned_mini_batch_is_skipped():
    trainer, tokenizer = make_trainer("tis-token", mini_batches=2)  # unclipped: every mini-batch has a gradient
    before = state_of(trainer)
    batch = make_batch(tokenizer)
    nan_behaviour_logprob(batch)
    metrics = trainer.step(batch)
    assert metrics["optim/skipped_updates"] == 1.0
    assert any(not torch.equal(before[0][n], p) for n, p in trainer.model.state_dict().items())
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_an_infinite_gradient_norm_alone_skips_the_update(caplog):
    trainer, tokenizer = make_trainer("grpo")
    before = state_of(trainer)
    real = trainer.parallel.clip_grad_norm
    trainer.parallel.clip_grad_norm = lambda params, max_norm: real(params, max_norm) * math.inf
    with caplog.at_level(logging.WARNING, logger="oprl.trainer"):
        metrics = trainer.step(make_batch(tokenizer))
    assert_equal_states(before, state_of(trainer))
    assert metrics["optim/skipped_updates"] == 1.0 and math.isfinite(metrics["loss/total"])
    assert [r.getMessage() for r in caplog.records][-1].startswith("train step 1: non-finite gradient norm inf:")
