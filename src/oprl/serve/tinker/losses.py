"""The losses ``forward_backward`` computes: Tinker's built-in ones as Tinker defines them, and oprl's presets.

Every tensor is ``(B, T)``: one row per datum, right-padded; ``mask`` is True at the datum's positions.
``logprobs`` = log π_θ(y_t | x_≤t), the trainer's log-prob of the target token at each position (with grad);
``q`` = the ``logprobs`` loss input (the sampler's log-probs), ``A`` = ``advantages``, ``w`` = ``weights``,
ρ = exp(logprobs − q). Each built-in loss is a **sum** over every position of every datum (Tinker's
convention, no normalisation), so the gradients of several ``forward_backward`` calls before one
``optim_step`` add up to the gradient of one call on their concatenation:

  cross_entropy        −Σ w·logprobs
  importance_sampling  −Σ ρ·A
  ppo                  −Σ min(ρ·A, clip(ρ, lo, hi)·A)          lo, hi: clip_low_threshold 0.8, clip_high_threshold 1.2
  cispo                −Σ sg[clip(ρ, lo, hi)]·logprobs·A       (sg: no gradient through the weight)
  dro                  −Σ (logprobs·A − ½·β·(logprobs − q)²)   β: ``beta``, required

``lo`` / ``hi`` come from ``loss_fn_config`` (one number), or per position from the ``clip_low_threshold`` /
``clip_high_threshold`` loss inputs. oprl's presets (``loss_fn_config={"preset": NAME, ...overrides}`` with
the inputs of ``importance_sampling``) are ``oprl.algorithms.policy_loss`` with the preset's loss settings,
turned into a sum by multiplying by ``aggregation_count`` (the tokens for ``token-mean``, the sequences for the
``seq-mean-*`` modes), so they accumulate across calls the same way (docs/tinker.md).

``stable_reinforce`` (tinker-cookbook's default RL loss) has no published objective: refused, unless the server's
operator names the oprl preset to serve it as (``oprl serve tinker --stable-reinforce PRESET``); each result then
says so in its metrics (``stable_reinforce=PRESET:max``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from oprl.algorithms import (
    ADVANTAGE_KEYS,
    DISTILL_KEYS,
    LossParams,
    SettingError,
    aggregation_count,
    policy_loss,
    resolve_preset,
)

BUILT_IN_INPUTS: dict[str, tuple[str, ...]] = {
    "cross_entropy": ("target_tokens", "weights"),
    "importance_sampling": ("target_tokens", "logprobs", "advantages"),
    "ppo": ("target_tokens", "logprobs", "advantages"),
    "cispo": ("target_tokens", "logprobs", "advantages"),
    "dro": ("target_tokens", "logprobs", "advantages"),
}
"""The loss inputs each built-in loss requires (every one of them (N,) per datum, N = the datum's length)."""

OPTIONAL_INPUTS = ("clip_low_threshold", "clip_high_threshold", "mask")
CONFIG_KEYS: dict[str, dict[str, float | None]] = {
    "cross_entropy": {},
    "importance_sampling": {},
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "cispo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "dro": {"beta": None},  # None: required
}
"""Each built-in loss's ``loss_fn_config`` keys and their defaults."""

REFUSED = {
    "gspo": "the server does not implement Tinker's gspo; {'preset': 'gspo'} with importance_sampling is "
    "oprl's GSPO (sequence-level ratio, one-sided clip)",
    # Not computable as Tinker's: tinker 0.38 and tinker-cookbook 0.6.1 send stable_reinforce the inputs of
    # importance_sampling plus provenance (each position's sampled sequence_id), and the hosted service combines
    # them with "stability information" it records at sampling (record_stability_info=True); neither the SDK,
    # the cookbook nor the public docs say what that information is or what objective uses it (docs/tinker.md).
    # Served only as an oprl preset the operator names (STABLE_REINFORCE_OPTION), never by a guess of ours.
    "stable_reinforce": "Tinker does not publish its objective (it combines the datums with stability "
    "information the hosted service records at sampling, which its SDK and docs do not define), so it cannot be "
    "computed exactly; use importance_sampling, ppo, cispo, dro or an oprl preset "
    "(loss_fn_config={'preset': ...}), or have the server started with `oprl serve tinker --stable-reinforce "
    "PRESET` to serve it as that oprl preset (the operator's choice, announced in each result's metrics)",
    "custom": "server-side custom losses are not served; forward_backward_custom runs the loss on the client",
}
"""Loss names the SDK knows that this server refuses, with the reason (the 400's message)."""

PRESET_LOSS_FNS = ("importance_sampling",)
"""A preset rides on a built-in name the SDK accepts: its inputs are importance_sampling's."""
STABLE_REINFORCE = "stable_reinforce"
STABLE_REINFORCE_OPTION = "--stable-reinforce"
"""The server option that serves ``stable_reinforce`` as an oprl preset (``loss_spec``'s ``stable_reinforce``)."""


class LossError(ValueError):
    """Bad loss name, config or inputs; the message starts with the field."""


@dataclass(frozen=True)
class LossSpec:
    """A validated loss: the built-in ``name``, its config, and the oprl settings of a preset (or None)."""

    name: str
    config: dict[str, Any]
    preset: dict[str, Any] | None = None
    served_as: str | None = None
    """The preset name when the client asked for ``stable_reinforce`` and the operator mapped it to a preset."""

    @property
    def inputs(self) -> tuple[str, ...]:
        return BUILT_IN_INPUTS[self.name]

    def announcement(self) -> dict[str, float]:
        """The metric that tells the client which loss answered it: ``stable_reinforce=<preset>:max`` = 1 when
        ``stable_reinforce`` ran as an operator-chosen preset (a ``ForwardBackwardOutput`` carries no other
        metadata: its metrics are the one field the SDK passes on, name:reduction keys with float values)."""
        return {} if self.served_as is None else {f"{STABLE_REINFORCE}={self.served_as}:max": 1.0}


def loss_spec(name: str, config: dict[str, float | str], stable_reinforce: str | None = None) -> LossSpec:
    """Check ``loss_fn`` and ``loss_fn_config`` before anything runs; ``LossError`` names the culprit.

    ``stable_reinforce``: the oprl preset the server's operator serves ``loss_fn="stable_reinforce"`` as
    (``oprl serve tinker --stable-reinforce PRESET``); None refuses it. The client's ``loss_fn_config`` then
    holds overrides of that preset, as ``{"preset": ...}``'s do (the cookbook sends none)."""
    if name == STABLE_REINFORCE and stable_reinforce is not None:
        if "preset" in config:
            raise LossError(
                f"loss_fn_config.preset: the server serves stable_reinforce as {stable_reinforce!r} "
                f"({STABLE_REINFORCE_OPTION}); send importance_sampling with {{'preset': ...}} for another preset"
            )
        settings = _preset_settings("importance_sampling", {"preset": stable_reinforce, **config})
        return LossSpec("importance_sampling", {}, settings, served_as=stable_reinforce)
    if name in REFUSED:
        raise LossError(f"loss_fn: {name!r} is refused: {REFUSED[name]}")
    if name not in BUILT_IN_INPUTS:
        raise LossError(f"loss_fn: unknown loss {name!r}; served: {', '.join([*BUILT_IN_INPUTS, *REFUSED])}")
    if "preset" in config:
        return LossSpec(name, {}, _preset_settings(name, dict(config)))
    known = CONFIG_KEYS[name]
    for key, value in config.items():
        if key not in known:
            allowed = ", ".join(known) or "none"
            raise LossError(f"loss_fn_config.{key}: not a setting of {name} (its settings: {allowed}; or 'preset')")
        if not isinstance(value, float | int):
            raise LossError(f"loss_fn_config.{key}: must be a number, got {value!r}")
    missing = [key for key, default in known.items() if default is None and key not in config]
    if missing:
        raise LossError(f"loss_fn_config.{missing[0]}: required by {name} (e.g. loss_fn_config={{'beta': 0.05}})")
    settings = {key: float(config.get(key, default or 0.0)) for key, default in known.items()}
    if name in ("ppo", "cispo") and not 0 <= settings["clip_low_threshold"] <= settings["clip_high_threshold"]:
        raise LossError("loss_fn_config.clip_low_threshold: must satisfy 0 <= clip_low <= clip_high")
    return LossSpec(name, settings)


def stable_reinforce_check(preset: str) -> None:
    """Refuse, at the server's start, a ``--stable-reinforce`` preset that ``loss_spec`` would refuse (one line
    naming the option: an unknown preset, a distillation or step-size preset, ...)."""
    try:
        loss_spec(STABLE_REINFORCE, {}, preset)
    except LossError as exc:
        reason = str(exc).split(": ", 1)[-1]
        raise LossError(f"{STABLE_REINFORCE_OPTION}: {reason}") from None


def _preset_settings(name: str, config: dict[str, Any]) -> dict[str, Any]:
    """The full settings of ``config['preset']`` with ``config``'s overrides (``normalizer`` aside)."""
    if name not in PRESET_LOSS_FNS:
        raise LossError(
            f"loss_fn_config.preset: a preset takes loss_fn='importance_sampling' (its inputs), not {name!r}"
        )
    preset = config.pop("preset")
    normalizer = config.pop("normalizer", None)
    for key in config:
        if key in ADVANTAGE_KEYS:
            raise LossError(f"loss_fn_config.{key}: an advantage setting; the client computes the advantages it sends")
        if key in DISTILL_KEYS:
            raise LossError(f"loss_fn_config.{key}: distillation needs teacher log-probs, which are not served")
    if not isinstance(preset, str):
        raise LossError(f"loss_fn_config.preset: a preset name, got {preset!r}")
    try:
        settings = resolve_preset(preset, **config)
    except SettingError as exc:
        raise LossError(f"loss_fn_config.{exc.key}: {exc}") from None
    if settings["distill_coef"] > 0:
        raise LossError(f"loss_fn_config.preset: {preset!r} distils from a teacher, whose log-probs are not served")
    if settings["ess_lr"] != "none":  # a step-size rule (VCPO), not a loss: optim_step's AdamParams set the rate
        raise LossError(
            f"loss_fn_config.preset: {preset!r} scales each optimizer step's learning rate by the batch's ESS "
            f"(ess_lr={settings['ess_lr']}), which a loss cannot do (optim_step's AdamParams set the rate, and the "
            "client computes the advantages, its baseline included); send 'ess_lr': 'none' for its loss alone"
        )
    if settings["entropy_eps"] is not None:  # ASPO's entropy-dependent band reads the trainer forward's entropies
        raise LossError(
            f"loss_fn_config.entropy_eps: {preset!r} widens the clip band of high-entropy tokens, which needs each "
            "token's entropy under the policy; the served forward computes only log-probs: send 'entropy_eps': null"
        )
    if normalizer is not None and not (isinstance(normalizer, float | int) and normalizer > 0):
        raise LossError(f"loss_fn_config.normalizer: a positive number, got {normalizer!r}")
    return {**settings, "normalizer": normalizer}


def compute_loss(
    spec: LossSpec, logprobs: torch.Tensor, inputs: dict[str, torch.Tensor], mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, float]]:
    """``(loss, elementwise loss (B, T) or None, metrics)`` for one micro-batch; the loss is a sum (module
    docstring), so micro-batches and calls add up. ``inputs`` are (B, T) float tensors, 0 on padding."""
    valid = mask.to(logprobs.dtype)
    if spec.preset is not None:
        loss, metrics = _preset_loss(spec.preset, logprobs, inputs, mask)
        return loss, None, metrics
    if spec.name == "cross_entropy":
        elementwise = -inputs["weights"] * logprobs
    else:
        advantages, sampled = inputs["advantages"], inputs["logprobs"]
        log_ratio = torch.where(mask, logprobs - sampled, torch.zeros_like(logprobs))
        ratio = log_ratio.exp()  # (B, T)
        if spec.name == "importance_sampling":
            elementwise = -ratio * advantages
        elif spec.name == "dro":
            elementwise = -(logprobs * advantages - 0.5 * spec.config["beta"] * (logprobs - sampled) ** 2)
        else:  # ppo, cispo: per-position thresholds when the datum carries them
            low = inputs.get("clip_low_threshold", torch.full_like(ratio, spec.config["clip_low_threshold"]))
            high = inputs.get("clip_high_threshold", torch.full_like(ratio, spec.config["clip_high_threshold"]))
            clipped = torch.minimum(torch.maximum(ratio, low), high)
            if spec.name == "ppo":
                elementwise = -torch.minimum(ratio * advantages, clipped * advantages)
            else:
                elementwise = -clipped.detach() * logprobs * advantages
    elementwise = elementwise * valid  # padding contributes nothing, whatever it holds
    return elementwise.sum(), elementwise.detach(), {}


def call_policy_loss(
    logprobs: torch.Tensor,
    behavior: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: dict[str, Any],
    proximal: torch.Tensor | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The one call into ``oprl.algorithms.policy_loss`` (the only place that knows its signature): the
    preset's loss settings as ``LossParams``, the normaliser, the optional proximal log-probs."""
    params = LossParams.of(settings, normalizer=settings["normalizer"])
    return policy_loss(logprobs, behavior, advantages, mask, params, proximal_logprobs=proximal)


def _preset_loss(settings: dict[str, Any], logprobs, inputs, mask) -> tuple[torch.Tensor, dict[str, float]]:
    """oprl's loss as a sum: ``policy_loss(...)·aggregation_count(m, loss_agg)``, m = the ``mask`` input, else
    the positions with A ≠ 0 (the sampled tokens of a response that carries signal). Decoupled PPO's π_prox
    is the weights before the update, i.e. the current ones: ``logprobs`` detached."""
    covered = inputs["mask"] > 0 if "mask" in inputs else inputs["advantages"] != 0
    covered = covered & mask
    proximal = logprobs.detach() if settings["recompute_proximal"] else None
    loss, metrics = call_policy_loss(logprobs, inputs["logprobs"], inputs["advantages"], covered, settings, proximal)
    count = aggregation_count(covered, settings["loss_agg"])
    return loss * count, {key: float(value) for key, value in metrics.items()}
