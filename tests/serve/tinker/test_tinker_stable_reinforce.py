"""``stable_reinforce``, tinker-cookbook's default RL loss, served only by the operator's choice: ``oprl serve tinker
--stable-reinforce PRESET`` computes it as that oprl preset (the same loss, gradient and step as
``importance_sampling`` with ``{"preset": PRESET}``), announces it at start and in each result's metrics, and
without the option it stays a 400 naming the option. Through the SDK, on a server started with the option."""

import numpy as np
import pytest
from tinker_server import TINY, datum, serve

from oprl.cli import main as oprl_main

tinker = pytest.importorskip("tinker")
types = tinker.types

PRESET = "rec-oneside-nois"
ANNOUNCED = f"stable_reinforce={PRESET}:max"


@pytest.fixture(scope="module")
def chosen(tmp_path_factory):
    """A server started with ``stable_reinforce=PRESET`` and a service client of it."""
    up = serve(tmp_path_factory.mktemp("stable"), stable_reinforce=PRESET)
    service = tinker.ServiceClient(base_url=up.url, api_key="tml-test-key")
    yield service
    service.close("success").result()
    up.stop()


def _data(client):
    """Two replies of one prompt with stale behaviour log-probs (ρ ≠ 1, some outside the preset's band)."""
    prompt = client.get_tokenizer().encode("3+4=")
    data = []
    for reply, advantage, shift in (("7", 1.0, -0.5), ("12", -1.0, 0.4)):
        tokens = prompt + client.get_tokenizer().encode(reply)
        n, pad = len(tokens) - 1, len(prompt) - 1
        data.append(datum(tokens, logprobs=[-3.0 + shift] * n, advantages=[0.0] * pad + [advantage] * (n - pad)))
    return data


def test_stable_reinforce_is_the_chosen_preset_and_says_so(chosen):
    served = chosen.create_lora_training_client(base_model=TINY, rank=2, seed=5).result()
    preset = chosen.create_lora_training_client(base_model=TINY, rank=2, seed=5).result()
    data = _data(served)
    out = served.forward_backward(data, "stable_reinforce").result()
    reference = preset.forward_backward(data, "importance_sampling", {"preset": PRESET}).result()
    assert out.metrics[ANNOUNCED] == 1.0 and ANNOUNCED not in reference.metrics
    assert out.metrics["loss:sum"] == reference.metrics["loss:sum"] != 0.0
    for a, b in zip(out.loss_fn_outputs, reference.loss_fn_outputs, strict=True):
        np.testing.assert_array_equal(a["logprobs"].to_numpy(), b["logprobs"].to_numpy())
    # The same gradient, so the same step: equal norms, then equal log-probs under the stepped weights.
    steps = [c.optim_step(types.AdamParams(learning_rate=1e-2)).result() for c in (served, preset)]
    assert steps[0].metrics["grad_norm:mean"] == steps[1].metrics["grad_norm:mean"] > 0
    assert steps[0].metrics[ANNOUNCED] == 1.0 and ANNOUNCED not in steps[1].metrics  # the step says it too
    after = [c.forward(data, "importance_sampling").result() for c in (served, preset)]
    for a, b in zip(after[0].loss_fn_outputs, after[1].loss_fn_outputs, strict=True):
        np.testing.assert_array_equal(a["logprobs"].to_numpy(), b["logprobs"].to_numpy())


def test_stable_reinforce_takes_preset_overrides_and_refuses_another_preset(chosen):
    client = chosen.create_lora_training_client(base_model=TINY, rank=2, seed=6).result()
    data = _data(client)
    wide = client.forward(data, "stable_reinforce", {"eps_high": 5.0}).result()
    reference = client.forward(data, "importance_sampling", {"preset": PRESET, "eps_high": 5.0}).result()
    assert wide.metrics["loss:sum"] == reference.metrics["loss:sum"] and wide.metrics[ANNOUNCED] == 1.0
    with pytest.raises(
        tinker.BadRequestError, match=f"loss_fn_config.preset: the server serves stable_reinforce as '{PRESET}'"
    ):
        client.forward(data, "stable_reinforce", {"preset": "grpo"}).result()
    with pytest.raises(tinker.BadRequestError, match=r"loss_fn_config\.kl_coeff"):
        client.forward(data, "stable_reinforce", {"kl_coeff": 0.1}).result()
    client.forward(data, "stable_reinforce").result()  # the refusals took their turns


def test_an_unknown_preset_stops_the_server_at_start_in_one_line(tmp_path, capsys):
    code = oprl_main(["serve", "tinker", "--stable-reinforce", "rec-onesid-nois", "--state-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert err.startswith("error: --stable-reinforce: unknown preset 'rec-onesid-nois'") and "rec-oneside-nois" in err
    code = oprl_main(["serve", "tinker", "--stable-reinforce", "distill", "--state-dir", str(tmp_path)])
    assert code == 2 and "--stable-reinforce: 'distill' distils from a teacher" in capsys.readouterr().err


def test_the_choice_is_announced_in_the_start_up_log(tmp_path, capsys, monkeypatch):
    import uvicorn

    monkeypatch.setattr(uvicorn, "run", lambda *args, **kwargs: None)  # start, log, return at once
    assert oprl_main(["serve", "tinker", "--stable-reinforce", PRESET, "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"stable_reinforce: served as oprl's preset '{PRESET}' (--stable-reinforce" in out and ANNOUNCED in out
