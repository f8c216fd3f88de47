"""Per-token KL estimators to a frozen reference policy.

KL(π‖π_ref) is estimated on tokens sampled from (about) π with r = π_ref/π, following Schulman,
"Approximating KL Divergence" (2020):
  k1 = −log r = logprobs − ref_logprobs               unbiased, can be negative, high variance
  k2 = ½·(log r)²                                      biased, low variance, always ≥ 0
  k3 = (r − 1) − log r                                 unbiased, always ≥ 0 (the usual choice)
Each returns a (B, T) tensor that keeps the gradient of ``logprobs``; aggregate it with ``aggregate``.

Not here: the coefficient (``algorithms.step.loss_terms``), masking or aggregation, computing log-probs or logits,
and the entropy (computed with the log-probs, chunk by chunk, in ``oprl.models.logprobs``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from oprl.algorithms.losses import MAX_LOG_RATIO
from oprl.algorithms.registry import lookup
from oprl.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch", globals())  # imported on first use (oprl.lazy): the config needs only names


def _k1(log_r: torch.Tensor) -> torch.Tensor:
    return -log_r


def _k2(log_r: torch.Tensor) -> torch.Tensor:
    return 0.5 * log_r.square()


def _k3(log_r: torch.Tensor) -> torch.Tensor:
    # Clamped like the policy ratio: exp of a huge log-ratio on a stray token would be inf.
    log_r = log_r.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return log_r.exp() - 1 - log_r


KL_ESTIMATORS: dict[str, Callable] = {"k1": _k1, "k2": _k2, "k3": _k3}


def kl_penalty(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-token estimate (B, T) of KL(π‖π_ref) from ``logprobs`` (B, T) and ``ref_logprobs`` (B, T).

    With log r = ref_logprobs − logprobs: k1 = −log r, k2 = ½(log r)², k3 = (r − 1) − log r. With ``mask``
    (B, T), positions where it is 0 give 0 whatever the inputs hold there (±inf included), gradient 0.
    """
    estimator = lookup(KL_ESTIMATORS, kind, "kl estimator")
    ref_logprobs = ref_logprobs.to(logprobs.dtype)
    if mask is not None:
        valid = mask > 0
        logprobs = torch.where(valid, logprobs, torch.zeros_like(logprobs))
        ref_logprobs = torch.where(valid, ref_logprobs, torch.zeros_like(ref_logprobs))
    return estimator(ref_logprobs - logprobs)  # (B, T)
