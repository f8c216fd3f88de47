"""The consistency surrogate of docs/paper.md#surrogate, whose gradient at θ_t is group-relative REINFORCE.

For one group of K responses with rewards r_i, sequence log-probs s_i(θ) = log π_θ(y_i|x) and an anchor
s_i(θ_t) (detached), the KL-regularised optimum satisfies r_i − τ·(s_i − s_i(θ_t)) = const. The
surrogate penalises pairwise violations of that consistency. It exists to make the derivation checkable
(tests/algorithms/test_derivation.py) and to document the identity; training uses ``policy_loss``.

Not here: computing sequence log-probs (sum the token log-probs of each response yourself).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from oprl.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch", globals())  # imported on first use (oprl.lazy): the config needs only names


def consistency_surrogate(
    seq_logprobs: torch.Tensor,
    anchor_seq_logprobs: torch.Tensor,
    rewards: torch.Tensor,
    tau: float,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """L̂_w(θ) = (1/W²)·Σ_{i<j} w_i·w_j·(a_i − a_j)², a_i = r_i − τ·(s_i − s_i(θ_t)), W = Σ_i w_i.

    Inputs are (K,): ``seq_logprobs`` s_i with grad, ``anchor_seq_logprobs`` s_i(θ_t) (detached here),
    ``rewards`` r_i, optional ``weights`` w_i ≥ 0 (default all 1, giving the paper's (1/K²)·Σ_{i<j}).
    The 1/W² normalisation makes L̂_w the w-weighted population variance of a, and at θ = θ_t (a_i = r_i)
      ∇L̂_w = −(2τ/W)·Σ_i w_i·(r_i − r̄_w)·∇s_i,   r̄_w = Σ_j w_j·r_j / W,
    i.e. −(2τ/K)·Σ_i (r_i − r̄)·∇s_i unweighted: one descent step is group-relative REINFORCE, whatever
    distribution the y_i came from. With w ∈ {0, 1} it is the unweighted surrogate of the kept subset
    (RED-Drop). (The paper writes the weighted form without 1/W²; that only rescales by W².) W = 0 gives 0.
    """
    consistency = rewards - tau * (seq_logprobs - anchor_seq_logprobs.detach())  # (K,)
    if weights is None:
        weights = torch.ones_like(consistency)
    weights = weights.to(consistency.dtype)
    gaps = (consistency[:, None] - consistency[None, :]).square()  # (K, K)
    pair_weights = weights[:, None] * weights[None, :]  # (K, K)
    upper = torch.ones_like(gaps, dtype=torch.bool).triu(diagonal=1)  # pairs i < j
    total_weight = weights.sum()
    total_weight = torch.where(total_weight > 0, total_weight, torch.ones_like(total_weight))
    return (pair_weights * gaps)[upper].sum() / total_weight.square()
