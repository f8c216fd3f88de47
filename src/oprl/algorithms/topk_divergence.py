"""DPPO's Top-K divergence (Qi et al. 2026, "Rethinking the Trust Region in LLM Reinforcement Learning", arXiv
2602.04879): the trust region on a divergence between the sampler's and the trainer's whole next-token
distributions, estimated on the sampler's top-K set with the rest of the vocabulary as one bucket, instead of the
binary {sampled token, rest} divergence of ``corrections._dppo_binary_*`` (the authors' code and verl's).

At a valid token with sampled id y, H the sampler's top-K ids (``top_k.py``: q = μ the sampler's, p = π the
trainer's probabilities), S = H ∪ {y} (y joins with its own recorded μ_y and π_y when the sampler's top-K missed
it), and the bucket r holding the rest, μ_r = (1 − Σ_S μ)⁺, π_r = (1 − Σ_S π)⁺:

    dppo-tv-topk:  D = ½·(Σ_{v∈S} |π_v − μ_v| + |π_r − μ_r|)
    dppo-kl-topk:  D = Σ_{v∈S} μ_v·log(μ_v/π_v) + μ_r·log((μ_r + 1e-8)/(π_r + 1e-8))      (KL(μ ‖ π))
    M = (D ≤ δ_high or π_y ≤ μ_y) if A > 0 else (D ≤ δ_low or π_y ≥ μ_y)

the binary rules' harmful-direction mask with D in place of the binary divergence (δ = eps_low / eps_high, as
there). With S = {y} (K = 1 and the sampler's top token drawn) D is exactly the binary divergence: TV |π_y − μ_y|,
the binary KL with its 1e-8 (tested), so the rules coincide; S refines the binary partition {y, rest}, so D is never
below it (data processing) and the Top-K rule masks at least what the binary one masks. Probabilities come from
log-probs clamped at 0, 0·log 0 = 0, and an id the trainer's kept set drops (π_v = 0 with μ_v > 0) gives KL = ∞:
masked in its harmful direction. The anchor is the sampler (the recorded top-K has no π_prox counterpart:
``recompute_proximal`` is refused with these modes).

Not here: the loss (``losses.policy_loss`` looks these masks up in ``CLIP_MODES``), where the top-K come from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from oprl.algorithms.top_k import TopKTokens, head_masses
from oprl.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch", globals())  # imported on first use (oprl.lazy): the config needs only names

BUCKET_EPS = 1e-8
"""Added to both sides of the bucket's ratio, as DPPO's binary KL adds it to 1 − p (``corrections.BINARY_KL_EPS``)."""


def partition(top_k: TopKTokens, logprobs: torch.Tensor, behavior_logprobs: torch.Tensor, mask: torch.Tensor):
    """``(π (B, T, K + 2), μ (B, T, K + 2))``: both distributions on S's cells and the bucket, detached: the top-K
    slots (0 on padded ones), the sampled token where H missed it (else 0), then the rest. ``logprobs`` and
    ``behavior_logprobs`` (B, T): the sampled token's; ``mask`` (B, T) the valid tokens."""
    heads = head_masses(top_k.detached(), mask)
    with torch.no_grad():
        valid = mask > 0
        missed = valid & ~(top_k.sampled & heads.slots).any(-1)  # (B, T): y is not in H
        zero = torch.zeros((), dtype=torch.float32, device=heads.p.device)
        pi_y = torch.where(missed, logprobs.detach().float().clamp(max=0).exp(), zero)  # (B, T)
        mu_y = torch.where(missed, behavior_logprobs.detach().float().clamp(max=0).exp(), zero)
        pi_rest = (1 - heads.p_head - pi_y).clamp(min=0)
        mu_rest = (1 - heads.q_head - mu_y).clamp(min=0)
        pi = torch.cat([heads.p, pi_y[..., None], pi_rest[..., None]], dim=-1)  # (B, T, K + 2)
        mu = torch.cat([heads.q, mu_y[..., None], mu_rest[..., None]], dim=-1)
        return pi, mu


def topk_tv(pi: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
    """½ Σ |π − μ| over the cells of ``partition`` (B, T, K + 2) -> (B, T)."""
    return 0.5 * (pi - mu).abs().sum(-1)


def topk_kl(pi: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
    """KL(μ ‖ π) over the cells of ``partition`` (B, T, K + 2) -> (B, T): the bucket (last cell) with
    ``BUCKET_EPS`` on both sides, 0·log 0 = 0, μ > 0 = π gives +inf."""
    cells_mu, cells_pi = mu[..., :-1], pi[..., :-1]
    logs = cells_mu.clamp(min=1e-30).log() - cells_pi.log()  # log 0 = −inf -> +inf where π = 0
    cells = torch.where(cells_mu > 0, cells_mu * logs, torch.zeros_like(cells_mu)).sum(-1)
    rest_mu, rest_pi = mu[..., -1], pi[..., -1]
    return cells + rest_mu * ((rest_mu + BUCKET_EPS) / (rest_pi + BUCKET_EPS)).log()


def _topk_mask(divergence_fn, ratio, advantages, params):
    """DPPO's harmful-direction mask on the Top-K ``divergence_fn`` (module docstring); ``params.top_k`` holds the
    micro-batch's ``TopKTokens`` (``step.loss_terms`` sets it when ``Algorithm.needs.top_k``)."""
    if params.top_k is None:
        raise ValueError(
            f"clip_mode={params.clip_mode} reads the sampler's top-K: the rows carry none (rollout.record_top_k=0)"
        )
    valid = params.mask > 0
    pi, mu = partition(params.top_k, params.logprobs, params.anchor_logprobs, params.mask)
    divergence = divergence_fn(pi, mu)  # (B, T)
    current, behavior = params.logprobs.clamp(max=0).exp(), params.anchor_logprobs.clamp(max=0).exp()  # π_y, μ_y
    keep_up = (divergence <= params.eps_high) | (current <= behavior)
    keep_down = (divergence <= params.eps_low) | (current >= behavior)
    keep = torch.where(advantages > 0, keep_up, keep_down)
    finite = torch.where(valid, divergence, torch.zeros_like(divergence)).clamp(max=1e30)
    count = valid.sum().clamp(min=1)
    return keep, {"dppo_divergence_mean": (finite.sum() / count).detach()}


def _dppo_topk_tv(ratio, advantages, params):
    return _topk_mask(topk_tv, ratio, advantages, params)


def _dppo_topk_kl(ratio, advantages, params):
    return _topk_mask(topk_kl, ratio, advantages, params)


TOP_K_MASKS = {"dppo-tv-topk": _dppo_topk_tv, "dppo-kl-topk": _dppo_topk_kl}
"""The clip modes of this module (``losses.CLIP_MODES`` lists them): they make a step need the top-K."""
