"""The trainer's scope of the batch rules (#70): with M2PO's three forms and BAPO, an update's gradient does not
depend on ``optim.micro_batch_size`` (the mini-batch's 12 rows in 1, 2 or 4 micro-batches), because the mask's
statistic is computed once over the mini-batch (``Trainer._batch_rule``); the same update with each micro-batch's
own statistic (the scope before #70) moves. micro == mini runs no extra forward.

Tolerance: the micro-batches' forwards pad to their own widths, so float32 log-probs differ from the whole batch's in
the last bits (the existing ``test_micro_batching_equals_full_batch`` allows atol 1e-6, rtol 1e-4); measured here the
gradients differ by < 1e-7 while each micro-batch's own statistic moves them by > 1e-3."""

import copy

import pytest
import torch

from oprl.algorithms import PRESETS
from oprl.algorithms.method import Method
from oprl.config import OptimConfig
from oprl.models.tiny import build_model, build_tokenizer
from oprl.models.truncation import Sampling
from oprl.trainer.trainer import Trainer
from trainer_helpers import make_batch

RULES = {  # preset, overrides: m2-clip's band is never narrower than [1 − ε_low, 1 + ε_high], so ε = 0 lets M2PO's
    # own bound decide (the preset's [0.7, 1.5] already holds every ratio of these batches)
    "m2po": {},
    "m2po-areal": {},
    "m2po-clip": {"eps_low": 0.0, "eps_high": 0.0},
    "bapo": {"bapo_target": 0.6},  # the preset's 0.5 holds at the start bounds in each quarter as in the whole
}
BATCH_RULE = Trainer._batch_rule
SIZES = [12, 6, 3]  # micro_batch_size: the mini-batch (make_batch's 12 rows), half, quarter


def make_trainer(preset, micro_batch_size):
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    method = Method.of(dict(PRESETS[preset], **RULES[preset]), max_response_tokens=8)
    trainer = Trainer(model, pad_id=tokenizer.pad_token_id, method=method,
                      optim=OptimConfig(micro_batch_size=micro_batch_size), sampling=Sampling())  # fmt: skip
    return trainer, tokenizer


def off_policy_batch(preset, spread):
    """make_batch's rows with behaviour log-probs = the tiny model's own plus N(0, spread²) noise: ratios near 1
    with a spread, where the rules mask some tokens and not all."""
    trainer, tokenizer = make_trainer(preset, 256)
    batch = make_batch(tokenizer)
    current = trainer.inputs.proximal_logprobs(batch)
    generator = torch.Generator().manual_seed(0)
    for row, values in zip(batch, current, strict=True):
        row.behavior_logprobs = (torch.tensor(values) + spread * torch.randn(len(values), generator=generator)).tolist()
    return batch


def gradients(preset, batch, micro_batch_size, *, whole_batch_rule=True, monkeypatch=None):
    trainer, _ = make_trainer(preset, micro_batch_size=micro_batch_size)
    trainer.optimizer.step = lambda: None  # compare accumulated gradients, not Adam steps
    calls = []

    def counted(self, *args):
        calls.append(len(args[2]))
        return BATCH_RULE(self, *args) if whole_batch_rule else [None] * len(args[2])

    monkeypatch.setattr(Trainer, "_batch_rule", counted)
    metrics = trainer.step(copy.deepcopy(batch))
    return {name: p.grad.clone() for name, p in trainer.model.named_parameters()}, metrics, calls


def largest_difference(a, b):
    return max((a[name] - b[name]).abs().max().item() for name in a)


@pytest.fixture(scope="module")
def batch():
    return off_policy_batch("m2po", spread=0.3)  # the tiny model is the same for every preset


@pytest.mark.parametrize("preset", list(RULES))
def test_the_gradient_does_not_depend_on_the_micro_batch_size(preset, batch, monkeypatch):
    whole, whole_metrics, calls = gradients(preset, batch, 12, monkeypatch=monkeypatch)
    assert calls == []  # micro == mini: nothing extra runs
    assert 0 < whole_metrics["loss/clip_frac"] < 1
    rule_keys = [key for key in whole_metrics if key.startswith(("loss/m2", "loss/bapo"))]
    for size in SIZES[1:] if preset == "m2po" else SIZES[2:]:  # the half once, the quarter for each rule
        micro, metrics, calls = gradients(preset, batch, size, monkeypatch=monkeypatch)
        assert calls == [12 // size]  # one pre-pass over the update's micro-batches
        assert largest_difference(micro, whole) < 1e-6, size
        assert metrics["loss/clip_frac"] == pytest.approx(whole_metrics["loss/clip_frac"], abs=1e-6)
        assert all(metrics[key] == pytest.approx(whole_metrics[key], rel=1e-5, abs=1e-7) for key in rule_keys)
    own, _, _ = gradients(preset, batch, SIZES[-1], whole_batch_rule=False, monkeypatch=monkeypatch)
    assert largest_difference(own, whole) > 1e-3  # each micro-batch's own statistic would change the update
