"""Every preset on a hand-built batch: loss values and gradients w.r.t. logprobs against a scalar reference.

The batch: two groups (3 + 2 responses) × 3 tokens, with padding whose behaviour log-probs are garbage.
Ratios are chosen to land in every region of the clip modes. The reference below is a deliberately naive
per-token loop that follows the docs/paper.md#loss-table literally; two presets are also pinned to numbers worked out
by hand in the comments.
"""

import inspect
import math

import pytest
import torch
from arena_reference import reference_loss

from oprl.algorithms import (
    ADVANTAGE_KEYS,
    ALGORITHM_DEFAULTS,
    DISTILL_KEYS,
    PRESETS,
    TRAINER_KEYS,
    WEIGHTED_BASELINES,
    LossParams,
    advantage_settings,
    distill_advantages,
    group_advantages,
    policy_loss,
    resolve_preset,
)
from oprl.algorithms.losses import SETTING_FIELDS
from oprl.algorithms.topk_divergence import TOP_K_MASKS

LOSS_ONLY = [name for name in PRESETS if PRESETS[name]["clip_mode"] not in TOP_K_MASKS]
"""The presets whose loss needs no more than these tests give: the Top-K masks read the sampler's top-K
(tests/algorithms/test_topk_divergence.py)."""

REWARDS = [1.0, 0.0, 0.0, 0.5, 1.0]
GROUPS = [0, 0, 0, 1, 1]
MASK = [[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 0]]  # 11 valid tokens
LOGPROBS = [[-0.5, -1.0, -0.1], [-0.2, -0.7, -1.5], [-0.3, -2.0, -3.0], [-1.2, -0.4, -0.9], [-0.6, -0.8, -0.2]]
RATIOS = [[1.0, 1.5, 1.0], [0.6, 1.1, 4.0], [0.9, 1.0, 1.0], [0.3, 2.5, 1.0], [0.3, 1.25, 1.0]]
GARBAGE = {(0, 2): -math.inf, (2, 1): 500.0, (2, 2): math.nan, (4, 2): -300.0}  # padding positions


def batch():
    logprobs = torch.tensor(LOGPROBS, dtype=torch.float64, requires_grad=True)
    behavior = torch.tensor(LOGPROBS, dtype=torch.float64) - torch.tensor(RATIOS, dtype=torch.float64).log()
    for (b, t), value in GARBAGE.items():
        behavior[b, t] = value
    mask = torch.tensor(MASK, dtype=torch.bool)
    return logprobs, behavior, mask


def grouped_advantages(settings):
    """``group_advantages`` of REWARDS/GROUPS under ``settings``; a weighted baseline (VCPO's) gets unequal
    per-response log-weights, as the trainer would pass (tests/algorithms/test_variance.py checks its formula),
    and every preset the responses' token counts (test_red_weight.py checks adaptive RED-Weight's rule)."""
    rewards, groups = torch.tensor(REWARDS, dtype=torch.float64), torch.tensor(GROUPS)
    weights = {"log_weights": torch.linspace(-1.0, 1.0, 5)} if settings["baseline"] in WEIGHTED_BASELINES else {}
    lengths = torch.tensor(MASK).sum(-1)  # (5,) each response's tokens (adaptive RED-Weight's L_i)
    return group_advantages(
        rewards,
        groups,
        generator=torch.Generator().manual_seed(0),
        response_lengths=lengths,
        **advantage_settings(settings),
        **weights,
    )


def _sequence_ratio(b):
    logs = [math.log(RATIOS[b][t]) for t in range(3) if MASK[b][t]]
    return math.exp(sum(logs) / len(logs))


ARENA_KINDS = {"dppo-tv", "dppo-kl", "m2-mask", "m2-mask-areal", "m2-clip", "bapo", "flipped-is", "tapered",
               "soft-gate", "sequence-sum", "gamma", "advantage-regression"}  # fmt: skip


def reference(settings, advantages, keep):
    """Loss and d loss / d logprobs, one token at a time, then the aggregation of ``loss_agg``. The methods
    after the paper go to ``arena_reference`` (batch-level rules, OAPL's objective), written the same way."""
    kinds = {settings[key] for key in ("clip_mode", "weight", "ratio_level", "objective")}
    if kinds & ARENA_KINDS:
        mask = [[bool(MASK[b][t] and keep[b]) for t in range(3)] for b in range(5)]
        log_ratios = [[math.log(r) for r in row] for row in RATIOS]
        loss, grad, _ = reference_loss(settings, LOGPROBS, log_ratios, advantages, mask)
        return loss, grad
    eps_l, eps_h = settings["eps_low"], settings["eps_high"]
    eps_lp, eps_hp = settings["eps_low_prime"], settings["eps_high_prime"]
    c, cap = settings["regularizer_coef"], settings["is_cap"]
    valid = [(b, t) for b in range(5) for t in range(3) if MASK[b][t] and keep[b]]
    token_loss, token_grad = {}, {}
    for b, t in valid:
        a, lp = advantages[b], LOGPROBS[b][t]
        rho = _sequence_ratio(b) if settings["ratio_level"] == "sequence" else RATIOS[b][t]
        in_band = 1 - eps_l <= rho <= 1 + eps_h
        m = {
            "none": True,
            "one-side": (a >= 0 and rho <= 1 + eps_h) or (a <= 0 and rho >= 1 - eps_l),
            "two-side": in_band,
            "ring": in_band or (a >= 0 and rho <= 1 - eps_lp) or (a <= 0 and rho >= 1 + eps_hp),
            "mask": settings["mask_low"] <= rho <= settings["mask_high"],
        }[settings["clip_mode"]]
        w = {
            "none": 1.0,
            "importance-sampling": rho,
            "truncated-is": min(rho, cap),
            "clipped-is": min(max(rho, 1 - eps_l), 1 + eps_h),
            "advantage": math.exp(a / settings["weight_temperature"]),
        }[settings["weight"]]
        log_rho = math.log(RATIOS[b][t])  # the regulariser is always token-level, to the behaviour policy
        reg, reg_grad = {
            "none": (0.0, 0.0),
            "squared-log-ratio": (c * log_rho**2, 2 * c * log_rho),
            "forward-kl": (-c * lp, -c),
        }[settings["regularizer"]]
        eta = settings["delight_temperature"]  # DG's gate σ(A·(−lp)/η), detached
        w *= 1.0 if eta is None else 1 / (1 + math.exp(a * lp / eta))
        token_loss[b, t] = -m * w * a * lp + reg
        token_grad[b, t] = -m * w * a + reg_grad
    rows = sorted({b for b, _ in valid})
    scale = {  # the factor of each token of row b in the aggregate
        "token-mean": lambda b: 1 / len(valid),
        "seq-mean-token-mean": lambda b: 1 / len(rows) / sum(1 for r, _ in valid if r == b),
        "seq-mean-token-sum": lambda b: 1 / len(rows),
        "seq-mean-token-sum-norm": lambda b: 1 / len(rows) / 3,  # normaliser = padded width T = 3
    }[settings["loss_agg"]]
    grad = [[0.0] * 3 for _ in range(5)]
    for (b, t), g in token_grad.items():
        grad[b][t] = g * scale(b)
    return sum(value * scale(b) for (b, _), value in token_loss.items()), grad


@pytest.mark.parametrize("name", LOSS_ONLY)
def test_preset_matches_reference(name):
    settings = PRESETS[name]
    loss_settings = settings
    logprobs, behavior, mask = batch()
    grouped = grouped_advantages(settings)
    # A constant entropy puts no token above its response's quantile: aspo-entropy is aspo here (its band is
    # tested in test_turn4_options.py); every other preset ignores it.
    loss, metrics = policy_loss(
        logprobs, behavior, grouped.advantages, mask & grouped.keep[:, None], LossParams.of(loss_settings),
        entropy=torch.zeros_like(behavior),
    )  # fmt: skip
    loss.backward()
    expected_loss, expected_grad = reference(settings, grouped.advantages.tolist(), grouped.keep.tolist())
    assert loss.item() == pytest.approx(expected_loss, abs=1e-12)
    assert logprobs.grad.tolist() == [pytest.approx(row, abs=1e-12) for row in expected_grad]
    assert metrics["pg_loss"] + metrics["reg_loss"] == pytest.approx(loss.item(), abs=1e-12)
    assert all(torch.isfinite(value) for value in metrics.values())


def test_reinforce_by_hand():
    # A = [2/3, −1/3, −1/3 | −1/4, 1/4]; loss = −(1/11)·Σ_b A_b·Σ_t lp_bt over the 11 valid tokens
    #   = −(1/11)·[(2/3)(−1.5) + (−1/3)(−2.4) + (−1/3)(−0.3) + (−1/4)(−2.5) + (1/4)(−1.4)] = −0.175/11
    logprobs, behavior, mask = batch()
    advantages = group_advantages(torch.tensor(REWARDS, dtype=torch.float64), torch.tensor(GROUPS)).advantages
    loss, _ = policy_loss(logprobs, behavior, advantages, mask, LossParams.of(PRESETS["reinforce"]))
    loss.backward()
    assert loss.item() == pytest.approx(-0.175 / 11)
    expected = [[-2 / 33, -2 / 33, 0], [1 / 33] * 3, [1 / 33, 0, 0], [1 / 44] * 3, [-1 / 44, -1 / 44, 0]]  # −A/11
    assert logprobs.grad.tolist() == [pytest.approx(row) for row in expected]


def test_rec_oneside_nois_by_hand():
    # Masked (ε = 0.2): row0 ρ=1.5 (A>0), row1 ρ=0.6 (A<0), row3 ρ=0.3 (A<0), row4 ρ=1.25 (A>0).
    # loss = −(1/11)·[(2/3)(−0.5) + (−1/3)(−0.7 − 1.5) + (−1/3)(−0.3) + (−1/4)(−0.4 − 0.9) + (1/4)(−0.6)]
    #      = −0.675/11; clip_frac = 4/11, low = 2/11 (ρ 0.6, 0.3), high = 2/11 (ρ 1.5, 1.25).
    logprobs, behavior, mask = batch()
    advantages = group_advantages(torch.tensor(REWARDS, dtype=torch.float64), torch.tensor(GROUPS)).advantages
    loss, metrics = policy_loss(logprobs, behavior, advantages, mask, LossParams.of(PRESETS["rec-oneside-nois"]))
    assert loss.item() == pytest.approx(-0.675 / 11)
    assert metrics["clip_frac"].item() == pytest.approx(4 / 11)
    assert metrics["clip_frac_low"].item() == pytest.approx(2 / 11)
    assert metrics["clip_frac_high"].item() == pytest.approx(2 / 11)
    # valid ratios: 1, 1.5 | 0.6, 1.1, 4 | 0.9 | 0.3, 2.5, 1 | 0.3, 1.25 (padding ignored, even −inf/NaN there)
    assert metrics["ratio_mean"].item() == pytest.approx(14.45 / 11)
    assert metrics["ratio_min"].item() == pytest.approx(0.3)
    assert metrics["ratio_max"].item() == pytest.approx(4.0)
    assert metrics["ratio_outside_frac"].item() == pytest.approx(4 / 11)  # 4.0, 0.3, 2.5, 0.3
    assert metrics["weight_mean"].item() == pytest.approx(1.0)


def test_every_preset_sets_every_setting():
    required = {"reinforce", "grpo", "opmd", "asymre", "red-drop", "red-weight"}
    for clip in ("oneside", "twoside", "ring"):
        for weight in ("is", "nois"):
            required |= {f"rec-{clip}-{weight}", f"rec-{clip}-{weight}-wide"}
    assert required <= set(PRESETS)
    assert set(ADVANTAGE_KEYS) | set(SETTING_FIELDS) | set(DISTILL_KEYS) | set(TRAINER_KEYS) == set(ALGORITHM_DEFAULTS)
    assert not set(ADVANTAGE_KEYS) & set(SETTING_FIELDS)
    for name, settings in PRESETS.items():
        assert set(settings) == set(ALGORITHM_DEFAULTS), name
        if name.endswith("-wide"):
            assert (settings["eps_low"], settings["eps_high"]) == (0.6, 2.0)


@pytest.mark.parametrize(
    "function, keys",
    [(group_advantages, ADVANTAGE_KEYS), (LossParams, SETTING_FIELDS), (distill_advantages, DISTILL_KEYS)],
)
def test_the_functions_keyword_defaults_are_algorithm_defaults(function, keys):
    """One source: every setting the function (the loss: its ``LossParams``) takes defaults to
    ``ALGORITHM_DEFAULTS``' value, and it takes every setting of its keys (a default changed in defaults.py
    reaches a direct call too)."""
    parameters = inspect.signature(function).parameters
    settings = {n: p.default for n, p in parameters.items() if n in ALGORITHM_DEFAULTS}
    assert set(settings) == set(keys)
    for name, default in settings.items():
        assert default is ALGORITHM_DEFAULTS[name] or default == ALGORITHM_DEFAULTS[name], name
        assert type(default) is type(ALGORITHM_DEFAULTS[name]), name


def test_resolve_preset_applies_overrides_and_copies():
    resolved = resolve_preset("rec-oneside-nois", eps_high=2.0)
    assert resolved["eps_high"] == 2.0 and resolved["clip_mode"] == "one-side"
    resolved["clip_mode"] = "ring"
    assert PRESETS["rec-oneside-nois"]["clip_mode"] == "one-side"


@pytest.mark.parametrize(
    "name, overrides, message",
    [
        ("grpoo", {}, "did you mean 'grpo'"),
        ("grpo", {"eps_hgh": 0.3}, "did you mean 'eps_high'"),
        ("grpo", {"clip_mode": "onesided"}, "one-side, two-side, ring"),
        ("grpo", {"drop": "balanced"}, "balance"),
        ("grpo", {"weight_temperature": 0.0}, "weight_temperature"),
        ("grpo", {"temperature": 2.0}, "'temperature' was renamed 'weight_temperature'"),
        ("grpo", {"regularizer": "k2"}, "'k2' was renamed 'squared-log-ratio'"),
        ("grpo", {"weight": "importance_sampling"}, "was renamed 'importance-sampling'"),
        ("grpo", {"eps_low": -0.1}, "eps_low"),
    ],
)
def test_resolve_preset_rejects_unknown_names(name, overrides, message):
    with pytest.raises(ValueError, match=message):
        resolve_preset(name, **overrides)


@pytest.mark.parametrize("name", LOSS_ONLY)
@pytest.mark.parametrize("masked_value", [-math.inf, math.inf, math.nan])
def test_masked_positions_are_ignored_even_when_infinite(name, masked_value):
    """Every input at a masked position may be ±inf or NaN (trainer log-probs of padding included): the loss
    and the gradient equal the reference's, finite, and the gradient there is exactly 0."""
    settings = PRESETS[name]
    loss_settings = settings
    grouped = grouped_advantages(settings)
    _, behavior, mask = batch()
    mask = mask & grouped.keep[:, None]
    raw = torch.tensor(LOGPROBS, dtype=torch.float64)
    logprobs = torch.where(mask, raw, torch.full_like(raw, masked_value)).requires_grad_(True)
    behavior = torch.where(mask, behavior, torch.full_like(raw, masked_value))
    extra = {}
    if settings["recompute_proximal"]:  # π_prox = π_θ before the update: ρ = 1 on valid tokens
        extra["proximal_logprobs"] = torch.where(mask, raw, torch.full_like(raw, masked_value))
    entropy = torch.where(mask, torch.ones_like(raw), torch.full_like(raw, masked_value))  # aspo-entropy's band
    params = LossParams.of({**loss_settings, **extra})
    loss, metrics = policy_loss(logprobs, behavior, grouped.advantages, mask, params, entropy=entropy)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logprobs.grad).all()
    assert (logprobs.grad[~mask] == 0).all()
    assert all(torch.isfinite(value) for value in metrics.values())
    if not extra:  # the same numbers as the clean batch
        expected_loss, expected_grad = reference(settings, grouped.advantages.tolist(), grouped.keep.tolist())
        assert loss.item() == pytest.approx(expected_loss, abs=1e-12)
        assert logprobs.grad.tolist() == [pytest.approx(row, abs=1e-12) for row in expected_grad]
