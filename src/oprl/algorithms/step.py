"""The algorithm's part of one trainer step, as pure stages over tensors and an ``Algorithm`` (``spec.py``):

    step_advantages(given, method, generator, carry)           -> (GroupAdvantages, metrics, carry)  per step
    loss_terms(logprobs, entropy, advantages, given, method)   -> LossTerms                     per micro-batch
    step_scale(log_weights, method)                            -> (scale, metrics)             per optimizer update
    loss_units(mask, method): each row's part of the loss's count, the micro-batches' weights in accumulation

The trainer (``oprl.trainer.trainer``) runs them in this order around its forwards, backward, clipping and
optimizer step; what they need beyond the policy's log-probs (π_prox, score statistics, reference and teacher
log-probs) it computes once per step as ``Algorithm.needs`` asks (``oprl.trainer.inputs``). Metrics are detached
0-dim tensors under their logged names; the trainer turns them into numbers.

Not here: forward passes, gradients, the optimizer, micro-batch weights (the trainer's); the formulas (each in
its module: advantages, losses, distill, kl, variance).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from oprl.algorithms.advantages import WEIGHTED_BASELINES, GroupAdvantages, group_advantages
from oprl.algorithms.aggregation import aggregate, aggregation_count
from oprl.algorithms.algorithm import Algorithm
from oprl.algorithms.delight import kondo_gate
from oprl.algorithms.distill import teacher_advantages
from oprl.algorithms.kl import kl_penalty
from oprl.algorithms.losses import (
    BatchKeep,
    RuleInputs,
    alone,
    batch_keeps,
    effective_sample_size,
    policy_loss,
    ratio_stats,
)
from oprl.algorithms.score_centering import score_centering_tokens
from oprl.algorithms.top_k import TopKTokens
from oprl.algorithms.variance import baseline_gap, sequence_log_ratios, step_size
from oprl.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch", globals())  # imported on first use (oprl.lazy): the config needs only names


@dataclass(frozen=True)
class Carry:
    """What a method carries from one step to the next (the trainer keeps it, ``step_advantages`` renews it)."""

    kondo_window: torch.Tensor | None = None
    """(H,) the Kondo gate's recent responses' delights (None before the first gated step)."""

    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensors a checkpoint keeps (``trainer/carry.safetensors``), so a resumed run gates as the
        undisturbed one does; fields still None are left out."""
        fields = (f.name for f in dataclasses.fields(self))
        return {name: value for name in fields if (value := getattr(self, name)) is not None}

    @classmethod
    def of(cls, tensors: dict[str, torch.Tensor]) -> Carry:
        """Inverse of ``tensors``; a name this oprl does not carry (another version's checkpoint) is a ValueError,
        which ``checkpoint.files.load_carry`` reports as one line naming the file."""
        unknown = set(tensors) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown tensor(s) {sorted(unknown)}: a checkpoint of another oprl")
        return cls(**tensors)


class BatchInputs(NamedTuple):
    """What the advantages stage reads of a batch of N responses, computed by the trainer (``Algorithm.needs``)."""

    rewards: torch.Tensor
    """(N,) float."""
    group_ids: torch.Tensor
    """(N,) long."""
    lengths: torch.Tensor
    """(N,) each response's loss tokens (adaptive RED-Weight's L_i)."""
    score_statistics: tuple[torch.Tensor, torch.Tensor] | None = None
    """(log w (N,), ‖∇θ log π_θ(y_i)‖² (N,)) under the pre-update weights (``needs.score_statistics``)."""
    screen: tuple[torch.Tensor, torch.Tensor] | None = None
    """(log-probs (N, T) under the pre-update weights, loss mask (N, T)) (``needs.screen``)."""


class TokenInputs(NamedTuple):
    """A micro-batch's per-token inputs besides the policy's own log-probs, (B, T) each, computed by the trainer."""

    behavior_logprobs: torch.Tensor
    """Recorded by the sampler."""
    mask: torch.Tensor
    """The tokens the loss covers (0 on padding, environment and stale-masked tokens)."""
    proximal_logprobs: torch.Tensor | None = None
    """π_prox (``needs.proximal``)."""
    ref_logprobs: torch.Tensor | None = None
    """The reference policy's (``needs.reference``)."""
    teacher_logprobs: torch.Tensor | None = None
    """The teacher's, where every row carries them."""
    top_k: TopKTokens | None = None
    """(B, T, K) the sampler's top-K and the policy's log-probs of those ids from this forward, with grad
    (``needs.top_k``: score centering, DPPO's Top-K masks)."""


class LossTerms(NamedTuple):
    """One micro-batch's loss and what it logs."""

    loss: torch.Tensor
    """0-dim, with grad: the policy loss (+ KL penalty − entropy bonus), in the loss's own aggregation."""
    metrics: dict[str, torch.Tensor]
    """Detached 0-dim tensors: ``loss/*``, ``distill/*``, ``entropy/mean``, ``kl/*``, ``rho/*``."""
    log_weights: torch.Tensor
    """(b,) log w_i = Σ_t log ρ_it of the rows with a valid token (``sequence_log_ratios``): the step size's input."""


def step_advantages(
    given: BatchInputs, method: Algorithm, *, generator: torch.Generator | None = None, carry: Carry = Carry()
) -> tuple[GroupAdvantages, dict[str, torch.Tensor], Carry]:
    """The step's advantages of ``given.rewards`` (N,) in the groups of ``given.group_ids`` (N,), their metrics, and
    the ``carry`` for the next step.

    With ``given.score_statistics``: the weights of a baseline that reads them (``WEIGHTED_BASELINES``: VCPO's
    off-policy optimal u_i = w_i²·‖∇ log π‖², ``variance``), logged as ``vcpo/score_norm_mean`` and
    ``vcpo/baseline_gap``. With ``given.screen``: the Kondo gate zeroes the
    advantages of the responses it does not pass (``delight.kondo_gate``; ``kondo/*``), drawing from ``generator``
    after the advantages' own draws. Adaptive RED-Weight reads ``given.lengths`` (``adv/red_weight_*``)."""
    rewards, group_ids, lengths, score_statistics, screen = given
    log_weights, metrics = None, {}
    if score_statistics is not None:
        log_ratios, score_sq_norms = score_statistics
        log_weights = WEIGHTED_BASELINES[method.advantages.baseline](log_ratios, score_sq_norms)  # (N,)
        metrics["vcpo/score_norm_mean"] = score_sq_norms.sqrt().mean()
    adv = group_advantages(
        rewards,
        group_ids,
        generator=generator,
        log_weights=log_weights,
        response_lengths=lengths,
        **method.advantages.keywords(),
    )
    if log_weights is not None:  # how far the weighted baseline moved from the group mean, in reward units
        metrics["vcpo/baseline_gap"] = baseline_gap(rewards, group_ids, adv.baseline)
    gate = method.gate
    if screen is not None and gate.kondo_rate is not None:  # rows the gate skips train with A = 0
        logprobs, mask = screen
        window = carry.kondo_window if carry.kondo_window is not None else torch.zeros(0)
        gated = kondo_gate(
            adv.advantages,
            logprobs,
            mask,
            window,
            rate=gate.kondo_rate,
            temperature=gate.kondo_temperature,
            window_size=gate.kondo_window,
            generator=generator,
        )
        adv, carry = dataclasses.replace(adv, advantages=gated.advantages), Carry(kondo_window=gated.window)
        metrics |= {f"kondo/{key}": value for key, value in gated.metrics.items()}
    return adv, metrics | {f"adv/{key}": value for key, value in adv.metrics.items()}, carry


def loss_terms(
    logprobs: torch.Tensor,
    entropy: torch.Tensor,
    advantages: torch.Tensor,
    given: TokenInputs,
    method: Algorithm,
    *,
    batch_keep: BatchKeep | None = None,
) -> LossTerms:
    """One micro-batch's loss terms: the teacher's advantage (rows that carry ``teacher_logprobs``), the policy
    loss, the entropy bonus, the KL penalty (where ``ref_logprobs`` are given), with the behaviour diagnostics.

    Inputs: ``logprobs`` (B, T) and ``entropy`` (B, T) of the policy being trained, with grad; ``advantages`` (B,)
    the group advantages; ``given``: the sampler's log-probs, the loss's token mask and the optional (B, T) inputs.
      A     = teacher_advantages(A, π_b, π_T)                      (distill.py; A unchanged at distill_coef 0)
      loss  = policy_loss(logprobs, π_b, A, mask, method.loss, proximal_logprobs)
              + aggregate(score_centering_tokens(top_k, A))         (score_centering; top_k.py's inputs)
              − entropy_coef·aggregate(entropy) + kl_coef·aggregate(k(logprobs, ref_logprobs))
    every aggregate in the loss's aggregation, so micro-batch shares weight them like the policy term. With
    ``given.top_k`` the loss's masks see it too (``LossParams.top_k``: DPPO's Top-K divergence). ``batch_keep``:
    this micro-batch's rows of a batch rule's mask over its whole mini-batch (``batch_rule_keeps``)."""
    behavior_logprobs, mask, proximal_logprobs, ref_logprobs, _, top_k = given
    advantages, metrics = _token_advantages(advantages, given, method)  # (B,) or (B, T)
    params = method.loss
    if top_k is not None:  # the masks on the sampler's top-K read it (numbers only)
        params = dataclasses.replace(params, top_k=top_k.detached())
    band = entropy.detach() if params.entropy_eps is not None else None  # ASPO's entropy-dependent band
    loss, policy = policy_loss(logprobs, behavior_logprobs, advantages, mask, params,
                               proximal_logprobs=proximal_logprobs, entropy=band, batch_keep=batch_keep)  # fmt: skip
    metrics |= {f"loss/{key}": value for key, value in policy.items()}
    if params.score_centering:
        if top_k is None:
            raise ValueError("score_centering reads the sampler's top-K: the rows carry none (rollout.record_top_k=0)")
        centering, centered = score_centering_tokens(top_k, advantages, mask, weight=params.weight,
                                                     is_cap=params.is_cap)  # fmt: skip
        centering = aggregate(centering, mask, params.loss_agg, params.normalizer)
        loss = loss + centering
        metrics |= {"loss/score_centering": centering.detach()} | {f"loss/{k}": v for k, v in centered.items()}
    metrics |= behavior_metrics(logprobs.detach(), entropy.detach(), behavior_logprobs, mask)
    if method.entropy.entropy_coef > 0:
        loss = loss - method.entropy.entropy_coef * aggregate(entropy, mask, params.loss_agg, params.normalizer)
    if ref_logprobs is not None:
        reference = method.reference
        kl_tokens = kl_penalty(logprobs, ref_logprobs.to(logprobs.device), reference.kl_estimator, mask)  # (B, T)
        kl = aggregate(kl_tokens, mask, params.loss_agg, params.normalizer)
        if reference.kl_coef > 0:
            loss = loss + reference.kl_coef * kl
        metrics["kl/ref"] = kl.detach()
    metrics["loss/total"] = loss.detach()
    log_weights = sequence_log_ratios(logprobs, behavior_logprobs, mask)[mask.any(dim=-1)]  # (b,)
    return LossTerms(loss, metrics, log_weights)


def _token_advantages(
    advantages: torch.Tensor, given: TokenInputs, method: Algorithm
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss's advantages: ``advantages`` (B,), plus the teacher's term where ``given`` carries its log-probs
    (``teacher_advantages``: (B, T)), and the ``distill/*`` metrics."""
    if given.teacher_logprobs is None:
        return advantages, {}
    behavior = given.behavior_logprobs
    advantages, distilled = teacher_advantages(
        advantages, behavior, given.teacher_logprobs.to(behavior.device), given.mask, method.distill
    )
    return advantages, {f"distill/{key}": value for key, value in distilled.items()}


def batch_rule_keeps(
    micro_batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, TokenInputs]],
    method: Algorithm,
    *,
    positions: Sequence[int] | None = None,
    gather: Callable[[Any], list[Any]] = alone,
) -> list[BatchKeep]:
    """The mask of a batch rule (``method.needs.batch_rule``: M2PO, BAPO) over a whole mini-batch, one
    ``BatchKeep`` per micro-batch for ``loss_terms(batch_keep=...)``: ``micro_batches`` are each micro-batch's
    ``(logprobs (B, T), entropy (B, T), advantages (B,), given)`` as ``loss_terms`` receives them (the trainer's
    forward without grad: the weights do not change between the micro-batches of an update), in the mini-batch's
    row order. The statistic (M2PO's cut on (log ρ)², its clip bounds, BAPO's bounds) is then the mini-batch's
    whatever ``optim.micro_batch_size`` is (``losses.batch_keeps``). Under data parallelism the micro-batches are
    this rank's, ``positions`` their rows' places in the mini-batch and ``gather`` the runtime's all-gather: the
    statistic is then the whole mini-batch's over every rank (``losses.batch_keeps``)."""
    parts = []
    for logprobs, entropy, advantages, given in micro_batches:
        advantages, _ = _token_advantages(advantages, given, method)
        parts.append(RuleInputs(logprobs, given.behavior_logprobs, advantages, given.mask, given.proximal_logprobs,
                                entropy))  # fmt: skip
    return batch_keeps(parts, method.loss, positions=positions, gather=gather)


def behavior_metrics(
    logprobs: torch.Tensor, entropy: torch.Tensor, behavior_logprobs: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Token means over ``mask`` (B, T) of the policy's entropy and of ρ = π_θ/π_behaviour whatever the loss uses
    (sampler mismatch, ``rollout.dtype``, and staleness, every step): ``entropy/mean``, ``kl/behavior_k3``,
    ``rho/behavior_*``, ``rho/ess`` and ``rho/ess_seq``; inputs (B, T), detached."""
    out = {"entropy/mean": aggregate(entropy, mask, "token-mean")}
    out["kl/behavior_k3"] = aggregate(kl_penalty(logprobs, behavior_logprobs, "k3", mask), mask, "token-mean")
    out |= {f"rho/behavior_{key}": value for key, value in ratio_stats(logprobs, behavior_logprobs, mask).items()}
    ess = effective_sample_size(logprobs, behavior_logprobs, mask)  # per micro-batch, averaged like the rest
    return out | {"rho/ess": ess["token"], "rho/ess_seq": ess["sequence"]}


def loss_units(mask: torch.Tensor, method: Algorithm) -> torch.Tensor:
    """(B,) each row's part of the loss's denominator over ``mask`` (B, T) (``aggregation_count`` row by row: its
    tokens for token-mean, else 1 if it has any): a micro-batch's share of the sum over its mini-batch is its exact
    weight in gradient accumulation, whichever rank holds its rows."""
    agg = method.loss.loss_agg
    return torch.stack([aggregation_count(row[None], agg) for row in mask]) if len(mask) else torch.zeros(0)


def step_scale(log_weights: torch.Tensor, method: Algorithm) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``(scale, metrics)`` of one optimizer update from the mini-batch's responses' ``log_weights`` (N,), every
    rank's (``LossTerms.log_weights``), asked for when ``method.needs.log_weights``: the learning rate of that
    update is lr·scale (``variance.step_size``, VCPO)."""
    return step_size(log_weights, method.step_size.ess_lr, method.step_size.ess_lr_base)
