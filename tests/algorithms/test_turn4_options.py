"""#55: the parts of the turn-4 methods left unbuilt, as options of the one loss: BAPO's dual clip (``dual_clip``,
preset ``bapo-dual``) and ASPO's entropy-dependent band (``entropy_eps`` / ``entropy_quantile``, preset
``aspo-entropy``). Each against the plain-Python reference of ``arena_reference`` (both signs of A, ratios far
above c, padding holding ±inf and NaN), against autograd of the authors' code's surrogates, at their limits
(c = ∞ and a quantile of 1 are the presets without them), with bad settings, and training on the tiny model."""

import copy
import math

import pytest
import torch
from arena_reference import reference_loss
from test_arena_methods import random_batch, torch_loss

from oprl.algorithms import PRESETS, aggregate, resolve_preset, trainer_only

CASES = {
    "bapo-dual": ("bapo-dual", {}),
    "grpo-dual-1.5": ("grpo", {"dual_clip": 1.5}),  # c near 1: many tokens capped
    "rec-ring-dual": ("rec-ring-is", {"dual_clip": 4.0}),  # ring keeps A < 0 at ρ ≥ 3: c = 4 caps the far ones
    "aspo-entropy": ("aspo-entropy", {}),
    "aspo-entropy-dual": ("aspo-entropy", {"dual_clip": 3.0}),
    "rec-ring-entropy": ("rec-ring-is", {"entropy_eps": 0.6, "entropy_quantile": 0.5}),
    "cispo-entropy": ("cispo", {"entropy_eps": 0.1, "entropy_quantile": 0.3}),
}


def random_entropy(seed, like):
    return 3 * torch.rand(like.shape, generator=torch.Generator().manual_seed(100 + seed), dtype=like.dtype)


def run(settings, logprobs, log_ratios, mask, advantages, entropy=None, garbage=None):
    """``policy_loss`` with every padded input (entropy included) replaced by ``garbage`` if given."""
    return torch_loss(settings, logprobs, log_ratios, mask, advantages, garbage=garbage, entropy=entropy)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_the_plain_python_reference(case, seed):
    preset, overrides = CASES[case]
    settings = resolve_preset(preset, **overrides)
    logprobs, log_ratios, mask, advantages = random_batch(seed, rows=10, width=8, spread=1.5)
    entropy = random_entropy(seed, logprobs)
    expected, expected_grad, report = reference_loss(
        settings, logprobs.tolist(), log_ratios.tolist(), advantages.tolist(), mask.tolist(), entropy.tolist()
    )
    for garbage in (None, -math.inf, math.inf, math.nan):
        loss, grad, metrics = run(settings, logprobs, log_ratios, mask, advantages, entropy, garbage)
        assert loss.item() == pytest.approx(expected, rel=1e-9, abs=1e-12), (case, garbage)
        assert grad.tolist() == [pytest.approx(row, rel=1e-9, abs=1e-12) for row in expected_grad]
        assert (grad[~mask] == 0).all() and torch.isfinite(grad).all()
        assert all(torch.isfinite(value) for value in metrics.values())
        if settings["dual_clip"] is not None:
            assert metrics["dual_clip_frac"].item() == pytest.approx(report["dual_clip_frac"])
        if settings["entropy_eps"] is not None:
            assert metrics["entropy_wide_frac"].item() == pytest.approx(report["entropy_wide_frac"])


def test_the_options_act_on_the_reference_batches():
    """Each option changes the gradient on at least one of the random batches (a match on untouched data proves
    little), and the presets without it log no metric of it."""
    for case, (preset, overrides) in CASES.items():
        settings = resolve_preset(preset, **overrides)
        without = {**settings, "dual_clip": None} if settings["dual_clip"] is not None else {
            **settings, "entropy_eps": None}  # fmt: skip
        changed = []
        for seed in range(3):
            batch = random_batch(seed, rows=10, width=8, spread=1.5)
            entropy = random_entropy(seed, batch[0])
            with_it, plain = run(settings, *batch, entropy=entropy), run(without, *batch, entropy=entropy)
            changed.append(not torch.equal(with_it[1], plain[1]))
            assert "dual_clip_frac" not in plain[2] or without["dual_clip"] is not None
        assert any(changed), case


def test_the_arena_presets_are_unchanged():
    """bapo and aspo (the measured arena's) keep no dual clip and one band; the variants add exactly one option."""
    assert PRESETS["bapo"]["dual_clip"] is None and PRESETS["aspo"]["entropy_eps"] is None
    assert PRESETS["bapo-dual"] == {**PRESETS["bapo"], "dual_clip": 3.0}
    assert PRESETS["aspo-entropy"] == {**PRESETS["aspo"], "entropy_eps": 0.4, "entropy_quantile": 0.8}


def _autograd(surrogate, logprobs, log_ratios, mask, advantages, loss_agg="token-mean"):
    lp = logprobs.clone().requires_grad_(True)
    ratio = torch.exp(lp - (logprobs - log_ratios))
    aggregate(surrogate(lp, ratio, advantages[:, None].expand_as(lp)), mask, loss_agg).backward()
    return lp.grad


def _verl_dual_clip(low, high, c):
    """verl's compute_policy_loss (and BAPO's code) with clip bounds [low, high] and clip_ratio_c = c."""

    def surrogate(lp, ratio, adv):
        clipped = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, low, high))
        return torch.where(adv < 0, torch.minimum(-adv * c, clipped), clipped)

    return surrogate


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dual_clip_gradient_is_verls_dual_clip_ppo(seed):
    batch = random_batch(seed, rows=10, width=8, spread=1.5)
    _, grad, metrics = run(resolve_preset("grpo", dual_clip=3.0), *batch)
    assert torch.allclose(grad, _autograd(_verl_dual_clip(0.8, 1.2, 3.0), *batch), atol=1e-12)
    assert metrics["dual_clip_frac"].item() > 0 or seed  # far-off ratios: seed 0 has tokens above c


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bapo_dual_gradient_is_the_authors_code_at_the_bounds_it_found(seed):
    # WooooDyy/BAPO compute_policy_loss_bapo: PPO's loss at the searched bounds, dual clip with clip_ratio_c = 3.
    batch = random_batch(seed, rows=10, width=8, spread=1.5)
    _, grad, metrics = run(PRESETS["bapo-dual"], *batch)
    low, high = metrics["bapo_clip_low"].item(), metrics["bapo_clip_high"].item()
    assert torch.allclose(grad, _autograd(_verl_dual_clip(low, high, 3.0), *batch), atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_aspo_entropy_gradient_is_the_authors_dynamic_clip(seed):
    # compute_policy_loss_archer / the ASPO loss with use_dynamic_clip: q = nanquantile(entropy, 0.8) per response;
    # tokens with entropy <= q clip at 0.2, the rest at 0.4; positives −A·(p/sg(p))/sg(p), p = min(r, 1 + ε);
    # negatives −A·max(r, 1 − ε); past c = 3 either is −A·c·logπ.
    logprobs, log_ratios, mask, advantages = random_batch(seed, rows=10, width=8, spread=1.5)
    entropy = random_entropy(seed, logprobs)
    masked = torch.where(mask, entropy, torch.nan)
    low_entropy = masked <= torch.nanquantile(masked, 0.8, dim=-1, keepdim=True)
    eps = torch.where(low_entropy, 0.2, 0.4).to(logprobs.dtype)

    def archer(lp, ratio, adv):
        positive = torch.minimum(ratio, 1 + eps)
        negative = torch.maximum(ratio, 1 - eps)
        flipped = -adv * (positive / positive.detach()) / positive.detach()
        positive_loss = torch.where(1 / positive > 3, -adv * 3 * lp, flipped)
        negative_loss = torch.where(negative > 3, -adv * 3 * lp, -adv * negative)
        return torch.where(adv < 0, negative_loss, positive_loss)

    expected = _autograd(archer, logprobs, log_ratios, mask, advantages)
    _, grad, metrics = run(PRESETS["aspo-entropy"], logprobs, log_ratios, mask, advantages, entropy)
    assert torch.allclose(grad, expected, atol=1e-12)
    assert 0 < metrics["entropy_wide_frac"].item() < 0.3  # about the top 20 % of each response


@pytest.mark.parametrize("seed", [0, 1])
def test_the_limits_are_the_presets_without_the_option(seed):
    batch = random_batch(seed, rows=10, width=8, spread=1.5)
    entropy = random_entropy(seed, batch[0])
    # c = ∞: nothing capped, bit-equal to bapo.
    infinite = run(resolve_preset("bapo", dual_clip=math.inf), *batch)
    assert torch.equal(infinite[1], run(PRESETS["bapo"], *batch)[1]) and infinite[2]["dual_clip_frac"].item() == 0
    # Quantile 1 (no token above its response's largest entropy) or the same ε: aspo exactly.
    aspo = run(PRESETS["aspo"], *batch)[1]
    for overrides in ({"entropy_quantile": 1.0}, {"entropy_eps": 0.2}):
        assert torch.equal(run(resolve_preset("aspo-entropy", **overrides), *batch, entropy=entropy)[1], aspo)
    # Quantile 0 widens every token but each response's least-entropy one(s); a wide ε everywhere is ε itself.
    everywhere = run(resolve_preset("aspo-entropy", entropy_quantile=0.0, entropy_eps=0.2), *batch, entropy=entropy)
    assert torch.equal(everywhere[1], aspo)


def test_on_policy_the_options_change_nothing():
    logprobs, _, mask, advantages = random_batch(8)
    zeros = torch.zeros_like(logprobs)
    for preset in ("bapo-dual", "aspo-entropy"):
        a = run(PRESETS[preset], logprobs, zeros, mask, advantages, random_entropy(8, logprobs))
        b = run(PRESETS[preset.split("-")[0]], logprobs, zeros, mask, advantages)
        assert torch.equal(a[1], b[1]) and a[2]["clip_frac"].item() == 0


def test_entropy_eps_without_entropies_says_so():
    batch = random_batch(0)
    with pytest.raises(ValueError, match="entropy_eps needs the token entropies"):
        run(PRESETS["aspo-entropy"], *batch)


@pytest.mark.parametrize(
    "preset, overrides, key, message",
    [
        ("bapo", {"dual_clip": 1.0}, "dual_clip", "dual_clip must be > 1"),
        ("aspo", {"entropy_eps": -0.1}, "entropy_eps", "entropy_eps must be >= 0"),
        ("bapo", {"entropy_eps": 0.4}, "entropy_eps", "clip_mode='bapo' has none"),
        ("dppo-tv", {"entropy_eps": 0.4}, "entropy_eps", "widens the band of clip_mode=one-side"),
        ("aspo-entropy", {"entropy_quantile": 1.5}, "entropy_quantile", "entropy_quantile must be in"),
    ],
)
def test_bad_settings_name_the_key(preset, overrides, key, message):
    with pytest.raises(ValueError, match=message) as error:
        resolve_preset(preset, **overrides)
    assert error.value.key == key


def test_only_the_entropy_band_needs_oprls_trainer():
    """TRL, verl and the Tinker server pass no token entropies: they refuse entropy_eps (``trainer_only``); the
    dual clip is loss math on ρ and A, which every host computes."""
    assert trainer_only(PRESETS["aspo-entropy"]) == ["entropy_eps=0.4"]
    assert trainer_only(PRESETS["bapo-dual"]) == []


@pytest.mark.parametrize("preset, metric", [("bapo-dual", "loss/dual_clip_frac"),
                                            ("aspo-entropy", "loss/entropy_wide_frac")])  # fmt: skip
def test_each_variant_trains_two_steps(preset, metric):
    """On the tiny model through the real ``Trainer``: the trainer passes its entropies to the loss."""
    from trainer_helpers import make_batch, make_trainer

    trainer, tokenizer = make_trainer(preset)
    before = copy.deepcopy(trainer.model.state_dict())
    for seed in range(2):
        batch = make_batch(tokenizer, seed=seed)
        noise = torch.Generator().manual_seed(seed)
        for row, own in zip(batch, trainer.inputs.proximal_logprobs(batch), strict=True):  # ρ ≈ e^±1.5: some above 3
            row.behavior_logprobs = [v + 3 * (float(torch.rand(1, generator=noise)) - 0.5) for v in own]
        metrics = trainer.step(batch)
        assert all(math.isfinite(value) for value in metrics.values()) and metric in metrics, preset
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.state_dict().items())


def test_both_options_train_the_default_job_through_the_config(small_overrides, tmp_path):
    """``oprl train algorithm.preset=aspo-entropy algorithm.dual_clip=3``: config -> trainer -> loss, both logged."""
    from oprl.cli import main
    from oprl.metrics import read_metrics

    args = [*small_overrides, "steps=2", "eval.interval=0", "tensorboard=false", "run_name=turn4"]
    assert main(["train", *args, "algorithm.preset=aspo-entropy", "algorithm.dual_clip=3.0"]) == 0
    rows = [r for r in read_metrics(tmp_path / "runs" / "turn4" / "metrics.jsonl") if "loss/total" in r]
    assert [r["step"] for r in rows] == [1, 2] and all(math.isfinite(r["loss/total"]) for r in rows)
    assert all(0 < r["loss/entropy_wide_frac"] < 0.5 and r["loss/dual_clip_frac"] >= 0 for r in rows)
