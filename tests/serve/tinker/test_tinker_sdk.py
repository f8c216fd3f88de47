"""The real ``tinker`` SDK (sync and async) against the server on a tiny model: the futures protocol, the model and
sampling-client lifecycle, off-policy exactness (snapshots, ρ = 1 on-policy, accumulation), save/load, retries."""

import asyncio

import httpx
import numpy as np
import pytest
from tinker_server import TINY, datum

tinker = pytest.importorskip("tinker")
types = tinker.types

TEXT = "12+34=46"


def _tokens(client):
    return client.get_tokenizer().encode(TEXT)


def test_lora_client_trains_samples_and_scores_with_the_sdk(service):
    client = service.create_lora_training_client(base_model=TINY, rank=4, seed=0).result()
    info = client.get_info()
    assert info.model_data.model_name == TINY and info.lora_rank == 4
    tokens = _tokens(client)  # the tokenizer comes from the server's local model directory
    data = [datum(tokens, weights=[1.0] * (len(tokens) - 1))]
    first = client.forward_backward(data, "cross_entropy")
    step = client.optim_step(types.AdamParams(learning_rate=0.002))
    out = first.result()
    logprobs = out.loss_fn_outputs[0]["logprobs"].to_numpy()
    assert logprobs.shape == (len(tokens) - 1,) and (logprobs < 0).all()
    assert out.metrics["loss:sum"] == pytest.approx(-logprobs.sum(), rel=1e-5)
    assert step.result().metrics["learning_rate:mean"] == 0.002
    after = client.forward(data, "cross_entropy").result()
    assert after.metrics["loss:sum"] < out.metrics["loss:sum"]  # one Adam step on the same datum lowers its loss

    sampler = client.save_weights_and_get_sampling_client().result()
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(tokens)).result()
    assert scored[0] is None
    np.testing.assert_allclose(scored[1:], after.loss_fn_outputs[0]["logprobs"].to_numpy(), atol=1e-5)

    prompt = types.ModelInput.from_ints(tokens[:4])
    result = sampler.sample(prompt, 3, types.SamplingParams(max_tokens=6, seed=7)).result()
    assert len(result.sequences) == 3
    for sequence in result.sequences:
        assert 1 <= len(sequence.tokens) <= 6 and len(sequence.logprobs) == len(sequence.tokens)
        # On-policy exactness: the trainer's log-prob of each sampled token is the sampler's (ρ = 1).
        full = tokens[:4] + sequence.tokens
        trained = client.forward([datum(full, weights=[0.0] * (len(full) - 1))], "cross_entropy").result()
        np.testing.assert_allclose(trained.loss_fn_outputs[0]["logprobs"].to_numpy()[3:], sequence.logprobs, atol=1e-4)
    again = sampler.sample(prompt, 3, types.SamplingParams(max_tokens=6, seed=7)).result()
    assert [s.tokens for s in again.sequences] == [s.tokens for s in result.sequences]  # seeded


def test_unseeded_requests_for_one_prompt_draw_different_samples(service):
    # tinker-cookbook samples a group as one num_samples=1 request per member, unseeded: each must be its own draw
    # (they were all the same sequence while each request sampled in a forked, restored RNG state).
    client = service.create_lora_training_client(base_model=TINY, rank=2, seed=0).result()
    sampler = client.save_weights_and_get_sampling_client().result()
    prompt = types.ModelInput.from_ints(_tokens(client)[:4])
    params = types.SamplingParams(max_tokens=8)
    futures = [sampler.sample(prompt, 1, params) for _ in range(4)]
    drawn = [tuple(f.result().sequences[0].tokens) for f in futures]
    assert len(set(drawn)) > 1, drawn
    seeded = [sampler.sample(prompt, 1, types.SamplingParams(max_tokens=8, seed=3)).result() for _ in range(2)]
    assert seeded[0].sequences[0].tokens == seeded[1].sequences[0].tokens


def test_async_calls_and_a_sampler_of_weights_saved_two_steps_ago(service):
    async def scenario():
        client = await service.create_lora_training_client(base_model=TINY, rank=4, seed=1)
        tokens = client.get_tokenizer().encode(TEXT)
        data = [datum(tokens, weights=[1.0] * (len(tokens) - 1))]
        old = await client.save_weights_and_get_sampling_client()
        before = await old.compute_logprobs(types.ModelInput.from_ints(tokens))
        for _ in range(2):
            fb = client.forward_backward(data, "cross_entropy")
            opt = client.optim_step(types.AdamParams(learning_rate=0.05))
            await fb
            await opt
        new = await client.save_weights_and_get_sampling_client()
        return (
            before,
            await old.compute_logprobs(types.ModelInput.from_ints(tokens)),
            await new.compute_logprobs(types.ModelInput.from_ints(tokens)),
        )

    before, old_after, new_after = asyncio.run(scenario())
    assert old_after == before  # the old sampler still samples from the weights it was created with
    assert not np.allclose(new_after[1:], before[1:], atol=1e-3)


def _rl_data(client, seed):
    """Two RL datums sampled from the client's current weights, with fixed advantages."""
    tokens = client.get_tokenizer().encode("7+8=")
    sampler = client.save_weights_and_get_sampling_client().result()
    result = sampler.sample(types.ModelInput.from_ints(tokens), 2, types.SamplingParams(max_tokens=5, seed=seed))
    data = []
    for sequence, advantage in zip(result.result().sequences, (1.0, -0.5), strict=True):
        full = tokens + sequence.tokens
        pad = len(tokens) - 1
        data.append(
            datum(
                full,
                logprobs=[0.0] * pad + sequence.logprobs,
                advantages=[0.0] * pad + [advantage] * len(sequence.tokens),
            )
        )
    return data


def test_gradient_accumulation_over_calls_equals_one_call_on_the_concatenation(service):
    split = service.create_lora_training_client(base_model=TINY, rank=4, seed=3).result()
    joined = service.create_lora_training_client(base_model=TINY, rank=4, seed=3).result()
    data = _rl_data(split, seed=0) + _rl_data(split, seed=1)
    adam = types.AdamParams(learning_rate=0.02)
    for part in (data[:1], data[1:3], data[3:]):
        split.forward_backward(part, "importance_sampling")
    split.optim_step(adam).result()
    joined.forward_backward(data, "importance_sampling")
    joined.optim_step(adam).result()
    a = split.forward(data, "importance_sampling").result()
    b = joined.forward(data, "importance_sampling").result()
    for x, y in zip(a.loss_fn_outputs, b.loss_fn_outputs, strict=True):
        np.testing.assert_allclose(x["logprobs"].to_numpy(), y["logprobs"].to_numpy(), atol=2e-6)


def test_save_state_and_resume_with_the_optimizer_continues_exactly(service):
    client = service.create_lora_training_client(base_model=TINY, rank=4, seed=4).result()
    data = _rl_data(client, seed=2)
    adam = types.AdamParams(learning_rate=0.02)
    client.forward_backward(data, "ppo")
    client.optim_step(adam).result()
    path = client.save_state("after-one").result().path
    assert path.startswith("tinker://") and path.endswith("/weights/after-one")
    resumed = service.create_training_client_from_state_with_optimizer(path).result()
    for trainer in (client, resumed):
        trainer.forward_backward(data, "ppo")
        trainer.optim_step(adam).result()
    a, b = (t.forward(data, "ppo").result() for t in (client, resumed))
    for x, y in zip(a.loss_fn_outputs, b.loss_fn_outputs, strict=True):
        np.testing.assert_allclose(x["logprobs"].to_numpy(), y["logprobs"].to_numpy(), atol=1e-6)
    sampler_path = client.save_weights_for_sampler("named").result().path
    sampler = service.create_sampling_client(model_path=sampler_path).result()
    tokens = client.get_tokenizer().encode(TEXT)
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(tokens)).result()
    trained = client.forward([datum(tokens, weights=[0.0] * (len(tokens) - 1))], "cross_entropy").result()
    np.testing.assert_allclose(scored[1:], trained.loss_fn_outputs[0]["logprobs"].to_numpy(), atol=1e-5)


def test_a_retried_request_gets_the_first_answer(running, service):
    client = service.create_lora_training_client(base_model=TINY, rank=2, seed=5).result()
    body = {"model_id": client.model_id, "seq_id": 1, "adam_params": {"learning_rate": 0.01}}
    headers = {"X-API-Key": "tml-test-key"}
    first = httpx.post(f"{running.url}/api/v1/optim_step", json=body, headers=headers).json()
    again = httpx.post(f"{running.url}/api/v1/optim_step", json=body, headers=headers).json()
    assert first["request_id"] == again["request_id"]
    server = running.server
    assert server.backend.policies[client.model_id].version <= 1  # one step at most, never two


def test_forward_backward_custom_runs_the_callable_on_the_client(service):
    import torch

    client = service.create_lora_training_client(base_model=TINY, rank=2, seed=6).result()
    tokens = _tokens(client)
    data = [datum(tokens, weights=[1.0] * (len(tokens) - 1))]

    def mean_nll(data, logprobs_list):  # a loss the server does not have: the mean, not the sum
        loss = -torch.cat(logprobs_list).mean()
        return loss, {"mean_nll:mean": float(loss.detach())}

    out = client.forward_backward_custom(data, mean_nll).result()
    reference = client.forward(data, "cross_entropy").result()
    assert out.metrics["mean_nll:mean"] == pytest.approx(reference.metrics["loss:sum"] / (len(tokens) - 1), rel=1e-5)
    client.optim_step(types.AdamParams(learning_rate=0.002)).result()
    assert client.forward(data, "cross_entropy").result().metrics["loss:sum"] < reference.metrics["loss:sum"]
