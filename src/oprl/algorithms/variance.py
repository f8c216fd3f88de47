"""VCPO's two variance controls as pure functions (Huang et al. 2026, "Stable Asynchrony: Variance-Controlled
Off-Policy RL for LLMs", arXiv 2602.17616; the authors' code, github.com/mit-han-lab/vcpo: ``ess_scaling`` and
``grad_baselining`` of its verl fork, ``recipe/fully_async_policy/staleness_utils.py`` and
``verl/workers/actor/megatron_actor.py``).

- ``ess_lr_scale``: the factor on the learning rate of one optimizer step from the normalised effective sample
  size of the step's responses' importance weights (the trainer multiplies that step's learning rate by it and
  restores it after the step):

      w_i = π_θ(y_i | x_i) / π_b(y_i | x_i) = Π_t ρ_it        (the whole response's ratio, unclipped)
      ESS = (Σ_i w_i)² / (N · Σ_i w_i²) ∈ (0, 1]                (N = responses of the mini-batch)
      lr_t = lr · g(min(1, ESS / ESS_base))                      g = sqrt ("sqrt"), identity ("linear")

  On-policy every w_i = 1, so ESS = 1 and the step is unchanged; when a few responses dominate the weights,
  ESS → 1/N and the step shrinks. sqrt is the authors' rule for Adam-type optimizers (their README: η_eff ∝
  √ESS; their scripts: ``scaling_rule=sqrt``, ``base_ess_ratio=1.0``, ``use_clipped=False``). Adam normalises the
  gradient's scale away, so a loss scale would not do this: it has to be the step size.

- ``off_policy_baseline_log_weights``: log u_i of the closed-form minimum-variance baseline of the off-policy
  estimator Σ_i w_i·(r_i − b)·∇θ log π_θ(y_i), per group (the README's b*_OPOB):

      b* = Σ_i u_i·r_i / Σ_i u_i,      u_i = w_i² · ‖∇θ log π_θ(y_i | x_i)‖²

  (d/db of E‖w(r − b)∇log π‖² = 0). ``group_advantages(baseline="off-policy-optimal", log_weights=...)`` uses it
  in place of the group mean (``advantages.py``); the trainer computes ‖∇θ log π_θ(y_i)‖² with one backward
  pass per response (``Trainer.score_statistics``). On-policy with equal score norms it is the group mean.

Weights are handled in the log domain (a response's Π_t ρ_t overflows float32 long before it is meaningless), and
every per-token log-ratio is clamped to ±``MAX_LOG_RATIO`` as in the loss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from oprl.algorithms.losses import MAX_LOG_RATIO, _normalized_ess
from oprl.algorithms.registry import lookup
from oprl.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch", globals())  # imported on first use (oprl.lazy): the config needs only names


def _unscaled(ratio: torch.Tensor) -> torch.Tensor:
    return torch.ones_like(ratio)


def _sqrt(ratio: torch.Tensor) -> torch.Tensor:
    return ratio.sqrt()


def _linear(ratio: torch.Tensor) -> torch.Tensor:
    return ratio


ESS_LR_RULES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "none": _unscaled,  # the learning rate as configured (the trainer computes nothing)
    "sqrt": _sqrt,  # VCPO (the authors' default for AdamW): lr · √min(1, ESS/ESS_base)
    "linear": _linear,  # the authors' alternative: lr · min(1, ESS/ESS_base)
}
"""``algorithm.ess_lr``: the function g of r = min(1, ESS/ESS_base) ∈ (0, 1] that multiplies the learning rate."""


def sequence_log_ratios(logprobs: torch.Tensor, behavior_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) log w_i = Σ_t clamp(log π − log π_b, ±MAX_LOG_RATIO) over the valid tokens of ``mask`` (B, T): the
    log of each response's importance weight Π_t ρ_t (0 for a row without a valid token). Detached; ±inf/NaN at
    masked positions are ignored."""
    valid = mask > 0
    log_ratio = logprobs.detach() - behavior_logprobs.to(logprobs.dtype)
    log_ratio = torch.where(valid, log_ratio, torch.zeros_like(log_ratio))
    return log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).sum(dim=-1)


def ess_lr_scale(log_weights: torch.Tensor, rule: str = "sqrt", base: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scale, ess)``, two 0-dim tensors: ess = (Σw)²/(N·Σw²) of w = exp(``log_weights``) (N,), the responses'
    importance weights; scale = g(min(1, ess/``base``)) with g = ``ESS_LR_RULES[rule]``. The learning rate of the
    step is lr·scale. N = 0 gives ess = 1 and scale = 1. ``base`` > 0 is the ESS at or above which the step is
    not reduced (VCPO's ``base_ess_ratio``, 1.0)."""
    function = lookup(ESS_LR_RULES, rule, "ess_lr")
    if not base > 0:
        raise ValueError(f"ess_lr_base must be > 0, got {base!r}")
    ess = _normalized_ess(log_weights.detach())
    ratio = (ess / base).clamp(max=1.0)
    return function(ratio), ess


def off_policy_baseline_log_weights(log_weights: torch.Tensor, score_sq_norms: torch.Tensor) -> torch.Tensor:
    """(N,) log u_i = 2·log w_i + log ‖∇θ log π_θ(y_i)‖² of the off-policy optimal baseline (module docstring):
    ``log_weights`` (N,) the responses' log importance weights (``sequence_log_ratios``), ``score_sq_norms`` (N,)
    the squared norms of the gradients of Σ_t log π_θ(y_it) over the parameters. A zero norm (a response without
    a valid token) gives −inf: that response does not count in its group's baseline."""
    return 2 * log_weights + score_sq_norms.to(log_weights.dtype).log()


def baseline_gap(rewards: torch.Tensor, group_ids: torch.Tensor, baseline: torch.Tensor) -> torch.Tensor:
    """0-dim: the mean over responses of |b_i − mean_g(i)(r)|, how far a per-response ``baseline`` (N,) (e.g.
    ``GroupAdvantages.baseline``) lies from the plain mean reward of the response's group (0 for ``mean``)."""
    distinct, group = torch.unique(group_ids, return_inverse=True)
    rewards = rewards.to(baseline.dtype)
    sums = torch.zeros(len(distinct), dtype=rewards.dtype, device=rewards.device).index_add_(0, group, rewards)
    counts = torch.bincount(group, minlength=len(distinct)).to(rewards.dtype)
    return (baseline - (sums / counts)[group]).abs().mean().detach()
