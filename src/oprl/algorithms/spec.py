"""The algorithm as one typed value: every knob declared once, with its default, meaning, citation and range.

A knob is one field of a frozen stage dataclass below, declared with ``knob(default, meaning, why=..., range=...,
choices=..., group=...)``; everything else about it is generated from that one declaration:

- ``ALGORITHM_DEFAULTS`` (the table the presets start from: ``preset_defaults()``) and the keyword defaults of
  the formulas (``group_advantages``, ``distill_advantages`` read ``Advantages.std_normalize``, ...);
- the range checks (``range_error``; ``presets.validate_settings`` adds the registries and the rules across knobs);
- ``AlgorithmConfig``'s fields, their ``oprl config --help`` text and its help groups (``oprl.config.algorithm``).

The stages, in the order a trainer step reads them (``oprl.algorithms.step``): ``Advantages`` (the group
advantages), ``LossParams`` (the token loss, ``policy_loss``), ``StepSize`` (VCPO's learning-rate rule), ``Gate``
(the Kondo gate on each response's backward pass), ``Distill`` (the teacher's advantage), ``Reference`` (the KL to
the initial policy) and ``Entropy`` (the bonus). ``Algorithm`` (``algorithm.py``) holds one of each.

Bottom of the package: the formula modules import this one for their defaults and settings types, so it imports
no module of oprl. Not here: the formulas, their registries, the presets, and the value that resolves a preset
and derives its needs from the registries (``algorithm.py``, above them).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

LOGPROB_FLOOR = -20.0
"""f, the least teacher log-prob distillation uses (nats; ``teacher.logprob_floor``'s default, ``distill.py``):
e^-20 ≈ 2e-9, below any token a sampler at temperature ~1 draws in practice, so only tokens the teacher gives
probability 0 (or nearly) reach it, and d_t = f − log π_b stays a bounded penalty of ~20 nats rather than −inf."""


@dataclass(frozen=True)
class Range:
    """A knob's valid numbers, as one phrase (``text``, for the one-line error) and a test (``holds``)."""

    text: str
    """What the error says: ``"> 0"``, ``"in [0, 1]"``, ..."""
    holds: Callable[[float], bool]
    """True for a valid number (never called with a boolean or a non-number)."""
    bounds: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """The same as pydantic ``Field`` constraints, for the knobs a preset does not set (checked by the config)."""
    integer: bool = False


POSITIVE = Range("> 0", lambda v: v > 0, {"gt": 0})
NON_NEGATIVE = Range(">= 0", lambda v: v >= 0, {"ge": 0})
SHARE = Range("in [0, 1]", lambda v: 0 <= v <= 1, {"ge": 0, "le": 1})
RATE = Range("in (0, 1]", lambda v: 0 < v <= 1, {"gt": 0, "le": 1})
ABOVE_ONE = Range("> 1", lambda v: v > 1, {"gt": 1})
COUNT = Range("an integer >= 1", lambda v: v >= 1, {"ge": 1}, integer=True)
NON_NEGATIVE_INT = Range("an integer >= 0", lambda v: v >= 0, {"ge": 0}, integer=True)

# The help groups of ``oprl config --help`` (``AlgorithmConfig.GROUPS``), in the order they are printed.
ADVANTAGES = "advantages"
BAND = "clip band and masks"
WEIGHTS = "importance weights"
OBJECTIVE = "objective, regulariser and aggregation"
AFTER_THE_PAPER = "methods after the paper"
DELIGHT = "delight (DG, the Kondo gate)"
DISTILLATION = "distillation"
REFERENCE = "reference KL and entropy"


@dataclass(frozen=True)
class Knob:
    """What ``knob`` declares beside the default (``dataclasses.Field.metadata["knob"]``)."""

    meaning: str
    """The ``algorithm.<name>`` help text."""
    why: str | None
    """The reason and source of oprl's default (printed beside the preset's value)."""
    range: Range | None
    """Valid numbers; a default of None also allows None ("or unset": the option is off)."""
    choices: bool
    """The value is a key of the registry of the same name (``presets.REGISTRIES``)."""
    group: str
    """Its help group."""
    in_preset: bool
    """A preset sets it (``ALGORITHM_DEFAULTS``; the config field is None = the preset's value); False: a run knob
    with its own default in the config (the reference KL and the entropy bonus)."""


def knob(
    default: Any,
    meaning: str,
    *,
    group: str,
    why: str | None = None,
    range: Range | None = None,
    choices: bool = False,
    in_preset: bool = True,
) -> Any:
    """One algorithm knob: a dataclass field whose metadata carries everything else about it (``Knob``)."""
    return field(default=default, metadata={"knob": Knob(meaning, why, range, choices, group, in_preset)})


@dataclass(frozen=True)
class Advantages:
    """The keywords of ``group_advantages`` (``advantages.py``; its docstring has the formulas)."""

    std_normalize: bool = knob(
        False,
        "Divide advantages by the group's population std + 1e-6 (GRPO).",
        why="plain r − mean, as derived; GRPO divides by the std",
        group=ADVANTAGES,
    )
    mean_normalize: bool = knob(
        False,
        "Divide advantages by the group's mean reward (MaxRL: A = r/mean - 1; 0 where the mean is <= 0); an "
        "alternative to std_normalize.",
        why="MaxRL (arXiv 2602.02710; prime-rl max_rl): A = r/mean − 1, rewards ≥ 0",
        group=ADVANTAGES,
    )
    drop: str = knob(
        "none",
        "``balance`` = RED-Drop: drop surplus negatives so each group has as many negatives as positives, "
        "baseline over the kept ones; ``probabilistic`` = Trinity-RFT's first RED-Drop: drop each negative "
        "with probability 1 - #pos/#neg, baseline over the whole group; ``none`` keeps every response.",
        why='"none" keeps every response; "balance" is RED-Drop, "probabilistic" its first version',
        choices=True,
        group=ADVANTAGES,
    )
    keep_dropped: bool = knob(
        False,
        "RED-Drop: keep dropped responses in the batch with advantage 0, so they count in the loss "
        "denominators (Trinity-RFT's final version); false removes them (the batch then equals one without "
        "them).",
        why="dropped responses leave the batch (True: they stay with A = 0, in the denominators)",
        group=ADVANTAGES,
    )
    baseline_shift: float = knob(
        0.0,
        "AsymRE: baseline = group mean - baseline_shift.",
        why="AsymRE's δ: baseline = mean − δ",
        group=ADVANTAGES,
    )
    baseline: str = knob(
        "mean",
        "Group baseline: mean, the OPMD soft baseline tau*log(mean(exp(r/tau))), or off-policy-optimal (VCPO:"
        " sum u*r / sum u with u_i = w_i^2 * |grad log pi(y_i)|^2; the trainer computes the score norms with "
        "one backward pass per response).",
        why='or "logavgexp" (OPMD\'s soft baseline)',
        choices=True,
        group=ADVANTAGES,
    )
    tau: float = knob(
        1.0,
        "Temperature of the logavgexp baseline (> 0).",
        why="temperature of the logavgexp baseline",
        range=POSITIVE,
        group=ADVANTAGES,
    )
    red_weight: str = knob(
        "none",
        "Adaptive RED-Weight (arXiv 2606.20002; Trinity-RFT's cod advantage), applied only where the token-"
        "weighted sum of the advantages sum_i A_i*L_i is negative (L_i = response i's loss tokens): "
        "``adaptive`` = A_i*exp(A_i/T), T in [0.8, 100] bisected to bring the sum to about 0 (preset red-"
        "weight-adaptive); ``shift`` = A_i minus the token-weighted mean (red-weight-shift); ``none``. Logged"
        " as adv/red_weight_temperature and adv/red_weight_fired_frac. Not with weight=advantage (the fixed-T"
        " RED-Weight); oprl train only (not TRL/verl).",
        why='adaptive RED-Weight (arXiv 2606.20002): "adaptive" or "shift" where Σ A·L < 0',
        choices=True,
        group=ADVANTAGES,
    )
    red_weight_level: str = knob(
        "batch",
        "The set red_weight balances: ``batch`` (the whole training batch, Trinity-RFT's default) or "
        "``group`` (each prompt's responses, Trinity-RFT's ``task`` level).",
        why="its set: the whole batch (Trinity-RFT's default) or each prompt's \"group\"",
        choices=True,
        group=ADVANTAGES,
    )

    def keywords(self) -> dict[str, Any]:
        """``group_advantages``' keyword arguments."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class LossParams:
    """Every setting of ``policy_loss`` (``losses.py``), one typed value: which rule of each kind (a registry name)
    and the numbers the rules read; ``LossParams()`` is plain group-relative REINFORCE.

    ``policy_loss`` hands the rules (masks, weights, objectives: ``(ratio, advantages, params)``) a copy that
    also carries the call's tensors (B, T): ``mask``, the detached current ``logprobs`` and the anchor's
    ``anchor_logprobs``, for rules on probabilities (DPPO) or on the whole batch (M2PO, BAPO); they are None in
    the stored settings, as is ``normalizer`` unless the run fixes it."""

    clip_mode: str = knob(
        "none",
        "Token mask M: none, one-side (where PPO-clip has gradient), two-side, ring, mask (rho outside "
        "[mask_low, mask_high] gets no gradient); dppo-tv, dppo-kl, m2-mask, m2-mask-areal, m2-clip, bapo "
        "(docs/algorithms.md).",
        why="M = 1: REINFORCE as derived, nothing masked (the presets choose a clip)",
        choices=True,
        group=BAND,
    )
    weight: str = knob(
        "none",
        "Per-token weight (detached): none (NoIS), importance-sampling (rho), truncated-is (min(rho, "
        "is_cap)), clipped-is (CISPO), advantage (exp(A/T), RED-Weight), flipped-is (ASPO), tapered (TOPR), "
        "soft-gate (SAPO).",
        why='w = 1: "NoIS", the group-relative gradient without importance weights (paper, finding 1)',
        choices=True,
        group=WEIGHTS,
    )
    ratio_level: str = knob(
        "token",
        "``token``: rho per token; ``sequence``: each response's geometric-mean ratio exp(mean_t log rho_t) "
        "on all its tokens, for the mask and the weight (GSPO; sequence-level TIS and masking); ``sequence-"
        "sum``: prod_t rho_t.",
        why='or "sequence": each response\'s geometric-mean ratio (GSPO)',
        choices=True,
        group=BAND,
    )
    eps_low: float = knob(
        0.2,
        "Clip band lower edge: rho >= 1 - eps_low (>= 0).",
        why="PPO's ε (Schulman et al. 2017)",
        range=NON_NEGATIVE,
        group=BAND,
    )
    eps_high: float = knob(
        0.2,
        "Clip band upper edge: rho <= 1 + eps_high (>= 0).",
        why="PPO's symmetric band; DAPO's clip-higher raises it (0.28)",
        range=NON_NEGATIVE,
        group=BAND,
    )
    eps_low_prime: float = knob(
        0.6,
        "Ring clipping: positive-advantage tokens are also kept where rho <= 1 - eps_low_prime.",
        why="ring extremes: ρ ≤ 0.4 (A ≥ 0) and ρ ≥ 3.0 (A ≤ 0)",
        range=NON_NEGATIVE,
        group=BAND,
    )
    eps_high_prime: float = knob(
        2.0,
        "Ring clipping: negative-advantage tokens are also kept where rho >= 1 + eps_high_prime.",
        why="the paper's REC-Ring extremes (Yao et al. 2025)",
        range=NON_NEGATIVE,
        group=BAND,
    )
    mask_low: float = knob(
        0.5,
        "clip_mode=mask: tokens (responses, with ratio_level=sequence) with rho < mask_low get no gradient "
        "(masked IS / IcePop); must be < mask_high.",
        why="clip_mode=mask keeps 0.5 ≤ ρ ≤ 2.0 (symmetric in log ρ)",
        range=NON_NEGATIVE,
        group=BAND,
    )
    mask_high: float = knob(
        2.0,
        "clip_mode=mask: tokens with rho > mask_high get no gradient.",
        why="1/mask_low: the rejection band symmetric in log ρ (IcePop; verl's rollout_rs)",
        range=POSITIVE,
        group=BAND,
    )
    is_cap: float = knob(
        2.0,
        "C (> 0): truncated-is uses min(rho, C); decoupled PPO caps its behaviour weight pi_prox/pi_behaviour"
        " at C. 2.0 by default (verl's rollout_is_threshold); larger C = less bias, more variance.",
        why="C of truncated-is and of decoupled PPO's behaviour weight (verl's rollout_is_threshold)",
        range=POSITIVE,
        group=WEIGHTS,
    )
    recompute_proximal: bool = knob(
        False,
        "Decoupled PPO (AReaL): before each step's update the trainer recomputes the log-probs of the batch "
        "with its pre-update weights (pi_prox, one no-grad forward); the clip and the weight then use "
        "pi/pi_prox, times min(pi_prox/pi_behaviour, is_cap). Costs one extra forward per step.",
        why="decoupled PPO: the trainer recomputes π_prox before the update",
        group=WEIGHTS,
    )
    regularizer: str = knob(
        "none",
        "Regulariser on every valid token: squared-log-ratio c*(logprobs - behavior_logprobs)^2 (OPMD) or "
        "forward-kl -c*logprobs (AsymRE).",
        why="OPMD's squared log-ratio and AsymRE's forward KL are the presets' choice",
        choices=True,
        group=OBJECTIVE,
    )
    regularizer_coef: float = knob(
        0.0,
        "Coefficient c of the regulariser (>= 0).",
        why="c of the regulariser (OPMD's preset: 0.1; AsymRE's: 0.1)",
        range=NON_NEGATIVE,
        group=OBJECTIVE,
    )
    weight_temperature: float = knob(
        1.0,
        "RED-Weight temperature T in w = exp(A/T) (> 0; not the sampling temperature).",
        why="RED-Weight's T in exp(A/T) (not the sampling temperature)",
        range=POSITIVE,
        group=WEIGHTS,
    )
    loss_agg: str = knob(
        "token-mean",
        "How token losses are averaged over the optimizer batch (token-mean = over all valid tokens).",
        why="Σ ℓ·m / Σ m over the optimizer batch",
        choices=True,
        group=OBJECTIVE,
    )
    objective: str = knob(
        "policy-gradient",
        "policy-gradient: -M*w*A*logprobs; advantage-regression: OAPL's (regression_beta*log(pi/pi_b) - A)^2.",
        why='−M·w·A·logprobs; "advantage-regression" is OAPL\'s squared residual',
        choices=True,
        group=OBJECTIVE,
    )
    m2_threshold: float = knob(
        0.04,
        "M2PO (clip_mode=m2-mask, m2-mask-areal, m2-clip): the bound tau_M2 on the mean of (log rho)^2.",
        why="M2PO's τ_M2 (Zheng et al. 2025: the paper's and the authors' scripts' value)",
        range=NON_NEGATIVE,
        group=AFTER_THE_PAPER,
    )
    tau_pos: float = knob(
        1.0,
        "SAPO (weight=soft-gate): gate temperature of tokens with A > 0.",
        why="SAPO's gate temperature for A > 0 (Gao et al. 2025; verl / Trinity-RFT defaults)",
        range=POSITIVE,
        group=AFTER_THE_PAPER,
    )
    tau_neg: float = knob(
        1.05,
        "SAPO (weight=soft-gate): gate temperature of tokens with A <= 0.",
        why="SAPO's for A ≤ 0: slightly steeper, negative updates are attenuated sooner",
        range=POSITIVE,
        group=AFTER_THE_PAPER,
    )
    bapo_target: float = knob(
        0.5,
        "BAPO (clip_mode=bapo): the share rho_0 of the clipped update the positive tokens must reach (0..1).",
        why="BAPO's ρ₀: the share of the clipped update the positive tokens must reach",
        range=SHARE,
        group=AFTER_THE_PAPER,
    )
    bapo_low_max: float = knob(
        0.9,
        "BAPO: the lower ratio bound rises from 1 - eps_low up to this.",
        why="BAPO's b₋: c_low rises from 1 − eps_low up to this",
        range=NON_NEGATIVE,
        group=AFTER_THE_PAPER,
    )
    bapo_high_max: float = knob(
        3.0,
        "BAPO: the upper ratio bound rises from 1 + eps_high up to this.",
        why="BAPO's b₊: c_high rises from 1 + eps_high up to this",
        range=POSITIVE,
        group=AFTER_THE_PAPER,
    )
    dual_clip: float | None = knob(
        None,
        "Dual-clip PPO's c (> 1; off unless a preset sets it, bapo-dual: 3, BAPO's code): tokens with A < 0 "
        "and rho > c get no gradient (logged as loss/dual_clip_frac); off: the preset without it (bapo for "
        "bapo-dual).",
        why="off; BAPO's code (and verl's clip_ratio_c) caps A < 0 tokens at c = 3: ρ > c gets no gradient",
        range=ABOVE_ONE,
        group=AFTER_THE_PAPER,
    )
    entropy_eps: float | None = knob(
        None,
        "ASPO's code's entropy-dependent band (off unless a preset sets it, aspo-entropy: 0.4): the tokens "
        "above their response's entropy_quantile of token entropy use eps_low = eps_high = entropy_eps, the "
        "rest keep eps_low/eps_high (clip_mode one-side/two-side/ring or weight=clipped-is; oprl train only, "
        "not TRL/verl/Tinker). Logged as loss/entropy_wide_frac.",
        why="off; ASPO's code: ε of the tokens above a response's entropy quantile (0.4 there)",
        range=NON_NEGATIVE,
        group=AFTER_THE_PAPER,
    )
    entropy_quantile: float = knob(
        0.8,
        "entropy_eps: the per-response quantile (0..1, 0.8 in ASPO's code) at or below which a token keeps the band.",
        why="ASPO's code (token_entropy_quantile): tokens at or below it keep eps_low/eps_high",
        range=SHARE,
        group=AFTER_THE_PAPER,
    )
    regression_beta: float = knob(
        0.001,
        "OAPL (objective=advantage-regression): beta on each response's log-ratio sum_t log(pi/pi_b).",
        why="OAPL's β (β2 in the authors' scripts) on Σ_t log(π/π_b)",
        range=NON_NEGATIVE,
        group=AFTER_THE_PAPER,
    )
    vespo_k_pos: float = knob(
        2.0,
        "VESPO (weight=gamma): shape k of phi(w) = e^lam * w^k * e^(-lam*w) for A >= 0 (>= 0).",
        why="VESPO's shape k₊ for A ≥ 0 (arXiv 2602.10693; TRL's GRPOConfig defaults)",
        range=NON_NEGATIVE,
        group=AFTER_THE_PAPER,
    )
    vespo_lambda_pos: float = knob(
        3.0,
        "VESPO: rate lam for A >= 0 (> 0); phi peaks at w = k/lam.",
        why="VESPO's rate λ₊ for A ≥ 0: φ peaks at w = k/λ < 1, damping w > 1",
        range=POSITIVE,
        group=AFTER_THE_PAPER,
    )
    vespo_k_neg: float = knob(
        3.0,
        "VESPO: shape k for A < 0 (>= 0).",
        why="VESPO's k₋ for A < 0",
        range=NON_NEGATIVE,
        group=AFTER_THE_PAPER,
    )
    vespo_lambda_neg: float = knob(
        2.0,
        "VESPO: rate lam for A < 0 (> 0).",
        why="VESPO's λ₋ for A < 0: φ peaks at w = 1.5, damping w < 1",
        range=POSITIVE,
        group=AFTER_THE_PAPER,
    )
    delight_temperature: float | None = knob(
        None,
        "Delightful policy gradient (arXiv 2603.14608; preset dg): each token's policy-gradient term times "
        "sigmoid(A*(-log pi)/eta), eta = this (> 0; 1 in the paper), detached, on top of any clip and weight;"
        " off unless a preset sets it. Logged as loss/delight_mean and loss/delight_gate_mean.",
        why="off; DG (arXiv 2603.14608): each token's term times σ(A·(−log π)/η), η = 1 there",
        range=POSITIVE,
        group=DELIGHT,
    )
    score_centering: bool = knob(
        False,
        "Score centering (arXiv 2609.20807; NeMo RL's loss_fn.score_centering; presets reinforce-sc, rec-oneside-"
        "nois-sc, tis-token-sc): add A*sum_{v in H} sg(m_v - alpha*p_v)*log p_v to each token's loss, H the "
        "sampler's top-K (needs rollout.record_top_k > 0), m = q and alpha = rho without IS (weight=none), the "
        "TIS form with weight=truncated-is (docs/algorithms.md#score-centering). Logged as loss/score_centering*.",
        why="off; score centering (arXiv 2609.20807) subtracts the sampler-expected score, from the top-K",
        group=AFTER_THE_PAPER,
    )
    normalizer: float | None = None
    """``seq-mean-token-sum-norm``'s fixed denominator (Dr.GRPO: the response budget); None = the batch's."""
    mask: torch.Tensor | None = field(default=None, repr=False)
    logprobs: torch.Tensor | None = field(default=None, repr=False)
    anchor_logprobs: torch.Tensor | None = field(default=None, repr=False)
    top_k: Any = field(default=None, repr=False)
    """The micro-batch's ``top_k.TopKTokens`` (detached) where the step needs them (``Needs.top_k``), for the
    masks on the sampler's top-K (DPPO's Top-K divergence); None otherwise."""

    @classmethod
    def of(cls, settings: Mapping[str, Any], **extra: Any) -> LossParams:
        """Deprecated (``Algorithm.of(...).loss``): the loss's part of complete settings (other keys are left
        out), with ``extra`` fields on top."""
        return cls(**({key: settings[key] for key in knob_names(cls) if key in settings} | extra))


@dataclass(frozen=True)
class StepSize:
    """The step-size rule (``variance.step_size``): VCPO's ESS-scaled learning rate, or the configured one."""

    ess_lr: str = knob(
        "none",
        "VCPO (arXiv 2602.17616): each optimizer step's learning rate times g(min(1, ESS/ess_lr_base)), ESS ="
        " (sum w)^2/(N*sum w^2) of the mini-batch's responses' importance weights w_i = prod_t rho_t; g = "
        "sqrt (the authors' rule for AdamW), linear, or none (the configured rate). Logged as vcpo/lr_scale "
        "and vcpo/ess.",
        why="the learning rate as configured; VCPO (arXiv 2602.17616) scales it by √min(1, ESS/base)",
        choices=True,
        group=AFTER_THE_PAPER,
    )
    ess_lr_base: float = knob(
        1.0,
        "VCPO: the ESS (0..1] at or above which ess_lr leaves the step unscaled (the authors' base_ess_ratio, 1.0).",
        why="VCPO's base_ess_ratio (the authors' scripts): any ESS < 1 shrinks the step",
        range=POSITIVE,
        group=AFTER_THE_PAPER,
    )


@dataclass(frozen=True)
class Gate:
    """The Kondo gate (``delight.kondo_gate``, arXiv 2603.20526): which responses get a backward pass."""

    kondo_rate: float | None = knob(
        None,
        "The Kondo gate (arXiv 2603.20526; preset dg-kondo: 0.5): rho in (0, 1], the share of responses whose"
        " backward pass runs; each passes with probability sigmoid((chi - lambda)/kondo_temperature), chi its"
        " token-mean delight, lambda the (1 - rho)-quantile of chi over the last kondo_window responses; a "
        "skipped one trains with A = 0. Costs one forward without grad per step; oprl train only (not "
        "TRL/verl). Logged as kondo/*.",
        why="off; the Kondo gate (arXiv 2603.20526): ρ, the share of responses given a backward pass",
        range=RATE,
        group=DELIGHT,
    )
    kondo_temperature: float = knob(
        1.0,
        "The Kondo gate's eta (> 0; 1.0).",
        why="η of its pass probability σ((χ − λ)/η): the paper's and DG's scale of delight",
        range=POSITIVE,
        group=DELIGHT,
    )
    kondo_window: int = knob(
        1024,
        "The Kondo gate's rolling window, in responses (this step's included; 1024).",
        why="responses whose (1 − ρ)-quantile of delight is the price λ (oprl's choice: ~8 steps)",
        range=COUNT,
        group=DELIGHT,
    )


@dataclass(frozen=True)
class Distill:
    """The teacher's per-token advantage (``distill.teacher_advantages``; docs/algorithms.md#distillation)."""

    distill_coef: float = knob(
        0.0,
        "Distillation (docs/algorithms.md#distillation; needs teacher.path or a store scored by ``oprl "
        "teacher-score``): c in the per-token advantage A_t = A_group + c*(log pi_teacher(y_t) - log "
        "pi_behaviour(y_t)), the negative reverse-KL estimate of the published on-policy distillation recipes"
        " (tinker-cookbook, verl opd; 1.0 there). 0 = no teacher signal (the default of every preset but "
        "``distill``).",
        why="c in A_t = A_group + c·(log π_teacher − log π_b); 0 = no teacher signal",
        range=NON_NEGATIVE,
        group=DISTILLATION,
    )
    distill_mix: str = knob(
        "add",
        "``add``: the teacher's term is added to the task reward's group advantage; ``replace``: it replaces "
        "it (pure distillation, the ``distill`` preset: the reward is then only logged).",
        why='"add" to the group advantage, or "replace" it (pure distillation)',
        choices=True,
        group=DISTILLATION,
    )
    logprob_floor: float = LOGPROB_FLOOR
    """``teacher.logprob_floor``: the least teacher log-prob used (−inf outside a truncated teacher's support)."""


@dataclass(frozen=True)
class Reference:
    """The KL to the frozen initial policy (``kl.kl_penalty``)."""

    kl_coef: float = knob(
        0.0,
        "Coefficient of a KL penalty to the frozen initial policy (0 = off, no reference model kept).",
        range=NON_NEGATIVE,
        group=REFERENCE,
        in_preset=False,
    )
    kl_estimator: str = knob(
        "k3",
        "Per-token KL estimator of the reference penalty (Schulman's k1/k2/k3).",
        choices=True,
        group=REFERENCE,
        in_preset=False,
    )
    log_ref_kl_every: int = knob(
        0,
        "Log ``kl/ref`` (the estimator above, current vs initial policy, token mean) every N trainer steps "
        "even when kl_coef is 0; 0 = never. Keeps a frozen copy of the initial model and costs one extra no-"
        "grad forward on the steps that log it (with kl_coef > 0 it is computed and logged every step "
        "anyway).",
        range=NON_NEGATIVE_INT,
        group=REFERENCE,
        in_preset=False,
    )


@dataclass(frozen=True)
class Entropy:
    """The entropy bonus: loss − entropy_coef·aggregate(entropy)."""

    entropy_coef: float = knob(
        0.0,
        "Entropy bonus coefficient (0 = off).",
        range=NON_NEGATIVE,
        group=REFERENCE,
        in_preset=False,
    )


STAGES: tuple[type, ...] = (Advantages, LossParams, StepSize, Gate, Distill, Reference, Entropy)
"""The stage dataclasses, in ``Algorithm``'s order (which is also the help's)."""


def knob_names(stage: type) -> tuple[str, ...]:
    """The knobs of a stage dataclass, in declaration order (its other fields are filled by the run)."""
    return tuple(f.name for f in dataclasses.fields(stage) if "knob" in f.metadata)


FIELDS: dict[str, dataclasses.Field] = {
    f.name: f for s in STAGES for f in dataclasses.fields(s) if "knob" in f.metadata
}
"""Every knob's dataclass field (its default and type), by name, in the stages' order."""
KNOBS: dict[str, Knob] = {name: f.metadata["knob"] for name, f in FIELDS.items()}
"""Every knob's declaration, by name."""


def default(name: str) -> Any:
    """Knob ``name``'s default."""
    return FIELDS[name].default


def preset_defaults() -> dict[str, Any]:
    """``ALGORITHM_DEFAULTS``: the default of every knob a preset sets, by name (a new dict)."""
    return {name: default(name) for name, spec in KNOBS.items() if spec.in_preset}


def range_error(name: str, value: Any) -> str | None:
    """One line saying why ``value`` is not valid for knob ``name`` by its own declaration (its type when
    boolean, its ``Range``), or None. Registry names and rules across knobs are ``presets.validate_settings``'."""
    spec, declared = KNOBS[name], FIELDS[name].type
    if declared == "bool":
        return None if isinstance(value, bool) else f"{name} must be true or false, got {value!r}"
    if spec.range is None or (value is None and default(name) is None):
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value)
    if number and (not spec.range.integer or isinstance(value, int)) and spec.range.holds(value):
        return None
    unset = " or unset" if default(name) is None else ""
    return f"{name} must be {spec.range.text}{unset}, got {value!r}"
