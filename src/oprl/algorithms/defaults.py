"""The one source of every algorithm setting's default: ``ALGORITHM_DEFAULTS``, and which function takes it.

``group_advantages``' keywords and the fields of ``policy_loss``'s ``LossParams`` take their defaults from this
dict, the presets start from it, and ``oprl config --help`` prints a preset's values from it: a default is
changed here, nowhere else.
A module of plain values (it imports nothing of oprl), so the formulas' modules and the presets can all read it.
"""

from typing import Any

ALGORITHM_DEFAULTS: dict[str, Any] = {
    # group_advantages
    "std_normalize": False,  # plain r − mean, as derived; GRPO divides by the std
    "mean_normalize": False,  # MaxRL (arXiv 2602.02710; prime-rl max_rl): A = r/mean − 1, rewards ≥ 0
    "drop": "none",  # "none" keeps every response; "balance" is RED-Drop, "probabilistic" its first version
    "keep_dropped": False,  # dropped responses leave the batch (True: they stay with A = 0, in the denominators)
    "baseline_shift": 0.0,  # AsymRE's δ: baseline = mean − δ
    "baseline": "mean",  # or "logavgexp" (OPMD's soft baseline)
    "tau": 1.0,  # temperature of the logavgexp baseline
    "red_weight": "none",  # adaptive RED-Weight (arXiv 2606.20002): "adaptive" or "shift" where Σ A·L < 0
    "red_weight_level": "batch",  # its set: the whole batch (Trinity-RFT's default) or each prompt's "group"
    # policy_loss
    "clip_mode": "none",  # M = 1: REINFORCE as derived, nothing masked (the presets choose a clip)
    "weight": "none",  # w = 1: "NoIS", the group-relative gradient without importance weights (paper, finding 1)
    "ratio_level": "token",  # or "sequence": each response's geometric-mean ratio (GSPO)
    "eps_low": 0.2,  # PPO's ε (Schulman et al. 2017)
    "eps_high": 0.2,  # PPO's symmetric band; DAPO's clip-higher raises it (0.28)
    "eps_low_prime": 0.6,  # ring extremes: ρ ≤ 0.4 (A ≥ 0) and ρ ≥ 3.0 (A ≤ 0)
    "eps_high_prime": 2.0,  # the paper's REC-Ring extremes (Yao et al. 2025)
    "mask_low": 0.5,  # clip_mode=mask keeps 0.5 ≤ ρ ≤ 2.0 (symmetric in log ρ)
    "mask_high": 2.0,  # 1/mask_low: the rejection band symmetric in log ρ (IcePop; verl's rollout_rs)
    "is_cap": 2.0,  # C of truncated-is and of decoupled PPO's behaviour weight (verl's rollout_is_threshold)
    "regularizer": "none",  # OPMD's squared log-ratio and AsymRE's forward KL are the presets' choice
    "regularizer_coef": 0.0,  # c of the regulariser (OPMD's preset: 0.1; AsymRE's: 0.1)
    "weight_temperature": 1.0,  # RED-Weight's T in exp(A/T) (not the sampling temperature)
    "loss_agg": "token-mean",  # Σ ℓ·m / Σ m over the optimizer batch
    "objective": "policy-gradient",  # −M·w·A·logprobs; "advantage-regression" is OAPL's squared residual
    "m2_threshold": 0.04,  # M2PO's τ_M2 (Zheng et al. 2025: the paper's and the authors' scripts' value)
    "tau_pos": 1.0,  # SAPO's gate temperature for A > 0 (Gao et al. 2025; verl / Trinity-RFT defaults)
    "tau_neg": 1.05,  # SAPO's for A ≤ 0: slightly steeper, negative updates are attenuated sooner
    "bapo_target": 0.5,  # BAPO's ρ₀: the share of the clipped update the positive tokens must reach
    "bapo_low_max": 0.9,  # BAPO's b₋: c_low rises from 1 − eps_low up to this
    "bapo_high_max": 3.0,  # BAPO's b₊: c_high rises from 1 + eps_high up to this
    "dual_clip": None,  # off; BAPO's code (and verl's clip_ratio_c) caps A < 0 tokens at c = 3: ρ > c gets no gradient
    "entropy_eps": None,  # off; ASPO's code: ε of the tokens above a response's entropy quantile (0.4 there)
    "entropy_quantile": 0.8,  # ASPO's code (token_entropy_quantile): tokens at or below it keep eps_low/eps_high
    "delight_temperature": None,  # off; DG (arXiv 2603.14608): each token's term times σ(A·(−log π)/η), η = 1 there
    "regression_beta": 1e-3,  # OAPL's β (β2 in the authors' scripts) on Σ_t log(π/π_b)
    "vespo_k_pos": 2.0,  # VESPO's shape k₊ for A ≥ 0 (arXiv 2602.10693; TRL's GRPOConfig defaults)
    "vespo_lambda_pos": 3.0,  # VESPO's rate λ₊ for A ≥ 0: φ peaks at w = k/λ < 1, damping w > 1
    "vespo_k_neg": 3.0,  # VESPO's k₋ for A < 0
    "vespo_lambda_neg": 2.0,  # VESPO's λ₋ for A < 0: φ peaks at w = 1.5, damping w < 1
    # distill_advantages (docs/algorithms.md#distillation)
    "distill_coef": 0.0,  # c in A_t = A_group + c·(log π_teacher − log π_b); 0 = no teacher signal
    "distill_mix": "add",  # "add" to the group advantage, or "replace" it (pure distillation)
    # the trainer
    "recompute_proximal": False,  # decoupled PPO: the trainer recomputes π_prox before the update
    "ess_lr": "none",  # the learning rate as configured; VCPO (arXiv 2602.17616) scales it by √min(1, ESS/base)
    "ess_lr_base": 1.0,  # VCPO's base_ess_ratio (the authors' scripts): any ESS < 1 shrinks the step
    "kondo_rate": None,  # off; the Kondo gate (arXiv 2603.20526): ρ, the share of responses given a backward pass
    "kondo_temperature": 1.0,  # η of its pass probability σ((χ − λ)/η): the paper's and DG's scale of delight
    "kondo_window": 1024,  # responses whose (1 − ρ)-quantile of delight is the price λ (oprl's choice: ~8 steps)
}

ADVANTAGE_KEYS: tuple[str, ...] = (
    "std_normalize", "mean_normalize", "drop", "keep_dropped", "baseline_shift", "baseline", "tau", "red_weight",
    "red_weight_level",
)  # fmt: skip
"""Settings of ``group_advantages`` (``advantage_settings``; ``red_weight`` also needs each response's token count,
which the caller passes as ``response_lengths``). The loss's are the fields of
``oprl.algorithms.losses.LossParams``."""
DISTILL_KEYS: tuple[str, ...] = ("distill_coef", "distill_mix")
"""Settings of ``distill_advantages``: the trainer calls it when ``distill_coef`` > 0 (rows need teacher log-probs)."""
TRAINER_KEYS: tuple[str, ...] = (
    "recompute_proximal", "ess_lr", "ess_lr_base", "kondo_rate", "kondo_temperature", "kondo_window",
)  # fmt: skip
"""Settings the trainer reads: ``recompute_proximal`` makes it pass ``proximal_logprobs`` to ``policy_loss``;
``ess_lr`` / ``ess_lr_base`` scale each optimizer step's learning rate by ``oprl.algorithms.variance.ess_lr_scale``;
``kondo_*`` gate each response's backward pass (``oprl.algorithms.delight.kondo_gate``)."""


__all__ = ["ADVANTAGE_KEYS", "ALGORITHM_DEFAULTS", "DISTILL_KEYS", "TRAINER_KEYS"]
