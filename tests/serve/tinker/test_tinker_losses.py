"""The losses through the SDK (values against the formulas of docs/tinker.md on the returned log-probs, presets
against ``oprl.algorithms.policy_loss``) and what the server refuses, each refusal naming its field."""

import httpx
import numpy as np
import pytest
import torch
from tinker_server import TINY, datum

from oprl.algorithms import LossParams, aggregation_count, policy_loss, resolve_preset

tinker = pytest.importorskip("tinker")
types = tinker.types


@pytest.fixture(scope="module")
def client(service):
    return service.create_lora_training_client(base_model=TINY, rank=4, seed=11).result()


@pytest.fixture(scope="module")
def rl_data(client):
    """Sampled responses with the sampler's log-probs, shifted by a fixed offset per token so ρ ≠ 1."""
    tokens = client.get_tokenizer().encode("3+4=")
    sampler = client.save_weights_and_get_sampling_client().result()
    result = sampler.sample(types.ModelInput.from_ints(tokens), 3, types.SamplingParams(max_tokens=6, seed=3)).result()
    data = []
    for i, (sequence, advantage) in enumerate(zip(result.sequences, (1.0, -1.0, 0.5), strict=True)):
        pad = len(tokens) - 1
        offset = np.linspace(-0.4, 0.4, len(sequence.tokens)) * (i + 1)  # stale behaviour log-probs
        data.append(
            datum(
                tokens + sequence.tokens,
                logprobs=[0.0] * pad + list(np.array(sequence.logprobs) + offset),
                advantages=[0.0] * pad + [advantage] * len(sequence.tokens),
            )
        )
    return data


def _arrays(data, name):
    return [d.loss_fn_inputs[name].to_numpy().astype(np.float64) for d in data]


REFERENCE = {
    "importance_sampling": lambda lp, q, a, cfg: -(np.exp(lp - q) * a).sum(),
    "ppo": lambda lp, q, a, cfg: -np.minimum(np.exp(lp - q) * a, np.clip(np.exp(lp - q), *cfg) * a).sum(),
    "cispo": lambda lp, q, a, cfg: -(np.clip(np.exp(lp - q), *cfg) * lp * a).sum(),
    "dro": lambda lp, q, a, cfg: -(lp * a - 0.5 * cfg[0] * (lp - q) ** 2).sum(),
}


@pytest.mark.parametrize(
    ("loss", "config", "args"),
    [
        ("importance_sampling", None, ()),
        ("ppo", None, (0.8, 1.2)),
        ("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}, (0.9, 1.1)),
        ("cispo", {"clip_low_threshold": 0.7, "clip_high_threshold": 1.3}, (0.7, 1.3)),
        ("dro", {"beta": 0.05}, (0.05,)),
    ],
)
def test_built_in_losses_follow_their_formulas(client, rl_data, loss, config, args):
    out = client.forward(rl_data, loss, config).result()
    expected = 0.0
    behaviour, advantages = _arrays(rl_data, "logprobs"), _arrays(rl_data, "advantages")
    for output, q, a in zip(out.loss_fn_outputs, behaviour, advantages, strict=True):
        lp = output["logprobs"].to_numpy().astype(np.float64)
        expected += REFERENCE[loss](lp, q, a, args)
        assert output["elementwise_loss"].to_numpy().sum() == pytest.approx(REFERENCE[loss](lp, q, a, args), abs=1e-4)
    assert out.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4, abs=1e-4)


@pytest.mark.parametrize(
    "preset", ["rec-oneside-nois", "grpo", "opmd", "cispo", "gspo", "m2po", "decoupled-ppo", "bapo-dual"]
)
def test_a_preset_is_oprls_policy_loss_as_a_sum(client, rl_data, preset):
    config = {"preset": preset, "eps_high": 0.1} if preset.startswith("rec") else {"preset": preset}
    out = client.forward(rl_data, "importance_sampling", config).result()
    width = max(len(d.model_input.to_ints()) for d in rl_data)

    def padded(arrays):
        return torch.tensor(np.stack([np.pad(x, (0, width - len(x))) for x in arrays]), dtype=torch.float32)

    lp = padded([o["logprobs"].to_numpy() for o in out.loss_fn_outputs])
    q, a = padded(_arrays(rl_data, "logprobs")), padded(_arrays(rl_data, "advantages"))
    covered = a != 0
    settings = resolve_preset(preset, **{k: v for k, v in config.items() if k != "preset"})
    proximal = lp if settings["recompute_proximal"] else None
    loss, _ = policy_loss(lp, q, a, covered, LossParams.of(settings), proximal_logprobs=proximal)
    expected = float(loss * aggregation_count(covered, settings["loss_agg"]))
    assert out.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4, abs=1e-5)
    assert "clip_frac:mean" in out.metrics


@pytest.mark.parametrize(
    ("loss", "config", "field"),
    [
        ("dro", None, "loss_fn_config.beta"),
        ("ppo", {"clip": 0.2}, "loss_fn_config.clip"),
        ("importance_sampling", {"preset": "no-such-preset"}, "loss_fn_config.preset"),
        ("importance_sampling", {"preset": "grpo", "std_normalize": 1.0}, "loss_fn_config.std_normalize"),
        ("importance_sampling", {"preset": "vcpo"}, "ess_lr=sqrt"),  # a step-size rule is not a loss
        ("importance_sampling", {"preset": "aspo-entropy"}, "loss_fn_config.entropy_eps"),  # no entropies served
        ("stable_reinforce", None, r"loss_fn: .*--stable-reinforce PRESET"),  # names the option
        ("gspo", None, "loss_fn"),
    ],
)
def test_bad_loss_requests_are_400s_naming_the_field(running, client, rl_data, loss, config, field):
    fresh = running.server  # the server keeps serving after each refusal
    fresh_client = tinker.ServiceClient(base_url=running.url, api_key="tml-test-key")
    try:
        with pytest.raises(tinker.BadRequestError, match=field):
            trainer = fresh_client.create_lora_training_client(base_model=TINY, rank=2, seed=0).result()
            trainer.forward(rl_data, loss, config).result()
    finally:
        fresh_client.close("success").result()  # no heartbeats left to outlive the server
    assert fresh.backend.policies  # still up, models still there


def test_refusals_name_the_field_and_keys_isolate_sessions(running, service, client):
    tokens = client.get_tokenizer().encode("1+1=")
    with pytest.raises(Exception, match="base_model"):
        service.create_lora_training_client(base_model="no/such-model", rank=2).result()
    vocab = len(client.get_tokenizer())
    bad = [datum([*tokens, vocab + 5], weights=[1.0] * len(tokens))]
    with pytest.raises(Exception, match=r"target_tokens: token id \d+ is outside the vocabulary"):
        client.forward(bad, "cross_entropy").result()
    sampler = client.save_weights_and_get_sampling_client().result()
    with pytest.raises(Exception, match=r"sampling_params\.temperature"):
        sampler.sample(types.ModelInput.from_ints(tokens), 1, types.SamplingParams(temperature=0.0)).result()
    # Another API key sees none of this session's models or samplers.
    other = {"X-API-Key": "tml-someone-else"}
    reply = httpx.post(f"{running.url}/api/v1/get_info", json={"model_id": client.model_id}, headers=other)
    assert reply.status_code == 404 and "model_id" in reply.json()["detail"]
    big = httpx.post(f"{running.url}/api/v1/optim_step", content=b"x" * (running.server.max_body + 1), headers=other)
    assert big.status_code == 413 and "body" in big.json()["detail"]
    assert httpx.get(f"{running.url}/api/v1/healthz").json() == {"status": "ok"}


def test_a_configured_key_is_required(tmp_path):
    from fastapi.testclient import TestClient

    from oprl.serve.tinker import build_server, create_app

    app = create_app(build_server(api_keys=["tml-secret"], state_dir=tmp_path))
    with TestClient(app) as http:
        assert http.get("/api/v1/healthz", headers={"X-API-Key": "tml-wrong"}).status_code == 401
        assert http.get("/api/v1/healthz", headers={"X-API-Key": "tml-secret"}).status_code == 200
