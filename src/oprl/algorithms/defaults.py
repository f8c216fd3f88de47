"""The one source of every algorithm setting's default: ``ALGORITHM_DEFAULTS``, and which function takes it.

``group_advantages`` and ``policy_loss`` take their keyword defaults from this dict, the presets start from
it, and ``oprl config --help`` prints a preset's values from it: a default is changed here, nowhere else.
A module of plain values (it imports nothing of oprl), so the formulas' modules and the presets can all read it.
"""

from typing import Any

ALGORITHM_DEFAULTS: dict[str, Any] = {
    # group_advantages
    "std_normalize": False,  # plain r − mean, as derived; GRPO divides by the std
    "drop": "none",  # "none" keeps every response; "balance" is RED-Drop, "probabilistic" its first version
    "keep_dropped": False,  # dropped responses leave the batch (True: they stay with A = 0, in the denominators)
    "baseline_shift": 0.0,  # AsymRE's δ: baseline = mean − δ
    "baseline": "mean",  # or "logavgexp" (OPMD's soft baseline)
    "tau": 1.0,  # temperature of the logavgexp baseline
    # policy_loss
    "clip_mode": "none",
    "weight": "none",
    "ratio_level": "token",  # or "sequence": each response's geometric-mean ratio (GSPO)
    "eps_low": 0.2,  # PPO's ε (Schulman et al. 2017)
    "eps_high": 0.2,
    "eps_low_prime": 0.6,  # ring extremes: ρ ≤ 0.4 (A ≥ 0) and ρ ≥ 3.0 (A ≤ 0)
    "eps_high_prime": 2.0,
    "mask_low": 0.5,  # clip_mode=mask keeps 0.5 ≤ ρ ≤ 2.0 (symmetric in log ρ)
    "mask_high": 2.0,
    "is_cap": 2.0,  # C of truncated-is and of decoupled PPO's behaviour weight (verl's rollout_is_threshold)
    "regularizer": "none",
    "regularizer_coef": 0.0,
    "weight_temperature": 1.0,  # RED-Weight's T in exp(A/T) (not the sampling temperature)
    "loss_agg": "token-mean",  # Σ ℓ·m / Σ m over the optimizer batch
    # distill_advantages (docs/algorithms.md#distillation)
    "distill_coef": 0.0,  # c in A_t = A_group + c·(log π_teacher − log π_b); 0 = no teacher signal
    "distill_mix": "add",  # "add" to the group advantage, or "replace" it (pure distillation)
    # the trainer
    "recompute_proximal": False,  # decoupled PPO: the trainer recomputes π_prox before the update
}

ADVANTAGE_KEYS: tuple[str, ...] = ("std_normalize", "drop", "keep_dropped", "baseline_shift", "baseline", "tau")
LOSS_KEYS: tuple[str, ...] = (
    "clip_mode", "weight", "ratio_level", "eps_low", "eps_high", "eps_low_prime", "eps_high_prime",
    "mask_low", "mask_high", "is_cap", "regularizer", "regularizer_coef", "weight_temperature", "loss_agg",
)  # fmt: skip
DISTILL_KEYS: tuple[str, ...] = ("distill_coef", "distill_mix")
"""Settings of ``distill_advantages``: the trainer calls it when ``distill_coef`` > 0 (rows need teacher log-probs)."""
TRAINER_KEYS: tuple[str, ...] = ("recompute_proximal",)
"""Settings the trainer reads: ``recompute_proximal`` makes it pass ``proximal_logprobs`` to ``policy_loss``."""


__all__ = ["ADVANTAGE_KEYS", "ALGORITHM_DEFAULTS", "DISTILL_KEYS", "LOSS_KEYS", "TRAINER_KEYS"]
