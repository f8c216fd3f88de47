"""``rollout.record_top_k``: every engine's top-K against an independent reference, the sampled tokens and their
log-probs unchanged by recording it, and K = 0 adding nothing (no tensor, no field, no column).

The reference is the model's plain forward over prompt + response, one row at a time (no padding, no cache):
``log_softmax(logits / T)`` with the tokens outside ``Sampling``'s kept set at ``-inf``, then ``topk``. Measured
agreement on the tiny model, float32 (lean, hf-generate and vLLM 0.32's CPU build alike): log-probs within
4.8e-7, ids equal at every finite entry; the tests allow 1e-5. Entries at ``-inf`` (the kept set smaller than
K) carry no mass and their ids are arbitrary: only their count is compared.
"""

import pytest
import torch

from oprl.errors import OprlError
from oprl.models.chat import encode_prompt
from oprl.rollout import EngineCapabilities, LeanEngine, Sampling, TorchEngine
from oprl.rollout.base import sequence_top_logprobs, top_logprobs
from oprl.rollout.lean_engine import lean_sample

TOLERANCE = 1e-5
"""Largest |recorded - reference| log-prob allowed; measured at most 4.8e-7 on every engine (module docstring)."""


def _prompts(tokenizer):
    texts = ["1+2=", "35+47-9=", "7=", "123*4-56+7="]
    return [encode_prompt(tokenizer, [{"role": "user", "content": t}]) for t in texts * 2]


def reference_top_k(model, prompt, response, sampling: Sampling, k: int):
    """``(ids (T, k), log-probs (T, k))``: top-k of the sampling distribution at each response position, from the
    model's forward over the unpadded row."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0].float()  # (P + T, V)
    scores = logits[len(prompt) - 1 : len(prompt) - 1 + len(response)] / sampling.temperature  # (T, V)
    if sampling.truncates:
        scores = scores.masked_fill(~sampling.kept(scores), float("-inf"))
    values, ids = torch.log_softmax(scores, dim=-1).topk(k, dim=-1)
    return ids, values


@pytest.mark.parametrize("sampling", [Sampling(1.0), Sampling(0.7, top_k=4, top_p=0.9)], ids=["plain", "truncated"])
def test_every_engine_records_the_top_k_of_the_distribution_it_samples_from(policy, Engine, sampling):
    model, tokenizer = policy
    prompts, k = _prompts(tokenizer), 6
    engine = Engine(model, tokenizer, sampling=sampling, max_new_tokens=8)
    plain = engine.generate(prompts, seed=5)
    rollout = engine.generate(prompts, seed=5, record_top_k=k)
    # Recording changes no sample and no behaviour log-prob, bit for bit.
    assert rollout.response_ids == plain.response_ids and rollout.behavior_logprobs == plain.behavior_logprobs
    assert plain.top_k_ids is None and plain.top_k_logprobs is None
    infinite = 0
    for row, prompt in enumerate(prompts):
        response = rollout.response_ids[row]
        ids, values = torch.tensor(rollout.top_k_ids[row]), torch.tensor(rollout.top_k_logprobs[row])
        assert ids.shape == values.shape == (len(response), k)
        ref_ids, ref_values = reference_top_k(model, prompt, response, sampling, k)
        finite = torch.isfinite(ref_values)
        assert torch.equal(torch.isfinite(values), finite)
        assert (values[finite] - ref_values[finite]).abs().max() < TOLERANCE
        assert torch.equal(ids[finite], ref_ids[finite])
        infinite += int((~finite).sum())
        # Where the sampled token is among the top K, its entry is its behaviour log-prob, exactly.
        for t, token in enumerate(response):
            hits = (ids[t] == token).nonzero()
            if len(hits):
                assert values[t, hits[0, 0]].item() == rollout.behavior_logprobs[row][t]
    assert (infinite > 0) == sampling.truncates  # top-k=4 keeps at most 4 (plus ties) of K=6: -inf past them


def test_an_engine_built_with_k_records_it_and_a_call_may_turn_it_off(policy):
    model, tokenizer = policy
    engine = LeanEngine(model, tokenizer, max_new_tokens=6, record_top_k=3)
    rollout = engine.generate(_prompts(tokenizer), seed=1)
    assert all(len(position) == 3 for row in rollout.top_k_ids for position in row)
    assert [len(r) for r in rollout.top_k_logprobs] == [len(r) for r in rollout.response_ids]
    off = engine.generate(_prompts(tokenizer), seed=1, record_top_k=0)
    assert off.top_k_ids is None and off.top_k_logprobs is None and off.response_ids == rollout.response_ids


def test_k_zero_computes_nothing_extra(policy, monkeypatch):
    """K = 0: the sampling loop never calls top_logprobs and returns the two tensors it always did."""
    from oprl.rollout import lean_engine

    model, tokenizer = policy
    calls = []
    monkeypatch.setattr(lean_engine, "top_logprobs", lambda *a: calls.append(1) or top_logprobs(*a))
    out = lean_sample(model, tokenizer, _prompts(tokenizer), Sampling(), 4)
    assert len(out) == 2 and calls == []
    out = lean_sample(model, tokenizer, _prompts(tokenizer), Sampling(), 4, top_k=2)
    assert len(out) == 4 and out[2].shape == out[3].shape == (8, 4, 2) and len(calls) == 4


def test_an_engine_without_top_logprobs_is_refused_in_one_line(policy):
    model, tokenizer = policy

    class Plain(TorchEngine):  # a plug-in TorchEngine whose sample knows nothing of top_k
        capabilities = EngineCapabilities()

        def __init__(self, model, tokenizer, **settings):
            super().__init__(lambda *a: lean_sample(*a), model, tokenizer, **settings)

    engine = Plain(model, tokenizer, max_new_tokens=4)
    assert engine.generate(_prompts(tokenizer), seed=0).top_k_ids is None
    with pytest.raises(OprlError, match=r"^rollout.record_top_k=2: Plain declares no top log-probs"):
        engine.generate(_prompts(tokenizer), seed=0, record_top_k=2)


def test_a_sequence_given_whole_gets_the_top_k_an_engine_records(policy):
    """``sequence_top_logprobs`` (the agent endpoint's and the Tinker server's entry) on prompt + response equals
    what the lean engine recorded while sampling that response."""
    model, tokenizer = policy
    sampling = Sampling(0.7, top_k=4, top_p=0.9)
    prompts = _prompts(tokenizer)[:2]
    rollout = LeanEngine(model, tokenizer, sampling=sampling, max_new_tokens=6).generate(
        prompts, seed=2, record_top_k=5
    )
    for row, prompt in enumerate(prompts):
        ids, values = sequence_top_logprobs(
            model, prompt + rollout.response_ids[row], 5, sampling=sampling, start=len(prompt)
        )
        recorded = torch.tensor(rollout.top_k_logprobs[row])
        finite = torch.isfinite(recorded)
        assert torch.equal(torch.isfinite(values), finite)
        assert (values[finite] - recorded[finite]).abs().max() < TOLERANCE
        assert torch.equal(ids[finite], torch.tensor(rollout.top_k_ids[row])[finite])
    with pytest.raises(ValueError, match="position 0 has no prefix"):
        sequence_top_logprobs(model, prompts[0], 5, start=0)
