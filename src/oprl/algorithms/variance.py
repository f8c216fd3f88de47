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
  in place of the group mean (``advantages.py``); the trainer computes ‖∇θ log π_θ(y_i)‖² for a whole batch in one
  forward and backward pass (``Inputs.score_statistics`` in ``oprl.trainer.inputs``). On-policy with equal
  score norms it is the group mean.

- ``squared_norms``: ‖Σ_k G_ik‖²_F per row i of one parameter's per-row gradient, given as terms ``Outer``
  (G_i = Σ_t left_it ⊗ right_it: a linear layer's Σ_t g_t a_tᵀ, an embedding's Σ_s e_{id_s} g_sᵀ) or any term
  that forms its rows' matrices. One term, the cheaper of forming G_i and the "ghost norm" identity (Li et al.
  2022, arXiv 2110.05679; Opacus' ghost clipping)

      ‖Σ_t l_t r_tᵀ‖²_F = Σ_{t,s} (l_t·l_s)(r_t·r_s)

  several Outer terms (a tied embedding and output head), Σ_{k,l} ⟨G_ik, G_il⟩ by the same identity.

Weights are handled in the log domain (a response's Π_t ρ_t overflows float32 long before it is meaningless), and
every per-token log-ratio is clamped to ±``MAX_LOG_RATIO`` as in the loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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


# ---------------------------------------------------------------------------------------------------------------
# Per-response squared score norms: a parameter's per-row gradient as a sum of terms (the trainer's batched
# pass, oprl.trainer.score_norms, builds the terms from one forward and backward pass).

MATERIALISE_FLOATS = 2**26
"""Row block of a materialised per-row gradient: at most this many floats (256 MiB) at a time."""


@dataclass
class Outer:
    """Per-row matrices G_i = Σ_t left_it ⊗ right_it, reshaped to ``shape``. ``left``/``right``: (B, n, d) float, or
    (B, n) long token ids standing for one-hot rows of width ``width`` (an embedding's vocabulary side)."""

    left: torch.Tensor
    right: torch.Tensor
    shape: torch.Size
    width: int = 0

    def dims(self) -> tuple[int, int]:
        return (
            self.width if self.left.dim() == 2 else self.left.shape[-1],
            self.width if self.right.dim() == 2 else self.right.shape[-1],
        )

    def rows(self, block: slice) -> torch.Tensor:
        """The per-row gradients of rows ``block``, ``(b, *shape)``."""
        left, right = self.left[block], self.right[block]
        d_left, d_right = self.dims()
        if left.dim() == 2:  # one-hot left side: scatter the right side's vectors into the id's row
            b, n = left.shape
            out = right.new_zeros(b * d_left, d_right)
            index = (left + torch.arange(b, device=left.device)[:, None] * d_left).reshape(-1)
            out.index_add_(0, index, right.reshape(b * n, d_right))
            return out.reshape(b, *self.shape)
        if right.dim() == 2:
            raise ValueError("Outer: only the left side may be one-hot")
        return torch.einsum("btl,btr->blr", left, right).reshape(left.shape[0], *self.shape)

    def total(self) -> torch.Tensor:
        """Σ_i G_i: the batch gradient these terms account for."""
        d_left, d_right = self.dims()
        if self.left.dim() == 2:
            out = self.right.new_zeros(d_left, d_right)
            out.index_add_(0, self.left.reshape(-1), self.right.reshape(-1, d_right))
            return out.reshape(self.shape)
        return torch.einsum("btl,btr->lr", self.left, self.right).reshape(self.shape)


def wide(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32 at least (bfloat16 activations under autocast widened; float64 kept)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def gram(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(B, n1, n2) inner products of the rows' vectors x_t·y_s; a (B, n) long side is one-hot (``Outer``)."""
    if x.dim() == 2 and y.dim() == 2:
        return (x[:, :, None] == y[:, None, :]).to(torch.float32)
    if x.dim() == 2:
        return gram(y, x).transpose(1, 2)
    if y.dim() == 2:  # e_{y_s}·x_t = x_t[y_s]
        return torch.gather(x, 2, y[:, None, :].expand(-1, x.shape[1], -1))
    return x @ y.transpose(1, 2)


def outer_inner(a: Outer, b: Outer, cache: dict | None = None) -> torch.Tensor:
    """(B,) ⟨G_i(a), G_i(b)⟩_F = Σ_{t,s} (left_t·left'_s)(right_t·right'_s), without forming either matrix.
    ``cache``: Gram matrices by the identity of their two sides (layers sharing an input share its Gram matrix;
    the caller keeps the sides alive)."""

    def cached(x, y):
        if cache is None:
            return gram(x, y)
        key = (id(x), id(y))
        if key not in cache:
            cache[key] = gram(x, y)
        return cache[key]

    return (cached(a.left, b.left) * cached(a.right, b.right)).sum(dim=(1, 2))


def ghost_is_cheaper(term: Outer) -> bool:
    """Per row: the Gram route costs n²·(d_l + d_r), the materialised one n·d_l·d_r (Opacus' rule)."""
    n = term.left.shape[1]
    d_left, d_right = term.dims()
    return term.left.dim() == 2 or n * (d_left + d_right) <= d_left * d_right


def squared_norms(terms: list, batch: int, cache: dict | None = None) -> torch.Tensor:
    """(B,) ‖Σ_k G_ik‖²_F of one parameter's per-row gradient, the sum of ``terms``: ``Outer`` terms, or any
    object with ``shape`` and ``rows(block) -> (b, *shape)`` (the rows' matrices formed; then every term is
    formed, in row blocks of at most ``MATERIALISE_FLOATS`` floats). ``cache``: see ``outer_inner``."""
    if all(isinstance(t, Outer) for t in terms) and (len(terms) > 1 or ghost_is_cheaper(terms[0])):
        out = torch.zeros(batch)
        for k, first in enumerate(terms):
            for second in terms[k:]:
                out = out + (1 if second is first else 2) * outer_inner(first, second, cache)
        return out
    numel = max(1, terms[0].shape.numel())
    size = max(1, MATERIALISE_FLOATS // numel)
    parts = []
    for start in range(0, batch, size):
        block = slice(start, min(batch, start + size))
        grads = sum(t.rows(block) for t in terms)
        parts.append(grads.reshape(grads.shape[0], -1).pow(2).sum(dim=1))
    return torch.cat(parts)


def step_size(log_weights: torch.Tensor, rule: str, base: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``(scale, metrics)`` of one optimizer step: ``ess_lr_scale`` of the mini-batch's responses' ``log_weights``
    (N,) (every rank's, ``sequence_log_ratios``), and ``vcpo/lr_scale`` and ``vcpo/ess`` to log."""
    scale, ess = ess_lr_scale(log_weights, rule, base)
    return scale, {"vcpo/lr_scale": scale, "vcpo/ess": ess}
