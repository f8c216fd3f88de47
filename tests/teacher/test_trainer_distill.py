"""The trainer with the ``distill`` preset: teacher = student leaves the weights unchanged, a different teacher
moves them and is measured, and rows without teacher log-probs are one line."""

import pytest
import torch

from oprl.errors import OprlError
from trainer_helpers import make_batch, make_trainer


def weights_of(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_teacher_equal_to_student_trains_nothing():
    trainer, tokenizer = make_trainer("distill")
    batch = make_batch(tokenizer)
    for e in batch:
        e.teacher_logprobs = list(e.behavior_logprobs)
    before = weights_of(trainer.model)
    metrics = trainer.step(batch)
    assert metrics["optim/grad_norm"] == 0.0
    assert metrics["distill/reverse_kl"] == 0.0 and metrics["distill/agreement"] == 1.0
    assert all(torch.equal(before[n], p) for n, p in trainer.model.named_parameters())


def test_a_teacher_moves_the_weights_and_is_measured():
    trainer, tokenizer = make_trainer("distill")
    batch = make_batch(tokenizer)
    for e in batch:  # the teacher likes the first token of every response more, the rest less
        e.teacher_logprobs = [lp + (0.5 if t == 0 else -0.25) for t, lp in enumerate(e.behavior_logprobs)]
    before = weights_of(trainer.model)
    metrics = trainer.step(batch)
    gaps = [-(0.5 if t == 0 else -0.25) for e in batch for t in range(len(e.response_ids))]
    assert metrics["distill/reverse_kl"] == pytest.approx(sum(gaps) / len(gaps), abs=1e-6)
    assert metrics["optim/grad_norm"] > 0
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())


def test_rows_without_teacher_logprobs_are_one_line():
    trainer, tokenizer = make_trainer("distill")
    with pytest.raises(OprlError, match=r"without teacher log-probs: set teacher\.path") as error:
        trainer.step(make_batch(tokenizer))
    assert "\n" not in str(error.value)


def test_scored_rows_are_measured_without_distillation():
    trainer, tokenizer = make_trainer("grpo")
    batch = make_batch(tokenizer)
    for e in batch:
        e.teacher_logprobs = [lp - 1.0 for lp in e.behavior_logprobs]
    metrics = trainer.step(batch)
    assert metrics["distill/reverse_kl"] == pytest.approx(1.0, abs=1e-6)
