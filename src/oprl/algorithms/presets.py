"""Named algorithms: each preset is a complete set of keyword arguments for the two pure functions.

A preset fixes every setting in ``ALGORITHM_DEFAULTS``; ``ADVANTAGE_KEYS`` go to ``group_advantages`` and
``LOSS_KEYS`` to ``policy_loss``. Config keys are ``algorithm.<setting>``, the preset is chosen with
``algorithm.preset=<name>`` (e.g. ``oprl train algorithm.preset=rec-oneside-nois algorithm.eps_high=2.0``).
Sources: Yao et al. 2025, "Group-Relative REINFORCE Is Secretly an Off-Policy Algorithm" (arXiv
2509.24203), unless an entry says otherwise.

Not here: the formulas (``advantages.py``, ``losses.py``) or config parsing (``oprl.config``).
"""

from typing import Any

from oprl.algorithms.advantages import BASELINES, DROP_RULES
from oprl.algorithms.aggregation import LOSS_AGGREGATIONS
from oprl.algorithms.losses import CLIP_MODES, REGULARIZERS, WEIGHTS
from oprl.algorithms.registry import unknown_name_message

ALGORITHM_DEFAULTS: dict[str, Any] = {
    # group_advantages
    "std_normalize": False,  # plain r − mean, as derived; GRPO divides by the std
    "drop": "none",  # "none" keeps every response; "balance" is RED-Drop
    "baseline_shift": 0.0,  # AsymRE's δ: baseline = mean − δ
    "baseline": "mean",  # or "logavgexp" (OPMD's soft baseline)
    "tau": 1.0,  # temperature of the logavgexp baseline
    # policy_loss
    "clip_mode": "none",
    "weight": "none",
    "eps_low": 0.2,  # PPO's ε (Schulman et al. 2017)
    "eps_high": 0.2,
    "eps_low_prime": 0.6,  # ring extremes: ρ ≤ 0.4 (A ≥ 0) and ρ ≥ 3.0 (A ≤ 0)
    "eps_high_prime": 2.0,
    "regularizer": "none",
    "regularizer_coef": 0.0,
    "weight_temperature": 1.0,  # RED-Weight's T in exp(A/T) (not the sampling temperature)
    "loss_agg": "token-mean",  # Σ ℓ·m / Σ m over the optimizer batch
}

ADVANTAGE_KEYS: tuple[str, ...] = ("std_normalize", "drop", "baseline_shift", "baseline", "tau")
LOSS_KEYS: tuple[str, ...] = (
    "clip_mode", "weight", "eps_low", "eps_high", "eps_low_prime", "eps_high_prime",
    "regularizer", "regularizer_coef", "weight_temperature", "loss_agg",
)  # fmt: skip

_WIDE = {"eps_low": 0.6, "eps_high": 2.0}  # ρ ∈ [0.4, 3.0]: faster on- and near-policy (finding 3)
_IS = {"weight": "importance-sampling"}  # w = ρ (detached)
_STD = {"std_normalize": True}  # A = (r − mean)/(std + 1e-6)

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
}

REGISTRIES: dict[str, dict[str, Any]] = {
    "drop": DROP_RULES,
    "baseline": BASELINES,
    "clip_mode": CLIP_MODES,
    "weight": WEIGHTS,
    "regularizer": REGULARIZERS,
    "loss_agg": LOSS_AGGREGATIONS,
}
"""The settings whose value is a registry key: the registry is the one list of valid strings (``oprl.config``
builds its ``Literal`` types from it)."""

RENAMED_SETTINGS: dict[str, str] = {"temperature": "weight_temperature"}
"""Setting names of earlier versions -> the current name (an old name is an error that names the new one)."""
RENAMED_VALUES: dict[str, dict[str, str]] = {
    "regularizer": {"k2": "squared-log-ratio"},  # "k2" is also the KL estimator ½(log r)², a different formula
    "weight": {"importance_sampling": "importance-sampling"},  # option strings are kebab-case
}
"""Option strings of earlier versions -> the current string, per setting."""

_POSITIVE = ("tau", "weight_temperature")
_NON_NEGATIVE = ("eps_low", "eps_high", "eps_low_prime", "eps_high_prime", "regularizer_coef")


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


def validate_settings(settings: dict[str, Any]) -> None:
    """Raise ``SettingError`` naming the first unknown key, unknown choice or out-of-range number."""
    for key, value in settings.items():
        renamed = renamed_message(key, value)
        if renamed:
            raise SettingError(key, renamed)
        if key not in ALGORITHM_DEFAULTS:
            raise SettingError(key, unknown_name_message("algorithm setting", key, list(ALGORITHM_DEFAULTS)))
        if key in REGISTRIES and value not in REGISTRIES[key]:
            raise SettingError(key, unknown_name_message(key, value, list(REGISTRIES[key])))
        if key in _POSITIVE and not value > 0:
            raise SettingError(key, f"{key} must be > 0, got {value!r}")
        if key in _NON_NEGATIVE and not value >= 0:
            raise SettingError(key, f"{key} must be >= 0, got {value!r}")


def resolve_preset(name: str, **overrides: Any) -> dict[str, Any]:
    """The complete settings of preset ``name`` with ``overrides`` applied (a new dict).

    Unknown preset or setting names, and invalid values, raise ``SettingError`` (a ``ValueError``) listing the
    valid ones. This is the one preset resolver: ``oprl.config`` calls it with the keys a user set.
    """
    if name not in PRESETS:
        raise SettingError("preset", unknown_name_message("preset", name, list(PRESETS)))
    validate_settings(overrides)
    return {**PRESETS[name], **overrides}


def split_settings(settings: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(keyword arguments for ``group_advantages``, keyword arguments for ``policy_loss``)."""
    return {key: settings[key] for key in ADVANTAGE_KEYS}, {key: settings[key] for key in LOSS_KEYS}
