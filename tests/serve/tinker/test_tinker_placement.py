"""Placement (``oprl serve tinker --workers processes|ray``): each model in a worker of oprl's backends computes
what the in-process server computes, through the real SDK; a worker's refusal is still the client's error naming
the field; a closed session's model worker stops."""

import os

import numpy as np
import pytest
from tinker_server import TINY, Running, datum

tinker = pytest.importorskip("tinker")
types = tinker.types

TEXT = "12+34=46"


def _scenario(service):
    """One LoRA model: a cross-entropy step, a seeded sample from its snapshot, a forward after the step, and a
    sampling client of a saved sampler checkpoint (a worker of its own when placed)."""
    client = service.create_lora_training_client(base_model=TINY, rank=4, seed=0).result()
    tokens = client.get_tokenizer().encode(TEXT)
    data = [datum(tokens, weights=[1.0] * (len(tokens) - 1))]
    client.forward_backward(data, "cross_entropy")
    client.optim_step(types.AdamParams(learning_rate=0.01)).result()
    sampler = client.save_weights_and_get_sampling_client().result()
    sampled = sampler.sample(types.ModelInput.from_ints(tokens[:4]), 3, types.SamplingParams(max_tokens=5, seed=2))
    after = client.forward(data, "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    path = client.save_weights_for_sampler("placed").result().path
    scored = (
        service.create_sampling_client(model_path=path).result().compute_logprobs(types.ModelInput.from_ints(tokens))
    )
    return client, [s.tokens for s in sampled.result().sequences], after, np.array(scored.result()[1:])


def _placed_server(workers, model_dir, state_dir):
    """A server whose models are placed: on ``threads`` (worker threads of the local backend: the forwarding,
    lanes and records, in seconds), or as ``oprl serve tinker --workers processes|ray`` builds it."""
    from oprl.serve.tinker import build_server

    if workers != "threads":
        return build_server(models=[f"{TINY}={model_dir}"], state_dir=state_dir, workers=workers, threads=1)
    from oprl.backends.local import LocalBackend
    from oprl.serve.tinker.app import TinkerServer
    from oprl.serve.tinker.backend import ModelTable
    from oprl.serve.tinker.placement import PlacedModels

    backend = PlacedModels(ModelTable({TINY: model_dir}, [], "cpu"), state_dir, "cpu", LocalBackend("threads"))
    return TinkerServer(backend, api_keys=[], session_timeout=300.0, max_body=2**26)


@pytest.mark.parametrize(
    "workers",
    [
        "threads",
        # ~20-40 s on 2 loaded cores: two worker processes each import torch, transformers, peft
        pytest.param("processes", marks=pytest.mark.slow),
        # ~1 min: a local Ray instance, then the same two workers as actors
        pytest.param("ray", marks=pytest.mark.slow),
    ],
)
def test_placed_models_compute_what_in_process_models_do(running, service, tmp_path, workers):
    if workers == "ray":
        pytest.importorskip("ray")
    server = _placed_server(workers, running.model_dir, tmp_path / "state")
    placed = Running(server)
    try:
        remote = tinker.ServiceClient(base_url=placed.url, api_key="tml-test-key")
        _, tokens, after, scored = _scenario(service)
        client, placed_tokens, placed_after, placed_scored = _scenario(remote)
        assert placed_tokens == tokens
        np.testing.assert_allclose(placed_after, after, atol=1e-6)
        np.testing.assert_allclose(placed_scored, scored, atol=1e-6)
        homes = server.backend.homes
        assert len(homes) == 2  # the training model's worker and the sampler checkpoint's
        if workers == "processes":
            pids = {actor.pid for actor in homes.values()}
            assert os.getpid() not in pids and len(pids) == 2

        bad = [datum([1, 2, 10_000], weights=[1.0, 1.0])]
        # Refused in the worker and still the client's error naming the field (not "internal error: RemoteError").
        with pytest.raises(
            tinker.RequestFailedError, match=r"failed: data\[0\]\.loss_fn_inputs\.target_tokens: token id"
        ):
            client.forward_backward(bad, "cross_entropy").result()
        assert client.forward([datum([1, 2, 3], weights=[1.0, 1.0])], "cross_entropy").result().metrics

        remote.close("success").result()
        for _ in range(200):  # the session's model worker stops; the checkpoint's stays for other sessions
            if client.model_id not in homes:
                break
            __import__("time").sleep(0.05)
        # The checkpoint's worker is its LoRA base and shape's (checkpoints.host_key): one for every such checkpoint.
        assert list(homes) == [next(h for h in homes if h.startswith("lora:"))]
    finally:
        placed.stop()
        server.backend.shutdown()
