"""The algorithm as one typed value: ``Algorithm`` holds one settings value per stage of ``spec.py`` (where every
knob is declared once), ``Algorithm.of(preset, overrides)`` is the one resolver (a preset of ``presets.PRESETS``
plus overrides, validated) and ``Algorithm.needs`` says what a step must compute for it besides the policy's own
log-probs (``Needs``: π_prox, score statistics, the teacher's and the reference's log-probs), derived from the
settings and the registries (a baseline in ``WEIGHTED_BASELINES`` asks for score statistics), so a method is a
change in ``oprl.algorithms`` only.

Above the formulas and the presets (it reads their registries and ``complete_settings``); they import ``spec.py``,
never this module, so the package's imports run one way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from oprl.algorithms.advantages import WEIGHTED_BASELINES
from oprl.algorithms.losses import BATCH_RULES
from oprl.algorithms.presets import complete_settings
from oprl.algorithms.spec import (
    KNOBS,
    LOGPROB_FLOOR,
    STAGES,
    Advantages,
    Distill,
    Entropy,
    Gate,
    LossParams,
    Reference,
    StepSize,
    knob_names,
)
from oprl.algorithms.topk_divergence import TOP_K_MASKS


@dataclass(frozen=True)
class Needs:
    """What a trainer step computes for an ``Algorithm`` besides the policy's own log-probs (``trainer/inputs.py``)."""

    proximal: bool = False
    """π_prox: every row's log-probs under the weights before the step's first update (decoupled PPO)."""
    screen: bool = False
    """The same log-probs, with the rows' loss masks, for a rule on the advantages (the Kondo gate)."""
    score_statistics: bool = False
    """Every row's log importance weight and squared score norm before the update (a baseline of
    ``WEIGHTED_BASELINES``: VCPO's)."""
    teacher: bool = False
    """Every row must carry the teacher's log-probs."""
    reference_every: int = 0
    """The reference policy's log-probs on steps divisible by this (1 = every step, 0 = never)."""
    entropy_grad: bool = False
    """The loss differentiates the token entropies (an entropy bonus)."""
    log_weights: bool = False
    """The step-size rule reads the mini-batch's responses' log importance weights, gathered over ranks."""
    top_k: bool = False
    """The loss reads the sampler's top-K ids and log-probs and the policy's log-probs of those ids, from the loss's
    own forward (score centering, DPPO's Top-K divergence: ``rollout.record_top_k > 0``)."""
    batch_rule: bool = False
    """The loss's mask reads a statistic of the whole batch (``losses.BATCH_RULES``: M2PO, BAPO): where a mini-batch
    spans several micro-batches, the trainer computes it once over them (``step.batch_rule_keeps``)."""

    def reference(self, step: int) -> bool:
        """Whether step ``step`` (1-based, the version the update produces) computes the reference log-probs."""
        return self.reference_every > 0 and step % self.reference_every == 0


@dataclass(frozen=True)
class Algorithm:
    """Every setting of a trainer step, by stage, and the quantities they make the trainer compute (``needs``).
    ``Algorithm()`` is plain group-relative REINFORCE; a run's is ``Algorithm.of(preset, overrides)``."""

    advantages: Advantages = field(default_factory=Advantages)
    loss: LossParams = field(default_factory=LossParams)
    step_size: StepSize = field(default_factory=StepSize)
    gate: Gate = field(default_factory=Gate)
    distill: Distill = field(default_factory=Distill)
    reference: Reference = field(default_factory=Reference)
    entropy: Entropy = field(default_factory=Entropy)

    @classmethod
    def of(
        cls,
        preset: str | Mapping[str, Any],
        overrides: Mapping[str, Any] | None = None,
        *,
        max_response_tokens: int | None = None,
        teacher_logprob_floor: float = LOGPROB_FLOOR,
        **knobs: Any,
    ) -> Algorithm:
        """The one resolver: preset ``preset`` (a name of ``presets.PRESETS``, or complete settings already
        resolved) with ``overrides`` and ``knobs`` (any knob, a preset's or a run's) applied, validated by
        ``presets.validate_settings`` (a bad name or value: ``SettingError`` naming the knob; an unknown keyword
        in ``knobs``: ``TypeError``, as for any function). ``max_response_tokens`` is Dr.GRPO's fixed normaliser
        (``loss_agg=seq-mean-token-sum-norm``: the padded width varies per micro-batch and would bias it);
        ``teacher_logprob_floor`` is ``teacher.logprob_floor``."""
        unknown = [key for key in knobs if key not in KNOBS]
        if unknown:
            raise TypeError(f"Algorithm.of() got an unexpected knob {unknown[0]!r}")
        settings = complete_settings(preset, {**(overrides or {}), **knobs})
        normalizer = None
        if max_response_tokens is not None and settings["loss_agg"] == "seq-mean-token-sum-norm":
            normalizer = float(max_response_tokens)
        stages = {f.name: _stage(str(f.type), settings) for f in dataclasses.fields(cls)}
        stages["loss"] = dataclasses.replace(stages["loss"], normalizer=normalizer)
        stages["distill"] = dataclasses.replace(stages["distill"], logprob_floor=teacher_logprob_floor)
        return cls(**stages)

    def settings(self, *, in_preset: bool = False) -> dict[str, Any]:
        """Every knob's value, by name (``in_preset``: only those a preset sets, ``resolve_preset``'s keys)."""
        stages = [getattr(self, f.name) for f in dataclasses.fields(self)]
        return {
            name: getattr(stage, name)
            for stage in stages
            for name in knob_names(type(stage))
            if not in_preset or KNOBS[name].in_preset
        }

    @property
    def needs(self) -> Needs:
        """What a step must compute for this algorithm, derived from its settings and the registries."""
        reference = self.reference
        return Needs(
            proximal=self.loss.recompute_proximal,
            screen=self.gate.kondo_rate is not None,
            score_statistics=self.advantages.baseline in WEIGHTED_BASELINES,
            teacher=self.distill.distill_coef > 0,
            reference_every=1 if reference.kl_coef > 0 else reference.log_ref_kl_every,
            entropy_grad=self.entropy.entropy_coef > 0,
            log_weights=self.step_size.ess_lr != "none",
            top_k=self.loss.score_centering or self.loss.clip_mode in TOP_K_MASKS,
            batch_rule=self.loss.clip_mode in BATCH_RULES,
        )


def _stage(name: str, settings: Mapping[str, Any]) -> Any:
    stage = _STAGE_BY_NAME[name]
    return stage(**{key: settings[key] for key in knob_names(stage)})


_STAGE_BY_NAME = {stage.__name__: stage for stage in STAGES}
