"""Truncated sampling (top-k, top-p): the one rule every sampler and the trainer apply to a distribution.

For temperature-scaled scores ``s = logits / temperature`` (..., V), the kept set ``S(s)`` is built in two
steps, in this order (vLLM's ``apply_top_k_top_p``, transformers' ``TopKLogitsWarper`` then
``TopPLogitsWarper``):

- **top-k** (``top_k > 0``): keep every token whose score is >= the k-th largest score (ties at the k-th value
  are all kept);
- **top-p** (``top_p < 1``): on the top-k survivors, renormalised, sort ascending and drop the tokens whose
  cumulative probability is <= 1 - top_p; the most likely token always stays.

The sampler draws from, and records the log-prob of, ``softmax`` over ``S(s)``; the trainer rebuilds ``S`` from
its own scores with this function (``oprl.models.logprobs``), so on-policy both sides renormalise over the same
set and rho = 1 up to float rounding. Deliberately not here: min-p, repetition penalties, any sampling.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from oprl.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch", globals())  # imported on first use (oprl.lazy): the config needs only names


def truncates(top_k: int, top_p: float) -> bool:
    """Whether ``(top_k, top_p)`` removes anything: ``top_k > 0`` or ``top_p < 1``."""
    return top_k > 0 or top_p < 1.0


def kept_tokens(scores: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """(..., V) bool: True where a token of ``scores`` (..., V), temperature-scaled logits, survives top-k then
    top-p (see the module docstring). ``top_k = 0`` and ``top_p = 1`` keep everything. No gradient: the set is
    a step function of the scores."""
    scores = scores.detach()
    vocab = scores.shape[-1]
    top_k = top_k if 0 < top_k < vocab else 0
    if top_p >= 1.0:
        if not top_k:
            return torch.ones_like(scores, dtype=torch.bool)
        return scores >= scores.topk(top_k, dim=-1).values[..., -1:]  # (..., V): no sort needed
    # vLLM's order of operations: one ascending sort, top-k then top-p in sorted space. Only where scores tie
    # at the top-p boundary does the order of equal values matter; transformers re-sorts after top-k and may
    # break such a tie the other way.
    ascending, order = scores.sort(dim=-1)  # (..., V)
    if top_k:
        ascending = ascending.masked_fill(ascending < ascending[..., vocab - top_k, None], float("-inf"))
    outside = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1.0 - top_p
    outside[..., -1] = False  # the most likely token always stays
    kept = ascending.isfinite() & ~outside  # (..., V), in sorted order
    return torch.empty_like(kept).scatter_(-1, order, kept)
