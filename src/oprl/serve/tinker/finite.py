"""What keeps a non-finite number away from a training model's weights: a ``forward_backward`` call adds its
gradient only when its loss and that gradient are finite, else it fails naming its datums and the gradient is the
one accumulated before it; ``optim_step`` refuses non-finite ``AdamParams`` and a non-finite accumulated gradient.
Either way the weights and the AdamW state stay bit-equal.

How a call's gradient is kept apart (``CallGradient``): the gradient accumulated by the earlier calls of the step
is moved aside (references, no copy), the call's backward passes fill fresh ``.grad`` tensors, and only a finite
call adds the accumulated ones back, in the order autograd itself accumulates (``accumulated += call``), so a
finite one-micro-batch call leaves the bits it left before.

Deliberately not here: ``forward`` (``forward_only``) answers non-finite values as they are (nothing it computes
reaches the weights, and a −inf loss is the answer the formula gives), on the protobuf wire, which carries them.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from oprl.serve.tinker.errors import UserError

CAUSE = (
    "ρ = exp(logprobs − q) overflows float32 when a behaviour log-prob q lies ~88 or more below the model's; "
    "check the logprobs loss input"
)
"""The usual cause, said with each refusal."""


class CallGradient:
    """One ``forward_backward`` call's gradient over ``params``, kept apart until ``close`` (module docstring)."""

    def __init__(self, params: list[torch.Tensor]):
        self.params = params
        self.accumulated = [p.grad for p in params]
        for p in params:
            p.grad = None

    def finite(self) -> bool:
        """Whether every element of the call's gradient is finite (the norm of a tensor holding a NaN or ±inf is
        not; one reduction per tensor)."""
        norms = [torch.linalg.vector_norm(p.grad) for p in self.params if p.grad is not None]
        return not norms or bool(torch.isfinite(torch.stack(norms).sum()))

    def close(self, keep: bool) -> None:
        """``keep``: the accumulated gradient plus the call's; else the accumulated gradient as it was."""
        for p, before in zip(self.params, self.accumulated, strict=True):
            if not keep or p.grad is None:
                p.grad = before
            elif before is not None:
                p.grad = before.add_(p.grad)


def suspect_rows(
    logprobs: torch.Tensor,
    inputs: dict[str, torch.Tensor],
    mask: torch.Tensor,
    elementwise: torch.Tensor | None,
    *,
    ratio: bool,
) -> list[int]:
    """Rows (of B) where a valid position's log-prob, elementwise loss or (``ratio``, or when there is no
    elementwise loss: a preset's is one number) ratio ρ = exp(logprobs − q) is not finite: where a non-finite
    loss or gradient comes from (a clipped loss can be finite where ρ = inf, its gradient 0·inf = NaN).
    ``logprobs``, ``mask``, each input and ``elementwise`` are (B, T)."""
    values = logprobs.detach()
    bad = ~torch.isfinite(values)
    if elementwise is not None:
        bad |= ~torch.isfinite(elementwise)
    if "logprobs" in inputs and (ratio or elementwise is None):
        bad |= ~torch.isfinite((values - inputs["logprobs"]).exp())
    return torch.nonzero((bad & mask).any(dim=1)).flatten().tolist()


def refusal(what: str, rows: list[int], value: float | None = None) -> UserError:
    """The failure of a call whose ``what`` ("loss", "gradient") is not finite, naming its datums (``data`` when
    no datum alone shows it)."""
    names = ", ".join(f"data[{i}]" for i in rows) or "data"
    shown = f" ({value})" if value is not None else ""
    return UserError(
        f"{names}: the {what} is not finite{shown}; this forward_backward added nothing to the gradient (the "
        f"weights and optimizer state are untouched). {CAUSE}"
    )


def checked_adam_params(params: dict[str, Any], defaults: dict[str, float]) -> dict[str, float]:
    """``AdamParams`` as finite floats, absent fields at ``defaults``; ``UserError`` naming a non-finite or null
    one (the SDK sends a NaN or ±inf as null)."""
    values = {}
    for key, default in defaults.items():
        value = params.get(key, default)
        if not isinstance(value, int | float) or not math.isfinite(value):
            raise UserError(f"adam_params.{key}: a finite number, got {value!r} (the SDK sends NaN and inf as null)")
        values[key] = float(value)
    return values
