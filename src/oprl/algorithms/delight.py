"""Delight: the product of a token's advantage and its surprisal, and the two rules that read it.

With ℓ_t = −log π_θ(y_t) (surprisal under the current policy, detached) and A the advantage, the delight of a
token is χ_t = A·ℓ_t: large for a rare token of a good response (a breakthrough), very negative for a rare token
of a bad one (a blunder the policy already almost never makes).

- **Delightful policy gradient** (DG; Osband 2026, arXiv 2603.14608): each token's policy-gradient term is
  multiplied by the detached gate g_t = σ(χ_t/η), η = 1 in the paper. Rare successes are learned from with weight
  → 1, rare failures pushed down with weight → 0, confident tokens at ½ (``delight_gate``; the loss's option
  ``delight_temperature``, ``losses.py``). open-instruct's and miles's implementations (allenai/open-instruct
  PR 1628, radixark/miles PR 2348) gate GRPO's per-token term the same way.
- **The Kondo gate** (Osband 2026, arXiv 2603.20526): a response's backward pass runs with probability
  σ((χ_i − λ)/η), χ_i its token-mean delight, λ a price. oprl sets the price as open-instruct's PR 1628 does:
  λ = the (1 − ρ)-quantile of χ over a rolling window of recent responses, ρ the target share of responses that
  get a backward pass. oprl's window is the last ``kondo_window`` responses *including this step's* (so the first
  step has a price and needs no warm-up), the quantile is linear interpolation (``torch.quantile``), and the
  Bernoulli draw uses the step's seeded generator. A skipped response trains with A = 0: the gradient of the
  paper's gate (Σ over the passed responses, the denominators unchanged), not its saving (``kondo_gate``).

Not here: where ℓ comes from (the loss's detached log-probs; for the Kondo gate the trainer's screening forward),
and the window's storage between steps (the trainer keeps the returned tensor).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from oprl.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch", globals())  # imported on first use (oprl.lazy): the config needs only names


def delight(logprobs: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """χ = A·(−log π): ``logprobs`` (B, T), detached, and ``advantages`` (B, T) (or broadcastable) → (B, T)."""
    return advantages * -logprobs


def delight_gate(
    logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DG's gate g = σ(A·(−log π)/η) per token (B, T), detached, and its metrics over the valid tokens of ``mask``
    (B, T): ``delight_mean`` (mean χ) and ``delight_gate_mean`` (mean g; ½ everywhere a token's A or ℓ is 0)."""
    chi = delight(logprobs.detach(), advantages.detach())  # (B, T)
    gate = torch.sigmoid(chi / temperature)  # (B, T)
    weight = mask.to(gate.dtype)
    total = weight.sum().clamp(min=1)
    return gate, {"delight_mean": (chi * weight).sum() / total, "delight_gate_mean": (gate * weight).sum() / total}


def response_delight(logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The Kondo gate's χ_i: each response's token-mean delight, Σ_t m·A_i·(−log π_t) / Σ_t m.

    ``logprobs`` (N, T) under the current policy, ``advantages`` (N,), ``mask`` (N, T): the response's loss tokens
    (a response without any has χ = 0). Returns (N,)."""
    weight = mask.to(logprobs.dtype)  # (N, T)
    surprisal = (-logprobs * weight).sum(-1) / weight.sum(-1).clamp(min=1)  # (N,) mean −log π
    return advantages.to(logprobs.dtype) * surprisal


def kondo_price(window: torch.Tensor, rate: float) -> torch.Tensor:
    """λ = the (1 − ``rate``)-quantile of the delights in ``window`` (H,), linear interpolation: about a share
    ``rate`` of them lies above it. 0-dim; 0 for an empty window."""
    if window.numel() == 0:
        return window.new_zeros(())
    return torch.quantile(window, 1 - rate)


class KondoGate(NamedTuple):
    """The gate's decision for one batch of responses."""

    advantages: torch.Tensor
    """(N,) the advantages with 0 for every response the gate skipped."""
    passed: torch.Tensor
    """(N,) bool: the responses whose backward pass runs."""
    window: torch.Tensor
    """(≤ window size,) the rolling window after this batch (its χ appended, the oldest dropped)."""
    metrics: dict[str, torch.Tensor]
    """0-dim: ``pass_frac`` (share passed), ``price`` (λ), ``delight_mean`` (mean χ_i of the batch)."""


def kondo_gate(
    advantages: torch.Tensor,
    logprobs: torch.Tensor,
    mask: torch.Tensor,
    window: torch.Tensor,
    *,
    rate: float,
    temperature: float,
    window_size: int,
    generator: torch.Generator | None = None,
) -> KondoGate:
    """The Kondo gate over one batch (module docstring).

    ``advantages`` (N,) the responses' advantages; ``logprobs`` (N, T) their tokens' log-probs under the current
    policy (a screening forward without grad); ``mask`` (N, T) their loss tokens; ``window`` (H,) the delights of
    earlier responses (empty at the start). χ = ``response_delight``, the window becomes the last ``window_size``
    of [window, χ], λ = ``kondo_price``(window, ``rate``), and response i passes where u_i < σ((χ_i − λ)/η),
    u_i ~ U(0, 1) drawn from ``generator`` in row order (η = ``temperature``).
    """
    chi = response_delight(logprobs.detach(), advantages.detach(), mask)  # (N,)
    window = torch.cat([window.to(chi), chi])[-window_size:]  # (≤ window_size,)
    price = kondo_price(window, rate)
    probability = torch.sigmoid((chi - price) / temperature)  # (N,)
    draws = torch.rand(len(chi), generator=generator).to(chi)  # (N,) on the generator's device (the CPU's)
    passed = draws < probability
    gated = torch.where(passed, advantages, torch.zeros_like(advantages))
    metrics = {
        "pass_frac": passed.to(chi.dtype).mean() if len(chi) else chi.new_ones(()),
        "price": price,
        "delight_mean": chi.mean() if len(chi) else chi.new_zeros(()),
    }
    return KondoGate(gated, passed, window, metrics)
