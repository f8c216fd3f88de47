"""Score centering (arXiv 2609.20807, "Score Centering Stabilizes Off-policy Reinforcement Learning"; NeMo RL's
``loss_fn.score_centering``, vime's ``score_centering_correction``): subtract from each token's policy gradient the
sampler-expected score, estimated from the sampler's top-K (``top_k.py``), so a non-zero mean advantage does not
push the policy along E_q[∇ log p] ≠ 0 when q ≠ p.

At a valid token with advantage A, H the sampler's top-K set (``top_k.py``: q the sampler's, p the trainer's
probabilities of its ids):

    ρ        = (1 − Σ_H q)⁺ / max(1 − Σ_H p, 1e-6)      the tail's q/p, assumed constant off H
    NoIS     (weight=none):          m_v = q_v,                      α = ρ
    TIS      (weight=truncated-is, w = clamp(p/q, lo, hi), lo = 0, hi = is_cap):
                                     m_v = clamp(p_v, lo·q_v, hi·q_v), α = clamp(1, lo·ρ, hi·ρ)
    c_t      = A · Σ_{v∈H} sg(m_v − α·p_v) · log p_v     added to the token's loss term

so −∇c_t = −A·Σ_H (m_v − α p_v) ∇log p_v: with the sampled token's −w·A·∇log p_y this is A·(w_y ∇log p_y − μ̂_w),
μ̂_w = Σ_v q̂_v f(p_v/q̂_v) ∇log p_v the weighted score's mean under q̂ = q on H, ρ·p off it (Σ_v p ∇log p = 0 turns
the tail into −ρ·Σ_H p ∇log p). Sign and forms as vime's documentation derives them and the issue states them
(loss = −A[w_y log p_y − Σ_H sg(q_v f(p_v/q_v) − ρ f(1/ρ) p_v) log p_v]). The numerator (1 − Σ_H q) is clamped at
0 (a full-support top-K sums to 1 up to float rounding); 1e-6 bounds ρ where p's head holds all its mass. The term
covers every valid token whatever the clip masks (a mask only drops the sampled token's term, as in vime's and
the IPO loss's composition). Slots the sampler padded, and ids outside the trainer's kept set (p = 0), add 0.

Not here: the sampled token's own term (``losses.policy_loss``), the aggregation (``step.loss_terms`` aggregates
c_t as the loss does its tokens), where the top-K come from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from oprl.algorithms.spec import default
from oprl.algorithms.top_k import TopKTokens, head_masses
from oprl.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch", globals())  # imported on first use (oprl.lazy): the config needs only names

TAIL_FLOOR = 1e-6
"""The least 1 − Σ_H p in ρ's denominator (the paper's and the issue's max(·, 1e-6))."""

CENTERED_WEIGHTS: dict[str, str] = {"none": "NoIS: m = q, α = ρ", "truncated-is": "TIS: w = min(ρ, is_cap)"}
"""The token weights score centering composes with (``LossParams.weight``), and its form for each."""


def weight_band(weight: str, is_cap: float) -> tuple[float, float] | None:
    """(lo, hi) of the token weight w = clamp(p/q, lo, hi) that ``weight`` applies, or None for no weight (NoIS).
    ``truncated-is`` is min(ρ, C) = clamp(ρ, 0, C)."""
    if weight == "none":
        return None
    if weight == "truncated-is":
        return 0.0, is_cap
    raise ValueError(f"score_centering composes with weight={' or '.join(CENTERED_WEIGHTS)}, got {weight!r}")


def score_centering_tokens(
    top_k: TopKTokens,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    weight: str = default("weight"),
    is_cap: float = default("is_cap"),
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``(c (B, T), metrics)``: each valid token's centering term c_t (module docstring), with grad through
    ``top_k.current`` only, 0 at masked positions; ``advantages`` (B,) or (B, T), detached here; ``mask`` (B, T).
    Metrics (detached, token means over ``mask``): ``score_centering_rho_mean`` (ρ), ``score_centering_head_q``
    (Σ_H q) and ``score_centering_coef_abs`` (Σ_H |m − α p|, the size of the subtracted mean)."""
    heads = head_masses(top_k, mask)
    band = weight_band(weight, is_cap)
    valid = mask > 0  # (B, T)
    with torch.no_grad():
        rho = (1 - heads.q_head).clamp(min=0) / (1 - heads.p_head).clamp(min=TAIL_FLOOR)  # (B, T)
        if band is None:
            m, alpha = heads.q, rho
        else:
            low, high = band
            m = torch.minimum(torch.maximum(heads.p, low * heads.q), high * heads.q)  # clamp(p, lo·q, hi·q)
            alpha = torch.minimum(torch.maximum(torch.ones_like(rho), low * rho), high * rho)  # clamp(1, lo·ρ, hi·ρ)
        coef = torch.where(heads.slots, m - alpha[..., None] * heads.p, torch.zeros_like(m))  # (B, T, K)
    usable = heads.slots & torch.isfinite(top_k.current)  # p = 0 (−inf) adds 0: its coefficient is q·… only
    current = top_k.current.float()
    log_p = torch.where(usable, current, torch.zeros_like(current))  # where: no inf·0 in the sum or its gradient
    a = advantages.detach().float()
    a = a[:, None].expand_as(valid) if a.dim() == 1 else a
    a = torch.where(valid, a, torch.zeros_like(a))
    tokens = a * (torch.where(usable, coef, torch.zeros_like(coef)) * log_p).sum(-1)  # (B, T)
    count = valid.sum().clamp(min=1)
    metrics = {
        "score_centering_rho_mean": torch.where(valid, rho, 0.0).sum() / count,
        "score_centering_head_q": torch.where(valid, heads.q_head, 0.0).sum() / count,
        "score_centering_coef_abs": torch.where(valid, coef.abs().sum(-1), 0.0).sum() / count,
    }
    return tokens, {key: value.detach() for key, value in metrics.items()}
