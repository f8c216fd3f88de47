"""No non-finite number reaches the weights or the wire: a ``forward_backward`` whose loss or gradient is not finite
fails naming its datums and adds nothing to the gradient (what earlier calls accumulated stays), an
``optim_step`` of non-finite ``AdamParams`` is refused, and the weights and AdamW state stay bit-equal."""

import math

import numpy as np
import pytest
import torch
from tinker_server import TINY, datum

tinker = pytest.importorskip("tinker")
types = tinker.types

WAIT_S = 30


def _rl_datum(client, behaviour):
    """``3+4=7`` as an RL datum: advantage 1 on the answer's tokens, whose behaviour log-prob is ``behaviour``."""
    tokens = client.get_tokenizer().encode("3+4=7")
    n = len(tokens) - 1
    return datum(tokens, logprobs=[0.0] * 3 + [behaviour] * (n - 3), advantages=[0.0] * 3 + [1.0] * (n - 3))


def _state(running, client):
    """The model's trainable tensors and AdamW state, copied."""
    policy = running.server.backend.policies[client.model_id]
    weights = {name: p.detach().clone() for name, p in policy.trainable().items()}
    optimizer = {
        i: {k: v.clone() if torch.is_tensor(v) else v for k, v in state.items()}
        for i, state in enumerate(policy.optimizer.state.values())
    }
    return weights, optimizer


def _assert_bit_equal(a, b):
    (wa, oa), (wb, ob) = a, b
    assert wa.keys() == wb.keys() and oa.keys() == ob.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name
    for i in oa:
        for k in oa[i]:
            assert torch.equal(torch.as_tensor(oa[i][k]), torch.as_tensor(ob[i][k])), (i, k)


def test_a_behaviour_logprob_of_minus_200_fails_the_call_and_leaves_the_weights_bit_equal(running, service):
    client = service.create_lora_training_client(base_model=TINY, rank=2, seed=0).result(timeout=WAIT_S)
    adam = types.AdamParams(learning_rate=1e-2)
    client.forward_backward([_rl_datum(client, -1.0)], "importance_sampling").result(timeout=WAIT_S)
    client.optim_step(adam).result(timeout=WAIT_S)  # AdamW has state to keep untouched
    before = _state(running, client)
    bad = [_rl_datum(client, -1.0), _rl_datum(client, -200.0)]  # ρ = exp(logprobs + 200) overflows float32
    with pytest.raises(tinker.RequestFailedError, match=r"data\[1\]: the loss is not finite"):
        client.forward_backward(bad, "importance_sampling").result(timeout=WAIT_S)
    step = client.optim_step(adam).result(timeout=WAIT_S)  # nothing accumulated: a step of no gradient
    assert all(math.isfinite(v) for v in step.metrics.values())
    _assert_bit_equal(_state(running, client), before)


def test_a_failed_call_keeps_what_earlier_calls_accumulated(running, service):
    adam = types.AdamParams(learning_rate=1e-2)
    twins = [service.create_lora_training_client(base_model=TINY, rank=2, seed=1).result(timeout=WAIT_S) for _ in "ab"]
    good = [_rl_datum(twins[0], -1.5)]
    for client in twins:
        client.forward_backward(good, "importance_sampling").result(timeout=WAIT_S)
    with pytest.raises(tinker.RequestFailedError, match=r"data\[0\]"):
        twins[1].forward_backward([_rl_datum(twins[1], -200.0)], "importance_sampling").result(timeout=WAIT_S)
    for client in twins:
        client.optim_step(adam).result(timeout=WAIT_S)
    _assert_bit_equal(_state(running, twins[0]), _state(running, twins[1]))


def test_a_non_finite_gradient_of_a_finite_loss_fails_the_call(running, service):
    # ppo clips ρ = inf to its band: the loss is finite, but the unselected branch's gradient is 0·exp(inf) = NaN.
    client = service.create_lora_training_client(base_model=TINY, rank=2, seed=2).result(timeout=WAIT_S)
    before = _state(running, client)
    out = client.forward([_rl_datum(client, -200.0)], "ppo").result(timeout=WAIT_S)
    assert np.isfinite(out.metrics["loss:sum"])
    with pytest.raises(tinker.RequestFailedError, match=r"data\[0\]: the gradient is not finite"):
        client.forward_backward([_rl_datum(client, -200.0)], "ppo").result(timeout=WAIT_S)
    client.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=WAIT_S)
    _assert_bit_equal(_state(running, client), before)


def test_non_finite_adam_params_are_refused(running, service):
    client = service.create_lora_training_client(base_model=TINY, rank=2, seed=3).result(timeout=WAIT_S)
    client.forward_backward([_rl_datum(client, -1.0)], "importance_sampling").result(timeout=WAIT_S)
    before = _state(running, client)
    with pytest.raises(tinker.RequestFailedError, match=r"adam_params\.learning_rate"):
        client.optim_step(types.AdamParams(learning_rate=float("nan"))).result(timeout=WAIT_S)
    _assert_bit_equal(_state(running, client), before)
    client.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=WAIT_S)  # the gradient is still there


def test_a_json_result_never_carries_a_bare_nan():
    from oprl.serve.tinker.routes.common import as_json

    with pytest.raises(ValueError):
        as_json({"metrics": {"grad_norm:mean": float("nan")}})


def test_an_overflowing_accumulated_gradient_is_not_stepped(running, service):
    # Each call's gradient is finite (forward_backward checks it); their sum can still overflow: stand it in here.
    client = service.create_lora_training_client(base_model=TINY, rank=2, seed=4).result(timeout=WAIT_S)
    client.forward_backward([_rl_datum(client, -1.0)], "importance_sampling").result(timeout=WAIT_S)
    policy = running.server.backend.policies[client.model_id]
    next(p for p in policy.trainable().values() if p.grad is not None).grad[0] = float("inf")
    before = _state(running, client)
    with pytest.raises(tinker.RequestFailedError, match="optim_step: the accumulated gradient's norm is inf"):
        client.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=WAIT_S)
    _assert_bit_equal(_state(running, client), before)
    assert all(p.grad is None for p in policy.trainable().values())  # cleared: the next step starts afresh
