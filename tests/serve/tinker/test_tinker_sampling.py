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


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"), [(0.7, -1, 1.0), (1.3, 5, 1.0), (1.0, -1, 0.6), (0.5, 8, 0.9)]
)
def test_temperature_top_k_top_p_through_the_sdk_return_the_behaviour_logprobs(
    running, service, temperature, top_k, top_p
):
    """The SDK's SamplingParams draw from μ = softmax(logits / T) over the top-k, then top-p, kept set, and each
    sampled token's returned log-prob is log μ(y), checked against an independent transformers forward of the
    served model; ``forward`` scores the same tokens at temperature 1 untruncated, log π(y), so ρ = π / μ."""
    import torch
    from tinker_server import datum
    from transformers import AutoModelForCausalLM

    from oprl.models.truncation import kept_tokens

    sampler = service.create_sampling_client(base_model=TINY).result()
    prompt = [5, 17, 9, 30, 12]
    params = types.SamplingParams(max_tokens=6, seed=4, temperature=temperature, top_k=top_k, top_p=top_p)
    sequences = sampler.sample(types.ModelInput.from_ints(prompt), 3, params).result().sequences
    model = AutoModelForCausalLM.from_pretrained(running.model_dir, dtype=torch.float32).eval()
    trainer = service.create_lora_training_client(base_model=TINY, rank=1, seed=0).result()
    for sequence in sequences:
        full = torch.tensor([prompt + sequence.tokens])
        with torch.no_grad():
            logits = model(full).logits[0, len(prompt) - 1 : -1].float()  # (N, V): the scores of each drawn token
        scores = logits / temperature
        kept = kept_tokens(scores, 0 if top_k == -1 else top_k, top_p)
        behaviour = torch.log_softmax(scores.masked_fill(~kept, float("-inf")), dim=-1)
        drawn = torch.tensor(sequence.tokens)[:, None]
        assert kept.gather(-1, drawn).all()  # every drawn token is in its step's kept set
        np.testing.assert_allclose(sequence.logprobs, behaviour.gather(-1, drawn).squeeze(-1), atol=1e-5)
        scored = trainer.forward([datum(prompt + sequence.tokens, weights=[0.0] * (len(full[0]) - 1))], "cross_entropy")
        model_logprobs = scored.result().loss_fn_outputs[0]["logprobs"].to_numpy()[len(prompt) - 1 :]
        np.testing.assert_allclose(
            model_logprobs, torch.log_softmax(logits, -1).gather(-1, drawn).squeeze(-1), atol=1e-5
        )


def test_top_k_1_is_greedy_with_log_prob_0(service):
    sampler = service.create_sampling_client(base_model=TINY).result()
    params = types.SamplingParams(max_tokens=5, top_k=1, temperature=0.3)
    a, b = (sampler.sample(types.ModelInput.from_ints([5, 17, 9]), 2, params).result().sequences for _ in "ab")
    assert a[0].tokens == a[1].tokens == b[0].tokens  # unseeded, still one path: the argmax
    assert np.allclose(a[0].logprobs, 0.0)  # μ puts all its mass on the kept token


@pytest.mark.parametrize(
    ("field", "value"), [("temperature", 0.0), ("temperature", -1.0), ("top_k", -2), ("top_p", 0.0), ("top_p", 1.5)]
)
def test_sampling_params_out_of_range_are_400s_naming_the_field(service, field, value):
    sampler = service.create_sampling_client(base_model=TINY).result()
    params = types.SamplingParams(max_tokens=2, **{field: value})
    with pytest.raises(tinker.BadRequestError, match=rf"sampling_params\.{field}"):
        sampler.sample(types.ModelInput.from_ints([5, 17, 9]), 1, params).result()
