"""The trainer: parameters move, micro-batching is exact, RED-Drop rows leave the batch, mini-batches step."""

import copy
import math

import pytest
import torch

from oprl.algorithms import PRESETS
from oprl.algorithms.method import Method
from oprl.config import OptimConfig
from oprl.errors import OprlError
from oprl.models.tiny import build_model, build_tokenizer
from oprl.models.truncation import Sampling
from oprl.trainer.trainer import Trainer
from trainer_helpers import make_batch, make_trainer


def test_step_changes_parameters_and_version():
    trainer, tokenizer = make_trainer()
    before = copy.deepcopy(trainer.model.state_dict())
    metrics = trainer.step(make_batch(tokenizer))
    assert trainer.version == 1
    changed = [n for n, p in trainer.model.state_dict().items() if not torch.equal(p, before[n])]
    assert len(changed) == len(before)
    for key in ("loss/clip_frac", "loss/ratio_mean", "optim/grad_norm", "reward/mean", "response/length_mean"):
        assert key in metrics
    assert metrics["reward/mean"] == pytest.approx(4 / 12)


@pytest.mark.parametrize("preset", ["grpo", "reinforce", "opmd", "red-weight"])
def test_micro_batching_equals_full_batch(preset):
    full, tokenizer = make_trainer(preset, micro_batch_size=256)
    micro, _ = make_trainer(preset, micro_batch_size=3)
    batch = make_batch(tokenizer)
    # Compare accumulated gradients, not Adam steps: Adam's first step is ~lr*sign(g) and would amplify
    # float-rounding differences on parameters whose gradient is ~0.
    for trainer in (full, micro):
        trainer.optimizer.step = lambda: None
        trainer.step(copy.deepcopy(batch))
    for (name, a), (_, b) in zip(full.model.named_parameters(), micro.model.named_parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, atol=1e-6, rtol=1e-4), name


def test_seq_mean_token_sum_norm_micro_batching_uses_fixed_normaliser():
    settings = dict(PRESETS["reinforce"], loss_agg="seq-mean-token-sum-norm")
    results = []
    for size in (256, 2):
        tokenizer = build_tokenizer()
        model = build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0)
        trainer = Trainer(
            model,
            pad_id=tokenizer.pad_token_id,
            method=Method.of(settings, max_response_tokens=8),
            optim=OptimConfig(micro_batch_size=size),
            sampling=Sampling(),
        )
        trainer.optimizer.step = lambda: None
        trainer.step(make_batch(tokenizer))
        results.append({n: p.grad for n, p in model.named_parameters()})
    for name in results[0]:
        assert torch.allclose(results[0][name], results[1][name], atol=1e-6, rtol=1e-4), name


def test_red_drop_removes_rows_before_the_loss():
    trainer, tokenizer = make_trainer("red-drop")
    metrics = trainer.step(make_batch(tokenizer))
    # Groups 0 and 2 have 1 positive vs 3 negatives -> 2 dropped each; group 1 has 2 vs 2 -> none.
    assert metrics["adv/keep_frac"] == pytest.approx(8 / 12)


def test_mini_batches_and_epochs_take_several_optimizer_steps():
    trainer, tokenizer = make_trainer(mini_batches=2, epochs=2)
    trainer.step(make_batch(tokenizer))
    state = trainer.optimizer.state[next(iter(trainer.model.parameters()))]
    assert int(state["step"]) == 4
    assert trainer.version == 1


def test_log_ref_kl_every_logs_kl_to_initial_policy_without_changing_the_update():
    tokenizer = build_tokenizer()
    trainers = []
    for every in (0, 2):
        model = build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0)
        trainers.append(
            Trainer(
                model,
                pad_id=tokenizer.pad_token_id,
                method=Method.of(PRESETS["reinforce"], max_response_tokens=8, log_ref_kl_every=every),
                optim=OptimConfig(lr=1e-2),
                sampling=Sampling(),
                seed=0,
            )
        )
    plain, logged = trainers
    batch = make_batch(tokenizer)
    first = [t.step(copy.deepcopy(batch)) for t in trainers]
    assert "kl/ref" not in first[0] and "kl/ref" not in first[1]  # step 1: not a logging step of every=2
    second = [t.step(copy.deepcopy(batch)) for t in trainers]
    assert second[1]["kl/ref"] > 1e-6  # the policy has moved away from the frozen copy
    assert second[0]["loss/total"] == second[1]["loss/total"]  # logging only: the loss is untouched
    for a, b in zip(plain.model.parameters(), logged.model.parameters(), strict=True):
        assert torch.equal(a, b)


def _saved_bytes(trainer, batch) -> int:
    """Bytes autograd keeps for backward during one forward of the trainer's policy (train mode, as in a step)."""
    saved = []

    def pack(tensor):
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    trainer.model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        trainer.policy([e.prompt_ids for e in batch], [e.response_ids for e in batch], trainer.pad_id)
    return sum(saved)


def test_activation_checkpointing_keeps_fewer_activations_and_equals_the_default():
    """trainer.activation_checkpointing: same gradients (checkpointed layers recomputed in backward, prompts
    packed per row instead of shared), and backward keeps far less than every layer's intermediates."""
    plain, tokenizer = make_trainer(num_layers=3)
    checkpointed, _ = make_trainer(num_layers=3, activation_checkpointing=True)
    batch = make_batch(tokenizer, groups=3, k=4)
    assert _saved_bytes(checkpointed, batch) < 0.5 * _saved_bytes(plain, batch)
    for trainer in (plain, checkpointed):  # gradients, not Adam steps (see test_micro_batching_equals_full_batch)
        trainer.optimizer.step = lambda: None
        trainer.step(copy.deepcopy(batch))
    for (name, a), (_, b) in zip(plain.model.named_parameters(), checkpointed.model.named_parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, atol=1e-6, rtol=1e-4), name


def test_activation_checkpointing_on_a_model_without_it_is_one_line():
    from oprl.errors import OprlError
    from oprl.trainer.distributed import enable_activation_checkpointing

    with pytest.raises(OprlError, match=r"^trainer.activation_checkpointing: Linear does not support"):
        enable_activation_checkpointing(torch.nn.Linear(2, 2))


def test_bfloat16_autocast_trains_over_float32_master_weights():
    """trainer.autocast=bfloat16: the loss is finite, every parameter moves, and parameters, gradients and AdamW
    moments stay float32; the log-probs were computed in bfloat16 (they differ from the float32 trainer's)."""
    exact, tokenizer = make_trainer(seed=0)
    mixed, _ = make_trainer(seed=0, autocast=torch.bfloat16)
    batch = make_batch(tokenizer)
    before = {name: p.detach().clone() for name, p in mixed.model.named_parameters()}
    metrics = mixed.step(batch)
    assert math.isfinite(metrics["loss/total"]) and metrics["optim/grad_norm"] > 0
    for name, param in mixed.model.named_parameters():
        assert param.dtype == torch.float32 and param.grad.dtype == torch.float32, name
        assert not torch.equal(param.detach(), before[name]), f"{name} did not change"
        state = mixed.optimizer.state[param]
        assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32, name
    reference = exact.step(batch)
    assert metrics["loss/total"] != reference["loss/total"]
    assert metrics["loss/total"] == pytest.approx(reference["loss/total"], rel=0.05, abs=0.01)


def test_autocast_with_bfloat16_weights_is_one_line():
    from oprl.config import load_config

    with pytest.raises(OprlError, match=r"^trainer.autocast=bfloat16 needs model.dtype=float32 .*bfloat16$"):
        load_config(None, ["trainer.autocast=bfloat16", "model.dtype=bfloat16"])  # refused at load
