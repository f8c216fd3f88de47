"""Named algorithms: each preset is a complete set of the knobs a preset sets (``ALGORITHM_DEFAULTS``, generated
from their one declaration in ``spec.py``), and the checks every resolved set passes.

``Algorithm.of(name, overrides)`` (``spec.py``) resolves a preset through ``complete_settings`` here; the config
key of a knob is ``algorithm.<name>``, the preset is chosen with ``algorithm.preset=<name>`` (e.g. ``oprl train
algorithm.preset=rec-oneside-nois algorithm.eps_high=2.0``). Sources: Yao et al. 2025, "Group-Relative
REINFORCE Is Secretly an Off-Policy Algorithm" (arXiv 2509.24203), unless an entry says otherwise.

Not here: the formulas (``advantages.py``, ``losses.py``), a knob's default or range (``spec.py``) or config
parsing (``oprl.config``)."""

import math
from collections.abc import Callable, Collection, Mapping
from typing import Any

from oprl.algorithms.advantages import BASELINES, DROP_RULES, WEIGHTED_BASELINES
from oprl.algorithms.aggregation import LOSS_AGGREGATIONS
from oprl.algorithms.defaults import ADVANTAGE_KEYS, ALGORITHM_DEFAULTS
from oprl.algorithms.distill import DISTILL_MIXES
from oprl.algorithms.kl import KL_ESTIMATORS
from oprl.algorithms.losses import CLIP_MODES, OBJECTIVES, RATIO_LEVELS, REGULARIZERS, WEIGHTS
from oprl.algorithms.red_weight import RED_WEIGHT_LEVELS, RED_WEIGHT_RULES
from oprl.algorithms.registry import unknown_name_message
from oprl.algorithms.score_centering import CENTERED_WEIGHTS
from oprl.algorithms.spec import KNOBS, default, range_error
from oprl.algorithms.topk_divergence import TOP_K_MASKS
from oprl.algorithms.variance import ESS_LR_RULES

_WIDE = {"eps_low": 0.6, "eps_high": 2.0}  # ρ ∈ [0.4, 3.0]: faster on- and near-policy (finding 3)
_IS = {"weight": "importance-sampling"}  # w = ρ (detached)
_STD = {"std_normalize": True}  # A = (r − mean)/(std + 1e-6)
_DPPO = {"weight": "truncated-is", "is_cap": 20.0, "loss_agg": "seq-mean-token-sum-norm"}  # DPPO's TIS, clip_ratio_c

_BAPO = {
    **ALGORITHM_DEFAULTS,
    **_STD,
    **_IS,
    "clip_mode": "bapo",
    "eps_low": 0.4,
    "eps_high": 0.2,
    "bapo_target": 0.5,
    "bapo_low_max": 0.9,
    "bapo_high_max": 3.0,
}  # BAPO's and its dual-clip variant's shared settings (below)
_ASPO = {**ALGORITHM_DEFAULTS, **_STD, "clip_mode": "one-side", "weight": "flipped-is", "is_cap": 3.0}

PRESETS: dict[str, dict[str, Any]] = {
    # Group-relative REINFORCE exactly as derived (docs/paper.md#derivation); unregularised, drifts when off-policy.
    "reinforce": {**ALGORITHM_DEFAULTS},
    # GRPO (Shao et al. 2024): PPO's one-sided clip with IS weights and std-normalised advantages.
    "grpo": {**ALGORITHM_DEFAULTS, **_STD, "clip_mode": "one-side", **_IS},
    "grpo-wide": {**ALGORITHM_DEFAULTS, **_STD, "clip_mode": "one-side", **_IS, **_WIDE},
    # REC (REINFORCE with Clipping): the clip is the regulariser (P1); IS optional (finding 1).
    "rec-oneside-is": {**ALGORITHM_DEFAULTS, "clip_mode": "one-side", **_IS},
    "rec-oneside-nois": {**ALGORITHM_DEFAULTS, "clip_mode": "one-side"},
    "rec-twoside-is": {**ALGORITHM_DEFAULTS, "clip_mode": "two-side", **_IS},
    "rec-twoside-nois": {**ALGORITHM_DEFAULTS, "clip_mode": "two-side"},
    "rec-ring-is": {**ALGORITHM_DEFAULTS, "clip_mode": "ring", **_IS},
    "rec-ring-nois": {**ALGORITHM_DEFAULTS, "clip_mode": "ring"},
    # The same with the paper's wide band (0.6, 2.0).
    "rec-oneside-is-wide": {**ALGORITHM_DEFAULTS, "clip_mode": "one-side", **_IS, **_WIDE},
    "rec-oneside-nois-wide": {**ALGORITHM_DEFAULTS, "clip_mode": "one-side", **_WIDE},
    "rec-twoside-is-wide": {**ALGORITHM_DEFAULTS, "clip_mode": "two-side", **_IS, **_WIDE},
    "rec-twoside-nois-wide": {**ALGORITHM_DEFAULTS, "clip_mode": "two-side", **_WIDE},
    "rec-ring-is-wide": {**ALGORITHM_DEFAULTS, "clip_mode": "ring", **_IS, **_WIDE},
    "rec-ring-nois-wide": {**ALGORITHM_DEFAULTS, "clip_mode": "ring", **_WIDE},
    # OPMD (Kimi k1.5, Team et al. 2025): REINFORCE + a squared log-ratio pull to the behaviour policy (P1).
    "opmd": {**ALGORITHM_DEFAULTS, "regularizer": "squared-log-ratio", "regularizer_coef": 0.1},
    # AsymRE (Arnal et al. 2025): a lowered baseline, written as the equivalent forward-KL term −c·logprobs.
    "asymre": {**ALGORITHM_DEFAULTS, "regularizer": "forward-kl", "regularizer_coef": 0.1},
    # RED-Drop: shape the data (P2) by dropping surplus negatives; the baseline is the kept subset's mean.
    "red-drop": {**ALGORITHM_DEFAULTS, "drop": "balance"},
    # RED-Weight: shape the data (P2) by weighting responses with exp(A/T), T = 1.
    "red-weight": {**ALGORITHM_DEFAULTS, "weight": "advantage", "weight_temperature": 1.0},
    # Adaptive RED-Weight (arXiv 2606.20002; Trinity-RFT's cod advantage, examples/research_cod): where the batch's
    # token-weighted advantage sum is negative, A = s·exp(s/T) with T ∈ [0.8, 100] bisected to bring it to 0; with
    # REC-OneSide-NoIS's loss (ε = 0.2), as in the authors' runs.
    "red-weight-adaptive": {**ALGORITHM_DEFAULTS, "clip_mode": "one-side", "red_weight": "adaptive"},
    # Its shift variant (red_weight_adv_shift): subtract the negative token-weighted mean instead.
    "red-weight-shift": {**ALGORITHM_DEFAULTS, "clip_mode": "one-side", "red_weight": "shift"},
    # RED-Drop as Trinity-RFT first had it: drop negatives with probability 1 − pos/neg, baseline of all K.
    "red-drop-probabilistic": {**ALGORITHM_DEFAULTS, "drop": "probabilistic"},
    # RED-Drop as Trinity-RFT has it now: balanced and re-centred, dropped rows kept with A = 0.
    "red-drop-keep": {**ALGORITHM_DEFAULTS, "drop": "balance", "keep_dropped": True},
    # The GSM8k settings of the authors' scripts: AsymRE's coefficient 0.2; the wide runs used std_normalize.
    "asymre-0.2": {**ALGORITHM_DEFAULTS, "regularizer": "forward-kl", "regularizer_coef": 0.2},
    "rec-oneside-nois-wide-std": {**ALGORITHM_DEFAULTS, **_STD, "clip_mode": "one-side", **_WIDE},
    # Corrections of the sampler–trainer mismatch the field uses now (docs/algorithms.md#off-policy-corrections).
    # Truncated IS (F. Yao et al. 2025; verl rollout_is, TRL, OpenRLHF): REINFORCE with w = min(ρ, 2).
    "tis-token": {**ALGORITHM_DEFAULTS, "weight": "truncated-is"},
    "tis-seq": {**ALGORITHM_DEFAULTS, "weight": "truncated-is", "ratio_level": "sequence"},
    # Masked IS / rejection (IcePop, Ling team 2025; verl rollout_rs): REINFORCE on tokens (responses) with
    # 0.5 ≤ ρ ≤ 2, no weight.
    "masked-is-token": {**ALGORITHM_DEFAULTS, "clip_mode": "mask"},
    "masked-is-seq": {**ALGORITHM_DEFAULTS, "clip_mode": "mask", "ratio_level": "sequence"},
    # Decoupled PPO (AReaL, Fu et al. 2025): GRPO's clip around the recomputed proximal policy, times the
    # behaviour weight min(π_prox/π_b, 2).
    "decoupled-ppo": {**ALGORITHM_DEFAULTS, **_STD, "clip_mode": "one-side", **_IS, "recompute_proximal": True},
    # GSPO (Zheng et al. 2025, arXiv 2507.18071): sequence-level ratio, PPO's one-sided clip at (3e-4, 4e-4),
    # each response's token mean (Trinity-RFT's gspo).
    "gspo": {
        **ALGORITHM_DEFAULTS,
        **_STD,
        "clip_mode": "one-side",
        **_IS,
        "ratio_level": "sequence",
        "eps_low": 3e-4,
        "eps_high": 4e-4,
        "loss_agg": "seq-mean-token-mean",
    },
    # LUSPO (arXiv 2602.05261; TRL loss_type="luspo"): GSPO's loss times each response's length |y|, i.e. the
    # token sum per response instead of its mean (removes GSPO's bias towards short responses).
    "luspo": {
        **ALGORITHM_DEFAULTS,
        **_STD,
        "clip_mode": "one-side",
        **_IS,
        "ratio_level": "sequence",
        "eps_low": 3e-4,
        "eps_high": 4e-4,
        "loss_agg": "seq-mean-token-sum",
    },
    # VESPO (arXiv 2602.10693; TRL loss_type="vespo"): no clip; the detached weight φ(w) = e^λ·w^k·e^(−λw) of the
    # response's ratio w = Π_t ρ_t, (k, λ) = (2, 3) for A ≥ 0 and (3, 2) for A < 0; GRPO's advantages; token mean.
    "vespo": {**ALGORITHM_DEFAULTS, **_STD, "weight": "gamma", "ratio_level": "sequence-sum"},
    # MaxRL (arXiv 2602.02710; prime-rl max_rl, TRL scale_rewards="mean"): A_i = r_i/mean_G(r) − 1, with GRPO's
    # clip and importance weights.
    "maxrl": {**ALGORITHM_DEFAULTS, "mean_normalize": True, "clip_mode": "one-side", **_IS},
    # CISPO (MiniMax-M1, arXiv 2506.13585): w = clip(ρ, 1 − ε_low, 1 + ε_high) detached, no token masked; no
    # lower bound (ε_low = 1), ε_high = 1 (oprl's choice: the cap 2 of tis-token).
    "cispo": {**ALGORITHM_DEFAULTS, **_STD, "weight": "clipped-is", "eps_low": 1.0, "eps_high": 1.0},
    # Dr. GRPO (Liu et al. 2025, arXiv 2503.20783): GRPO without std normalisation or length bias.
    "dr-grpo": {**ALGORITHM_DEFAULTS, "clip_mode": "one-side", **_IS, "loss_agg": "seq-mean-token-sum-norm"},
    # VCPO (Huang et al. 2026, arXiv 2602.17616; mit-han-lab/vcpo's scripts): the step's learning rate times
    # √min(1, ESS) of the responses' weights Π_t ρ_t, the off-policy optimal baseline Σu·r/Σu (u = w²·‖∇log π‖²)
    # divided by the group's std (norm_by_std), PPO's surrogate with no effective clip (w = ρ), token mean per response.
    "vcpo": {
        **ALGORITHM_DEFAULTS,
        **_STD,
        **_IS,
        "baseline": "off-policy-optimal",
        "loss_agg": "seq-mean-token-mean",
        "ess_lr": "sqrt",
        "ess_lr_base": 1.0,
    },
    # On-policy distillation (Agarwal et al. 2024; Thinking Machines 2025, tinker-cookbook's defaults): the
    # per-token advantage log π_teacher − log π_b replaces the reward's, w = ρ (tinker's importance_sampling
    # loss). Needs teacher.path (docs/algorithms.md#distillation); add clip_mode=one-side for REC's clip.
    "distill": {**ALGORITHM_DEFAULTS, **_IS, "distill_coef": 1.0, "distill_mix": "replace"},
    # The methods after the paper (docs/algorithms.md#the-arena-methods), with their authors' defaults.
    # DPPO (Qi et al. 2026, arXiv 2602.04879; verl dppo_tv/dppo_kl, the authors' port): mask the tokens whose
    # probability moved past δ in the harmful direction (eps_low/eps_high are δ here: TV 0.15, binary KL 0.05),
    # w = min(ρ, 20), A = r − mean, each response's token sum / T (the authors' run script).
    "dppo-tv": {**ALGORITHM_DEFAULTS, **_DPPO, "clip_mode": "dppo-tv", "eps_low": 0.15, "eps_high": 0.15},
    "dppo-kl": {**ALGORITHM_DEFAULTS, **_DPPO, "clip_mode": "dppo-kl", "eps_low": 0.05, "eps_high": 0.05},
    # DPPO's Top-K divergence (the paper's Top-K approximation; oprl's reading, docs/algorithms.md#dppo-top-k): the
    # same trust region on TV / KL over the sampler's top-K plus the rest as one bucket, same δ. Needs
    # rollout.record_top_k > 0.
    "dppo-tv-topk": {**ALGORITHM_DEFAULTS, **_DPPO, "clip_mode": "dppo-tv-topk", "eps_low": 0.15, "eps_high": 0.15},
    "dppo-kl-topk": {**ALGORITHM_DEFAULTS, **_DPPO, "clip_mode": "dppo-kl-topk", "eps_low": 0.05, "eps_high": 0.05},
    # M2PO (Zheng et al. 2025, arXiv 2510.01161, Algorithm 1): the paper's mask (drop the harmful token with the
    # largest (log ρ)² while M̂₂ > 0.04) with ρ-weighted GRPO advantages and no clip.
    "m2po": {**ALGORITHM_DEFAULTS, **_STD, **_IS, "clip_mode": "m2-mask", "m2_threshold": 0.04},
    # M2PO as AReaL implements it (actor.m2_threshold): every token is a candidate, strict M̂₂ < 0.04.
    "m2po-areal": {**ALGORITHM_DEFAULTS, **_STD, **_IS, "clip_mode": "m2-mask-areal", "m2_threshold": 0.04},
    # M2PO as the authors' released code does it (Infini-AI-Lab/M2PO, M2_budget 0.04): one-side clip bounds from
    # the budget over the harmful tokens, never narrower than [0.7, 1.5].
    "m2po-clip": {
        **ALGORITHM_DEFAULTS,
        **_STD,
        **_IS,
        "clip_mode": "m2-clip",
        "m2_threshold": 0.04,
        "eps_low": 0.3,
        "eps_high": 0.5,
    },
    # OAPL (Ritter et al. 2026, arXiv 2602.19362; danieldritter/OAPL): (β·Σ log(π/π_b) − (r − V̂*))² per
    # response, V̂* = β₁·log mean exp(r/β₁) (baseline=logavgexp, tau = β₁ = 1), β = 1e-3, mean over responses.
    "oapl": {
        **ALGORITHM_DEFAULTS,
        "baseline": "logavgexp",
        "tau": 1.0,
        "objective": "advantage-regression",
        "regression_beta": 1e-3,
        "loss_agg": "seq-mean-token-mean",
    },
    # TOPR (Le Roux et al. 2025, arXiv 2503.14286): positives as SFT, negatives with the truncated whole-response
    # ratio min(Π_t ρ_t, 1); A = r − mean (the baseline variant; Trinity-RFT's topr uses the token ratio).
    "topr": {**ALGORITHM_DEFAULTS, "weight": "tapered", "ratio_level": "sequence-sum"},
    # BAPO (Xi et al. 2025, arXiv 2510.18927; WooooDyy/BAPO README): PPO's clip with c_low ∈ [0.6, 0.9] and
    # c_high ∈ [1.2, 3.0] raised until the positive tokens carry ρ₀ = 0.5 of the update.
    "bapo": {**_BAPO},
    # BAPO with the authors' code's dual clip (WooooDyy/BAPO policy_loss.py, clip_ratio_c = 3): tokens with A < 0
    # and ρ > 3 get no gradient.
    "bapo-dual": {**_BAPO, "dual_clip": 3.0},
    # ASPO (Wang et al. 2025, arXiv 2510.06062; wizard-III/Archer2.0): one-side clip at 0.2, positive tokens
    # weighted by the flipped ratio 1/ρ, both signs capped at C = 3 (soft dual clip).
    "aspo": {**_ASPO},
    # ASPO with its code's entropy-dependent band (use_dynamic_clip): ε = 0.2 for the tokens at or below their
    # response's 0.8 entropy quantile, 0.4 for the rest. Needs the trainer's token entropies (oprl train only).
    "aspo-entropy": {**_ASPO, "entropy_eps": 0.4, "entropy_quantile": 0.8},
    # Delightful policy gradient (Osband 2026, arXiv 2603.14608): each token's term times σ(A·(−log π)/η), η = 1,
    # with no clip and no importance weight (the paper's "no importance ratios"); GRPO's advantages, the unit scale
    # η = 1 assumes (open-instruct PR 1628 gates GRPO's), token mean.
    "dg": {**ALGORITHM_DEFAULTS, **_STD, "delight_temperature": 1.0},
    # DG with the Kondo gate (Osband 2026, arXiv 2603.20526): a response's backward pass runs with probability
    # σ((χ − λ)/1), λ the 0.5-quantile of the last 1024 responses' delight (ρ = 0.5: open-instruct PR 1628's test
    # script); the skipped train with A = 0. Needs oprl's trainer (a screening forward per step).
    "dg-kondo": {**ALGORITHM_DEFAULTS, **_STD, "delight_temperature": 1.0, "kondo_rate": 0.5},
    # Score centering (arXiv 2609.20807; NeMo RL loss_fn.score_centering): each token's gradient minus the
    # sampler-expected score estimated on its top-K (needs rollout.record_top_k > 0). NoIS form on REINFORCE and
    # REC-OneSide-NoIS (the paper's "no IS needed"), the TIS form on tis-token (w = min(ρ, 2)).
    "reinforce-sc": {**ALGORITHM_DEFAULTS, "score_centering": True},
    "rec-oneside-nois-sc": {**ALGORITHM_DEFAULTS, "clip_mode": "one-side", "score_centering": True},
    "tis-token-sc": {**ALGORITHM_DEFAULTS, "weight": "truncated-is", "score_centering": True},
    # SAPO (Gao et al. 2025, arXiv 2511.20347; verl / Trinity-RFT sapo): the soft gate's gradient weight
    # 4σ(1 − σ)·ρ with τ+ = 1, τ− = 1.05, no mask, each response's token mean.
    "sapo": {
        **ALGORITHM_DEFAULTS,
        **_STD,
        "weight": "soft-gate",
        "tau_pos": 1.0,
        "tau_neg": 1.05,
        "loss_agg": "seq-mean-token-mean",
    },
}

REGISTRIES: dict[str, dict[str, Any]] = {
    "drop": DROP_RULES,
    "baseline": BASELINES,
    "clip_mode": CLIP_MODES,
    "weight": WEIGHTS,
    "ratio_level": RATIO_LEVELS,
    "regularizer": REGULARIZERS,
    "loss_agg": LOSS_AGGREGATIONS,
    "objective": OBJECTIVES,
    "distill_mix": DISTILL_MIXES,
    "ess_lr": ESS_LR_RULES,
    "red_weight": RED_WEIGHT_RULES,
    "red_weight_level": dict.fromkeys(RED_WEIGHT_LEVELS),
    "kl_estimator": KL_ESTIMATORS,
}
"""The registry of each knob declared with ``choices=True`` (``spec.py``): the one list of valid strings
(``oprl.config`` builds its ``Literal`` types from it)."""

RENAMED_SETTINGS: dict[str, str] = {"temperature": "weight_temperature"}
"""Setting names of earlier versions -> the current name (an old name is an error that names the new one)."""
RENAMED_VALUES: dict[str, dict[str, str]] = {
    "regularizer": {"k2": "squared-log-ratio"},  # "k2" is also the KL estimator ½(log r)², a different formula
    "weight": {"importance_sampling": "importance-sampling"},  # option strings are kebab-case
}
"""Option strings of earlier versions -> the current string, per setting."""


class SettingError(ValueError):
    """A bad algorithm setting; ``key`` names it so a config layer can say ``algorithm.<key>``."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


def renamed_message(key: str, value: Any = None) -> str | None:
    """One line naming the new name if ``key`` (or ``value`` of ``key``) is a name of an earlier version."""
    if key in RENAMED_SETTINGS:
        return f"{key!r} was renamed {RENAMED_SETTINGS[key]!r}"
    new = RENAMED_VALUES.get(key, {}).get(value) if isinstance(value, str) else None
    return f"{value!r} was renamed {new!r}" if new else None


def validate_settings(settings: Mapping[str, Any], knobs: Collection[str] = ALGORITHM_DEFAULTS) -> None:
    """Raise ``SettingError`` naming the first unknown key (not in ``knobs``: by default the knobs a preset sets),
    unknown choice or value out of its declared range (``spec.range_error``), then the first broken rule across
    knobs (``_check_relations``)."""
    for key, value in settings.items():
        renamed = renamed_message(key, value)
        if renamed:
            raise SettingError(key, renamed)
        if key not in knobs:
            raise SettingError(key, unknown_name_message("algorithm setting", key, list(knobs)))
        if KNOBS[key].choices and value not in REGISTRIES[key]:
            raise SettingError(key, unknown_name_message(key, value, list(REGISTRIES[key])))
        message = range_error(key, value)
        if message:
            raise SettingError(key, message)
    _check_relations(settings)


def _check_relations(settings: Mapping[str, Any]) -> None:
    """The rules across knobs: each knob's own range is its declaration's (``spec.py``); these relate two."""

    def value(key: str) -> Any:
        return settings.get(key, default(key))

    if value("distill_mix") == "replace" and settings.get("distill_coef") == 0:
        message = "distill_mix=replace with distill_coef=0 sets every advantage to 0 (nothing trains): set it > 0"
        raise SettingError("distill_coef", message)
    if settings.get("std_normalize") and settings.get("mean_normalize"):
        message = "std_normalize and mean_normalize are alternatives (GRPO's std, MaxRL's mean): set one to false"
        raise SettingError("mean_normalize", message)
    banded = value("clip_mode") in ENTROPY_BANDS or value("weight") == "clipped-is"
    if value("entropy_eps") is not None and not banded:
        message = (f"entropy_eps widens the band of clip_mode={'/'.join(ENTROPY_BANDS)} or weight=clipped-is; "
                   f"clip_mode={settings.get('clip_mode')!r} has none")  # fmt: skip
        raise SettingError("entropy_eps", message)
    if value("delight_temperature") is not None and value("objective") != "policy-gradient":
        message = f"delight_temperature gates the policy-gradient term; objective={settings['objective']} has none"
        raise SettingError("delight_temperature", message)
    if value("kondo_rate") is not None and value("regularizer") != "none":
        message = (f"kondo_rate skips a response's backward pass by zeroing its advantage, which leaves "
                   f"regularizer={settings['regularizer']} acting on it: use one of them")  # fmt: skip
        raise SettingError("kondo_rate", message)
    if value("red_weight") != "none" and settings.get("weight") == "advantage":
        message = (f"red_weight={settings['red_weight']} reshapes the advantages that weight=advantage (RED-Weight's "
                   "fixed exp(A/T)) would weight again: use one of them")  # fmt: skip
        raise SettingError("red_weight", message)
    _check_top_k(settings, value)
    low, high = settings.get("mask_low", 0.0), settings.get("mask_high", math.inf)
    if not low < high:
        message = f"mask_low must be < mask_high (the band of clip_mode=mask), got {low!r} >= {high!r}"
        raise SettingError("mask_low", message)


def _check_top_k(settings: Mapping[str, Any], value: Callable[[str], Any]) -> None:
    """Score centering composes with no weight or truncated IS, per token, in the policy-gradient objective; the
    Top-K masks compare with the sampler (the recorded top-K has no π_prox)."""
    if value("score_centering"):
        if value("weight") not in CENTERED_WEIGHTS:
            message = (f"score_centering has a form for weight={' or '.join(CENTERED_WEIGHTS)} (NoIS, TIS), "
                       f"not weight={value('weight')}")  # fmt: skip
            raise SettingError("score_centering", message)
        if value("ratio_level") != "token" or value("objective") != "policy-gradient":
            message = (f"score_centering centres each token's policy-gradient score: needs ratio_level=token and "
                       f"objective=policy-gradient, got {value('ratio_level')} / {value('objective')}")  # fmt: skip
            raise SettingError("score_centering", message)
    if value("clip_mode") in TOP_K_MASKS and value("recompute_proximal"):
        message = (f"clip_mode={value('clip_mode')} compares the trainer with the sampler's recorded top-K, which "
                   "has no recomputed proximal counterpart: set recompute_proximal=false")  # fmt: skip
        raise SettingError("recompute_proximal", message)


ENTROPY_BANDS = ("one-side", "two-side", "ring")
"""The clip modes whose band [1 − ε_low, 1 + ε_high] ``entropy_eps`` can widen per token (and weight=clipped-is)."""


def complete_settings(preset: str | Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Every knob's value (a new dict): preset ``preset`` (a name, or complete settings already resolved), the
    run knobs' defaults and ``overrides`` on top, validated (``validate_settings`` over every knob). The
    resolver behind ``Algorithm.of``."""
    if isinstance(preset, str) and preset not in PRESETS:
        raise SettingError("preset", unknown_name_message("preset", preset, list(PRESETS)))
    base = PRESETS[preset] if isinstance(preset, str) else preset
    run = {name: default(name) for name, knob in KNOBS.items() if not knob.in_preset}
    settings = {**run, **base, **overrides}
    validate_settings(settings, KNOBS)  # the whole set: some checks relate two settings (mask_low < mask_high)
    return settings


def resolve_preset(name: str, **overrides: Any) -> dict[str, Any]:
    """Deprecated (``Algorithm.of(name, overrides)``, the one resolver): the complete settings of preset ``name``
    with ``overrides`` applied, as the dict the integrations read (the knobs a preset sets; a run knob such as
    ``kl_coef`` is an unknown setting here, as before). Bad names and values raise ``SettingError``."""
    for key in overrides:
        if key in KNOBS and not KNOBS[key].in_preset:
            raise SettingError(key, unknown_name_message("algorithm setting", key, list(ALGORITHM_DEFAULTS)))
    settings = complete_settings(name, overrides)
    return {key: settings[key] for key, knob in KNOBS.items() if knob.in_preset}  # Algorithm.settings' order


def trainer_only(settings: dict[str, Any]) -> list[str]:
    """The settings (``key=value``) in resolved ``settings`` that only oprl's own trainer applies, beyond the loss
    and the advantages: VCPO's ESS-scaled step (``ess_lr``), its baseline from per-response gradient norms
    (``baseline=off-policy-optimal``) and ASPO's entropy-dependent band (``entropy_eps``: the loss needs the
    trainer's token entropies, which those hosts do not pass). A host that takes only oprl's loss and advantages
    (TRL, verl, the Tinker server) refuses a preset with any of them rather than drop them silently. Adaptive
    RED-Weight (``red_weight``) is one too: it needs each response's loss token count, which their advantage
    hooks are not given; and the Kondo gate (``kondo_rate``): a screening forward and a window kept across steps.
    Score centering and the Top-K masks read the sampler's top-K, which only oprl's rows carry."""
    found = [f"ess_lr={settings['ess_lr']}"] if settings["ess_lr"] != "none" else []
    found += [f"red_weight={settings['red_weight']}"] if settings.get("red_weight", "none") != "none" else []
    found += [f"kondo_rate={settings['kondo_rate']}"] if settings.get("kondo_rate") is not None else []
    found += [f"entropy_eps={settings['entropy_eps']}"] if settings.get("entropy_eps") is not None else []
    found += ["score_centering=True"] if settings.get("score_centering") else []
    found += [f"clip_mode={settings['clip_mode']}"] if settings.get("clip_mode") in TOP_K_MASKS else []
    return found + ([f"baseline={settings['baseline']}"] if settings["baseline"] in WEIGHTED_BASELINES else [])


def advantage_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of ``group_advantages`` in resolved settings; the loss's part is
    ``LossParams.of(settings)``, ``DISTILL_KEYS`` and ``TRAINER_KEYS`` are the caller's."""
    return {key: settings[key] for key in ADVANTAGE_KEYS}
