"""``teacher.support`` under top-p / top-k sampling (docs/algorithms.md, "Distillation under top-p / top-k"):
``truncated`` with teacher = student returns the behaviour log-probs (zero advantage), ``full`` differs from them
by log M_t (the student's kept mass, computed here by hand from the full softmax), a token outside the teacher's
kept set scores -inf and the trainer floors and counts it, and vLLM refuses ``truncated`` in one line."""

import math
from typing import Any

import pytest
import torch

from oprl.algorithms import distill_advantages
from oprl.config import load_config
from oprl.errors import OprlError
from oprl.models.tiny import build_model, build_tokenizer
from oprl.rollout import ENGINES, Sampling
from oprl.teacher import Teacher
from oprl.teacher.teacher import build_teacher
from trainer_helpers import make_batch, make_trainer

TEMPERATURE = 0.7
TRUNCATIONS: dict[str, dict[str, Any]] = {"top_p=0.9": {"top_p": 0.9}, "top_k=20": {"top_k": 20}}


@pytest.fixture(scope="module")
def student():
    tokenizer = build_tokenizer()
    return build_model(tokenizer, hidden_size=32, num_layers=2, num_heads=2, seed=0), tokenizer


@pytest.fixture(scope="module", params=list(TRUNCATIONS))
def sampled(request, student):
    """(truncation, prompts, rollout): 2 prompts x 3 responses the lean engine sampled under ``truncation``."""
    model, tokenizer = student
    truncation = TRUNCATIONS[request.param]
    engine = ENGINES["lean"](model, tokenizer, sampling=Sampling(TEMPERATURE, **truncation), max_new_tokens=6)
    prompts = [tokenizer(f"<|user|>{a}+1=</s><|assistant|>", add_special_tokens=False).input_ids for a in range(2)]
    rows = [p for p in prompts for _ in range(3)]
    return truncation, rows, engine.generate(rows, seed=0)


def padded(values: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) float32 values right-padded with 0, and the (B, T) mask of the real ones."""
    width = max(len(v) for v in values)
    out = torch.tensor([v + [0.0] * (width - len(v)) for v in values], dtype=torch.float32)
    return out, torch.tensor([[t < len(v) for t in range(width)] for v in values])


def test_a_truncated_teacher_equal_to_the_student_gives_the_behaviour_logprobs(sampled, student, tmp_path):
    truncation, prompts, rollout = sampled
    model, tokenizer = student
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    overrides = [f"rollout.{key}={value}" for key, value in truncation.items()]
    config = load_config(
        None, ["teacher.path=tiny", "teacher.support=truncated", f"rollout.temperature={TEMPERATURE}", *overrides]
    )
    for engine in ("lean", "hf"):
        config.teacher.engine = engine
        teacher = build_teacher(config, str(tmp_path))
        values = teacher.logprobs(prompts, rollout.response_ids)
        for got, expected in zip(values, rollout.behavior_logprobs, strict=True):
            assert got == pytest.approx(expected, abs=1e-5), engine
        behavior, mask = padded(rollout.behavior_logprobs)
        advantages, metrics = distill_advantages(
            torch.zeros(len(prompts)), behavior, padded(values)[0], mask, distill_coef=1.0, distill_mix="replace"
        )
        assert advantages.abs().max().item() < 1e-5
        assert metrics["outside_teacher_support"].item() == 0.0


def kept_mass(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """(T,) M_t by hand: the full softmax's mass on the k most likely tokens, or on the nucleus (every token
    whose more likely tokens hold less than top_p)."""
    probs = (logits / TEMPERATURE).softmax(-1).sort(dim=-1, descending=True).values  # (T, V)
    if top_k:
        return probs[:, :top_k].sum(-1)
    before = probs.cumsum(-1) - probs  # (T, V): mass of the more likely tokens
    return (probs * (before < top_p)).sum(-1)


def test_a_full_teacher_equal_to_the_student_is_off_by_the_log_kept_mass(sampled, student):
    truncation, prompts, rollout = sampled
    model, tokenizer = student
    teacher = Teacher(model, tokenizer.pad_token_id, sampling=Sampling(TEMPERATURE))  # support=full: no truncation
    values = teacher.logprobs(prompts, rollout.response_ids)
    checked = 0
    rows = zip(prompts, rollout.response_ids, values, rollout.behavior_logprobs, strict=True)
    for prompt, response, full, behavior in rows:
        with torch.no_grad():
            logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].float()  # (T, V)
        mass = kept_mass(logits, **truncation)  # (T,)
        assert (mass < 1).all()  # the truncation removed something at every position: d_t < 0
        assert [f - b for f, b in zip(full, behavior, strict=True)] == pytest.approx(mass.log().tolist(), abs=1e-5)
        checked += len(response)
    assert checked >= 12


def test_a_token_outside_the_teachers_kept_set_scores_minus_inf_and_the_trainer_floors_and_counts_it(student):
    """Sampled with top-k = 20, scored by the same model truncated to its top 2: every sampled token below the
    teacher's 2 most likely is outside its support."""
    model, tokenizer = student
    engine = ENGINES["lean"](model, tokenizer, sampling=Sampling(TEMPERATURE, top_k=20), max_new_tokens=6)
    prompts = [tokenizer("<|user|>2+2=</s><|assistant|>", add_special_tokens=False).input_ids] * 4
    rollout = engine.generate(prompts, seed=1)
    teacher = Teacher(model, tokenizer.pad_token_id, sampling=Sampling(TEMPERATURE, top_k=2))
    values = teacher.logprobs(prompts, rollout.response_ids)
    outside = []
    for prompt, response, scored in zip(prompts, rollout.response_ids, values, strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]  # (T, V)
        top2 = logits.topk(2, dim=-1).indices  # (T, 2)
        row = [token not in top2[t].tolist() for t, token in enumerate(response)]
        assert [math.isinf(v) and v < 0 for v in scored] == row
        outside.append(row)
    share = sum(map(sum, outside)) / sum(map(len, outside))
    assert 0 < share < 1

    trainer, _ = make_trainer("distill")  # the floor reaches the advantage: finite, ~20 nats below the student's
    batch = make_batch(tokenizer)
    for e in batch:  # the teacher drops every second token
        e.teacher_logprobs = [float("-inf") if t % 2 else lp for t, lp in enumerate(e.behavior_logprobs)]
    metrics = trainer.step(batch)
    dropped = [t % 2 for e in batch for t in range(len(e.response_ids))]
    assert metrics["distill/outside_teacher_support"] == pytest.approx(sum(dropped) / len(dropped))
    gaps = [(-20.0 - lp) if t % 2 else 0.0 for e in batch for t, lp in enumerate(e.behavior_logprobs)]
    assert metrics["distill/reverse_kl"] == pytest.approx(-sum(gaps) / len(gaps), rel=1e-5)
    assert math.isfinite(metrics["optim/grad_norm"]) and metrics["optim/grad_norm"] > 0


def test_truncated_support_with_the_vllm_engine_is_one_line():
    with pytest.raises(OprlError, match=r"teacher\.support=truncated needs teacher\.engine=lean or hf") as error:
        load_config(None, ["teacher.path=tiny", "teacher.engine=vllm", "teacher.support=truncated"])
    assert "\n" not in str(error.value)
    assert load_config(None, ["teacher.path=tiny", "teacher.support=truncated"]).teacher.logprob_floor == -20.0
