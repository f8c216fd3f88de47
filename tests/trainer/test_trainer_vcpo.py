"""The trainer's side of VCPO (docs/algorithms.md#vcpo): the per-response statistics of the off-policy optimal
baseline are those of a separate forward and backward pass, the advantages the loss receives are the baseline's
formula, and the ESS-scaled step is exactly an AdamW step at lr·√ESS for that step only."""

import copy
import math

import pytest
import torch

import oprl.algorithms.step as step_module
from oprl.algorithms import resolve_preset
from oprl.algorithms.method import Method
from oprl.config import OptimConfig
from oprl.models.logprobs import pack, response_logprobs
from oprl.models.tiny import build_model, build_tokenizer
from oprl.models.truncation import Sampling
from oprl.trainer.trainer import Trainer
from trainer_helpers import make_batch

LR = 3e-4


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread: the score pass is many tiny single-row ops, which two threads only slow down when
    another process holds the cores (a run sets its workers' threads with ``runtime.torch_threads``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def vcpo_trainer(lr=LR, micro_batch_size=256, **overrides):
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    trainer = Trainer(
        model,
        pad_id=tokenizer.pad_token_id,
        method=Method.of(resolve_preset("vcpo", **overrides), max_response_tokens=8),
        optim=OptimConfig(lr=lr, micro_batch_size=micro_batch_size),
        sampling=Sampling(),
    )
    return trainer, tokenizer


def separate_statistics(model, rows, pad_id):
    """Per row, from a fresh copy of ``model`` and a plain packed forward: (Σ_t log π − log π_b, ‖∇ Σ_t log π‖²)."""
    model = copy.deepcopy(model).train()
    params = [p for p in model.parameters() if p.requires_grad]
    out = []
    for row in rows:
        input_ids, attention_mask, targets, mask = pack([row.prompt_ids], [row.response_ids], pad_id)
        logprobs, _ = response_logprobs(model, input_ids, attention_mask, targets)
        values = logprobs[mask.bool()]
        grads = torch.autograd.grad(values.sum(), params, allow_unused=True)
        squared = sum(float(g.pow(2).sum()) for g in grads if g is not None)
        out.append((float((values.detach() - torch.tensor(row.behavior_logprobs)).sum()), squared))
    return out


def reference_advantages(rows, statistics):
    """A_i = (r_i − b*_g)/(std_g(r) + 1e-6), b*_g = Σ w²‖g‖²r / Σ w²‖g‖² over the group (plain Python)."""
    out = []
    for row in rows:
        pairs = zip(rows, statistics, strict=True)
        members = [(other.reward, stat) for other, stat in pairs if other.group_id == row.group_id]
        weights = [math.exp(2 * log_w) * squared for _, (log_w, squared) in members]
        rewards = [reward for reward, _ in members]
        baseline = sum(w * r for w, r in zip(weights, rewards, strict=True)) / sum(weights)
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
        out.append((row.reward - baseline) / (std + 1e-6) if max(rewards) > min(rewards) else 0.0)
    return out


def reference_ess(statistics):
    weights = [math.exp(log_w) for log_w, _ in statistics]
    return sum(weights) ** 2 / (len(weights) * sum(w * w for w in weights))


def test_score_statistics_are_a_separate_forward_and_backward():
    trainer, tokenizer = vcpo_trainer()
    trainer.step(make_batch(tokenizer))  # off the initial weights first
    batch = make_batch(tokenizer, seed=1)
    expected = separate_statistics(trainer.model, batch, tokenizer.pad_token_id)
    log_w, squared = trainer.inputs.score_statistics(batch)
    assert log_w.tolist() == pytest.approx([e[0] for e in expected], rel=1e-5, abs=1e-5)
    assert squared.tolist() == pytest.approx([e[1] for e in expected], rel=1e-4)
    assert all(p.grad is None for p in trainer.model.parameters())  # nothing left for the update to add to


def test_the_loss_gets_the_off_policy_optimal_advantages(monkeypatch):
    trainer, tokenizer = vcpo_trainer()
    batch = make_batch(tokenizer)
    expected = reference_advantages(batch, separate_statistics(trainer.model, batch, tokenizer.pad_token_id))
    seen = []
    original = step_module.policy_loss
    monkeypatch.setattr(step_module, "policy_loss", lambda *a, **k: seen.append(a[2].clone()) or original(*a, **k))
    metrics = trainer.step(batch)
    assert len(seen) == 1 and seen[0].tolist() == pytest.approx(expected, rel=1e-4, abs=1e-5)
    assert any(a > 0 for a in expected) and any(a < 0 for a in expected)
    assert metrics["vcpo/baseline_gap"] > 0 and metrics["vcpo/score_norm_mean"] > 0


def test_the_ess_scaled_step_is_an_adamw_step_at_the_scaled_rate_for_that_step_only():
    # Three micro-batches: the ESS is the mini-batch's, gathered over them, not their average.
    scaled, tokenizer = vcpo_trainer(micro_batch_size=5)
    batch = make_batch(tokenizer)
    expected_ess = reference_ess(separate_statistics(scaled.model, batch, tokenizer.pad_token_id))
    metrics = scaled.step(batch)
    assert metrics["vcpo/ess"] == pytest.approx(expected_ess, rel=1e-4)
    assert expected_ess < 0.9  # make_batch's behaviour log-probs are far from the model's
    assert metrics["vcpo/lr_scale"] == pytest.approx(math.sqrt(expected_ess), rel=1e-6)
    assert metrics["optim/lr"] == LR * metrics["vcpo/lr_scale"]
    assert scaled.optimizer.param_groups[0]["lr"] == LR  # restored after the step
    # The same step with the rate set to lr·scale and no ESS scaling gives the same weights, bit for bit.
    plain, _ = vcpo_trainer(lr=LR * metrics["vcpo/lr_scale"], micro_batch_size=5, ess_lr="none")
    plain_metrics = plain.step(make_batch(tokenizer))
    assert not any(key in plain_metrics for key in ("vcpo/lr_scale", "vcpo/ess"))
    for name, value in plain.model.state_dict().items():
        assert torch.equal(value, scaled.model.state_dict()[name]), name


def test_on_policy_the_step_is_the_configured_one():
    trainer, tokenizer = vcpo_trainer(ess_lr="linear")
    batch = make_batch(tokenizer)
    own = separate_statistics(trainer.model, batch, tokenizer.pad_token_id)
    for row, (log_w, _) in zip(batch, own, strict=True):  # shift π_b so that every response's Π_t ρ_t = 1
        row.behavior_logprobs = [v + log_w / len(row.behavior_logprobs) for v in row.behavior_logprobs]
    metrics = trainer.step(batch)
    assert metrics["vcpo/ess"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["vcpo/lr_scale"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["optim/lr"] == pytest.approx(LR, rel=1e-5)
