"""The methods after the paper (DPPO, M2PO, OAPL, TOPR, BAPO, ASPO, SAPO): ``policy_loss`` against the plain-Python
reference of ``arena_reference`` on random batches (both signs of A, ratios far from 1, padding holding ±inf
and NaN), against autograd of the authors' own surrogate forms, their limits, bad settings, and each preset
training 2 steps on the tiny model."""

import copy
import math

import pytest
import torch
from arena_reference import reference_loss

from oprl.algorithms import PRESETS, LossParams, advantage_settings, group_advantages, policy_loss, resolve_preset

ARENA_PRESETS = ["dppo-tv", "dppo-kl", "m2po", "oapl", "topr", "bapo", "aspo", "sapo", "vespo", "luspo", "maxrl"]
VARIANTS = {  # the options that implement the frameworks' or the authors' code where it differs from the paper
    "m2po-areal": ("m2po-areal", {}),
    "m2po-authors-code": ("m2po-clip", {}),
    "dppo-tv-prime-rl": ("dppo-tv", {"eps_low": 0.2, "eps_high": 0.2, "weight": "importance-sampling",
                                     "regularizer": "squared-log-ratio", "regularizer_coef": 1e-3,
                                     "loss_agg": "token-mean"}),
    "topr-token": ("topr", {"ratio_level": "token"}),
    "bapo-authors-code": ("bapo", {"eps_low": 0.2, "eps_high": 0.2, "bapo_low_max": 0.95, "bapo_high_max": 2.0,
                                   "bapo_target": 1 / 3}),
}  # fmt: skip
CASES = {name: (name, {}) for name in ARENA_PRESETS} | VARIANTS


def random_batch(seed, rows=8, width=6, spread=1.5):
    """Log-probs in (−4, 0), log ρ ≈ N(0, spread²) (ratios far from 1; μ < 1), advantages of both signs, ragged rows."""
    generator = torch.Generator().manual_seed(seed)
    logprobs = -4 * torch.rand(rows, width, generator=generator, dtype=torch.float64)
    noise = spread * torch.randn(rows, width, generator=generator, dtype=torch.float64)
    log_ratios = logprobs - (logprobs - noise).clamp(max=-1e-3)  # behaviour log-probs stay < 0 (μ < 1)
    lengths = torch.randint(1, width + 1, (rows,), generator=generator)
    mask = torch.arange(width)[None, :] < lengths[:, None]
    advantages = torch.randn(rows, generator=generator, dtype=torch.float64)
    advantages[0], advantages[1] = 1.0, -1.0  # both signs always present
    return logprobs, log_ratios, mask, advantages


def torch_loss(settings, logprobs, log_ratios, mask, advantages, garbage=None, entropy=None):
    """``policy_loss`` on the batch (and token ``entropy``), every padded input replaced by ``garbage`` if given."""
    behavior = logprobs - log_ratios
    lp = logprobs.clone()
    if garbage is not None:
        lp = torch.where(mask, lp, torch.full_like(lp, garbage))
        behavior = torch.where(mask, behavior, torch.full_like(behavior, garbage))
        entropy = None if entropy is None else torch.where(mask, entropy, torch.full_like(entropy, garbage))
    lp.requires_grad_(True)
    loss, metrics = policy_loss(lp, behavior, advantages, mask, LossParams.of(settings), entropy=entropy)
    loss.backward()
    return loss, lp.grad, metrics


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_the_plain_python_reference(case, seed):
    preset, overrides = CASES[case]
    settings = resolve_preset(preset, **overrides)
    logprobs, log_ratios, mask, advantages = random_batch(seed, spread=0.4 if preset.startswith("m2po") else 1.5)
    expected, expected_grad, report = reference_loss(
        settings, logprobs.tolist(), log_ratios.tolist(), advantages.tolist(), mask.tolist()
    )
    for garbage in (None, -math.inf, math.inf, math.nan):
        loss, grad, metrics = torch_loss(settings, logprobs, log_ratios, mask, advantages, garbage)
        assert loss.item() == pytest.approx(expected, rel=1e-9, abs=1e-12), (case, garbage)
        assert grad.tolist() == [pytest.approx(row, rel=1e-9, abs=1e-12) for row in expected_grad]
        assert (grad[~mask] == 0).all() and torch.isfinite(grad).all()
        assert all(torch.isfinite(value) for value in metrics.values())
    if "m2" in report:
        assert metrics["m2"].item() == pytest.approx(report["m2"])
        assert metrics["m2_kept"].item() == pytest.approx(report["m2_kept"])
        if settings["clip_mode"] == "m2-mask-areal":
            assert metrics["m2_kept"].item() < settings["m2_threshold"] <= metrics["m2"].item()  # it had to mask
        else:  # the paper's rule: M̂₂ of the harmful tokens, which it brings to ≤ τ
            assert metrics["m2_kept"].item() <= settings["m2_threshold"] < metrics["m2"].item()  # it had to mask
    if settings["clip_mode"] == "m2-clip":
        assert metrics["m2_clip_low"].item() == pytest.approx(report["low"])
        assert metrics["m2_clip_high"].item() == pytest.approx(min(report["high"], 1e6))
    if settings["clip_mode"] == "bapo":
        assert (metrics["bapo_clip_low"].item(), metrics["bapo_clip_high"].item()) == pytest.approx(
            (report["low"], report["high"])
        )
        assert metrics["bapo_positive_share"].item() == pytest.approx(report["bapo_positive_share"])


def test_the_reference_cases_mask_something_and_keep_something():
    """The random batches exercise both sides of every rule (a reference match on all-kept data proves little)."""
    for case, (preset, overrides) in CASES.items():
        settings = resolve_preset(preset, **overrides)
        fractions = []
        for seed in range(3):
            logprobs, log_ratios, mask, advantages = random_batch(
                seed, spread=0.4 if preset.startswith("m2po") else 1.5
            )
            fractions.append(torch_loss(settings, logprobs, log_ratios, mask, advantages)[2]["clip_frac"].item())
        if settings["clip_mode"] != "none":
            assert max(fractions) > 0 and min(fractions) < 1, case


def _surrogate_gradient(surrogate, logprobs, behavior, advantages, mask, loss_agg):
    """Autograd of an authors' surrogate written with a ratio that carries the gradient."""
    from oprl.algorithms import aggregate

    lp = logprobs.clone().requires_grad_(True)
    ratio = torch.exp(lp - behavior)
    values = surrogate(ratio, advantages[:, None].expand_as(lp))
    aggregate(values, mask, loss_agg).backward()
    return lp.grad


def test_sapo_gradient_is_the_soft_gates():
    # SAPO's objective −(4/τ)·σ(τ(r − 1))·A (verl compute_policy_loss_sapo), differentiated by autograd.
    logprobs, log_ratios, mask, advantages = random_batch(3)
    settings = PRESETS["sapo"]

    def gate(ratio, adv):
        tau = torch.where(adv > 0, settings["tau_pos"], settings["tau_neg"])
        return -(4 / tau) * torch.sigmoid(tau * (ratio - 1)) * adv

    expected = _surrogate_gradient(gate, logprobs, logprobs - log_ratios, advantages, mask, "seq-mean-token-mean")
    _, grad, _ = torch_loss(settings, logprobs, log_ratios, mask, advantages)
    assert torch.allclose(grad, expected, atol=1e-12)


def test_aspo_gradient_is_the_authors_surrogate():
    # Archer2.0's compute_policy_loss_archer with fixed ε = 0.2 and c = 3: positives −A·(p/sg(p))/sg(p),
    # p = min(r, 1 + ε); negatives −A·max(r, 1 − ε); the dual clip replaces either by −A·c·logπ past c.
    logprobs, log_ratios, mask, advantages = random_batch(4)
    lp = logprobs.clone().requires_grad_(True)
    ratio = torch.exp(lp - (logprobs - log_ratios))
    adv = advantages[:, None].expand_as(lp)
    positive = torch.clamp(ratio, max=1.2)
    negative = torch.clamp(ratio, min=0.8)
    flipped = -adv * (positive / positive.detach()) / positive.detach()
    positive_loss = torch.where(1 / positive > 3, -adv * 3 * lp, flipped)
    negative_loss = torch.where(negative > 3, -adv * 3 * lp, -adv * negative)
    values = torch.where(adv < 0, negative_loss, positive_loss)
    from oprl.algorithms import aggregate

    aggregate(values, mask, "token-mean").backward()
    _, grad, metrics = torch_loss(PRESETS["aspo"], logprobs, log_ratios, mask, advantages)
    assert torch.allclose(grad, lp.grad, atol=1e-12)
    assert metrics["weight_capped_frac"].item() > 0  # the soft dual clip acted on this batch


def test_dppo_tv_masks_the_harmful_probability_shift_by_hand():
    # π − μ per token: +0.3 (A > 0: masked, δ = 0.15), −0.3 (A > 0: kept, moved against the push), and with
    # A < 0: −0.3 masked, +0.3 kept. w = min(ρ, 20), token sum / T = 2 per response.
    pi = torch.tensor([[0.6, 0.1], [0.1, 0.6]], dtype=torch.float64)
    mu = torch.tensor([[0.3, 0.4], [0.4, 0.3]], dtype=torch.float64)
    logprobs, log_ratios = pi.log(), pi.log() - mu.log()
    _, grad, metrics = torch_loss(PRESETS["dppo-tv"], logprobs, log_ratios, torch.ones(2, 2, dtype=torch.bool),
                                  torch.tensor([1.0, -1.0], dtype=torch.float64))  # fmt: skip
    # seq-mean-token-sum-norm with the padded width T = 2 as normaliser and 2 responses: factor 1/4.
    assert grad.tolist() == [pytest.approx([0.0, -0.25 / 4]), pytest.approx([0.0, 2.0 / 4])]
    assert metrics["clip_frac"].item() == 0.5 and metrics["dppo_divergence_mean"].item() == pytest.approx(0.3)


@pytest.mark.parametrize("preset", ["dppo-tv", "dppo-kl"])
def test_dppo_with_an_infinite_threshold_is_the_unclipped_loss(preset):
    logprobs, log_ratios, mask, advantages = random_batch(5)
    loose = resolve_preset(preset, eps_low=math.inf, eps_high=math.inf)
    unclipped = resolve_preset(preset, clip_mode="none")
    a = torch_loss(loose, logprobs, log_ratios, mask, advantages)
    b = torch_loss(unclipped, logprobs, log_ratios, mask, advantages)
    assert a[0].item() == pytest.approx(b[0].item()) and torch.equal(a[1], b[1])
    assert a[2]["clip_frac"].item() == 0
    # δ = 0 masks exactly the tokens that moved in their harmful direction (A > 0 and π > μ, A ≤ 0 and π < μ).
    tight = torch_loss(resolve_preset(preset, eps_low=0.0, eps_high=0.0), logprobs, log_ratios, mask, advantages)
    adv = advantages[:, None].expand_as(mask)
    harmful = ((adv > 0) & (log_ratios > 0)) | ((adv <= 0) & (log_ratios < 0))
    expected = (harmful & mask).sum().item() / mask.sum().item()
    assert tight[2]["clip_frac"].item() == pytest.approx(expected) and expected > 0.3


@pytest.mark.parametrize("clip_mode", ["m2-mask", "m2-mask-areal", "m2-clip"])
def test_m2po_with_an_infinite_bound_masks_nothing(clip_mode):
    logprobs, log_ratios, mask, advantages = random_batch(6)
    loose = resolve_preset("m2po", clip_mode=clip_mode, m2_threshold=math.inf, eps_low=1.0, eps_high=0.0)
    a = torch_loss(loose, logprobs, log_ratios, mask, advantages)
    b = torch_loss(resolve_preset("m2po", clip_mode="none"), logprobs, log_ratios, mask, advantages)
    assert a[2]["clip_frac"].item() == 0 and torch.allclose(a[1], b[1])
    # τ_M2 = 0: the paper's rule drops every harmful token (and only those); AReaL's drops every token; m2-clip
    # shrinks to its minimum band [1 − ε_l, 1 + ε_h], PPO's clip.
    tight = resolve_preset("m2po", clip_mode=clip_mode, m2_threshold=0.0)
    zero = torch_loss(tight, logprobs, log_ratios, mask, advantages)
    adv = advantages[:, None].expand_as(mask)
    harmful = mask & (((adv > 0) & (log_ratios > 0)) | ((adv < 0) & (log_ratios < 0)))
    if clip_mode == "m2-mask":
        assert zero[2]["clip_frac"].item() == pytest.approx(harmful.sum().item() / mask.sum().item())
        assert (zero[1][harmful] == 0).all() and (zero[1][mask & ~harmful] != 0).all()
    elif clip_mode == "m2-mask-areal":
        assert zero[2]["clip_frac"].item() == 1
    else:
        ppo = torch_loss(resolve_preset("m2po", clip_mode="one-side"), logprobs, log_ratios, mask, advantages)
        assert torch.equal(zero[1], ppo[1]) and zero[2]["m2_clip_high"].item() == pytest.approx(1.2)


def test_m2po_paper_rule_drops_only_harmful_tokens_and_fewer_than_areal():
    """#55: the paper's rule (m2po) ranks only the tokens that moved the way their advantage pushes and stops at
    M̂₂ ≤ τ; AReaL's (m2po-areal) ranks every token and stops at M̂₂ < τ: they mask different tokens. A token at
    ρ = 1 exactly is never dropped by the paper's rule, even at τ = 0."""
    paper_counts, areal_counts = [], []
    for seed in range(6):
        logprobs, log_ratios, mask, advantages = random_batch(seed, spread=0.4)
        log_ratios[:, 0] = 0.0  # ρ = 1 on every row's first token
        adv = advantages[:, None].expand_as(mask)
        harmful = mask & (((adv > 0) & (log_ratios > 0)) | ((adv < 0) & (log_ratios < 0)))
        paper = torch_loss(resolve_preset("m2po"), logprobs, log_ratios, mask, advantages)
        areal = torch_loss(resolve_preset("m2po-areal"), logprobs, log_ratios, mask, advantages)
        masked = mask & (paper[1] == 0)
        assert not (masked & ~harmful).any()  # only harmful tokens leave
        paper_counts.append(int(masked.sum()))
        areal_counts.append(int((mask & (areal[1] == 0)).sum()))
        zero = torch_loss(resolve_preset("m2po", m2_threshold=0.0), logprobs, log_ratios, mask, advantages)
        assert (zero[1][:, 0] != 0).all()  # ρ = 1 keeps its gradient at τ = 0
    assert sum(paper_counts) > 0 and paper_counts != areal_counts


def test_m2po_clip_puts_the_token_at_the_bound_outside_it():
    """The authors' τ² = v_{k−1} − 1e-12: the harmful token whose (log ρ)² is the cap gets no gradient (without
    the − 1e-12 it sat exactly on the bound and kept it)."""
    advantages = torch.tensor([1.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    log_ratios = torch.tensor([[0.1], [0.2], [0.9], [1.0]], dtype=torch.float64)  # harmful: A > 0, ρ > 1
    logprobs = torch.full((4, 1), -2.0, dtype=torch.float64)
    mask = torch.ones(4, 1, dtype=torch.bool)
    settings = resolve_preset("m2po-clip", eps_low=0.0, eps_high=0.0, m2_threshold=0.3)
    _, grad, metrics = torch_loss(settings, logprobs, log_ratios, mask, advantages)
    # Capping (log ρ)² ∈ {0.01, 0.04, 0.81, 1} at v = 0.81 gives 0.01 + 0.04 + 0.81·2 ≥ 0.3·4: τ² = 0.04 − 1e-12.
    assert metrics["m2_clip_high"].item() == pytest.approx(math.exp(0.2))
    assert grad[0, 0] != 0 and (grad[1:, 0] == 0).all()  # ρ = e^0.2 itself is just outside the bound


def test_bapo_with_target_zero_is_ppo_clip_at_the_start_bounds():
    logprobs, log_ratios, mask, advantages = random_batch(7)
    a = torch_loss(resolve_preset("bapo", bapo_target=0.0), logprobs, log_ratios, mask, advantages)
    b = torch_loss(resolve_preset("bapo", clip_mode="one-side"), logprobs, log_ratios, mask, advantages)
    assert torch.equal(a[1], b[1]) and (a[2]["bapo_clip_low"].item(), a[2]["bapo_clip_high"].item()) == (0.6, 1.2)
    # Target 1 is out of reach: both bounds end at their maxima.
    full = torch_loss(resolve_preset("bapo", bapo_target=1.0), logprobs, log_ratios, mask, advantages)[2]
    assert (full["bapo_clip_low"].item(), full["bapo_clip_high"].item()) == pytest.approx((0.9, 3.0))


@pytest.mark.parametrize("preset", ["topr", "aspo", "sapo", "dppo-tv", "dppo-kl", "m2po", "bapo"])
def test_on_policy_every_weight_is_one(preset):
    """ρ ≡ 1 (and π = μ): no mask, unit weights, so each is REINFORCE with the preset's aggregation."""
    logprobs, _, mask, advantages = random_batch(8)
    zeros = torch.zeros_like(logprobs)
    settings = PRESETS[preset]
    plain = resolve_preset("reinforce", loss_agg=settings["loss_agg"], weight="none")
    a = torch_loss(settings, logprobs, zeros, mask, advantages)
    b = torch_loss(plain, logprobs, zeros, mask, advantages)
    assert torch.allclose(a[1], b[1], atol=1e-12) and a[2]["clip_frac"].item() == 0


def test_oapl_at_the_behaviour_policy_is_scaled_reinforce():
    """At π = π_b the residual is −A: the gradient is 2β × REINFORCE's with each response's token sum."""
    logprobs, _, mask, advantages = random_batch(9)
    zeros = torch.zeros_like(logprobs)
    oapl = torch_loss(PRESETS["oapl"], logprobs, zeros, mask, advantages)
    summed = resolve_preset("reinforce", loss_agg="seq-mean-token-sum")
    reinforce = torch_loss(summed, logprobs, zeros, mask, advantages)
    assert torch.allclose(oapl[1], 2 * 1e-3 * reinforce[1], atol=1e-15)
    assert oapl[0].item() == pytest.approx(float((advantages**2).mean()))  # mean over responses of (0 − A)²


def test_oapl_advantage_is_reward_minus_the_soft_value():
    rewards, groups = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64), torch.tensor([0, 0, 1, 1])
    advantages = group_advantages(rewards, groups, **advantage_settings(PRESETS["oapl"])).advantages
    value = math.log((math.exp(1.0) + 1) / 2)  # β₁·log mean exp(r/β₁), β₁ = 1
    assert advantages.tolist() == pytest.approx([1 - value, -value, -value, 1 - value])


def test_topr_sequence_ratio_is_the_product_of_the_token_ratios():
    # One negative response with token ratios 0.5 and 1.5: Π = 0.75 < 1, every token weighs 0.75; the token
    # variant weighs them 0.5 and 1 (1.5 truncated). A positive response keeps weight 1 whatever ρ.
    logprobs = torch.full((2, 2), -1.0, dtype=torch.float64)
    log_ratios = torch.tensor([[0.5, 1.5], [0.5, 1.5]], dtype=torch.float64).log()
    advantages, mask = torch.tensor([-1.0, 1.0], dtype=torch.float64), torch.ones(2, 2, dtype=torch.bool)
    grad = torch_loss(PRESETS["topr"], logprobs, log_ratios, mask, advantages)[1]
    assert grad.tolist() == [pytest.approx([0.75 / 4, 0.75 / 4]), pytest.approx([-1 / 4, -1 / 4])]
    grad = torch_loss(resolve_preset("topr", ratio_level="token"), logprobs, log_ratios, mask, advantages)[1]
    assert grad.tolist() == [pytest.approx([0.5 / 4, 1 / 4]), pytest.approx([-1 / 4, -1 / 4])]


def test_a_long_stale_sequence_ratio_stays_finite():
    # Σ_t log ρ of 50 tokens at log ρ = 3 is 150: clamped to 20 before exp, no inf weight or NaN.
    logprobs = torch.full((1, 50), -1.0, dtype=torch.float64)
    loss, grad, _ = torch_loss(resolve_preset("topr", weight="importance-sampling"), logprobs,
                               torch.full_like(logprobs, 3.0), torch.ones(1, 50, dtype=torch.bool),
                               torch.tensor([1.0], dtype=torch.float64))  # fmt: skip
    assert torch.isfinite(loss) and grad[0, 0].item() == pytest.approx(-math.exp(20) / 50)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"bapo_target": 1.5}, "bapo_target must be in"),
        ({"m2_threshold": -0.1}, "m2_threshold must be >= 0"),
        ({"tau_neg": 0.0}, "tau_neg must be > 0"),
        ({"objective": "regression"}, "did you mean 'advantage-regression'"),
        ({"clip_mode": "dppo"}, "dppo-tv"),
        ({"weight": "flipped"}, "flipped-is"),
    ],
)
def test_bad_settings_name_the_key(overrides, message):
    with pytest.raises(ValueError, match=message) as error:
        resolve_preset("sapo", **overrides)
    assert error.value.key == next(iter(overrides)) and "\n" not in str(error.value)


@pytest.mark.parametrize("preset", ARENA_PRESETS)
def test_each_preset_trains_two_steps(preset):
    """On the tiny model through the real ``Trainer``: finite metrics, every new metric logged, weights move."""
    from trainer_helpers import make_batch, make_trainer

    trainer, tokenizer = make_trainer(preset)
    before = copy.deepcopy(trainer.model.state_dict())
    for seed in range(2):
        batch = make_batch(tokenizer, seed=seed)
        noise = torch.Generator().manual_seed(seed)
        for row, own in zip(batch, trainer.inputs.proximal_logprobs(batch), strict=True):  # near-policy: ρ ≈ 1 ± 0.1
            row.behavior_logprobs = [v + 0.2 * (float(torch.rand(1, generator=noise)) - 0.5) for v in own]
        metrics = trainer.step(batch)
        assert all(math.isfinite(value) for value in metrics.values()), preset
    changed = [n for n, p in trainer.model.state_dict().items() if not torch.equal(p, before[n])]
    assert changed, preset
    expected = {"m2po": "loss/m2", "bapo": "loss/bapo_clip_high", "oapl": "loss/regression_residual_mean",
                "dppo-tv": "loss/dppo_divergence_mean", "dppo-kl": "loss/dppo_divergence_mean",
                "aspo": "loss/weight_capped_frac"}  # fmt: skip
    if preset in expected:
        assert expected[preset] in metrics


def _train_default_job(small_overrides, tmp_path, preset):
    from oprl.cli import main
    from oprl.metrics import read_metrics

    args = [*small_overrides, "steps=2", "eval.interval=0", "tensorboard=false", f"algorithm.preset={preset}"]
    assert main(["train", *args, f"run_name={preset}"]) == 0
    rows = [r for r in read_metrics(tmp_path / "runs" / preset / "metrics.jsonl") if "loss/total" in r]
    assert [r["step"] for r in rows] == [1, 2] and all(math.isfinite(r["loss/total"]) for r in rows)
    return rows


def test_bapo_trains_the_default_job_through_the_config(small_overrides, tmp_path):
    """``oprl train algorithm.preset=bapo``: the new settings go config -> trainer -> loss, its bounds are logged."""
    rows = _train_default_job(small_overrides, tmp_path, "bapo")
    assert all(0.6 <= r["loss/bapo_clip_low"] <= 0.9 and 1.2 <= r["loss/bapo_clip_high"] <= 3.0 for r in rows)


@pytest.mark.parametrize("preset", [p for p in ARENA_PRESETS if p != "bapo"])
def test_each_preset_trains_the_default_job(small_overrides, tmp_path, preset):
    """About 1 s each once the session's warm start is cached."""
    _train_default_job(small_overrides, tmp_path, preset)


def test_luspo_is_gspo_times_each_responses_length():
    """LUSPO (TRL loss_type="luspo"): GSPO's per-response loss times |y_i|, so each token's gradient is GSPO's
    times its response's length."""
    logprobs, log_ratios, mask, advantages = random_batch(11, spread=0.01)
    _, gspo, _ = torch_loss(resolve_preset("gspo"), logprobs, log_ratios, mask, advantages)
    _, luspo, _ = torch_loss(resolve_preset("luspo"), logprobs, log_ratios, mask, advantages)
    lengths = mask.sum(dim=-1, keepdim=True).to(gspo.dtype)
    assert torch.allclose(luspo, gspo * lengths, atol=1e-12) and (luspo[mask] != 0).any()


def test_vespo_weight_is_trls_gamma_weight():
    """VESPO against TRL's get_gamma_weights written out: φ = exp(λ + k·log w − λ·w) with w = exp(clamp(Σ_t log ρ_t,
    log 1e-8, 20)), (k, λ) by the sign of A; φ(1) = 1 on-policy; the loss is −φ·A·logprobs, token mean."""
    logprobs, log_ratios, mask, advantages = random_batch(12, spread=0.3)
    settings = resolve_preset("vespo")
    _, grad, _ = torch_loss(settings, logprobs, log_ratios, mask, advantages)
    log_w = (log_ratios.clamp(-20, 20) * mask).sum(-1).clamp(math.log(1e-8), 20.0)  # (B,)
    positive = advantages >= 0
    k = torch.where(positive, 2.0, 3.0).to(log_w.dtype)
    lam = torch.where(positive, 3.0, 2.0).to(log_w.dtype)
    phi = torch.exp(lam + k * log_w - lam * log_w.exp())  # (B,)
    expected = -(phi * advantages)[:, None] * mask / mask.sum()  # d(−Σ φ·A·logprobs / N)/d logprobs
    assert torch.allclose(grad, expected, atol=1e-12)
    _, on_policy, _ = torch_loss(settings, logprobs, torch.zeros_like(log_ratios), mask, advantages)
    assert torch.allclose(on_policy, -advantages[:, None] * mask / mask.sum(), atol=1e-12)  # φ(1) = 1
