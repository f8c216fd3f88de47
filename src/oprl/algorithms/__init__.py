"""Pure math of the REINFORCE / GRPO / REC / RED family: tensors and plain scalars in, tensors out.

- ``advantages``: group-relative advantages (mean / soft baseline, std, AsymRE shift, RED-Drop).
- ``red_weight``: adaptive RED-Weight, the advantages reshaped where their token-weighted sum is negative.
- ``losses``: the token-level policy loss ℓ = −M·w·A·logprobs + regulariser and its metrics.
- ``corrections``: the masks, weights and objective of DPPO, M2PO, BAPO, ASPO, TOPR, SAPO and OAPL.
- ``aggregation``: the one place where (B, T) values become a scalar.
- ``delight``: advantage × surprisal: DG's per-token gate and the Kondo gate on each response's backward pass.
- ``distill``: the teacher's per-token advantage log π_teacher − log π_b, added to or replacing the group one.
- ``variance``: VCPO's controls: the step size scaled by the responses' ESS, the off-policy optimal baseline's weights.
- ``kl``: KL-to-reference estimators k1/k2/k3 (the entropy is computed with the log-probs in ``oprl.models``).
- ``surrogate``: the consistency surrogate whose gradient is group-relative REINFORCE (docs/paper.md#derivation).
- ``spec``: the algorithm as one typed value (``Algorithm``: its stages' knobs, each declared once with its
  default, meaning, citation and range; ``Algorithm.of(preset, overrides)``, the one resolver; ``Algorithm.needs``).
- ``defaults``: the knob tables by name generated from ``spec`` (``ALGORITHM_DEFAULTS``, ...).
- ``presets``: the paper's algorithms as complete settings dicts, and the checks across knobs.
- ``step``: the stages of a trainer step over an ``Algorithm`` (advantages, loss terms, step size).
- ``lr_schedule``: the learning rate of every optimizer update (transformers' constant / linear / cosine, with
  warmup), the one schedule of the trainer and of the TRL and verl integrations.

This package imports only torch and the standard library: no config objects, logging, I/O or ``.item()``.
See docs/algorithms.md for formulas, knobs, metrics and the bandit that motivates the regularisers.
"""

from oprl.algorithms.advantages import (
    BASELINES,
    DROP_RULES,
    WEIGHTED_BASELINES,
    DropRule,
    GroupAdvantages,
    group_advantages,
)
from oprl.algorithms.aggregation import LOSS_AGGREGATIONS, aggregate, aggregation_count
from oprl.algorithms.algorithm import Algorithm, Needs
from oprl.algorithms.defaults import ADVANTAGE_KEYS, ALGORITHM_DEFAULTS, DISTILL_KEYS, TRAINER_KEYS
from oprl.algorithms.delight import KondoGate, delight_gate, kondo_gate, kondo_price, response_delight
from oprl.algorithms.distill import DISTILL_MIXES, distill_advantages, distill_metrics
from oprl.algorithms.kl import KL_ESTIMATORS, kl_penalty
from oprl.algorithms.losses import (
    CLIP_MODES,
    MISMATCH_BAND,
    OBJECTIVES,
    RATIO_LEVELS,
    REGULARIZERS,
    WEIGHTS,
    LossParams,
    effective_sample_size,
    policy_loss,
    ratio_stats,
)
from oprl.algorithms.presets import (
    PRESETS,
    REGISTRIES,
    RENAMED_SETTINGS,
    RENAMED_VALUES,
    SettingError,
    advantage_settings,
    renamed_message,
    resolve_preset,
    trainer_only,
    validate_settings,
)
from oprl.algorithms.red_weight import RED_WEIGHT_LEVELS, RED_WEIGHT_RULES, red_weight_advantages
from oprl.algorithms.spec import KNOBS
from oprl.algorithms.surrogate import consistency_surrogate
from oprl.algorithms.variance import (
    ESS_LR_RULES,
    baseline_gap,
    ess_lr_scale,
    off_policy_baseline_log_weights,
    sequence_log_ratios,
)

__all__ = [
    "ADVANTAGE_KEYS",
    "ALGORITHM_DEFAULTS",
    "BASELINES",
    "CLIP_MODES",
    "DISTILL_KEYS",
    "DISTILL_MIXES",
    "DROP_RULES",
    "ESS_LR_RULES",
    "KL_ESTIMATORS",
    "KNOBS",
    "LOSS_AGGREGATIONS",
    "MISMATCH_BAND",
    "OBJECTIVES",
    "PRESETS",
    "RATIO_LEVELS",
    "RED_WEIGHT_LEVELS",
    "RED_WEIGHT_RULES",
    "REGISTRIES",
    "REGULARIZERS",
    "RENAMED_SETTINGS",
    "RENAMED_VALUES",
    "TRAINER_KEYS",
    "WEIGHTED_BASELINES",
    "WEIGHTS",
    "Algorithm",
    "DropRule",
    "GroupAdvantages",
    "KondoGate",
    "LossParams",
    "Needs",
    "SettingError",
    "advantage_settings",
    "aggregate",
    "aggregation_count",
    "baseline_gap",
    "consistency_surrogate",
    "delight_gate",
    "distill_advantages",
    "distill_metrics",
    "effective_sample_size",
    "ess_lr_scale",
    "group_advantages",
    "kl_penalty",
    "kondo_gate",
    "kondo_price",
    "off_policy_baseline_log_weights",
    "policy_loss",
    "ratio_stats",
    "red_weight_advantages",
    "renamed_message",
    "resolve_preset",
    "response_delight",
    "sequence_log_ratios",
    "trainer_only",
    "validate_settings",
]
