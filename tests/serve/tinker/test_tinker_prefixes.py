"""forward_backward runs the prompt that several datums share once (``prefix_shared_logprobs``), as ``oprl train``'s
trainer runs each prompt once for its group: the log-probs, the loss and the gradients equal those of every datum
run whole."""

import numpy as np
import pytest
import torch


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tinker_server import tiny_model_dir

    from oprl.serve.tinker.backend import ModelTable, TinkerModels

    root = tmp_path_factory.mktemp("prefixes")
    directory = tiny_model_dir(root / "model")
    return TinkerModels(ModelTable({"tiny": directory}, [], "cpu"), root / "state")


def _rl_datums(rng):
    """Three prompts of different lengths, three replies each of different lengths: the layout of
    tinker-cookbook's RL datums (input = prompt + reply[:-1], targets shifted by one, logprobs and advantages 0 on
    the prompt's positions), plus one datum whose loss starts at its first position (nothing to share)."""
    from oprl.serve.tinker.records import Datum

    data = []
    for prompt_length in (5, 9, 7):
        prompt = rng.integers(3, 100, prompt_length).tolist()
        for reply_length, advantage in zip((4, 6, 2), (1.0, -0.5, 0.25), strict=True):
            reply = rng.integers(3, 100, reply_length).tolist()
            full = prompt + reply
            pad = prompt_length - 1
            inputs = {
                "target_tokens": np.array(full[1:], np.int64),
                "logprobs": np.array([0.0] * pad + (-rng.random(reply_length) * 3).tolist(), np.float32),
                "advantages": np.array([0.0] * pad + [advantage] * reply_length, np.float32),
            }
            data.append(Datum(full[:-1], inputs))
    alone = rng.integers(3, 100, 6).tolist()
    data.append(
        Datum(
            alone,
            {
                "target_tokens": np.array(rng.integers(3, 100, 6), np.int64),
                "logprobs": np.full(6, -2.0, np.float32),
                "advantages": np.full(6, 0.5, np.float32),
            },
        )
    )
    return data


@pytest.mark.parametrize(("loss", "config"), [("importance_sampling", {}), ("dro", {"beta": 0.5}), ("ppo", {})])
def test_shared_prompts_run_once_and_give_what_whole_datums_give(models, loss, config):
    from oprl.serve.tinker.losses import loss_spec
    from oprl.serve.tinker.records import ForwardBackward
    from oprl.serve.tinker.training import checked_datum, shared_prefixes

    data = _rl_datums(np.random.default_rng(0))
    spec = loss_spec(loss, config)
    request = ForwardBackward("m", 1, loss, config, False, data)
    outputs, grads = [], []
    for grouped in (True, False):
        policy = models.create_policy(f"m-{loss}-{grouped}", "owner", "tiny", {"rank": 4, "seed": 0})
        rows = [checked_datum(policy, d, spec, "d") for d in data]
        assert (shared_prefixes(rows) is not None) is True  # the three prompts are each shared by three datums
        models.group_prefixes = grouped
        try:
            outputs.append(models.forward_backward(policy, request, spec))
        finally:
            models.group_prefixes = True
        grads.append({n: p.grad.clone() for n, p in policy.trainable().items()})
    grouped, whole = outputs
    assert grouped.metrics["loss:sum"] == pytest.approx(whole.metrics["loss:sum"], rel=1e-5, abs=1e-6)
    for a, b in zip(grouped.outputs, whole.outputs, strict=True):
        for name in ("logprobs", "elementwise_loss"):
            np.testing.assert_allclose(a[name], b[name], atol=1e-5)
    for name, value in grads[0].items():
        torch.testing.assert_close(value, grads[1][name], atol=1e-5, rtol=1e-4)


def _reference(policy, data, spec):
    """Every datum run whole under autograd, the loss's gradient over every position (no work left out): the
    log-probs, elementwise loss and gradient that leaving out zero-gradient work must reproduce."""
    from oprl.serve.tinker.losses import compute_loss
    from oprl.serve.tinker.training import checked_datum, target_logprobs

    rows = [checked_datum(policy, d, spec, "d") for d in data]
    logprobs, inputs, mask = target_logprobs(policy, rows, "cpu", group_prefixes=False, everywhere=True)
    loss, _, _ = compute_loss(spec, logprobs, inputs, mask)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in policy.trainable().items()}
    policy.optimizer.zero_grad(set_to_none=True)
    return float(loss.detach()), [lp[m].detach().numpy() for lp, m in zip(logprobs, mask, strict=True)], grads


@pytest.mark.parametrize(
    ("loss", "config", "from_zero"),
    [
        ("importance_sampling", {}, False),
        ("ppo", {}, False),
        ("importance_sampling", {"preset": "grpo"}, False),
        ("importance_sampling", {}, True),
    ],
)
def test_loss_free_datums_run_forward_only_and_change_nothing(models, loss, config, from_zero):
    """A group whose replies all scored alike (A = 0 on every position) carries no gradient under these losses:
    those datums run forward only and the shared prompts' own log-probs without autograd; the log-probs, the loss
    and the gradient equal every datum run whole under autograd. The zeroed group sits between the others, so the
    rows' order must come back too. ``from_zero`` adds a datum whose loss starts at its first position, which a
    shared prefix (at least one token) would cover: the prefixes then keep their autograd."""
    from oprl.serve.tinker.losses import loss_spec
    from oprl.serve.tinker.records import ForwardBackward

    data = _rl_datums(np.random.default_rng(1))
    data = data if from_zero else data[:-1]  # the last datum is the one whose loss starts at 0
    for datum in data[3:6]:  # the second prompt's group: every advantage 0
        datum.inputs["advantages"][:] = 0.0
    spec = loss_spec(loss, dict(config))
    policy = models.create_policy(f"free-{loss}-{len(config)}-{from_zero}", "owner", "tiny", {"rank": 0, "seed": 0})
    total, logprobs, grads = _reference(policy, data, spec)
    out = models.forward_backward(policy, ForwardBackward("m", 1, loss, config, False, data), spec)
    assert out.metrics["loss:sum"] == pytest.approx(total, rel=1e-5, abs=1e-6)
    for got, want in zip(out.outputs, logprobs, strict=True):
        np.testing.assert_allclose(got["logprobs"], want, atol=1e-5)
    assert any(float(g.abs().max()) > 0 for g in grads.values())
    for name, value in grads.items():
        torch.testing.assert_close(policy.trainable()[name].grad, value, atol=1e-5, rtol=1e-4)


def test_a_forward_shares_the_datums_common_starts(models):
    """``forward`` (no gradient) shares each datum's longest start common with another datum, whatever its loss
    inputs say: the log-probs equal every datum run whole."""
    from oprl.serve.tinker.losses import loss_spec
    from oprl.serve.tinker.records import ForwardBackward
    from oprl.serve.tinker.training import checked_datum, common_prefixes

    data = _rl_datums(np.random.default_rng(2))
    spec = loss_spec("importance_sampling", {})
    policy = models.create_policy("forward-common", "owner", "tiny", {"rank": 0, "seed": 0})
    rows = [checked_datum(policy, d, spec, "d") for d in data]
    shared = common_prefixes(rows)
    assert shared is not None and max(shared[:3]) >= 5  # the first group shares at least its 5-token prompt
    _, logprobs, _ = _reference(policy, data, spec)
    out = models.forward_backward(policy, ForwardBackward("m", 1, "importance_sampling", {}, True, data), spec)
    for got, want in zip(out.outputs, logprobs, strict=True):
        np.testing.assert_allclose(got["logprobs"], want, atol=1e-5)


def test_a_call_whose_every_datum_is_loss_free_adds_a_zero_gradient(models):
    """Every reply of every group scored alike (tinker-cookbook's recipe on an untrained model): the whole call runs
    forward only; it answers the log-probs, a zero loss, and leaves the gradient as it was (none here)."""
    from oprl.serve.tinker.losses import loss_spec
    from oprl.serve.tinker.records import ForwardBackward

    data = _rl_datums(np.random.default_rng(3))[:-1]
    for datum in data:
        datum.inputs["advantages"][:] = 0.0
    spec = loss_spec("importance_sampling", {})
    policy = models.create_policy("all-free", "owner", "tiny", {"rank": 0, "seed": 0})
    _, logprobs, _ = _reference(policy, data, spec)
    out = models.forward_backward(policy, ForwardBackward("m", 1, "importance_sampling", {}, False, data), spec)
    assert out.metrics["loss:sum"] == 0.0
    for got, want in zip(out.outputs, logprobs, strict=True):
        np.testing.assert_allclose(got["logprobs"], want, atol=1e-5)
    assert all(p.grad is None for p in policy.trainable().values())
