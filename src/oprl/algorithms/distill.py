"""On-policy (and off-policy) distillation as a per-token advantage: the teacher's verdict on each sampled token.

The student's sampled tokens y_t (drawn from π_b, the behaviour policy) are scored by a teacher π_T; the signal
is the negative per-token reverse KL estimate, discount 0 (Agarwal et al. 2024, GKD; Thinking Machines'
on-policy distillation, 2025: tinker-cookbook ``incorporate_kl_penalty``, verl ``docs/algo/opd.md``):

  d_t = −(log π_b(y_t) − log π_T(y_t))            (B, T); > 0 where the teacher likes the token more
  A_t = A_group + c·d_t     (distill_mix=add)      the task's group advantage plus the teacher's signal
  A_t = c·d_t               (distill_mix=replace)  pure distillation, the task reward ignored

with c = ``distill_coef``. A_t then goes through ``policy_loss`` like any advantage, so every clip mode, weight
and regulariser applies per token. No normalisation: the published recipes use the raw log-ratio (tinker's
``kl_penalty_coef`` = 1, no discount), and oprl does the same. Since E_{y~π_b}[log π_b − log π_T] =
KL(π_b‖π_T), ``distill/reverse_kl`` (the token mean of −d_t) estimates the reverse KL per token; it is exact
on-policy and an estimate of the *behaviour* policy's KL to the teacher when the data are stale or offline.

log π_T is clamped at a floor f (``teacher.logprob_floor``, default ``LOGPROB_FLOOR``): a teacher scoring its
top-k / top-p truncated distribution (``teacher.support=truncated``) gives −inf to a sampled token outside its
kept set, and d_t = f − log π_b(y_t) keeps the advantage finite; such tokens are counted
(``distill/outside_teacher_support``). With the floor the expected gradient is that of the reverse KL to the
teacher's distribution with e^f on each of its zero-probability tokens (docs/algorithms.md, "Distillation under
top-p / top-k").

Not here: computing the teacher's log-probs (``oprl.teacher``), token masks (the caller's), the loss itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from oprl.algorithms.losses import MAX_LOG_RATIO
from oprl.algorithms.registry import lookup
from oprl.algorithms.spec import LOGPROB_FLOOR, Distill
from oprl.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch", globals())  # imported on first use (oprl.lazy): the config needs only names


def _add(group_advantages: torch.Tensor, signal: torch.Tensor) -> torch.Tensor:
    return group_advantages[:, None] + signal  # (B, T)


def _replace(group_advantages: torch.Tensor, signal: torch.Tensor) -> torch.Tensor:
    return signal  # (B, T)


DISTILL_MIXES: dict[str, Callable] = {
    "add": _add,  # A_group + c·d_t: reward and teacher together (the reward model's advantage plus a KL term)
    "replace": _replace,  # c·d_t alone: pure on-policy distillation (tinker-cookbook, verl opd)
}


def distill_advantages(
    advantages: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    distill_coef: float = Distill.distill_coef,
    distill_mix: str = Distill.distill_mix,
    logprob_floor: float = LOGPROB_FLOOR,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token advantages (B, T) from the group advantages and the teacher's log-probs.

    Inputs: ``advantages`` (B,) the group advantages (``group_advantages``); ``behavior_logprobs`` (B, T)
    recorded by the sampler; ``teacher_logprobs`` (B, T) the teacher's log-probs of the same tokens (same
    temperature; −inf where the teacher gives the token probability 0); ``mask`` (B, T), 0 on padding and
    environment tokens, where A_t = 0 whatever the inputs hold; ``logprob_floor`` f.
      d_t = max(teacher_logprobs, f) − behavior_logprobs;  A_t = mix(A_group, c·d_t)   (module docstring)
    Returns ``(A (B, T), distill_metrics(...))``; nothing carries a gradient.
    """
    mix = lookup(DISTILL_MIXES, distill_mix, "distill_mix")
    valid = mask > 0  # (B, T)
    teacher = teacher_logprobs.clamp(min=logprob_floor)  # (B, T): −inf (outside the teacher's support) -> f
    signal = _log_ratio(teacher, behavior_logprobs, valid)  # (B, T): d_t, 0 off the mask
    token_advantages = mix(advantages.detach().to(signal.dtype), distill_coef * signal)  # (B, T)
    token_advantages = torch.where(valid, token_advantages, torch.zeros_like(token_advantages))
    return token_advantages, distill_metrics(behavior_logprobs, teacher_logprobs, mask, logprob_floor=logprob_floor)


def _log_ratio(teacher_logprobs: torch.Tensor, behavior_logprobs: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """log π_T − log π_b (B, T) on valid tokens, 0 elsewhere (padding may hold −inf or NaN), detached."""
    dtype = torch.promote_types(behavior_logprobs.dtype, torch.float32)
    teacher = torch.where(valid, teacher_logprobs.detach().to(dtype), torch.zeros((), dtype=dtype))
    behavior = torch.where(valid, behavior_logprobs.detach().to(dtype), torch.zeros((), dtype=dtype))
    return teacher - behavior  # (B, T)


def distill_metrics(
    behavior_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    logprob_floor: float = LOGPROB_FLOOR,
) -> dict[str, torch.Tensor]:
    """Token means over ``mask`` (B, T), detached 0-dim tensors (0 when no token is valid), with log π_T clamped
    at ``logprob_floor`` as in ``distill_advantages``:

    ``reverse_kl``: mean of log π_b − log π_T, the k1 estimate of KL(π_b‖π_T) per token;
    ``agreement``: mean of min(1, π_T/π_b), the chance that the teacher accepts the student's token in
    speculative sampling (Leviathan et al. 2023), an unbiased estimate of 1 − TV(π_b, π_T) per position
    (1 = the teacher would have sampled like the student);
    ``teacher_logprob``: mean log π_T of the sampled tokens;
    ``outside_teacher_support``: the share of tokens the teacher gives probability 0 (log π_T = −inf: outside its
    top-k / top-p kept set, ``teacher.support=truncated``), each scored at the floor.
    """
    valid = mask > 0
    weights = valid.to(torch.float32)  # (B, T)
    total = weights.sum().clamp(min=1.0)
    floored = teacher_logprobs.detach().clamp(min=logprob_floor)  # (B, T)
    log_ratio = _log_ratio(floored, behavior_logprobs, valid)  # (B, T)
    accept = log_ratio.clamp(max=0.0, min=-MAX_LOG_RATIO).exp()  # (B, T): min(1, π_T/π_b)
    teacher = torch.where(valid, floored.to(log_ratio.dtype), torch.zeros_like(log_ratio))
    outside = (valid & torch.isneginf(teacher_logprobs)).to(torch.float32)  # (B, T)
    return {
        "reverse_kl": -(log_ratio * weights).sum() / total,
        "agreement": (accept * weights).sum() / total,
        "teacher_logprob": (teacher * weights).sum() / total,
        "outside_teacher_support": outside.sum() / total,
    }


def teacher_advantages(
    advantages: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    mask: torch.Tensor,
    distill: Distill,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``(advantages, distill_metrics)`` of rows that carry the teacher's log-probs, under the run's ``distill``
    settings (the keywords of ``distill_advantages`` as one value): with ``distill_coef`` > 0 the per-token
    advantages (B, T) of ``distill_advantages``; at 0 the group ``advantages`` unchanged and the teacher only
    measured (a run with a teacher and another objective still logs how far the student is from it)."""
    coef, mix, floor = distill.distill_coef, distill.distill_mix, distill.logprob_floor
    if coef == 0:
        return advantages, distill_metrics(behavior_logprobs, teacher_logprobs, mask, logprob_floor=floor)
    return distill_advantages(
        advantages, behavior_logprobs, teacher_logprobs, mask, distill_coef=coef, distill_mix=mix, logprob_floor=floor
    )
