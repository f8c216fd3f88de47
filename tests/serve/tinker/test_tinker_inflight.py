"""In-flight sampling clients (``save_weights_and_get_sampling_client(kind="inflight")``) through the SDK: a model's
in-flight samplers share one published set of weights that each in-flight save replaces, and a sequence being
decoded continues on the new weights at its next step (its cache kept), each token's weight version recorded
(``/api/v1/oprl/sequence_versions/{sequence_id}``). The lane is held while the requests queue, so where the switch
falls is exact: one decode step under the old weights, the training step and the save, the rest under the new."""

import threading
import time

import httpx
import numpy as np
import pytest
from tinker_server import TINY, datum

from oprl.serve.tinker.backend import COMPUTE_LANE

tinker = pytest.importorskip("tinker")
types = tinker.types

WAIT_S = 60
HEADERS = {"X-API-Key": "tml-test-key"}


def _versions(running, sequence):
    reply = httpx.get(f"{running.url}/api/v1/oprl/sequence_versions/{sequence.sequence_id}", headers=HEADERS)
    assert reply.status_code == 200, reply.text
    return reply.json()["versions"]


def _until(condition, what):
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _train_step(client, tokens):
    n = len(tokens) - 1
    data = [datum(tokens, weights=[1.0] * n)]
    return client.forward_backward(data, "cross_entropy"), client.optim_step(types.AdamParams(learning_rate=0.5))


def test_a_running_sequence_continues_on_weights_published_while_it_decodes(running, service):
    client = service.create_lora_training_client(base_model=TINY, rank=2, seed=3).result(timeout=WAIT_S)
    tokens = client.get_tokenizer().encode("12+34=")
    before = client.save_weights_and_get_sampling_client().result(timeout=WAIT_S)  # a snapshot of version 0
    inflight = client.save_weights_and_get_sampling_client(kind="inflight").result(timeout=WAIT_S)
    params = types.SamplingParams(max_tokens=12, stop=[], seed=7)
    server = running.server
    lane = server.lane(COMPUTE_LANE)
    held, release = threading.Event(), threading.Event()

    def hold():  # the lane waits here while the requests queue behind it
        held.set()
        release.wait(WAIT_S)

    lane.submit(hold)
    held.wait(WAIT_S)
    try:
        running_sample = inflight.sample(types.ModelInput.from_ints(tokens), 1, params)
        _until(lambda: lane._work_queue.qsize() >= 1, "the sample batch on the lane")
        released = server.order[client.model_id].next_seq
        backward, step = _train_step(client, tokens)
        newer = client.save_weights_and_get_sampling_client(kind="inflight")
        _until(lambda: server.order[client.model_id].next_seq == released + 3, "the training requests on the lane")
    finally:
        release.set()
    sequence = running_sample.result(timeout=WAIT_S).sequences[0]
    backward.result(timeout=WAIT_S), step.result(timeout=WAIT_S)
    newer = newer.result(timeout=WAIT_S)
    # The first step drew under version 0; the training step and the save ran before the second.
    assert _versions(running, sequence) == [0] + [1] * 11
    old = before.sample(types.ModelInput.from_ints(tokens), 1, params).result(timeout=WAIT_S).sequences[0]
    assert sequence.tokens[0] == old.tokens[0] and sequence.logprobs[0] == pytest.approx(old.logprobs[0], abs=1e-5)
    assert (sequence.tokens, sequence.logprobs) != (old.tokens, old.logprobs)  # the rest came from new weights
    assert _versions(running, old) == [0] * 12  # a snapshot sampler stays on its snapshot

    # Both in-flight clients, the old one too, now sample the newest published weights.
    a = inflight.sample(types.ModelInput.from_ints(tokens), 1, params).result(timeout=WAIT_S).sequences[0]
    b = newer.sample(types.ModelInput.from_ints(tokens), 1, params).result(timeout=WAIT_S).sequences[0]
    assert a.tokens == b.tokens and _versions(running, a) == _versions(running, b) == [1] * 12
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6)


def test_inflight_weights_are_those_of_the_last_save_not_the_live_ones(running, service):
    client = service.create_lora_training_client(base_model=TINY, rank=2, seed=4).result(timeout=WAIT_S)
    tokens = client.get_tokenizer().encode("5+6=")
    params = types.SamplingParams(max_tokens=6, seed=2)
    inflight = client.save_weights_and_get_sampling_client(kind="inflight").result(timeout=WAIT_S)
    published = inflight.sample(types.ModelInput.from_ints(tokens), 1, params).result(timeout=WAIT_S).sequences[0]
    for future in _train_step(client, tokens):  # the live weights move on; nothing is published
        future.result(timeout=WAIT_S)
    again = inflight.sample(types.ModelInput.from_ints(tokens), 1, params).result(timeout=WAIT_S).sequences[0]
    assert again.tokens == published.tokens and _versions(running, again) == [0] * len(again.tokens)
    np.testing.assert_allclose(again.logprobs, published.logprobs, atol=1e-6)


def test_inflight_refusals_take_their_turn(running, service, monkeypatch):
    client = service.create_lora_training_client(base_model=TINY, rank=2, seed=5).result(timeout=WAIT_S)
    monkeypatch.setattr(running.server.backend, "serves_inflight", False)  # as with --workers
    with pytest.raises(tinker.BadRequestError, match="kind: 'inflight' sampling clients are served without --workers"):
        client.save_weights_and_get_sampling_client(kind="inflight").result(timeout=WAIT_S)
    monkeypatch.undo()
    client.save_weights_and_get_sampling_client(kind="inflight").result(timeout=WAIT_S)  # the next call answers
    other = {"X-API-Key": "tml-someone-else"}
    reply = httpx.get(f"{running.url}/api/v1/oprl/sequence_versions/nope:0", headers=other)
    assert reply.status_code == 404 and "sequence_id" in reply.json()["detail"]


def test_a_switch_keeps_the_cache_the_old_weights_computed():
    """``SampleBatch`` two steps at a time, the weights changed in between: the tokens after the switch carry the
    log-probs of the new weights reading the old weights' cache of the earlier tokens (``partial_kv=keep``),
    checked against a transformers forward that builds that cache by hand, and unlike a fresh pass (recompute)."""
    import torch

    from oprl.models.tiny import build_model, build_tokenizer
    from oprl.serve.tinker.sampling import SampleBatch

    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed=0).eval()
    old = {name: p.detach().clone() for name, p in model.named_parameters()}
    generator = torch.Generator().manual_seed(0)
    new = {name: p + 0.05 * torch.randn(p.shape, generator=generator) for name, p in old.items()}
    prompt = tokenizer.encode("12+34=")
    request = {
        "prompt": {"chunks": [{"tokens": prompt}]},
        "num_samples": 1,
        "sampling_params": {"max_tokens": 4, "seed": 1, "stop": []},
    }
    batch = SampleBatch(model, tokenizer, [request], "cpu")
    assert not batch.advance(model, 2, version=0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(new[name])
    assert batch.advance(model, 2, version=1)
    (sampled,) = batch.outcomes(model)
    sequence = sampled.sequences[0]
    assert sequence.versions == [0, 0, 1, 1]

    def load(weights):
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(weights[name])

    with torch.no_grad():
        load(old)
        ids = torch.tensor([prompt + sequence.tokens[:1]])
        cache = model(input_ids=ids, use_cache=True).past_key_values  # the old weights' cache: prompt + token 0
        load(new)
        kept = model(input_ids=torch.tensor([sequence.tokens[1:3]]), past_key_values=cache).logits[0]  # (2, V)
        fresh = model(input_ids=torch.tensor([prompt + sequence.tokens[:3]])).logits[0, -2:]  # recompute
    targets = torch.tensor(sequence.tokens[2:4])
    expected = torch.log_softmax(kept.float(), -1).gather(-1, targets[:, None]).squeeze(-1)
    recomputed = torch.log_softmax(fresh.float(), -1).gather(-1, targets[:, None]).squeeze(-1)
    np.testing.assert_allclose(sequence.logprobs[2:], expected.numpy(), atol=1e-5)
    assert not np.allclose(sequence.logprobs[2:], recomputed.numpy(), atol=1e-3)
