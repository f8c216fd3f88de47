"""The algorithm as a trainer runs it: one frozen ``Method`` of typed settings by stage, and ``Method.needs``, what
a trainer step must compute for it before the update.

``Method.of(settings, ...)`` takes the resolved settings (``resolve_preset``, ``oprl.config.algorithm_settings``)
plus the reference / entropy / teacher knobs of the run, once; the stages that read it are
``oprl.algorithms.step`` (advantages, a micro-batch's loss terms, the step-size rule). Each field's default is
``ALGORITHM_DEFAULTS``' (``defaults.py``, with its reason and citation) or the config's, so ``Method()`` is plain
group-relative REINFORCE. The trainer holds a ``Method`` and never reads a field by name: a method is a change here
and in the stages, not in the trainer.

Not here: validating settings (``presets.validate_settings``), the formulas, the config tree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from oprl.algorithms.advantages import WEIGHTED_BASELINES
from oprl.algorithms.defaults import ADVANTAGE_KEYS, DISTILL_KEYS
from oprl.algorithms.defaults import ALGORITHM_DEFAULTS as D
from oprl.algorithms.distill import LOGPROB_FLOOR
from oprl.algorithms.losses import LossParams


@dataclass(frozen=True)
class AdvantageParams:
    """The keywords of ``group_advantages`` (``ADVANTAGE_KEYS``; its docstring has the formulas)."""

    std_normalize: bool = D["std_normalize"]
    """GRPO: divide by the group's std."""
    mean_normalize: bool = D["mean_normalize"]
    """MaxRL: A = r/mean − 1."""
    drop: str = D["drop"]
    """RED-Drop's rule (``DROP_RULES``)."""
    keep_dropped: bool = D["keep_dropped"]
    """Dropped responses stay with A = 0."""
    baseline_shift: float = D["baseline_shift"]
    """AsymRE's δ."""
    baseline: str = D["baseline"]
    """``BASELINES``: mean, logavgexp (OPMD), off-policy-optimal (VCPO: needs the score statistics)."""
    tau: float = D["tau"]
    """Temperature of the logavgexp baseline."""
    red_weight: str = D["red_weight"]
    """Adaptive RED-Weight's rule (``RED_WEIGHT_RULES``): needs each response's loss-token count."""
    red_weight_level: str = D["red_weight_level"]
    """Its set: the batch or each group."""

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> AdvantageParams:
        return cls(**{key: settings[key] for key in ADVANTAGE_KEYS})

    def keywords(self) -> dict[str, Any]:
        """``group_advantages``' keyword arguments."""
        return asdict(self)


@dataclass(frozen=True)
class DistillParams:
    """The teacher's per-token advantage (``distill.teacher_advantages``; docs/algorithms.md#distillation)."""

    distill_coef: float = D["distill_coef"]
    """c in A_t = A_group + c·(log π_T − log π_b); 0 = the teacher is only measured (rows that carry it)."""
    distill_mix: str = D["distill_mix"]
    """``DISTILL_MIXES``: add to the group advantage, or replace it."""
    logprob_floor: float = LOGPROB_FLOOR
    """``teacher.logprob_floor``: the least teacher log-prob used (−inf outside a truncated teacher's support)."""


@dataclass(frozen=True)
class ReferenceParams:
    """The KL to the frozen initial policy (``kl.kl_penalty``)."""

    kl_coef: float = 0.0
    """``algorithm.kl_coef``: the penalty's coefficient (> 0: the reference is computed every step)."""
    kl_estimator: str = "k3"
    """``KL_ESTIMATORS``: k1, k2, k3."""
    log_ref_kl_every: int = 0
    """``algorithm.log_ref_kl_every``: without a penalty, log kl/ref every this many steps (0 = never)."""


@dataclass(frozen=True)
class StepSize:
    """The step-size rule (``variance.step_size``): VCPO's ESS-scaled learning rate, or the configured one."""

    ess_lr: str = D["ess_lr"]
    """``ESS_LR_RULES``: none, sqrt, linear."""
    ess_lr_base: float = D["ess_lr_base"]
    """The ESS at or above which the step is not reduced."""


@dataclass(frozen=True)
class GateParams:
    """The Kondo gate (``delight.kondo_gate``, arXiv 2603.20526): which responses get a backward pass."""

    kondo_rate: float | None = D["kondo_rate"]
    """ρ, the share of responses passed (None = off)."""
    kondo_temperature: float = D["kondo_temperature"]
    """η of the pass probability σ((χ − λ)/η)."""
    kondo_window: int = D["kondo_window"]
    """Responses whose (1 − ρ)-quantile of delight is the price λ."""


@dataclass(frozen=True)
class Needs:
    """What a trainer step computes for a ``Method`` besides the policy's own log-probs (``oprl.trainer.inputs``)."""

    proximal: bool = False
    """π_prox: every row's log-probs under the weights before the step's first update (decoupled PPO)."""
    screen: bool = False
    """The same log-probs, with the rows' loss masks, for a rule on the advantages (the Kondo gate)."""
    score_statistics: bool = False
    """Every row's log importance weight and squared score norm before the update (VCPO's baseline)."""
    teacher: bool = False
    """Every row must carry the teacher's log-probs."""
    reference_every: int = 0
    """The reference policy's log-probs on steps divisible by this (1 = every step, 0 = never)."""
    entropy_grad: bool = False
    """The loss differentiates the token entropies (an entropy bonus)."""
    log_weights: bool = False
    """The step-size rule reads the mini-batch's responses' log importance weights, gathered over ranks."""

    def reference(self, step: int) -> bool:
        """Whether step ``step`` (1-based, the version the update produces) computes the reference log-probs."""
        return self.reference_every > 0 and step % self.reference_every == 0


@dataclass(frozen=True)
class Method:
    """Every setting of a trainer step, by stage, and the quantities they make the trainer compute (``needs``)."""

    advantages: AdvantageParams = field(default_factory=AdvantageParams)
    loss: LossParams = field(default_factory=LossParams)
    distill: DistillParams = field(default_factory=DistillParams)
    reference: ReferenceParams = field(default_factory=ReferenceParams)
    entropy_coef: float = 0.0
    """``algorithm.entropy_coef``: the entropy bonus, loss − c·aggregate(entropy)."""
    step_size: StepSize = field(default_factory=StepSize)
    gate: GateParams = field(default_factory=GateParams)
    recompute_proximal: bool = D["recompute_proximal"]
    """Decoupled PPO: the loss anchors at π_prox, recomputed before the update."""

    @classmethod
    def of(
        cls,
        settings: Mapping[str, Any],
        *,
        max_response_tokens: int | None = None,
        teacher_logprob_floor: float = LOGPROB_FLOOR,
        **knobs: Any,
    ) -> Method:
        """The ``Method`` of resolved ``settings`` (a complete preset plus overrides). ``knobs``: the algorithm
        section's settings outside ``ALGORITHM_DEFAULTS`` (``ReferenceParams``' fields, ``entropy_coef``).
        ``max_response_tokens`` is Dr.GRPO's fixed normaliser (``loss_agg=seq-mean-token-sum-norm``: the padded
        width varies per micro-batch and would bias it)."""
        fixed = settings["loss_agg"] == "seq-mean-token-sum-norm" and max_response_tokens is not None
        normalizer = float(max_response_tokens) if fixed and max_response_tokens is not None else None
        reference_keys = [f.name for f in fields(ReferenceParams)]
        return cls(
            advantages=AdvantageParams.of(settings),
            loss=LossParams.of(settings, normalizer=normalizer),
            distill=DistillParams(**{key: settings[key] for key in DISTILL_KEYS}, logprob_floor=teacher_logprob_floor),
            reference=ReferenceParams(**{key: knobs.pop(key) for key in reference_keys if key in knobs}),
            entropy_coef=knobs.pop("entropy_coef", 0.0),
            step_size=StepSize(ess_lr=settings["ess_lr"], ess_lr_base=settings["ess_lr_base"]),
            gate=GateParams(**{key: settings[key] for key in [f.name for f in fields(GateParams)]}),
            recompute_proximal=settings["recompute_proximal"],
            **knobs,  # an unknown knob is a TypeError naming it
        )

    @property
    def needs(self) -> Needs:
        reference = self.reference
        return Needs(
            proximal=self.recompute_proximal,
            screen=self.gate.kondo_rate is not None,
            score_statistics=self.advantages.baseline in WEIGHTED_BASELINES,
            teacher=self.distill.distill_coef > 0,
            reference_every=1 if reference.kl_coef > 0 else reference.log_ref_kl_every,
            entropy_grad=self.entropy_coef > 0,
            log_weights=self.step_size.ess_lr != "none",
        )
