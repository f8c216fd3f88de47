"""Grouped log-probs (each distinct prompt run once, its cache shared by the group) equal the plain path."""

import pytest
import torch

from oprl.models.logprobs import grouped_response_logprobs, pack, response_logprobs
from oprl.models.tiny import build_model, build_tokenizer
from oprl.models.truncation import Sampling


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_grouped_equals_one_row_at_a_time_values_and_gradients(temperature):
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=4, seed=1)
    g = torch.Generator().manual_seed(0)
    prompts, responses = [], []
    for length in (3, 7, 5):  # prompts of different lengths: left padding in both paths
        prompt = torch.randint(7, 40, (length,), generator=g).tolist()
        for k in range(4):  # a group of 4 responses, lengths 1..6 (length 1: only the prompt predicts)
            prompts.append(prompt)
            responses.append(torch.randint(7, 40, (1 + (k * 5 + length) % 6,), generator=g).tolist())
    grads = []
    outputs = []
    for grouped in (False, True):
        model.zero_grad(set_to_none=True)
        if grouped:
            logprobs, entropy, mask = grouped_response_logprobs(
                model, prompts, responses, tokenizer.pad_token_id, sampling=Sampling(temperature), with_entropy=True
            )
        else:
            ids, attention, targets, mask = pack(prompts, responses, tokenizer.pad_token_id)
            logprobs, entropy = response_logprobs(
                model, ids, attention, targets, sampling=Sampling(temperature), with_entropy=True
            )
        (logprobs * mask).sum().backward()
        outputs.append((logprobs.detach(), entropy, mask))
        grads.append([p.grad.clone() for p in model.parameters()])
    (plain, plain_entropy, plain_mask), (shared, shared_entropy, shared_mask) = outputs
    assert torch.equal(plain_mask, shared_mask)
    assert torch.allclose(plain, shared, atol=1e-5), (plain - shared).abs().max()
    assert torch.allclose(plain_entropy * plain_mask, shared_entropy * shared_mask, atol=1e-5)
    for a, b in zip(*grads, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_entropy_is_the_softmax_entropy_of_the_scaled_logits_in_any_chunking():
    """The one entropy of oprl (``models.logprobs``): H = −Σ_v p_v·log p_v of softmax(logits / T) at every
    response position, the same whether the vocabulary projection runs in one chunk or row by row."""
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    prompts, responses = [[7, 8, 9], [10, 11]], [[12, 13, 14], [15]]
    ids, attention, targets, mask = pack(prompts, responses, tokenizer.pad_token_id)
    with torch.no_grad():
        position = (attention.cumsum(1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=attention, position_ids=position).logits
        scaled = logits[:, -targets.shape[1] - 1 : -1].float() / 0.7  # (B, T, V) predicting each response token
        expected = -(scaled.softmax(-1) * scaled.log_softmax(-1)).sum(-1) * mask
        for chunk_bytes in (1, 2**26):  # one row per chunk, or everything at once
            _, entropy = response_logprobs(
                model, ids, attention, targets, sampling=Sampling(0.7), with_entropy=True, chunk_bytes=chunk_bytes
            )
            assert torch.allclose(entropy * mask, expected, atol=1e-5)
