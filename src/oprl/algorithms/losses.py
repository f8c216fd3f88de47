"""The token-level policy loss of the REINFORCE / GRPO / REC / RED family (docs/paper.md#losses).

Per token: ℓ = −M·w·A·logprobs + regulariser, aggregated over valid tokens by ``aggregate``. The mask M
(clip_mode), the weight w, the regulariser and the aggregation are each looked up by name in a literal
registry below; presets (``oprl.algorithms.presets``) are named combinations of them. The objective is a
registry too: ``policy-gradient`` is the line above, ``advantage-regression`` OAPL's squared residual. The
masks, weights and objective of the methods published after the paper (DPPO, M2PO, BAPO, ASPO, TOPR, SAPO,
OAPL) live in ``corrections.py`` and are listed here.

ρ = exp(logprobs − behavior_logprobs) is computed from the *recorded* behaviour log-probs and detached, so
ρ only selects tokens (M) and scales them (w); the gradient always flows through ``logprobs``. With w = ρ
and the one-side mask this is PPO-clip's gradient exactly, since ∇(ρA) = ρ·A·∇logprobs.

Not here: advantages (``advantages.py``), KL to a reference model (``kl.py``), and anything
about which tokens are valid (the caller's mask).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple

from oprl.algorithms import corrections, delight, topk_divergence
from oprl.algorithms.aggregation import aggregate
from oprl.algorithms.registry import lookup
from oprl.algorithms.spec import LossParams, knob_names
from oprl.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch", globals())  # imported on first use (oprl.lazy): the config needs only names

MAX_LOG_RATIO = 20.0
"""|log ρ| is clamped here before exp: stale or padded tokens can carry log-ratios in the hundreds, whose
exp is inf, and inf·0 = NaN would poison the masked sums. e^20 ≈ 4.9e8 still selects and scales exactly
as intended for any ratio a clip band can care about."""

RATIO_RANGE = (0.5, 2.0)
"""``ratio_outside_frac`` counts valid tokens whose ρ lies outside this range (a staleness gauge)."""

MISMATCH_BAND = (0.8, 1.25)
"""``ratio_stats``' default band: a token whose ρ leaves it differs by more than 25% (either way) between the
trainer and the sampler, which a bf16 sampler already produces on-policy (1.25 = 1/0.8, symmetric in log ρ)."""


PLAIN = LossParams()
"""``policy_loss``'s default settings: plain group-relative REINFORCE (M = 1, w = 1, token mean)."""

SETTING_FIELDS: tuple[str, ...] = knob_names(LossParams)
"""The ``LossParams`` fields that are algorithm knobs (``algorithm.<name>``, declared in ``spec.py``); normalizer
and the call's tensors are filled in by the trainer and by ``policy_loss``."""


def _in_band(ratio, params):
    return (ratio >= 1 - params.eps_low) & (ratio <= 1 + params.eps_high)


def _keep_all(ratio, advantages, params):
    return torch.ones_like(ratio, dtype=torch.bool)


def _one_side(ratio, advantages, params):
    # Exactly the tokens where −min(ρA, clip(ρ)A) has a gradient.
    pushes_up_room = (advantages >= 0) & (ratio <= 1 + params.eps_high)
    pushes_down_room = (advantages <= 0) & (ratio >= 1 - params.eps_low)
    return pushes_up_room | pushes_down_room


def _two_side(ratio, advantages, params):
    return _in_band(ratio, params)


def _ring(ratio, advantages, params):
    # Far outside the band, a token whose update moves ρ back towards 1 is kept again.
    rare_good = (advantages >= 0) & (ratio <= 1 - params.eps_low_prime)
    common_bad = (advantages <= 0) & (ratio >= 1 + params.eps_high_prime)
    return _in_band(ratio, params) | rare_good | common_bad


def _reject_outside(ratio, advantages, params):
    # Both sides, whatever the sign of A: a token (or, with ratio_level=sequence, a whole response) whose ρ
    # left the band is treated as not drawn from a distribution the trainer can correct for.
    return (ratio >= params.mask_low) & (ratio <= params.mask_high)


CLIP_MODES: dict[str, Callable] = {
    "none": _keep_all,  # plain REINFORCE: M = 1
    "one-side": _one_side,  # REC-OneSide = PPO/GRPO's clip (Schulman et al. 2017; Yao et al. 2025)
    "two-side": _two_side,  # REC-TwoSide: only tokens inside the band (Yao et al. 2025)
    "ring": _ring,  # REC-Ring: band plus the far "corrective" regions (Yao et al. 2025)
    "mask": _reject_outside,  # masked IS / rejection: mask_low ≤ ρ ≤ mask_high (IcePop; verl's rollout_rs)
    # DPPO (arXiv 2602.04879): the harmful side of |π − μ| (binary TV) or of the binary KL ≤ eps_low/eps_high
    "dppo-tv": corrections._dppo_binary_tv,
    "dppo-kl": corrections._dppo_binary_kl,
    # DPPO's Top-K divergence: TV / KL(μ‖π) on the sampler's top-K ∪ {y} plus the rest as one bucket (needs top-K)
    **topk_divergence.TOP_K_MASKS,
    "m2-mask": corrections._m2_mask,  # M2PO (arXiv 2510.01161), paper: drop harmful tokens, largest (log ρ)², to M̂₂ ≤ τ
    "m2-mask-areal": corrections._m2_mask_all,  # M2PO as AReaL does it: any token, largest first, to M̂₂ < τ
    "m2-clip": corrections._m2_clip,  # M2PO, the authors' code: one-side bounds from τ_M2 over harmful tokens
    "bapo": corrections._bapo,  # BAPO (arXiv 2510.18927): one-side bounds widened until positives weigh ρ₀
}

BATCH_RULES: frozenset[str] = frozenset({"m2-mask", "m2-mask-areal", "m2-clip", "bapo"})
"""The clip modes whose mask reads a statistic of the whole batch (M2PO's second moment, BAPO's bounds): where a
mini-batch spans several micro-batches or data-parallel ranks the trainer computes their mask once over it
(``batch_keeps``; ``Needs.batch_rule``), so the result depends on neither ``optim.micro_batch_size`` nor
``trainer.world_size``."""


def _unit_weight(ratio, advantages, params):
    return torch.ones_like(ratio)


def _importance_weight(ratio, advantages, params):
    return ratio


def _truncated_importance_weight(ratio, advantages, params):
    return ratio.clamp(max=params.is_cap)


def _clipped_importance_weight(ratio, advantages, params):
    return ratio.clamp(1 - params.eps_low, 1 + params.eps_high)


def _advantage_weight(ratio, advantages, params):
    return torch.exp(advantages / params.weight_temperature)


WEIGHTS: dict[str, Callable] = {
    "none": _unit_weight,  # "NoIS": the group-relative REINFORCE gradient as derived (docs/paper.md#derivation)
    "importance-sampling": _importance_weight,  # "IS": w = ρ (detached), GRPO/PPO's surrogate gradient
    "truncated-is": _truncated_importance_weight,  # TIS: w = min(ρ, C) (Yao et al. 2025, "Your efficient RL
    # framework secretly brings you off-policy RL training"; verl rollout_is, TRL vllm_importance_sampling_cap)
    "clipped-is": _clipped_importance_weight,  # CISPO: w = clip(ρ, 1 − ε_low, 1 + ε_high) (MiniMax-M1, 2025)
    "advantage": _advantage_weight,  # RED-Weight: w = exp(A/T) up-weights better responses
    "flipped-is": corrections._flipped_importance_weight,  # ASPO: min(1/ρ, C) if A > 0, min(ρ, C) else
    "tapered": corrections._tapered_importance_weight,  # TOPR: 1 if A > 0, min(ρ, 1) else
    "soft-gate": corrections._soft_gate_weight,  # SAPO: 4σ(1 − σ)·ρ, σ = sigmoid(τ±(ρ − 1))
    "gamma": corrections._gamma_weight,  # VESPO: e^λ·w^k·e^(−λw) of the response's ratio, (k, λ) by sign of A
}


def _token_log_ratio(log_ratio, mask):
    return log_ratio


def _sequence_log_ratio(log_ratio, mask):
    # log of the geometric mean of the response's token ratios, broadcast to its tokens (GSPO's s_i).
    per_seq = (log_ratio * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)  # (B,)
    return per_seq[:, None].expand_as(log_ratio)


RATIO_LEVELS: dict[str, Callable] = {
    "token": _token_log_ratio,  # ρ_t = π_θ(y_t)/π_b(y_t)
    "sequence": _sequence_log_ratio,  # ρ_i = (Π_t ρ_t)^(1/|y_i|) for every token of response i (GSPO)
    "sequence-sum": corrections.sequence_sum_log_ratio,  # ρ_i = Π_t ρ_t, the whole response's ratio (TOPR)
}


def _no_regularizer(logprobs, behavior_logprobs, coef):
    return torch.zeros_like(logprobs)


def _squared_log_ratio(logprobs, behavior_logprobs, coef):
    return coef * (logprobs - behavior_logprobs).square()


def _forward_kl(logprobs, behavior_logprobs, coef):
    return -coef * logprobs


REGULARIZERS: dict[str, Callable] = {
    "none": _no_regularizer,
    "squared-log-ratio": _squared_log_ratio,  # OPMD: + c·(logprobs − behavior_logprobs)², a pull towards π_b
    "forward-kl": _forward_kl,  # AsymRE: − c·logprobs, the same gradient as lowering the baseline by c
}


def _policy_gradient(logprobs, anchor_logprobs, advantages, mask, keep, weights, params):
    return -keep.to(logprobs.dtype) * weights * advantages * logprobs, {}  # (B, T)


def _advantage_regression(logprobs, anchor_logprobs, advantages, mask, keep, weights, params):
    return corrections.advantage_regression(logprobs, anchor_logprobs, advantages, mask, params)


OBJECTIVES: dict[str, Callable] = {
    "policy-gradient": _policy_gradient,  # −M·w·A·logprobs: every method above
    "advantage-regression": _advantage_regression,  # OAPL: (β·Σ_t log(π/π_b) − A)² per response; M, w unused
}
"""``(logprobs, anchor_logprobs, advantages, mask, keep, weights, params) -> ((B, T) values, metrics)``; the
values keep the gradient of ``logprobs`` and go through ``aggregate`` like the policy-gradient tokens."""


def policy_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    params: LossParams = PLAIN,
    *,
    proximal_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    batch_keep: BatchKeep | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The REINFORCE-family loss and its diagnostics.

    Inputs: ``logprobs`` (B, T) with grad; ``behavior_logprobs`` (B, T) recorded by the sampler;
    ``advantages`` (B,), broadcast over T, or (B, T) per token (distillation, ``distill_advantages``);
    ``mask`` (B, T) bool or float, 0 on prompt/padding (values of every input there are ignored, even ±inf or
    NaN: the loss does not depend on them and their gradient is 0); ``proximal_logprobs`` (B, T), optional: the
    trainer's log-probs under the pre-update weights (decoupled PPO); ``entropy`` (B, T), detached, needed only
    with ``entropy_eps`` (ASPO's entropy-dependent band). With the anchor a = π_prox if given, else π_b, and
    ρ = exp(clamp(logprobs − a, ±20)) detached (``ratio_level``: per token, or each response's geometric mean
    or product on all its tokens; ``_TokenView``):
      ℓ_bt = −M_bt·w_bt·v_bt·A_b·logprobs_bt + R_bt,   v = min(π_prox/π_b, C) with a proximal, else 1
      M (clip_mode): none 1 | one-side (A≥0 ∧ ρ≤1+ε_h) ∨ (A≤0 ∧ ρ≥1−ε_l) | two-side 1−ε_l ≤ ρ ≤ 1+ε_h |
                     ring two-side ∨ (A≥0 ∧ ρ≤1−ε'_l) ∨ (A≤0 ∧ ρ≥1+ε'_h) | mask mask_low ≤ ρ ≤ mask_high
      w (weight):    none 1 | importance-sampling ρ | truncated-is min(ρ, C) (C = is_cap) |
                     clipped-is clip(ρ, 1−ε_l, 1+ε_h) | advantage exp(A/weight_temperature)
      R (regularizer, on every valid token whatever M): none 0 | squared-log-ratio c·(logprobs − π_b)² |
                     forward-kl −c·logprobs
    The methods after the paper (``corrections.py``, docs/algorithms.md#the-arena-methods): M dppo-tv, dppo-kl,
    m2-mask, m2-clip, bapo; w flipped-is, tapered, soft-gate, gamma; objective advantage-regression replaces
    −M·w·A·logprobs by OAPL's (β·Σ_t log(π/a) − A)² per response. Options of any mask: ``entropy_eps`` (the band
    of the tokens above their response's entropy quantile), ``dual_clip`` c (also masks A < 0 ∧ ρ > c); of any
    weight: ``delight_temperature`` η (times DG's gate σ(A·(−logprobs)/η), ``_token_weights``). Every setting is a
    field of ``params`` (``LossParams``). loss = aggregate(ℓ, mask, loss_agg, normalizer), a 0-dim tensor;
    metrics: detached 0-dim tensors over valid tokens (``_metrics``) plus what a rule reports (M2PO's M̂₂, ...).
    ``batch_keep``: these rows' part of a batch rule's mask computed over a whole mini-batch (``batch_keeps``),
    used as M instead of the rule's mask over these rows alone (its metrics are the mini-batch's).
    """
    keep_fn, weight_fn, level_fn, regularizer_fn, objective_fn = _rules(params)
    view = _TokenView.of(logprobs, behavior_logprobs, advantages, mask, proximal_logprobs, level_fn)
    params = replace(params, mask=view.mask, logprobs=view.current, anchor_logprobs=view.anchor)  # the rules' view
    params, band_metrics = corrections.entropy_band(entropy, params)  # per-token ε: ASPO's code (or unchanged)

    if batch_keep is None:
        keep, keep_metrics = _with_metrics(keep_fn(view.ratio, view.advantages, params))  # (B, T) bool
    else:  # a batch rule's mask over the whole mini-batch, at these rows
        keep, keep_metrics = batch_keep
    keep, dual_metrics = corrections.dual_clip(keep, view.ratio, view.advantages, params)  # dual-clip PPO (or not)
    weights, weight_metrics = _token_weights(weight_fn, view, params, proximal=proximal_logprobs is not None)
    pg_tokens, objective_metrics = objective_fn(
        view.logprobs, view.anchor, view.advantages, view.mask, keep, weights, params
    )  # (B, T)
    reg_tokens = regularizer_fn(view.logprobs, view.behavior, params.regularizer_coef)  # (B, T)

    pg_loss = aggregate(pg_tokens, view.mask, params.loss_agg, params.normalizer)  # ()
    reg_loss = aggregate(reg_tokens, view.mask, params.loss_agg, params.normalizer)  # ()
    metrics = _metrics(view.ratio, keep, weights, view.mask, pg_loss, reg_loss)
    rules = {**band_metrics, **keep_metrics, **dual_metrics, **weight_metrics, **objective_metrics}
    return pg_loss + reg_loss, metrics | {key: value.detach() for key, value in rules.items()}


def _rules(params: LossParams) -> tuple[Callable, Callable, Callable, Callable, Callable]:
    """The functions ``params`` names: its mask, weight, ratio level, regulariser and objective (a bad name: a
    ``ValueError`` listing the valid ones)."""
    return (
        lookup(CLIP_MODES, params.clip_mode, "clip_mode"),
        lookup(WEIGHTS, params.weight, "weight"),
        lookup(RATIO_LEVELS, params.ratio_level, "ratio_level"),
        lookup(REGULARIZERS, params.regularizer, "regularizer"),
        lookup(OBJECTIVES, params.objective, "objective"),
    )


def _no_grad(function):
    """``@torch.no_grad()``, entered when ``function`` is called (``torch`` is bound lazily, so the decorator
    cannot touch it when this module is imported)."""

    @functools.wraps(function)
    def without_grad(*args, **kwargs):
        with torch.no_grad():
            return function(*args, **kwargs)

    return without_grad


class RuleInputs(NamedTuple):
    """One micro-batch's inputs of ``policy_loss``, as a batch rule reads them (``batch_keeps``), (B, T) each."""

    logprobs: torch.Tensor
    behavior_logprobs: torch.Tensor
    advantages: torch.Tensor
    """(B,) or (B, T)."""
    mask: torch.Tensor
    proximal_logprobs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    """Read only with ``entropy_eps``."""


class BatchKeep(NamedTuple):
    """A micro-batch's rows of a batch rule's mask over the whole mini-batch (``policy_loss(batch_keep=...)``)."""

    keep: torch.Tensor
    """(B, T) bool, the micro-batch's shape."""
    metrics: dict[str, torch.Tensor]
    """What the rule reports, over the mini-batch (the same for each of its micro-batches)."""


def alone(payload: Any) -> list[Any]:
    """``batch_keeps``' default gather: one process holds the whole mini-batch, so "every rank's payload" is its
    own."""
    return [payload]


@_no_grad
def batch_keeps(
    parts: list[RuleInputs],
    params: LossParams,
    *,
    positions: Sequence[int] | None = None,
    gather: Callable[[Any], list[Any]] = alone,
) -> list[BatchKeep]:
    """The mask M of ``params.clip_mode`` computed once over the rows of all ``parts`` (a mini-batch's
    micro-batches, in its row order), cut back into each part's rows: ``BatchKeep`` (B_i, T_i) per part.

    The parts are right-padded to the widest (padding is masked out, and ``policy_loss`` ignores masked values),
    concatenated row after row and read through the same ``_TokenView``, ASPO band and rule as one
    ``policy_loss`` call over the whole mini-batch; so every token's M is the one that call gives, ties in the
    rule's ranking broken the same way (the order of (row, token) does not depend on the padded width), and the
    loss and gradient accumulated over the parts with their exact shares equal that call's whatever the split.

    Data parallelism: the parts are this rank's rows of the mini-batch; ``positions`` (n,) says where each of
    them (the parts' rows in order) sits in the mini-batch (default 0..n-1), and ``gather(payload)`` returns every
    rank's payload in rank order (``torch.distributed.all_gather_object``, injected by the runtime: this module
    stays pure tensor math; the default ``alone`` is one process). The rule then runs on every rank over all
    ranks' rows put back in the mini-batch's order (``_gathered``), so M, the bounds and the rule's metrics are
    the one-process ones whatever the ranks and micro-batches, and each rank keeps its own rows. Every rank
    calls ``gather`` exactly once, a rank without rows of this mini-batch too (``parts`` empty: it sends none
    and gets ``[]``)."""
    keep_fn, level_fn = (
        lookup(CLIP_MODES, params.clip_mode, "clip_mode"),
        lookup(RATIO_LEVELS, params.ratio_level, "ratio_level"),
    )

    def joined(values: list[torch.Tensor | None], width: int) -> torch.Tensor | None:
        present = [value for value in values if value is not None]
        if len(present) < len(values) or not present:
            return None
        padded = [torch.nn.functional.pad(value, (0, width - value.shape[1])) for value in present]
        return torch.cat(padded)  # (N, width)

    def per_token(part: RuleInputs) -> torch.Tensor:
        advantages = part.advantages.detach()
        return advantages[:, None].expand_as(part.logprobs) if advantages.dim() == 1 else advantages

    inputs: dict[str, torch.Tensor] = {}
    if parts:
        width = max(part.logprobs.shape[1] for part in parts)
        dtype = parts[0].logprobs.dtype
        fields: dict[str, list[torch.Tensor | None]] = {
            "logprobs": [part.logprobs.detach() for part in parts],
            "behavior": [part.behavior_logprobs.to(dtype) for part in parts],
            "advantages": [per_token(part) for part in parts],
            "mask": [part.mask.to(dtype) for part in parts],
            "proximal": [part.proximal_logprobs for part in parts],
            "entropy": [part.entropy for part in parts] if params.entropy_eps is not None else [None],
        }
        inputs = {name: value for name, values in fields.items() if (value := joined(values, width)) is not None}
    mine = list(range(sum(part.logprobs.shape[0] for part in parts))) if positions is None else list(positions)
    if gather is not alone:  # every rank's rows of the mini-batch, in its row order
        inputs, own = _gathered(gather, mine, inputs)
    else:
        own = None
    if not parts:  # a data-parallel rank without rows of this mini-batch (it joined the gather above)
        return []
    view = _TokenView.of(inputs["logprobs"], inputs["behavior"], inputs["advantages"], inputs["mask"],
                         inputs.get("proximal"), level_fn)  # fmt: skip
    rule_params = replace(params, mask=view.mask, logprobs=view.current, anchor_logprobs=view.anchor)
    rule_params, _ = corrections.entropy_band(inputs.get("entropy"), rule_params)
    keep, metrics = _with_metrics(keep_fn(view.ratio, view.advantages, rule_params))  # (N, width)
    metrics = {key: value.detach() for key, value in metrics.items()}
    if own is not None:
        keep = keep[own]  # (n, width): this rank's rows, in its parts' order
    out, start = [], 0
    for part in parts:
        rows, columns = part.logprobs.shape
        out.append(BatchKeep(keep[start : start + rows, :columns], metrics))
        start += rows
    return out


def _gathered(
    gather: Callable[[Any], list[Any]], positions: list[int], inputs: dict[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """``(inputs of the whole mini-batch, own)``: every rank's ``(positions, inputs)`` through ``gather`` (on the
    CPU: the payload is pickled), rows padded to the widest rank's and sorted by their position in the mini-batch,
    so the tensors are the ones one process would join (N, W); ``own`` (n,): this rank's rows among them."""
    device = next(iter(inputs.values())).device if inputs else torch.device("cpu")
    everyone = gather((positions, {name: value.cpu() for name, value in inputs.items()}))
    held = [(rank_positions, tensors) for rank_positions, tensors in everyone if rank_positions]
    if not held:  # no rank holds a row (the trainer never asks then)
        return {}, torch.zeros(0, dtype=torch.long)
    every_position = torch.tensor([p for rank_positions, _ in held for p in rank_positions])  # (N,) rank order
    order = every_position.argsort()  # positions are distinct: the mini-batch's row order
    width = max(tensors["logprobs"].shape[1] for _, tensors in held)

    def padded(name: str) -> torch.Tensor:
        return torch.cat([torch.nn.functional.pad(t[name], (0, width - t[name].shape[1])) for _, t in held])

    # The same names on every rank: which inputs exist is the method's.
    whole = {name: padded(name)[order].to(device) for name in held[0][1]}
    own = torch.searchsorted(every_position[order], torch.tensor(positions, dtype=torch.long)).to(device)
    return whole, own


class _TokenView(NamedTuple):
    """A call's inputs as every rule reads them, (B, T) each, finite everywhere: masked positions may hold
    anything (−inf log-probs of padding, NaN behaviour values), replaced before any arithmetic so no inf·0 = NaN
    reaches the sums, and ``where`` passes them a zero gradient."""

    mask: torch.Tensor
    """The mask in the log-probs' dtype."""
    logprobs: torch.Tensor
    """With grad; 0 at masked positions."""
    current: torch.Tensor
    """``logprobs`` detached."""
    behavior: torch.Tensor
    """π_b; the current log-prob at masked positions (a ratio of 1 there keeps every term finite)."""
    anchor: torch.Tensor
    """a: π_prox where given, else π_b."""
    ratio: torch.Tensor
    """ρ = exp(level(clamp(current − a, ±20))), clamped again (a sequence sum can exceed 20)."""
    advantages: torch.Tensor
    """Detached, per token (A broadcast over T), 0 at masked positions."""

    @classmethod
    def of(cls, logprobs, behavior_logprobs, advantages, mask, proximal_logprobs, level_fn) -> _TokenView:
        mask = mask.to(logprobs.dtype)
        valid = mask > 0
        logprobs = torch.where(valid, logprobs, torch.zeros_like(logprobs))
        current = logprobs.detach()
        behavior = torch.where(valid, behavior_logprobs.to(logprobs.dtype), current)
        anchor = behavior
        if proximal_logprobs is not None:
            anchor = torch.where(valid, proximal_logprobs.to(logprobs.dtype), current)
        log_ratio = level_fn((current - anchor).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO), mask)
        ratio = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).exp()
        token_advantages = advantages.detach().to(logprobs.dtype)  # (B,) per response or (B, T) per token
        if token_advantages.dim() == 1:
            token_advantages = token_advantages[:, None].expand_as(logprobs)
        token_advantages = torch.where(valid, token_advantages, torch.zeros_like(token_advantages))
        return cls(mask, logprobs, current, behavior, anchor, ratio, token_advantages)


def _token_weights(weight_fn, view: _TokenView, params: LossParams, *, proximal: bool):
    """``(w (B, T), metrics)``: the weight rule's w, times AReaL's behaviour weight min(π_prox/π_b, C) with a
    proximal anchor, times DG's gate σ(A·(−logprobs)/η) with ``delight_temperature`` (on top of any mask)."""
    weights, metrics = _with_metrics(weight_fn(view.ratio, view.advantages, params))  # (B, T)
    if proximal:
        weights = weights * (view.anchor - view.behavior).clamp(max=math.log(params.is_cap)).exp()
    if params.delight_temperature is not None:
        gate, delight_metrics = delight.delight_gate(
            view.current, view.advantages, view.mask, params.delight_temperature
        )
        weights, metrics = weights * gate, metrics | delight_metrics  # (B, T)
    return weights, metrics


def _with_metrics(result) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A mask or weight returns a tensor, or ``(tensor, metrics)`` saying what it masked or re-weighted."""
    return result if isinstance(result, tuple) else (result, {})


def _valid_extreme(ratio: torch.Tensor, valid: torch.Tensor, largest: bool) -> torch.Tensor:
    """Max (or min) of ``ratio`` over ``valid`` tokens; 1 when there are none."""
    if ratio.numel() == 0:
        return ratio.new_ones(())
    fill = torch.full_like(ratio, -torch.inf if largest else torch.inf)
    filled = torch.where(valid, ratio, fill)  # (B, T)
    extreme = filled.amax() if largest else filled.amin()
    return torch.where(valid.any(), extreme, torch.ones_like(extreme))


@_no_grad
def ratio_stats(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    mask: torch.Tensor,
    band: tuple[float, float] = MISMATCH_BAND,
) -> dict[str, torch.Tensor]:
    """The distribution of ρ = exp(logprobs − behavior_logprobs) over the valid tokens of ``mask`` (B, T).

    Returns detached 0-dim tensors: ``mean``, ``min``, ``max`` (1 when no token is valid) and
    ``outside_frac``, the share of valid tokens with ρ ∉ [band[0], band[1]]. The same clamp (±20 in log ρ)
    as the loss keeps stray tokens finite.
    """
    mask = mask.to(logprobs.dtype)
    valid = mask > 0
    log_ratio = torch.where(valid, logprobs - behavior_logprobs.to(logprobs.dtype), torch.zeros_like(logprobs))
    ratio = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).exp()  # (B, T)
    total = mask.sum().clamp(min=1)
    low, high = band
    return {
        "mean": torch.where(valid.any(), (ratio * mask).sum() / total, torch.ones_like(total)),
        "min": _valid_extreme(ratio, valid, largest=False),
        "max": _valid_extreme(ratio, valid, largest=True),
        "outside_frac": (((ratio < low) | (ratio > high)).to(mask.dtype) * mask).sum() / total,
    }


def _normalized_ess(log_weights: torch.Tensor) -> torch.Tensor:
    """(Σw)² / (N·Σw²) of the weights w = exp(log_weights) (N,), computed in the log domain (a sequence's
    Π_t ρ_t overflows); 1 when N = 0."""
    if log_weights.numel() == 0:
        return log_weights.new_ones(())
    n = math.log(log_weights.numel())
    return torch.exp(2 * torch.logsumexp(log_weights, 0) - n - torch.logsumexp(2 * log_weights, 0))


@_no_grad
def effective_sample_size(
    logprobs: torch.Tensor, behavior_logprobs: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The normalised effective sample size of the importance weights ρ = π/π_b over the valid tokens of
    ``mask`` (B, T): ESS = (Σw)² / (N·Σw²) ∈ (0, 1], 1 when every weight is equal (on-policy), → 1/N when one
    weight dominates (Kong 1992; VCPO, arXiv 2602.17616, watches its fall as the early sign of collapse).

    Returns detached 0-dim tensors: ``token`` (w = ρ_t, N = valid tokens) and ``sequence`` (w_i = Π_t ρ_t, the
    response's ratio, N = rows with a valid token). log ρ is clamped at ±20 per token, as in the loss."""
    valid = mask > 0
    log_ratio = torch.where(valid, logprobs - behavior_logprobs.to(logprobs.dtype), torch.zeros_like(logprobs))
    log_ratio = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # (B, T)
    rows = valid.any(dim=-1)  # (B,)
    return {
        "token": _normalized_ess(log_ratio[valid]),
        "sequence": _normalized_ess(log_ratio.sum(dim=-1)[rows]),
    }


@_no_grad
def _metrics(ratio, keep, weights, mask, pg_loss, reg_loss) -> dict[str, torch.Tensor]:
    """Diagnostics, each a detached 0-dim tensor; fractions and means weight tokens by the mask.

    clip_frac: valid tokens with M = 0; clip_frac_low / clip_frac_high: those with ρ < 1 / ρ > 1 (for the
    clip modes that is ρ < 1 − ε_low / ρ > 1 + ε_high; they sum to clip_frac whenever the band holds 1);
    ratio_mean/min/max: the loss's ρ over valid tokens (1 if none);
    ratio_outside_frac: valid tokens with ρ outside RATIO_RANGE; pg_loss, reg_loss: the two aggregated
    parts of the loss; weight_mean: mean w (0 if no valid token).
    """
    valid = mask > 0
    mask_total = mask.sum()
    total = torch.where(mask_total > 0, mask_total, torch.ones_like(mask_total))

    def mean(values: torch.Tensor) -> torch.Tensor:
        return (values.to(mask.dtype) * mask).sum() / total

    clipped = ~keep
    low, high = RATIO_RANGE
    return {
        "clip_frac": mean(clipped),
        "clip_frac_low": mean(clipped & (ratio < 1)),
        "clip_frac_high": mean(clipped & (ratio > 1)),
        "ratio_mean": torch.where(mask_total > 0, mean(ratio), torch.ones_like(total)),
        "ratio_min": _valid_extreme(ratio, valid, largest=False),
        "ratio_max": _valid_extreme(ratio, valid, largest=True),
        "ratio_outside_frac": mean((ratio < low) | (ratio > high)),
        "pg_loss": pg_loss.detach(),
        "reg_loss": reg_loss.detach(),
        "weight_mean": mean(weights),
    }
