"""``oprl serve tinker --overlap``: samplers of saved weights compute on a second lane with their own copy of the
module (``backend.Replica``), so one model samples while it trains. Through the SDK, on two servers of the same
random tiny model, one with the option and one without, the same calls give the same samples, token for token and
log-prob for log-prob, for full fine-tuning and LoRA, with a sampler of old weights called while the model trains
and between steps; in-flight samplers stay on the compute lane; the option refuses placed workers in one line."""

import threading

import numpy as np
import pytest
from tinker_server import TINY, datum, serve

from oprl.errors import OprlError
from oprl.serve.tinker import build_server
from oprl.serve.tinker.backend import COMPUTE_LANE, SAMPLE_LANE

tinker = pytest.importorskip("tinker")
types = tinker.types


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """{False: a plain server, True: one with overlap}: (its ``Running``, a service client)."""
    ups = {}
    for overlap in (False, True):
        up = serve(tmp_path_factory.mktemp(f"overlap-{overlap}"), overlap=overlap)
        ups[overlap] = (up, tinker.ServiceClient(base_url=up.url, api_key="tml-test-key"))
    yield ups
    for up, service in ups.values():
        service.close("success").result()
        up.stop()


def _session(service, rank):
    """Train, sampling old and new weights between and during steps; every sample's tokens and log-probs."""
    client = service.create_lora_training_client(base_model=TINY, rank=rank, seed=5).result()  # rank 0: full FT
    tokenizer = client.get_tokenizer()
    tokens = tokenizer.encode("12+34=46")
    data = [datum(tokens, weights=[1.0] * (len(tokens) - 1))]
    prompt = types.ModelInput.from_ints(tokens[:4])
    params = types.SamplingParams(max_tokens=6, seed=7, stop=[])
    old = client.save_weights_and_get_sampling_client().result()
    drawn = []

    def sample(sampler, seed):
        result = sampler.sample(prompt, 2, types.SamplingParams(max_tokens=6, seed=seed, stop=[])).result()
        drawn.extend((s.tokens, s.logprobs) for s in result.sequences)

    for step in range(3):
        fb = client.forward_backward(data, "cross_entropy")
        # A sampler of the first weights, while the step computes (a thread: the SDK call waits for its result).
        during = threading.Thread(target=sample, args=(old, 100 + step))
        during.start()
        fb.result()
        client.optim_step(types.AdamParams(learning_rate=0.05)).result()
        during.join()
        new = client.save_weights_and_get_sampling_client().result()
        sample(new, 200 + step)
        sample(old, 300 + step)
    # The same draw from the first and the last weights: they differ (else equality above says nothing).
    for sampler in (old, new):
        sequence = sampler.sample(prompt, 1, params).result().sequences[0]
        drawn.append((sequence.tokens, sequence.logprobs))
    assert drawn[-2][1] != drawn[-1][1]
    return drawn


@pytest.mark.parametrize("rank", [0, 4])
def test_overlap_samples_what_the_single_lane_samples(pair, rank):
    results = {}
    for overlap, (_up, service) in pair.items():
        results[overlap] = _session(service, rank)
    for (tokens_a, logprobs_a), (tokens_b, logprobs_b) in zip(results[False], results[True], strict=True):
        assert tokens_a == tokens_b
        np.testing.assert_allclose(logprobs_a, logprobs_b, rtol=0, atol=1e-6)
    up, _ = pair[True]
    backend = up.server.backend
    assert set(up.server.lanes) == {COMPUTE_LANE, SAMPLE_LANE}  # the samples computed on the second lane
    assert backend.replicas  # the snapshots sampled on the model's replica, not on the live module


def test_inflight_samplers_stay_on_the_compute_lane(pair):
    up, service = pair[True]
    client = service.create_lora_training_client(base_model=TINY, rank=0, seed=1).result()
    inflight = client.save_weights_and_get_sampling_client(kind="inflight").result()
    prompt = types.ModelInput.from_ints(client.get_tokenizer().encode("1+2="))
    result = inflight.sample(prompt, 1, types.SamplingParams(max_tokens=3, seed=1, stop=[])).result()
    assert len(result.sequences[0].tokens) == 3
    backend = up.server.backend
    ids = [sid for sid, s in backend.samplers.items() if s.inflight]
    assert ids and all(backend.home_of(sid) == COMPUTE_LANE for sid in ids)
    assert all(backend.home_of(sid) == SAMPLE_LANE for sid, s in backend.samplers.items() if not s.inflight)


def test_overlap_refuses_placed_workers_in_one_line(tmp_path):
    with pytest.raises(OprlError, match=r"^--overlap: only with --workers threads"):
        build_server(models=[], state_dir=tmp_path, workers="processes", overlap=True)
