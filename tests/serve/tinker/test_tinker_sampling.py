"""Batched sampling (``oprl.serve.tinker.sampling.sample_batch``, and the server's queue through the real SDK): a
request gets what it gets alone, whatever it is batched with; unseeded requests still differ; a bad request fails
alone."""

import numpy as np
import pytest
from tinker_server import TINY

tinker = pytest.importorskip("tinker")
types = tinker.types


@pytest.fixture(scope="module")
def tiny():
    from oprl.models.tiny import build_model, build_tokenizer

    tokenizer = build_tokenizer()
    return build_model(tokenizer, seed=0).eval(), tokenizer


def _request(tokens, n, max_tokens, seed=None, stop=None):
    params = {"max_tokens": max_tokens, "seed": seed, "stop": stop}
    return {"prompt": {"chunks": [{"tokens": tokens}]}, "num_samples": n, "sampling_params": params}


def _decoded(sampled):
    """A request's sequences as (tokens, float32 log-probs, stopped), what ``SampleResponse`` carries."""
    return [(s.tokens, np.asarray(s.logprobs, np.float32), s.stopped) for s in sampled.sequences]


def _requests(tokenizer):
    """Prompts of different lengths (left padding in the batch), different num_samples and max_tokens, and stop
    tokens that end some rows early (the random model draws them often), so requests finish at different steps
    and leave the batch while others go on."""
    text = [tokenizer.encode(t) for t in ("12+34=", "7+8=", "100-1=9", "3*3=")]
    return [
        _request(text[0], 1, 3, seed=11),
        _request(text[1], 3, 9, seed=12, stop=[tokenizer.encode("1")[0]]),
        _request(text[2], 2, 5, seed=13),
        _request(text[3], 4, 12, seed=14, stop=[tokenizer.encode("=")[0], tokenizer.encode("+")[0]]),
        _request(text[0], 2, 7, seed=15),  # a prompt another request has: prefilled once for both
    ]


def test_a_batch_returns_what_each_request_returns_alone(tiny):
    from oprl.serve.tinker.sampling import sample, sample_batch

    model, tokenizer = tiny
    requests = _requests(tokenizer)
    alone = [_decoded(sample(model, tokenizer, r, "cpu")) for r in requests]
    together = [_decoded(sampled) for sampled in sample_batch(model, tokenizer, requests, "cpu")]
    lengths = set()
    for one, batched, request in zip(alone, together, requests, strict=True):
        assert len(batched) == request["num_samples"]
        for (tokens, logprobs, reason), (tokens_b, logprobs_b, reason_b) in zip(one, batched, strict=True):
            assert tokens_b == tokens and reason_b == reason
            np.testing.assert_allclose(logprobs_b, logprobs, atol=1e-5)
            lengths.add(len(tokens))
    assert len(lengths) > 2  # rows did end at different steps: the batch shrank while it ran


def test_unseeded_requests_in_one_batch_differ_and_a_bad_one_fails_alone(tiny):
    from oprl.serve.tinker.errors import UserError
    from oprl.serve.tinker.sampling import sample_batch

    model, tokenizer = tiny
    prompt = tokenizer.encode("12+34=")
    bad = _request([*prompt, len(tokenizer) + 5], 1, 4)
    outcomes = sample_batch(model, tokenizer, [_request(prompt, 1, 8), bad, *[_request(prompt, 1, 8)] * 3], "cpu")
    assert isinstance(outcomes[1], UserError) and str(outcomes[1]).startswith("prompt: token id")
    drawn = [tuple(_decoded(o)[0][0]) for i, o in enumerate(outcomes) if i != 1]
    assert len(set(drawn)) > 1, drawn  # each unseeded request drew from its own generator


def test_concurrent_seeded_requests_through_the_sdk_are_one_engine_call_and_equal_sequential_ones(
    running, service, monkeypatch
):
    client = service.create_lora_training_client(base_model=TINY, rank=2, seed=7).result()
    sampler = client.save_weights_and_get_sampling_client().result()
    tokenizer = client.get_tokenizer()
    prompts = [types.ModelInput.from_ints(tokenizer.encode(t)) for t in ("12+34=", "7+8=", "100-1=9", "3*3=")]
    params = [types.SamplingParams(max_tokens=4 + i, seed=20 + i) for i in range(len(prompts))]
    sequential = [sampler.sample(p, 2, s).result() for p, s in zip(prompts, params, strict=True)]
    batches = running.server.backend.sample_batches
    # A window far above the SDK's spread between requests sent together, so that the test does not depend on
    # the machine's load; the server's default is 10 ms.
    monkeypatch.setattr(running.server, "sample_window", 0.5)
    before = len(batches)
    futures = [sampler.sample(p, 2, s) for p, s in zip(prompts, params, strict=True)]
    concurrent = [f.result() for f in futures]
    assert list(batches)[before:] == [len(prompts)]  # one engine call answered the four requests
    for one, batched in zip(sequential, concurrent, strict=True):
        for a, b in zip(one.sequences, batched.sequences, strict=True):
            assert a.tokens == b.tokens and a.stop_reason == b.stop_reason
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
