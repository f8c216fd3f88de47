"""The SDK's top-K fields through ``oprl serve tinker`` (``topk_sample_logprobs``, ``topk_prompt_logprobs``,
``target_prompt_logprobs``): each value equals an independent reference, the top-K of log_softmax(logits / T)
of a transformers forward of the served model (the *processed* distribution: what a token is, or would be, drawn
from under the request's SamplingParams); asking changes no sampled token or log-prob; a bad K is a 400 naming
the field, after which the client goes on."""

import math

import numpy as np
import pytest
from tinker_server import TINY

tinker = pytest.importorskip("tinker")
types = tinker.types

PROMPT = [5, 17, 9, 30, 12, 7]
WAIT_S = 30


@pytest.fixture(scope="module")
def reference(running):
    """log_softmax(logits / T) of the served model at each position of a sequence: (L - 1, V), row i predicting
    token i + 1 (an independent transformers forward, float32)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(running.model_dir, dtype=torch.float32).eval()

    def logp(tokens, temperature=1.0):
        with torch.no_grad():
            logits = model(torch.tensor([tokens])).logits[0, :-1].float()
        return torch.log_softmax(logits / temperature, dim=-1)

    return logp


def _check_top(entries, logp_rows, k):
    """Each position's (id, log-prob) pairs are the K largest of its reference row, largest first."""
    assert len(entries) == len(logp_rows)
    for entry, row in zip(entries, logp_rows, strict=True):
        values, ids = row.topk(k)
        assert [i for i, _ in entry] == ids.tolist()  # no ties among the tiny model's float32 scores
        np.testing.assert_allclose([v for _, v in entry], values.numpy(), atol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_top_k_fields_equal_the_reference_and_change_no_draw(service, reference, temperature):
    import torch

    sampler = service.create_sampling_client(base_model=TINY).result(timeout=WAIT_S)
    params = types.SamplingParams(max_tokens=5, seed=11, temperature=temperature, stop=[])
    prompt = types.ModelInput.from_ints(PROMPT)
    plain = sampler.sample(prompt, 2, params).result(timeout=WAIT_S)
    target = np.full((len(PROMPT) - 1, 2), -1, dtype=np.int64)
    target[:, 0] = PROMPT[1:]  # the prompt's own tokens
    target[2, 1] = 40
    asked = sampler.sample(
        prompt, 2, params, include_prompt_logprobs=True, topk_sample_logprobs=4, topk_prompt_logprobs=3,
        target_prompt_logprobs=types.TensorData(data=target.reshape(-1).tolist(), dtype="int64", shape=[5, 2]),
    ).result(timeout=WAIT_S)  # fmt: skip
    prompt_logp = reference(PROMPT, temperature)  # (P - 1, V)
    for a, b in zip(plain.sequences, asked.sequences, strict=True):
        assert a.tokens == b.tokens and a.logprobs == b.logprobs  # asking changes no draw
        assert a.topk_logprobs is None
        full = reference(PROMPT + b.tokens, temperature)[len(PROMPT) - 1 :]  # (N, V): each token's distribution
        _check_top(b.topk_logprobs, full, 4)
        np.testing.assert_allclose(b.logprobs, full.gather(-1, torch.tensor(b.tokens)[:, None])[:, 0], atol=1e-5)
    top = asked.topk_prompt_logprobs
    assert top[0] is None  # position 0 has no distribution
    _check_top(top[1:], prompt_logp, 3)
    got = asked.target_prompt_logprobs.to_numpy()
    assert got.shape == (5, 2)
    want = np.zeros((5, 2), dtype=np.float32)
    for i in range(5):
        want[i, 0] = prompt_logp[i, PROMPT[i + 1]]
    want[2, 1] = prompt_logp[2, 40]
    np.testing.assert_allclose(got, want, atol=1e-5)
    own = reference(PROMPT)  # prompt_logprobs stay the model's own (temperature 1)
    own_tokens = own.gather(-1, torch.tensor(PROMPT[1:])[:, None])[:, 0]
    np.testing.assert_allclose(asked.prompt_logprobs[1:], own_tokens, atol=1e-5)


def test_sparse_target_last_n_and_truncated_alternatives(service, reference):
    """A sparse target comes back sparse with its cells scored; ``prompt_logprobs_last_n`` leaves the earlier
    top-K rows empty; under top_k=2 every entry past the kept set is left out (no mass)."""
    import torch

    sampler = service.create_sampling_client(base_model=TINY).result(timeout=WAIT_S)
    ids = torch.full((len(PROMPT) - 1, 3), -1, dtype=torch.int64)
    ids[3, 2] = 21
    out = sampler.sample(
        types.ModelInput.from_ints(PROMPT), 1, types.SamplingParams(max_tokens=3, seed=2, top_k=2),
        include_prompt_logprobs=True, prompt_logprobs_last_n=2, topk_prompt_logprobs=4, topk_sample_logprobs=4,
        target_prompt_logprobs=types.TensorData.from_torch_sparse(ids, pad_value=-1),
    ).result(timeout=WAIT_S)  # fmt: skip
    logp = reference(PROMPT)
    kept = logp.topk(2).values[:, -1:]  # the second largest score: top_k=2 keeps these two
    processed = torch.log_softmax(logp.masked_fill(logp < kept, -math.inf), dim=-1)
    target = out.target_prompt_logprobs
    assert target.sparse_crow_indices is not None and len(target.data) == 1
    np.testing.assert_allclose(target.data, [processed[3, 21]], atol=1e-5)  # -inf when 21 is not kept
    top = out.topk_prompt_logprobs
    assert top[:4] == [None] * 4 and len(top) == len(PROMPT)
    for entry, row in zip(top[4:], processed[3:], strict=True):
        assert len(entry) == 2  # only the kept two carry mass
        np.testing.assert_allclose([v for _, v in entry], row.topk(2).values.numpy(), atol=1e-5)
    assert all(len(entry) == 2 for entry in out.sequences[0].topk_logprobs)


@pytest.mark.parametrize(("field", "value"), [("topk_sample_logprobs", -1), ("topk_prompt_logprobs", 21)])
def test_a_bad_k_is_a_400_naming_the_field_and_the_client_goes_on(service, field, value):
    sampler = service.create_sampling_client(base_model=TINY).result(timeout=WAIT_S)
    prompt, params = types.ModelInput.from_ints(PROMPT), types.SamplingParams(max_tokens=2, seed=1)
    with pytest.raises(tinker.BadRequestError, match=field):
        sampler.sample(prompt, 1, params, **{field: value}).result(timeout=WAIT_S)
    after = sampler.sample(prompt, 1, params, topk_sample_logprobs=2).result(timeout=WAIT_S).sequences[0]
    assert len(after.tokens) == len(after.topk_logprobs) == 2


def test_a_bad_target_fails_its_request_naming_the_field(service):
    """Checked against the prompt when the request is planned: a failed future (a user error), not an arrival 400."""
    sampler = service.create_sampling_client(base_model=TINY).result(timeout=WAIT_S)
    prompt, params = types.ModelInput.from_ints(PROMPT), types.SamplingParams(max_tokens=1)
    wrong_rows = types.TensorData(data=[5, 6], dtype="int64", shape=[2, 1])
    with pytest.raises(tinker.RequestFailedError, match=r"target_prompt_logprobs: shape must be \[len\(prompt\) - 1"):
        sampler.sample(prompt, 1, params, target_prompt_logprobs=wrong_rows).result(timeout=WAIT_S)
    assert len(sampler.sample(prompt, 1, params).result(timeout=WAIT_S).sequences[0].tokens) == 1
