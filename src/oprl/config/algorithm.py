"""The ``algorithm`` section of the run config: a named preset plus per-setting overrides of the loss.

Every field carries its default and meaning in the docstring under it (``oprl config --help`` prints them). The
valid strings of the variant fields are the live registries of ``oprl.algorithms`` (plug-ins join them through
``oprl.config.choices``), so this module holds no list of names of its own.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Annotated, ClassVar, Literal, TypeAlias

from pydantic import AfterValidator, Field

from oprl.algorithms import ESS_LR_RULES, KL_ESTIMATORS, RED_WEIGHT_LEVELS, RED_WEIGHT_RULES
from oprl.config.choices import CHOICE_SETTINGS, resolve_choice
from oprl.tasks.section import Section as _Section

if TYPE_CHECKING:  # the type checker sees strings; at run time each is the Literal of a registry's keys
    Drop: TypeAlias = str
    Baseline: TypeAlias = str
    ClipMode: TypeAlias = str
    Weight: TypeAlias = str
    RatioLevel: TypeAlias = str
    Regularizer: TypeAlias = str
    LossAgg: TypeAlias = str
    Objective: TypeAlias = str
    KlEstimator: TypeAlias = str
    EssLr: TypeAlias = str
    RedWeight: TypeAlias = str
    RedWeightLevel: TypeAlias = str
else:  # the live registries in oprl.algorithms are the one list of valid names, plug-ins join them (choices.py)
    Drop, Baseline, ClipMode, Weight, RatioLevel, Regularizer, LossAgg, Objective = (
        Annotated[str, AfterValidator(functools.partial(resolve_choice, key))] for key in CHOICE_SETTINGS
    )
    KlEstimator = Literal[tuple(KL_ESTIMATORS)]
    EssLr = Literal[tuple(ESS_LR_RULES)]
    RedWeight = Literal[tuple(RED_WEIGHT_RULES)]
    RedWeightLevel = Literal[RED_WEIGHT_LEVELS]


class AlgorithmConfig(_Section):
    """A named preset (docs/paper.md#presets, docs/algorithms.md) plus optional per-setting overrides; ``None`` =
    the preset's value.

    The valid strings come from the registries in ``oprl.algorithms`` and every value is checked by
    ``oprl.algorithms.validate_settings`` (ranges included) when the preset is resolved. ``oprl config --help``
    lists the fields in the groups below, each with the preset's value and, where oprl's own default has a
    reason or a source, that reason (the comments of ``oprl.algorithms.defaults``)."""

    GROUPS: ClassVar[dict[str, tuple[str, ...]]] = {
        "preset": ("preset",),
        "advantages": (
            "std_normalize", "mean_normalize", "drop", "keep_dropped", "baseline_shift", "baseline", "tau",
            "red_weight", "red_weight_level",
        ),
        "clip band and masks": (
            "clip_mode", "ratio_level", "eps_low", "eps_high", "eps_low_prime", "eps_high_prime", "mask_low",
            "mask_high",
        ),
        "importance weights": ("weight", "is_cap", "weight_temperature", "recompute_proximal"),
        "objective, regulariser and aggregation": ("objective", "regularizer", "regularizer_coef", "loss_agg"),
        "methods after the paper": (
            "m2_threshold", "tau_pos", "tau_neg", "bapo_target", "bapo_low_max", "bapo_high_max", "dual_clip",
            "entropy_eps", "entropy_quantile", "regression_beta",
            "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg", "ess_lr", "ess_lr_base",
        ),
        "delight (DG, the Kondo gate)": ("delight_temperature", "kondo_rate", "kondo_temperature", "kondo_window"),
        "distillation": ("distill_coef", "distill_mix"),
        "reference KL and entropy": ("kl_coef", "kl_estimator", "log_ref_kl_every", "entropy_coef"),
    }  # fmt: skip
    """The help's groups of this section's fields (``RolloutConfig.GROUPS`` does the same for ``rollout``)."""

    preset: str = "grpo"
    """Algorithm preset: reinforce, grpo, rec-oneside-is, rec-oneside-nois, rec-twoside-*, rec-ring-*, the
    ``-wide`` variants, opmd, asymre, red-drop, red-weight, ... (``oprl.algorithms.PRESETS``, docs/algorithms.md)."""
    std_normalize: bool | None = None
    """Divide advantages by the group's population std + 1e-6 (GRPO)."""
    mean_normalize: bool | None = None
    """Divide advantages by the group's mean reward (MaxRL: A = r/mean - 1; 0 where the mean is <= 0); an
    alternative to std_normalize."""
    drop: Drop | None = None
    """``balance`` = RED-Drop: drop surplus negatives so each group has as many negatives as positives, baseline
    over the kept ones; ``probabilistic`` = Trinity-RFT's first RED-Drop: drop each negative with probability
    1 - #pos/#neg, baseline over the whole group; ``none`` keeps every response."""
    keep_dropped: bool | None = None
    """RED-Drop: keep dropped responses in the batch with advantage 0, so they count in the loss denominators
    (Trinity-RFT's final version); false removes them (the batch then equals one without them)."""
    baseline_shift: float | None = None
    """AsymRE: baseline = group mean - baseline_shift."""
    baseline: Baseline | None = None
    """Group baseline: mean, the OPMD soft baseline tau*log(mean(exp(r/tau))), or off-policy-optimal (VCPO:
    sum u*r / sum u with u_i = w_i^2 * |grad log pi(y_i)|^2; the trainer computes the score norms with one backward
    pass per response)."""
    tau: float | None = None
    """Temperature of the logavgexp baseline (> 0)."""
    red_weight: RedWeight | None = None
    """Adaptive RED-Weight (arXiv 2606.20002; Trinity-RFT's cod advantage), applied only where the token-weighted
    sum of the advantages sum_i A_i*L_i is negative (L_i = response i's loss tokens): ``adaptive`` = A_i*exp(A_i/T),
    T in [0.8, 100] bisected to bring the sum to about 0 (preset red-weight-adaptive); ``shift`` = A_i minus the
    token-weighted mean (red-weight-shift); ``none``. Logged as adv/red_weight_temperature and
    adv/red_weight_fired_frac. Not with weight=advantage (the fixed-T RED-Weight); oprl train only (not TRL/verl)."""
    red_weight_level: RedWeightLevel | None = None
    """The set red_weight balances: ``batch`` (the whole training batch, Trinity-RFT's default) or ``group`` (each
    prompt's responses, Trinity-RFT's ``task`` level)."""
    clip_mode: ClipMode | None = None
    """Token mask M: none, one-side (where PPO-clip has gradient), two-side, ring, mask (rho outside
    [mask_low, mask_high] gets no gradient); dppo-tv, dppo-kl, m2-mask, m2-mask-areal, m2-clip, bapo
    (docs/algorithms.md)."""
    weight: Weight | None = None
    """Per-token weight (detached): none (NoIS), importance-sampling (rho), truncated-is (min(rho, is_cap)),
    clipped-is (CISPO), advantage (exp(A/T), RED-Weight), flipped-is (ASPO), tapered (TOPR), soft-gate (SAPO)."""
    ratio_level: RatioLevel | None = None
    """``token``: rho per token; ``sequence``: each response's geometric-mean ratio exp(mean_t log rho_t) on all
    its tokens, for the mask and the weight (GSPO; sequence-level TIS and masking); ``sequence-sum``: prod_t rho_t."""
    eps_low: float | None = None
    """Clip band lower edge: rho >= 1 - eps_low (>= 0)."""
    eps_high: float | None = None
    """Clip band upper edge: rho <= 1 + eps_high (>= 0)."""
    eps_low_prime: float | None = None
    """Ring clipping: positive-advantage tokens are also kept where rho <= 1 - eps_low_prime."""
    eps_high_prime: float | None = None
    """Ring clipping: negative-advantage tokens are also kept where rho >= 1 + eps_high_prime."""
    mask_low: float | None = None
    """clip_mode=mask: tokens (responses, with ratio_level=sequence) with rho < mask_low get no gradient
    (masked IS / IcePop); must be < mask_high."""
    mask_high: float | None = None
    """clip_mode=mask: tokens with rho > mask_high get no gradient."""
    is_cap: float | None = None
    """C (> 0): truncated-is uses min(rho, C); decoupled PPO caps its behaviour weight pi_prox/pi_behaviour at C.
    2.0 by default (verl's rollout_is_threshold); larger C = less bias, more variance."""
    recompute_proximal: bool | None = None
    """Decoupled PPO (AReaL): before each step's update the trainer recomputes the log-probs of the batch with
    its pre-update weights (pi_prox, one no-grad forward); the clip and the weight then use pi/pi_prox, times
    min(pi_prox/pi_behaviour, is_cap). Costs one extra forward per step."""
    regularizer: Regularizer | None = None
    """Regulariser on every valid token: squared-log-ratio c*(logprobs - behavior_logprobs)^2 (OPMD) or
    forward-kl -c*logprobs (AsymRE)."""
    regularizer_coef: float | None = None
    """Coefficient c of the regulariser (>= 0)."""
    weight_temperature: float | None = None
    """RED-Weight temperature T in w = exp(A/T) (> 0; not the sampling temperature)."""
    loss_agg: LossAgg | None = None
    """How token losses are averaged over the optimizer batch (token-mean = over all valid tokens)."""
    objective: Objective | None = None
    """policy-gradient: -M*w*A*logprobs; advantage-regression: OAPL's (regression_beta*log(pi/pi_b) - A)^2."""
    m2_threshold: float | None = None
    """M2PO (clip_mode=m2-mask, m2-mask-areal, m2-clip): the bound tau_M2 on the mean of (log rho)^2."""
    tau_pos: float | None = None
    """SAPO (weight=soft-gate): gate temperature of tokens with A > 0."""
    tau_neg: float | None = None
    """SAPO (weight=soft-gate): gate temperature of tokens with A <= 0."""
    bapo_target: float | None = None
    """BAPO (clip_mode=bapo): the share rho_0 of the clipped update the positive tokens must reach (0..1)."""
    bapo_low_max: float | None = None
    """BAPO: the lower ratio bound rises from 1 - eps_low up to this."""
    bapo_high_max: float | None = None
    """BAPO: the upper ratio bound rises from 1 + eps_high up to this."""
    dual_clip: float | None = None
    """Dual-clip PPO's c (> 1; off unless a preset sets it, bapo-dual: 3, BAPO's code): tokens with A < 0 and
    rho > c get no gradient (logged as loss/dual_clip_frac); off: the preset without it (bapo for bapo-dual)."""
    entropy_eps: float | None = None
    """ASPO's code's entropy-dependent band (off unless a preset sets it, aspo-entropy: 0.4): the tokens above
    their response's entropy_quantile of token entropy use eps_low = eps_high = entropy_eps, the rest keep
    eps_low/eps_high (clip_mode one-side/two-side/ring or weight=clipped-is; oprl train only, not TRL/verl/Tinker).
    Logged as loss/entropy_wide_frac."""
    entropy_quantile: float | None = None
    """entropy_eps: the per-response quantile (0..1, 0.8 in ASPO's code) at or below which a token keeps the band."""
    regression_beta: float | None = None
    """OAPL (objective=advantage-regression): beta on each response's log-ratio sum_t log(pi/pi_b)."""
    vespo_k_pos: float | None = None
    """VESPO (weight=gamma): shape k of phi(w) = e^lam * w^k * e^(-lam*w) for A >= 0 (>= 0)."""
    vespo_lambda_pos: float | None = None
    """VESPO: rate lam for A >= 0 (> 0); phi peaks at w = k/lam."""
    vespo_k_neg: float | None = None
    """VESPO: shape k for A < 0 (>= 0)."""
    vespo_lambda_neg: float | None = None
    """VESPO: rate lam for A < 0 (> 0)."""
    ess_lr: EssLr | None = None
    """VCPO (arXiv 2602.17616): each optimizer step's learning rate times g(min(1, ESS/ess_lr_base)), ESS =
    (sum w)^2/(N*sum w^2) of the mini-batch's responses' importance weights w_i = prod_t rho_t; g = sqrt (the
    authors' rule for AdamW), linear, or none (the configured rate). Logged as vcpo/lr_scale and vcpo/ess."""
    ess_lr_base: float | None = None
    """VCPO: the ESS (0..1] at or above which ess_lr leaves the step unscaled (the authors' base_ess_ratio, 1.0)."""
    delight_temperature: float | None = None
    """Delightful policy gradient (arXiv 2603.14608; preset dg): each token's policy-gradient term times
    sigmoid(A*(-log pi)/eta), eta = this (> 0; 1 in the paper), detached, on top of any clip and weight; off unless
    a preset sets it. Logged as loss/delight_mean and loss/delight_gate_mean."""
    kondo_rate: float | None = None
    """The Kondo gate (arXiv 2603.20526; preset dg-kondo: 0.5): rho in (0, 1], the share of responses whose
    backward pass runs; each passes with probability sigmoid((chi - lambda)/kondo_temperature), chi its token-mean
    delight, lambda the (1 - rho)-quantile of chi over the last kondo_window responses; a skipped one trains with
    A = 0. Costs one forward without grad per step; oprl train only (not TRL/verl). Logged as kondo/*."""
    kondo_temperature: float | None = None
    """The Kondo gate's eta (> 0; 1.0)."""
    kondo_window: int | None = None
    """The Kondo gate's rolling window, in responses (this step's included; 1024)."""
    distill_coef: float | None = None
    """Distillation (docs/algorithms.md#distillation; needs teacher.path or a store scored by ``oprl
    teacher-score``): c in the per-token advantage A_t = A_group + c*(log pi_teacher(y_t) - log pi_behaviour(y_t)),
    the negative reverse-KL estimate of the published on-policy distillation recipes (tinker-cookbook, verl opd;
    1.0 there). 0 = no teacher signal (the default of every preset but ``distill``)."""
    distill_mix: Literal["add", "replace"] | None = None
    """``add``: the teacher's term is added to the task reward's group advantage; ``replace``: it replaces it
    (pure distillation, the ``distill`` preset: the reward is then only logged)."""
    kl_coef: float = Field(0.0, ge=0.0)
    """Coefficient of a KL penalty to the frozen initial policy (0 = off, no reference model kept)."""
    kl_estimator: KlEstimator = "k3"
    """Per-token KL estimator of the reference penalty (Schulman's k1/k2/k3)."""
    log_ref_kl_every: int = Field(0, ge=0)
    """Log ``kl/ref`` (the estimator above, current vs initial policy, token mean) every N trainer steps even
    when kl_coef is 0; 0 = never. Keeps a frozen copy of the initial model and costs one extra no-grad forward
    on the steps that log it (with kl_coef > 0 it is computed and logged every step anyway)."""
    entropy_coef: float = Field(0.0, ge=0.0)
    """Entropy bonus coefficient (0 = off)."""
