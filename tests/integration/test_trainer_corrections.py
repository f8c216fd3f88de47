"""The trainer's side of the corrections: decoupled PPO's proximal log-probs are the pre-update weights'
(batched like the update), and every preset added with them trains."""

import copy

import pytest
import torch
from test_distributed import _config, _save_model, assert_ranks_equal_one_process

import oprl.algorithms.step as step_module
from oprl.models.logprobs import pack, response_logprobs
from trainer_helpers import make_batch, make_trainer

NEW_PRESETS = [
    "tis-token", "tis-seq", "masked-is-token", "masked-is-seq", "decoupled-ppo", "gspo", "cispo", "dr-grpo",
    "red-drop-probabilistic", "red-drop-keep", "asymre-0.2", "rec-oneside-nois-wide-std",
]  # fmt: skip


def separate_forward(model, rows, pad_id):
    """log π of each response token from a fresh copy of ``model``, one plain packed forward pass."""
    model = copy.deepcopy(model).train()
    input_ids, attention_mask, targets, mask = pack(
        [e.prompt_ids for e in rows], [e.response_ids for e in rows], pad_id
    )
    with torch.no_grad():
        logprobs, _ = response_logprobs(model, input_ids, attention_mask, targets)
    return [values[valid].tolist() for values, valid in zip(logprobs, mask.bool(), strict=True)]


def test_proximal_logprobs_equal_a_forward_with_the_pre_update_weights(monkeypatch):
    trainer, tokenizer = make_trainer("decoupled-ppo", micro_batch_size=5, mini_batches=3)
    batch = make_batch(tokenizer)
    trainer.step(batch)  # move off the initial weights first, so "pre-update" is not "initial"
    batch = make_batch(tokenizer, seed=1)
    expected = separate_forward(trainer.model, batch, tokenizer.pad_token_id)
    seen = []

    def spy(*args, proximal_logprobs=None, **kwargs):
        seen.append((args[3].clone(), proximal_logprobs.clone()))
        return policy_loss(*args, proximal_logprobs=proximal_logprobs, **kwargs)

    policy_loss = step_module.policy_loss
    monkeypatch.setattr(step_module, "policy_loss", spy)
    metrics = trainer.step(batch)
    # Three mini-batches (three optimizer updates), each with π_prox from the weights before the first one.
    flat_expected = sorted(v for row in expected for v in row)
    flat_seen = sorted(v for mask, prox in seen for v in prox[mask.bool()].tolist())
    assert len(seen) >= 3 and flat_seen == pytest.approx(flat_expected, abs=1e-5)
    assert torch.isfinite(torch.tensor(metrics["loss/total"]))


def test_without_recompute_the_loss_gets_no_proximal(monkeypatch):
    trainer, tokenizer = make_trainer("grpo")
    calls = []
    original = step_module.policy_loss
    monkeypatch.setattr(step_module, "policy_loss", lambda *a, **k: calls.append(k) or original(*a, **k))
    trainer.step(make_batch(tokenizer))
    assert calls and all(k.get("proximal_logprobs") is None for k in calls)  # the loss anchors at π_b


def test_decoupled_ppo_with_one_update_per_batch_starts_at_r_equal_one():
    trainer, tokenizer = make_trainer("decoupled-ppo")
    metrics = trainer.step(make_batch(tokenizer))
    # r = π/π_prox is 1 up to float error on the only update; ρ to the (made-up) behaviour is far from 1.
    assert metrics["loss/ratio_min"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["loss/ratio_max"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["rho/behavior_outside_frac"] > 0.5


def near_policy_batch(trainer, tokenizer, seed):
    """A batch whose behaviour log-probs are the model's own plus noise of ±0.05: ρ near 1, as on-policy."""
    batch = make_batch(tokenizer, seed=seed)
    own = separate_forward(trainer.model, batch, tokenizer.pad_token_id)
    noise = torch.Generator().manual_seed(seed)
    for experience, values in zip(batch, own, strict=True):
        experience.behavior_logprobs = [v + 0.1 * (float(torch.rand(1, generator=noise)) - 0.5) for v in values]
    return batch


@pytest.mark.parametrize("preset", NEW_PRESETS)
def test_new_presets_train(preset):
    trainer, tokenizer = make_trainer(preset)
    before = copy.deepcopy(trainer.model.state_dict())
    for seed in range(2):
        metrics = trainer.step(near_policy_batch(trainer, tokenizer, seed))
        assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    changed = [n for n, p in trainer.model.state_dict().items() if not torch.equal(p, before[n])]
    assert changed, preset


def _train(small_overrides, tmp_path, preset):
    from oprl.cli import main
    from oprl.metrics import read_metrics

    args = [*small_overrides, "steps=2", "eval.interval=0", "tensorboard=false", f"algorithm.preset={preset}"]
    assert main(["train", *args, f"run_name={preset}"]) == 0
    rows = read_metrics(tmp_path / "runs" / preset / "metrics.jsonl")
    assert [r["step"] for r in rows if "loss/total" in r] == [1, 2]
    return rows


def test_decoupled_ppo_trains_the_default_job(small_overrides, tmp_path):
    rows = _train(small_overrides, tmp_path, "decoupled-ppo")
    # One optimizer update per batch, on-policy with an fp32 sampler: π_prox = π_θ, so r = 1 (float error).
    assert all(abs(r["loss/ratio_max"] - 1) < 1e-4 for r in rows if "loss/ratio_max" in r)


def test_vcpo_trains_the_default_job(small_overrides, tmp_path):
    """VCPO's score pass (one backward per response) and ESS-scaled step inside a real run: two steps, each
    logging the rate it used, lr·√min(1, ESS)."""
    rows = [r for r in _train(small_overrides, tmp_path, "vcpo") if "vcpo/lr_scale" in r]
    assert len(rows) == 2
    for row in rows:
        assert 0 < row["vcpo/ess"] <= 1 + 1e-6
        assert row["vcpo/lr_scale"] == pytest.approx(min(1.0, row["vcpo/ess"]) ** 0.5)
        assert row["optim/lr"] == pytest.approx(3e-4 * row["vcpo/lr_scale"])
        assert row["vcpo/score_norm_mean"] > 0 and row["vcpo/baseline_gap"] >= 0


@pytest.mark.slow
@pytest.mark.parametrize("preset", NEW_PRESETS)
def test_each_new_preset_trains_the_default_job(small_overrides, tmp_path, preset):
    _train(small_overrides, tmp_path, preset)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return _save_model(tmp_path_factory.mktemp("tiny"), 32, 2, 2)


@pytest.mark.slow  # two gloo ranks per sharding mode
@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_decoupled_ppo_two_ranks_equal_one_process(tiny_path, sharding):
    """π_prox on data-parallel ranks (every rank recomputes every row through the wrapped policy) gives the
    one-process losses, gradient norms and weights (two mini-batches per step, so r ≠ 1 on the second)."""
    assert_ranks_equal_one_process(_config(tiny_path, sharding, 2, **{"algorithm.preset": "decoupled-ppo"}), tiny_path)


@pytest.mark.slow  # two gloo ranks per sharding mode
@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_vcpo_two_ranks_equal_one_process(tiny_path, sharding):
    """VCPO on data-parallel ranks: every rank runs every response's score pass (the reduction averages equal
    gradients) and the step's ESS is gathered over the ranks' rows, so losses, gradient norms, the scaled rates and
    the weights equal one process (two mini-batches per step)."""
    config = _config(tiny_path, sharding, 2, **{"algorithm.preset": "vcpo"})
    assert_ranks_equal_one_process(config, tiny_path)
