"""A request the server refuses on arrival (HTTP 400) still takes its turn in its model's order: the SDK moves
its turn on when a request fails, so the client's next call (a fallback loss, then ``save_state``) answers.
Every result is awaited with a short timeout, so a refusal that costs the turn fails here instead of hanging."""

import warnings

import pytest
from tinker_server import TINY, datum

tinker = pytest.importorskip("tinker")
types = tinker.types

WAIT_S = 30
"""Seconds any one call may take here (each takes well under one on the tiny model; a lost turn waits forever)."""


def _rl_data(client):
    tokens = client.get_tokenizer().encode("3+4=7")
    n = len(tokens) - 1
    return [datum(tokens, logprobs=[-1.0] * n, advantages=[0.0] * 3 + [1.0] * (n - 3))]


def _load_unknown(client, data):
    with warnings.catch_warnings():  # TrainingClient.load_state is deprecated in 0.38, and still what users call
        warnings.simplefilter("ignore", FutureWarning)
        return client.load_state("tinker://no-such-model/weights/none")


REFUSALS = {
    "stable_reinforce": (lambda c, d: c.forward_backward(d, "stable_reinforce"), "loss_fn"),
    "gspo": (lambda c, d: c.forward_backward(d, "gspo"), "loss_fn"),
    "loss_fn_config": (lambda c, d: c.forward_backward(d, "ppo", {"clip": 0.2}), "loss_fn_config.clip"),
    "ppo_band": (
        lambda c, d: c.forward_backward(d, "ppo", {"clip_low_threshold": 1.2, "clip_high_threshold": 0.8}),
        "clip_low_threshold",
    ),
    "preset": (lambda c, d: c.forward(d, "importance_sampling", {"preset": "no-such-preset"}), "preset"),
    "load_state": (_load_unknown, "path"),
}


@pytest.mark.parametrize("refusal", list(REFUSALS))
def test_a_refused_request_takes_its_turn_and_the_client_goes_on(service, refusal):
    client = service.create_lora_training_client(base_model=TINY, rank=2, seed=0).result(timeout=WAIT_S)
    data = _rl_data(client)
    call, field = REFUSALS[refusal]
    with pytest.raises(tinker.BadRequestError, match=field):
        call(client, data).result(timeout=WAIT_S)
    # The cookbook user's fallback on the same client, then a checkpoint: each answers.
    out = client.forward_backward(data, "importance_sampling").result(timeout=WAIT_S)
    assert "loss:sum" in out.metrics
    client.optim_step(types.AdamParams(learning_rate=1e-3)).result(timeout=WAIT_S)
    path = client.save_state(f"after-{refusal}").result(timeout=WAIT_S).path
    assert path.endswith(f"/weights/after-{refusal}")


def test_two_refusals_in_a_row_and_a_refused_optimizer_step(running, service):
    import httpx

    client = service.create_lora_training_client(base_model=TINY, rank=2, seed=1).result(timeout=WAIT_S)
    data = _rl_data(client)
    for loss in ("stable_reinforce", "gspo"):
        with pytest.raises(tinker.BadRequestError, match="loss_fn"):
            client.forward_backward(data, loss).result(timeout=WAIT_S)
    # An optim_step the SDK would never send (no adam_params), sent raw with the client's next seq_id (two refused
    # calls took seq 1 and 2), is refused and takes seq 3 too; the SDK's own calls then count from 4.
    client._request_id_counter += 1  # the raw request used the client's next turn
    client._turn_counter += 1
    body = {"model_id": client.model_id, "seq_id": 3}
    reply = httpx.post(f"{running.url}/api/v1/optim_step", json=body, headers={"X-API-Key": "tml-test-key"})
    assert reply.status_code == 400 and "optimizer_params" in reply.json()["detail"]
    client.forward_backward(data, "importance_sampling").result(timeout=WAIT_S)
    client.save_state("after-three").result(timeout=WAIT_S)
