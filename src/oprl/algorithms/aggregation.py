"""Loss aggregation: how per-token values (B, T) become one scalar, in one place.

The policy loss, its regulariser and any KL or entropy term the trainer adds all go through
``aggregate`` so they are averaged the same way. A sequence whose mask is all zero (padding, or a row
RED-Drop removed) counts in no denominator: a batch with such rows gives the same value and gradient as
the batch without them. ``aggregation_count`` gives the denominator unit of each mode so a trainer can
split an optimizer batch into micro-batches and still get the full-batch value.

Not here: which tokens are valid (the caller's mask) or any loss formula.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from oprl.algorithms.registry import lookup
from oprl.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch", globals())  # imported on first use (oprl.lazy): the config needs only names


def _safe(denominator: torch.Tensor) -> torch.Tensor:
    # Replacing 0 by 1 (rather than adding an epsilon) keeps the value exact; the numerator is 0 there.
    return torch.where(denominator > 0, denominator, torch.ones_like(denominator))


def _seq_mean(per_seq: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``per_seq`` (B,) over the sequences with at least one valid token."""
    seq_valid = (mask > 0).any(dim=-1).to(per_seq.dtype)  # (B,)
    return (per_seq * seq_valid).sum() / _safe(seq_valid.sum())


def _token_mean(values, mask, normalizer):
    return (values * mask).sum() / _safe(mask.sum())


def _seq_mean_token_mean(values, mask, normalizer):
    per_seq = (values * mask).sum(dim=-1) / _safe(mask.sum(dim=-1))  # (B,)
    return _seq_mean(per_seq, mask)


def _seq_mean_token_sum(values, mask, normalizer):
    return _seq_mean((values * mask).sum(dim=-1), mask)


def _seq_mean_token_sum_norm(values, mask, normalizer):
    # Dr. GRPO: a fixed normaliser (default: the padded length T) so long answers are not down-weighted.
    scale = mask.shape[-1] if normalizer is None else normalizer
    return _seq_mean((values * mask).sum(dim=-1) / scale, mask)


LOSS_AGGREGATIONS: dict[str, Callable] = {
    "token-mean": _token_mean,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum": _seq_mean_token_sum,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    loss_agg: str = "token-mean",
    normalizer: float | None = None,
) -> torch.Tensor:
    """Aggregate per-token ``values`` (B, T) over the valid tokens of ``mask`` (B, T) into a 0-dim tensor.

    With m the mask (bool, or float weights), S the sequences having any m > 0 and |S| their number:
      token-mean:              Σ_bt v·m / Σ_bt m
      seq-mean-token-mean:     (1/|S|) Σ_b∈S (Σ_t v·m / Σ_t m)
      seq-mean-token-sum:      (1/|S|) Σ_b∈S Σ_t v·m
      seq-mean-token-sum-norm: (1/|S|) Σ_b∈S Σ_t v·m / normalizer   (normalizer defaults to T)
    An empty mask gives 0 (no NaN, zero gradient); values where m = 0 are ignored, even ±inf or NaN.
    """
    reduce = lookup(LOSS_AGGREGATIONS, loss_agg, "loss_agg")
    # Values at m = 0 are ignored even when ±inf or NaN (v·0 would be NaN), with a zero gradient there.
    values = torch.where(mask > 0, values, torch.zeros_like(values))  # (B, T)
    return reduce(values, mask.to(values.dtype), normalizer)


def aggregation_count(mask: torch.Tensor, loss_agg: str = "token-mean") -> torch.Tensor:
    """The denominator unit of ``loss_agg`` for ``mask`` (B, T): Σ m for token-mean, else |S|.

    For micro-batches j of one optimizer batch, Σ_j aggregate(v_j, m_j)·count(m_j) / count(m) equals
    aggregate(v, m) for every mode, so gradient accumulation reproduces the full-batch gradient.
    """
    lookup(LOSS_AGGREGATIONS, loss_agg, "loss_agg")
    dtype = mask.dtype if mask.is_floating_point() else torch.float32
    if loss_agg == "token-mean":
        return mask.to(dtype).sum()
    return (mask > 0).any(dim=-1).to(dtype).sum()
