"""The learning-rate schedule (``optim.lr_schedule``, ``optim.warmup_steps`` / ``optim.warmup_ratio``): the rate of
every optimizer update as a pure function of its position, the formulas of transformers' ``get_scheduler`` (TRL's
``lr_scheduler_type`` ``constant_with_warmup``, ``linear``, ``cosine``), so a TRL user's schedule means the same.

Position ``t`` counts update slots from 0: trainer step ``s`` (from 0) holds ``U = optim.epochs * optim.mini_batches``
slots, ``t = s * U + slot``; a slot advances ``t`` whether its update ran, was skipped (non-finite) or had no rows,
so the rate is a function of (step, slot) alone and a resumed run meets the same rates. With ``T = steps * U`` slots
in the run and ``W`` warmup slots (``warmup_steps * U``, or ``ceil(warmup_ratio * T)`` as transformers'
``get_warmup_steps``), the rate is ``optim.lr * factor(t)``:

    factor(t) = t / W                                       t < W   (linear warmup from 0; t = 0 runs at rate 0,
                                                                     as transformers' first warmup update)
                1                                           constant
                max(0, (T - t) / max(1, T - W))             linear  (to 0 at t = T)
                max(0, (1 + cos(pi (t - W) / max(1, T - W))) / 2)   cosine (half a cycle, to 0 at t = T)

It is pure arithmetic on numbers (stdlib only), so it sits with the algorithms' math, where the trainer and the
TRL / verl integrations (``grpo_schedule``, ``verl_schedule``) both may import it. Deliberately not here: the
step-size rules (``algorithm.ess_lr``: ``oprl.algorithms.step.step_scale``) multiply the
scheduled rate for one update; the warm start keeps its own constant rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

KINDS = ("constant", "linear", "cosine")


@dataclass(frozen=True)
class LrSchedule:
    """The schedule of one run in update slots (see the module docstring); the default is the constant rate."""

    kind: str = "constant"
    warmup: int = 0
    """W: warmup slots."""
    total: int = 1
    """T: the run's slots (``steps * epochs * mini_batches``)."""

    @classmethod
    def of(cls, optim, steps: int) -> LrSchedule:
        """The schedule of ``optim`` (an ``OptimConfig``: ``lr_schedule``, ``warmup_steps`` | ``warmup_ratio``,
        ``epochs``, ``mini_batches``) over a run of ``steps`` trainer steps."""
        per_step = optim.epochs * optim.mini_batches
        total = max(1, steps * per_step)
        return cls(optim.lr_schedule, warmup_slots(optim.warmup_steps, optim.warmup_ratio, total, per_step), total)

    def factor(self, t: int) -> float:
        """The rate at slot ``t`` as a fraction of ``optim.lr``."""
        if t < self.warmup:
            return t / max(1, self.warmup)
        if self.kind == "constant":
            return 1.0
        span = max(1, self.total - self.warmup)
        if self.kind == "linear":
            return max(0.0, (self.total - t) / span)
        if self.kind == "cosine":
            return max(0.0, 0.5 * (1.0 + math.cos(math.pi * (t - self.warmup) / span)))
        raise ValueError(f"lr_schedule {self.kind!r}: one of {', '.join(KINDS)}")

    def describe(self) -> str:
        """``cosine, warmup 10 of 300 updates``: what the run's rate does, in one phrase."""
        warmup = f", warmup {self.warmup} of {self.total} updates" if self.warmup else ""
        return f"{self.kind}{warmup}"


def warmup_slots(warmup_steps: int | None, warmup_ratio: float | None, total: int, per_step: int = 1) -> int:
    """W: ``warmup_steps`` trainer steps of ``per_step`` slots each, or ``ceil(warmup_ratio * total)`` slots
    (transformers' rounding), or 0."""
    if warmup_steps is not None and warmup_ratio is not None:
        raise ValueError("optim.warmup_steps and optim.warmup_ratio: give one of them, not both")
    if warmup_steps is not None:
        return warmup_steps * per_step
    if warmup_ratio is not None:
        return math.ceil(total * warmup_ratio)
    return 0
