"""The off-policy methods published after the paper, as masks, weights, a ratio level and an objective of the
one policy loss (docs/algorithms.md#the-arena-methods): DPPO, M2PO, BAPO, ASPO, TOPR, SAPO and OAPL.

Each function here is an entry of a registry in ``losses.py`` (``CLIP_MODES``, ``WEIGHTS``, ``RATIO_LEVELS``,
``OBJECTIVES``) with that registry's signature: a mask ``M(ratio, advantages, params)`` -> (B, T) bool, a weight
``w(ratio, advantages, params)`` -> (B, T), both optionally returning ``(tensor, metrics)`` where the metrics
are detached 0-dim tensors that say what the rule masked or re-weighted and why. ``ratio`` is the detached
ρ = π/a (a = π_b, or π_prox with a proximal), ``advantages`` the (B, T) advantages (0 on padding) and
``params`` the ``LossParams`` of the call, which also carries the call's ``mask``, the current log-probs
``logprobs`` (detached) and the anchor's ``anchor_logprobs`` (B, T).

Batch-level rules (M2PO's second moment, BAPO's adaptive bounds; ``losses.BATCH_RULES``) compute their
statistic over the rows they are given: one ``policy_loss`` call's, or, when the trainer's mini-batch spans
several micro-batches, the whole mini-batch at once (``losses.batch_keeps``: the rule runs on the micro-batches'
tensors concatenated in the mini-batch's row order, and each micro-batch's loss takes its rows of that mask). So
the mask, the loss and the gradient do not depend on ``optim.micro_batch_size`` (Trinity-RFT sorts all of a
mini-batch's tokens together, as the paper's Algorithm 1). With data parallelism ``batch_keeps`` gathers every
rank's rows first, so the statistic is the whole mini-batch's there too (docs/algorithms.md#batch-rules-scope).

Not here: the loss assembly, aggregation and the common metrics (``losses.py``), advantages (OAPL's V̂* is
``baseline=logavgexp`` in ``advantages.py``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from oprl.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch", globals())  # imported on first use (oprl.lazy): the config needs only names

BINARY_KL_EPS = 1e-8
"""Added to 1 − p in DPPO's binary KL, as the authors' verl port does, so p = 1 gives a finite divergence."""

BAPO_LOW_STEP = 0.05
BAPO_HIGH_STEP = 0.1
"""BAPO's bound increments δ₋ / δ₊ (the authors' run_bapo_example.sh: ratio_lower_step / ratio_upper_step)."""

M2_TIE = 1e-12
"""M2PO's tolerance on A = 0, on r = 1, on the target sum and below the cap, as in the authors' code."""


def _valid(params) -> torch.Tensor:
    return params.mask > 0  # (B, T)


def _one_side_bounds(ratio, advantages, low, high):
    """PPO's one-sided clip with ratio bounds [low, high] (tensors or floats): where −min(ρA, clip(ρ)A) has a
    gradient."""
    return ((advantages >= 0) & (ratio <= high)) | ((advantages <= 0) & (ratio >= low))


# --- DPPO (Qi et al. 2026, arXiv 2602.04879): a trust region on the sampled token's probability -------------


def _probabilities(params):
    """(π, μ) of the sampled tokens (B, T); a recorded log-prob rounded above 0 is probability 1."""
    return params.logprobs.clamp(max=0).exp(), params.anchor_logprobs.clamp(max=0).exp()


def _dppo_binary_tv(ratio, advantages, params):
    # TV of the binary distribution {token, not token} is |π − μ|; only the harmful direction is masked.
    current, behavior = _probabilities(params)
    shift = current - behavior  # (B, T) π − μ
    keep = torch.where(advantages > 0, shift <= params.eps_high, shift >= -params.eps_low)
    return keep, {"dppo_divergence_mean": _mean(shift.abs(), params)}


def _binary_kl(behavior_probs, current_probs):
    """KL(Bern(μ) ‖ Bern(π)) = μ log(μ/π) + (1 − μ) log((1 − μ)/(1 − π)), elementwise (B, T)."""
    log_mu = behavior_probs.clamp(min=1e-30).log()
    log_pi = current_probs.clamp(min=1e-30).log()
    rest = ((1 - behavior_probs + BINARY_KL_EPS) / (1 - current_probs + BINARY_KL_EPS)).log()
    return behavior_probs * (log_mu - log_pi) + (1 - behavior_probs) * rest


def _dppo_binary_kl(ratio, advantages, params):
    current, behavior = _probabilities(params)  # (B, T)
    divergence = _binary_kl(behavior, current)  # (B, T)
    # A token that moved against its advantage's push is never masked: the update would bring it back.
    keep_up = (divergence <= params.eps_high) | (current <= behavior)
    keep_down = (divergence <= params.eps_low) | (current >= behavior)
    keep = torch.where(advantages > 0, keep_up, keep_down)
    return keep, {"dppo_divergence_mean": _mean(divergence, params)}


# --- M2PO (Zheng et al. 2025, arXiv 2510.01161): bound the second moment of log ρ over the batch ----------


def _harmful(ratio, advantages, valid):
    """Tokens that moved the way their advantage pushes (A > 0 ∧ ρ > 1, or A < 0 ∧ ρ < 1), with the authors'
    tolerance: the ones a trust region exists to stop (B, T) bool."""
    pushed_up = (advantages > M2_TIE) & (ratio > 1 + M2_TIE)
    pushed_down = (advantages < -M2_TIE) & (ratio < 1 - M2_TIE)
    return valid & (pushed_up | pushed_down)


def _m2_mask(ratio, advantages, params):
    """M2PO, the paper's rule (Zheng et al. 2025, Algorithm 1): over the harmful tokens (``_harmful``: the ones a
    trust region is about), M̂₂ = mean (log ρ)²; while M̂₂ > τ_M2, drop the one with the largest (log ρ)². A token
    at ρ = 1, or one that moved against its advantage, always keeps its gradient; the loop stops as soon as
    M̂₂ ≤ τ_M2. M̂₂ is measured over the harmful tokens as the authors' code measures it
    (``kpo_clip_harmful_tokens``): over all tokens, dropping a harmful token below the mean would raise it."""
    valid = _valid(params)
    harmful = _harmful(ratio, advantages, valid)
    second = torch.where(harmful, ratio.log().square(), torch.full_like(ratio, -1.0)).flatten()  # (BT,) −1: not
    order = torch.argsort(second, descending=True, stable=True)  # harmful first, largest first
    ranked = second[order].clamp(min=0)  # (BT,)
    count = harmful.sum()  # h
    position = torch.arange(ranked.numel() + 1, device=ratio.device)  # k = 0 .. BT
    rest = torch.cat([ranked.flip(0).cumsum(0).flip(0), ranked.new_zeros(1)])  # Σ_{j ≥ k} (padding adds 0)
    kept_mean = rest / (count - position).clamp(min=1)  # M̂₂ after dropping k
    meets = (kept_mean <= params.m2_threshold) & (position <= count)  # k = h: nothing left, M̂₂ = 0
    first = meets.to(torch.int64).argmax()  # k*: how many to drop (the first k that meets, at most h)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=ratio.device)
    keep = valid & ((rank >= first).view_as(ratio) | ~harmful)
    return keep, {
        "m2": kept_mean[0],  # M̂₂ of the harmful tokens before masking
        "m2_kept": torch.where(first < count, kept_mean[first], kept_mean.new_zeros(())),
    }


def _m2_mask_all(ratio, advantages, params):
    """M2PO as AReaL implements it (``actor.m2_threshold``, docs/algorithms/m2po.md): rank *every* valid token
    by (log ρ)², drop the largest until the mean of the rest is strictly < τ_M2 (a token at ρ = 1 can be
    dropped, and with every |log ρ| large all are)."""
    valid = _valid(params)
    if ratio.numel() == 0:
        return valid, {}
    second = torch.where(valid, ratio.log().square(), torch.full_like(ratio, -1.0)).flatten()  # (BT,) −1: padding
    order = torch.argsort(second, descending=True, stable=True)  # valid tokens first, largest first
    ranked = second[order].clamp(min=0)  # (BT,)
    count = valid.sum()  # n
    position = torch.arange(ranked.numel(), device=ranked.device)  # k
    suffix = ranked.flip(0).cumsum(0).flip(0)  # Σ_{j ≥ k} of the ranked values (padding adds 0)
    remaining = (count - position).clamp(min=1)  # n − k
    below = (suffix / remaining < params.m2_threshold) & (position < count)  # mean of the rest < τ
    first = torch.where(below.any(), below.to(torch.int64).argmax(), count)  # k*: how many to drop
    rank = torch.empty_like(position)
    rank[order] = position
    keep = (rank >= first).view_as(ratio)
    total = count.clamp(min=1).to(ratio.dtype)
    kept_count = (count - first).clamp(min=1).to(ratio.dtype)
    return keep, {
        "m2": ranked.sum() / total,  # M̂₂ of the batch before masking
        "m2_kept": torch.where(first < count, suffix[first.clamp(max=ranked.numel() - 1)], ranked.new_zeros(()))
        / kept_count,
    }


def _m2_clip(ratio, advantages, params):
    """The authors' code (Infini-AI-Lab/M2PO, ``kpo_clip_harmful_tokens`` and ``compute_m2po_policy_loss``):
    over the tokens PPO would clip (``_harmful``), with v_k their (log ρ)² ascending, the first k whose cap
    Σ_{j≤k} v_j + (v_k − 1e-12)·(n − k − 1) reaches τ_M2·n gives τ² = v_{k−1} − 1e-12 (0 if k = 0): the token at
    v_{k−1} itself lies just outside the bound. τ becomes one-side bounds [e^−τ, e^τ], never narrower than
    [1 − ε_low, 1 + ε_high]."""
    valid = _valid(params)
    harmful = _harmful(ratio, advantages, valid)
    values = torch.where(harmful, ratio.log().square(), torch.full_like(ratio, math.inf)).flatten()
    ranked, _ = torch.sort(values)  # harmful ascending, then +inf
    count = harmful.sum()
    inside = torch.arange(ranked.numel(), device=ranked.device) < count
    finite = torch.where(inside, ranked, torch.zeros_like(ranked))
    target = params.m2_threshold * count.to(ratio.dtype)
    position = torch.arange(ranked.numel(), device=ranked.device)
    capped = finite.cumsum(0) + (finite - M2_TIE) * (count - 1 - position)  # Σ_j min(v_j, v_k), as the authors
    reaches = inside & (capped >= target - M2_TIE)
    first = reaches.to(torch.int64).argmax()
    below = (finite[(first - 1).clamp(min=0)] - M2_TIE).clamp(min=0)
    cap = torch.where(first > 0, below, finite.new_zeros(()))  # τ²
    needed = (count > 0) & (finite.sum() > target + M2_TIE)  # else no constraint
    tau = torch.where(needed, cap.sqrt(), torch.full_like(cap, math.inf))
    low = torch.minimum(torch.exp(-tau), torch.as_tensor(1 - params.eps_low, dtype=ratio.dtype))
    high = torch.maximum(torch.exp(tau), torch.as_tensor(1 + params.eps_high, dtype=ratio.dtype))
    total = count.clamp(min=1).to(ratio.dtype)
    return _one_side_bounds(ratio, advantages, low, high), {
        "m2": finite.sum() / total,  # M̂₂ over the harmful tokens, as the authors' code measures it
        "m2_clip_low": low,
        "m2_clip_high": high.clamp(max=1e6),  # ∞ (no constraint) logged as 1e6 so the metric stays finite
    }


# --- BAPO (Xi et al. 2025, arXiv 2510.18927): adaptive bounds that balance positive and negative updates -----


def _bapo_candidates(params) -> list[tuple[float, float]]:
    """The bounds BAPO tries in order: c_low raised by δ₋ up to b₋, then c_high raised by δ₊ up to b₊."""
    low, high = 1 - params.eps_low, 1 + params.eps_high
    path = [(low, high)]
    while low < params.bapo_low_max - 1e-12:
        low = min(low + BAPO_LOW_STEP, params.bapo_low_max)
        path.append((low, high))
    while high < params.bapo_high_max - 1e-12:
        high = min(high + BAPO_HIGH_STEP, params.bapo_high_max)
        path.append((low, high))
    return path


def _bapo(ratio, advantages, params):
    weight = params.mask.to(ratio.dtype)  # (B, T)
    path = _bapo_candidates(params)
    lows = ratio.new_tensor([low for low, _ in path])[:, None, None]  # (K, 1, 1)
    highs = ratio.new_tensor([high for _, high in path])[:, None, None]  # (K, 1, 1)
    # |clip(ρ)·A| summed over the tokens of each sign, for each candidate: PPO's clipped surrogate's weights.
    positive = (torch.minimum(ratio, highs) * advantages.clamp(min=0) * weight).sum(dim=(-2, -1))  # (K,)
    negative = (torch.maximum(ratio, lows) * (-advantages).clamp(min=0) * weight).sum(dim=(-2, -1))  # (K,)
    total = positive + negative
    ones = torch.ones_like(total)
    share = torch.where(total > 0, positive / torch.where(total > 0, total, ones), ones)  # no update: balanced
    meets = share >= params.bapo_target  # (K,)
    last = torch.as_tensor(len(path) - 1, device=ratio.device)
    index = torch.where(meets.any(), meets.to(torch.int64).argmax(), last)
    low, high = lows.flatten()[index], highs.flatten()[index]
    return _one_side_bounds(ratio, advantages, low, high), {
        "bapo_clip_low": low,
        "bapo_clip_high": high,
        "bapo_positive_share": share[index],
    }


# --- options of any mask: ASPO's entropy-dependent band, dual-clip PPO ---------------------------------------


def entropy_band(entropy, params):
    """ASPO's entropy-dependent width (its code's ``use_dynamic_clip``, docs/algorithms.md#aspo): per response, q = the
    ``entropy_quantile`` of its valid tokens' entropies (``torch.nanquantile``, linear interpolation); a token
    with entropy > q gets ε_low = ε_high = ``entropy_eps``, the others keep eps_low / eps_high. Returns
    ``(params, metrics)``: params with (B, T) tensors as eps_low / eps_high, read by the masks and weights that
    use the band (one-side, two-side, ring, clipped-is); unchanged (and no metric) when entropy_eps is None."""
    if params.entropy_eps is None:
        return params, {}
    if entropy is None:
        raise ValueError("entropy_eps needs the token entropies: pass policy_loss(..., entropy=...)")
    valid = _valid(params)
    masked = torch.where(valid, entropy.detach().to(torch.float64), torch.nan)  # (B, T)
    wide = valid & (masked > torch.nanquantile(masked, params.entropy_quantile, dim=-1, keepdim=True))  # (B, T)
    wide_eps = torch.full(wide.shape, params.entropy_eps, dtype=params.logprobs.dtype, device=wide.device)
    low = torch.where(wide, wide_eps, torch.full_like(wide_eps, params.eps_low))
    high = torch.where(wide, wide_eps, torch.full_like(wide_eps, params.eps_high))
    return replace(params, eps_low=low, eps_high=high), {"entropy_wide_frac": _mean(wide, params)}


def dual_clip(keep, ratio, advantages, params):
    """Dual-clip PPO (Ye et al. 2020; verl's ``clip_ratio_c``, BAPO's code with c = 3): for A < 0, PPO's loss
    −A·max(ρ, clip(ρ)) is capped at −A·c, a constant: the tokens with A < 0 and ρ > c lose their gradient.
    Returns ``(keep, metrics)``; unchanged when dual_clip is None."""
    if params.dual_clip is None:
        return keep, {}
    capped = (advantages < 0) & (ratio > params.dual_clip) & _valid(params)  # (B, T)
    return keep & ~capped, {"dual_clip_frac": _mean(capped, params)}


# --- weights -----------------------------------------------------------------------------------------------


def _flipped_importance_weight(ratio, advantages, params):
    # ASPO (Wang et al. 2025, arXiv 2510.06062): positive tokens weigh 1/ρ (their IS ratio flipped), negative
    # ones ρ; both capped at C (the soft dual clip, which keeps a gradient of weight C instead of none).
    flipped = torch.where(advantages > 0, 1 / ratio, ratio)
    return flipped.clamp(max=params.is_cap), {"weight_capped_frac": _mean(flipped > params.is_cap, params)}


def _tapered_importance_weight(ratio, advantages, params):
    # TOPR (Le Roux et al. 2025, arXiv 2503.14286): positives as in SFT (w = 1), negatives truncated IS ρ ∧ 1.
    return torch.where(advantages > 0, torch.ones_like(ratio), ratio.clamp(max=1.0))


def _soft_gate_weight(ratio, advantages, params):
    # SAPO (Gao et al. 2025, arXiv 2511.20347): the gradient of the gate (4/τ)σ(τ(ρ − 1))·A is 4σ(1 − σ)·ρ·A·∇logπ.
    tau = torch.where(advantages > 0, torch.full_like(ratio, params.tau_pos), torch.full_like(ratio, params.tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1))
    return 4 * gate * (1 - gate) * ratio


# --- ratio level and objective -----------------------------------------------------------------------------


# --- VESPO (arXiv 2602.10693; TRL loss_type="vespo"): a gamma-shaped weight of the response's ratio ---------


VESPO_LOG_FLOOR = math.log(1e-8)
"""VESPO's floor on log w (TRL ``get_gamma_weights``): the weight of a response whose ratio underflows."""


def _gamma_weight(ratio, advantages, params):
    """VESPO's φ(w) = exp(λ + k·log w − λ·w) (= e^λ·w^k·e^(−λw), φ(1) = 1, largest at w = k/λ), detached, with w
    the response's ratio Π_t ρ_t (``ratio_level=sequence-sum``), log w clamped to [log 1e-8, 20]; (k, λ) =
    (vespo_k_pos, vespo_lambda_pos) where A ≥ 0, (vespo_k_neg, vespo_lambda_neg) where A < 0."""
    log_w = ratio.log().clamp(VESPO_LOG_FLOOR, 20.0)
    positive = advantages >= 0
    k = torch.where(positive, params.vespo_k_pos, params.vespo_k_neg).to(ratio.dtype)
    rate = torch.where(positive, params.vespo_lambda_pos, params.vespo_lambda_neg).to(ratio.dtype)
    return torch.exp(rate + k * log_w - rate * log_w.exp())


def sequence_sum_log_ratio(log_ratio, mask):
    """log of the whole response's ratio Π_t ρ_t (TOPR's trajectory ratio) on all its tokens (``policy_loss``
    clamps it to ±``MAX_LOG_RATIO`` before exp, like every ratio level)."""
    per_seq = (log_ratio * mask).sum(dim=-1)  # (B,)
    return per_seq[:, None].expand_as(log_ratio)


def advantage_regression(logprobs, anchor_logprobs, advantages, mask, params):
    """OAPL (Ritter et al. 2026, arXiv 2602.19362): per response i, (β·Σ_t(logprobs − a)_t − A_i)² on each of
    its tokens (so ``seq-mean-token-mean`` is the authors' mean over responses). The gradient flows through
    ``logprobs``; ``advantages`` (B, T) is A_i on every valid token. Returns ((B, T) values, metrics)."""
    weight = mask.to(logprobs.dtype)
    log_ratio = (logprobs - anchor_logprobs) * weight  # (B, T), 0 on padding, with grad
    residual = params.regression_beta * log_ratio.sum(dim=-1) - _row_value(advantages, weight)  # (B,)
    values = residual.square()[:, None].expand_as(logprobs)  # (B, T)
    rows = (weight.sum(dim=-1) > 0).to(logprobs.dtype)
    count = rows.sum().clamp(min=1)
    return values, {"regression_residual_mean": (residual.detach() * rows).sum() / count}


def _row_value(values, weight):
    """Each row's value of a (B, T) tensor constant over its valid tokens (0 for an empty row)."""
    return (values * weight).sum(dim=-1) / weight.sum(dim=-1).clamp(min=1)


def _mean(values, params):
    """Mean of ``values`` (B, T) over the call's valid tokens (0 if none), a detached 0-dim tensor."""
    weight = params.mask.to(params.logprobs.dtype)
    return (values.to(weight.dtype) * weight).sum() / weight.sum().clamp(min=1)
