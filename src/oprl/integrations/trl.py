"""oprl's algorithms inside TRL: ``OprlGRPOTrainer``, a ``trl.GRPOTrainer`` whose advantages and policy loss
come from ``oprl.algorithms`` under a preset name (``rec-oneside-nois``, ``opmd``, ``red-weight``, ...).

Everything else is TRL's: generation (transformers or its vLLM server/colocate modes), reward functions,
accelerate / DeepSpeed / FSDP, logging, checkpoints. Two methods change:

- advantages: after TRL scores a generation batch, the rewards of every process (TRL's weighted sum over
  ``reward_funcs``) go through ``oprl.algorithms.group_advantages`` with the preset's baseline, std
  normalisation, AsymRE shift and RED-Drop (groups = TRL's ``num_generations`` consecutive completions);
  RED-Drop's dropped completions leave the loss mask.
- the loss of each micro-batch is ``oprl.algorithms.policy_loss(logprobs, behavior, advantages, mask)``
  divided by the gradient-accumulation steps (as TRL does). ``behavior`` is the sampler's log-probs when TRL
  records them (vLLM), else TRL's ``old_per_token_logps`` (``num_iterations > 1``), else the current
  log-probs detached (on-policy: ρ = 1). Presets with ``recompute_proximal`` (``decoupled-ppo``) also get
  ``proximal_logprobs``: TRL's ``old_per_token_logps``, the trainer's own log-probs computed before the
  batch's first update (π_prox; TRL computes them with vLLM or ``num_iterations > 1``), else the current
  log-probs detached (then π_prox = π_θ).

Supported: TRL 1.x (tested with 1.16 on CPU), ``beta = 0`` (TRL's default; oprl's presets regularise
through the loss instead of a reference model), text models. ``pip install 'oprl[trl]'``.

    from oprl.integrations.trl import OprlGRPOTrainer
    trainer = OprlGRPOTrainer(model=..., reward_funcs=[...], args=GRPOConfig(...), train_dataset=...,
                              preset="rec-oneside-nois")
    trainer.train()

``grpo_schedule`` gives the ``GRPOConfig`` arguments of an oprl learning-rate schedule (``optim.lr_schedule`` with
``warmup_steps`` | ``warmup_ratio``): ``GRPOConfig(..., **grpo_schedule("cosine", warmup_ratio=0.1))``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from trl import GRPOConfig, GRPOTrainer

from oprl.algorithms import (
    LossParams,
    advantage_settings,
    group_advantages,
    policy_loss,
    resolve_preset,
    trainer_only,
)
from oprl.algorithms.lr_schedule import KINDS, warmup_slots

TRL_SCHEDULER = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}
"""oprl's ``optim.lr_schedule`` as transformers' ``lr_scheduler_type``. TRL's ``constant`` ignores the warmup, so
oprl's constant is ``constant_with_warmup`` (with no warmup the two are the same constant rate)."""


def grpo_schedule(
    lr_schedule: str = "constant", warmup_steps: int | None = None, warmup_ratio: float | None = None
) -> dict[str, Any]:
    """``GRPOConfig`` keyword arguments whose learning rate follows oprl's schedule ``lr_schedule`` (``constant``,
    ``linear``, ``cosine``; ``oprl.algorithms.lr_schedule``, the same formulas) with ``warmup_steps`` optimizer steps
    or ``warmup_ratio`` of them (not both). transformers 5 takes a ratio as ``warmup_steps`` below 1 (rounded up
    to whole steps, as oprl); older releases have ``warmup_ratio``."""
    if lr_schedule not in KINDS:
        raise ValueError(f"grpo_schedule: lr_schedule {lr_schedule!r} is not one of {', '.join(KINDS)}")
    warmup_slots(warmup_steps, warmup_ratio, total=1)  # refuses both at once
    args: dict[str, Any] = {"lr_scheduler_type": TRL_SCHEDULER[lr_schedule]}
    if warmup_steps is not None:
        args["warmup_steps"] = warmup_steps
    elif warmup_ratio is not None:
        fields = {field.name for field in dataclasses.fields(GRPOConfig)}
        args["warmup_ratio" if "warmup_ratio" in fields else "warmup_steps"] = warmup_ratio
    return args


class OprlGRPOTrainer(GRPOTrainer):
    """``trl.GRPOTrainer`` with oprl's advantages and policy loss (see the module docstring).

    Args:
        preset: an oprl preset (``oprl.algorithms.PRESETS``; docs/algorithms.md).
        algorithm: overrides of the preset's settings, e.g. ``{"eps_high": 0.28}``.
        *args, **kwargs: ``trl.GRPOTrainer``'s.
    """

    def __init__(
        self, *args: Any, preset: str = "rec-oneside-nois", algorithm: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        self.oprl_settings = resolve_preset(preset, **(algorithm or {}))
        if trainer_only(self.oprl_settings):  # GRPOTrainer owns the optimizer step and sees no gradient norms
            raise ValueError(
                f"OprlGRPOTrainer: preset {preset!r} needs oprl's own trainer for "
                f"{', '.join(trainer_only(self.oprl_settings))}; train it with `oprl train`"
            )
        self.advantage_kwargs = advantage_settings(self.oprl_settings)
        self.loss_params = LossParams.of(self.oprl_settings)
        super().__init__(*args, **kwargs)
        if self.beta != 0.0:
            raise ValueError("OprlGRPOTrainer: set GRPOConfig(beta=0.0); oprl's presets regularise in the loss")
        self._oprl_generator = torch.Generator().manual_seed(self.args.seed)
        self._oprl_rewards: torch.Tensor | None = None

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._oprl_rewards = rewards_per_func  # (all processes' completions, reward functions)
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        assert self._oprl_rewards is not None, "TRL scored the batch through _calculate_rewards"
        rewards = self.oprl_rewards(self._oprl_rewards)
        group_size = self.num_generations if self.model.training else self.num_generations_eval
        group_ids = torch.arange(len(rewards)) // group_size
        adv = group_advantages(rewards, group_ids, generator=self._oprl_generator, **self.advantage_kwargs)
        local = output["completion_ids"].size(0)
        rows = slice(self.accelerator.process_index * local, (self.accelerator.process_index + 1) * local)
        device = output["completion_ids"].device
        output["advantages"] = adv.advantages[rows].to(device)
        output["oprl_keep"] = adv.keep[rows].to(device)
        return output

    def oprl_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """(N,) float32 rewards: TRL's weighted sum over reward functions; a reward a function left out (NaN)
        counts 0."""
        weights = self.reward_weights.to(rewards_per_func.device)
        return (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1).float().cpu()

    def _compute_loss(self, model, inputs):
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        logprobs, _, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=False
        )
        mask = inputs["completion_mask"] * inputs["oprl_keep"][:, None].to(logprobs.dtype)
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        old = inputs.get("old_per_token_logps")
        behavior = inputs.get("sampling_per_token_logps", old)
        behavior = logprobs.detach() if behavior is None else behavior
        proximal = None
        if self.oprl_settings["recompute_proximal"]:  # decoupled PPO: clip around π_prox, weight π_prox/π_b
            proximal = logprobs.detach() if old is None else old
        loss, metrics = policy_loss(
            logprobs, behavior, inputs["advantages"], mask, self.loss_params, proximal_logprobs=proximal
        )
        mode = "train" if self.model.training else "eval"
        for name, value in metrics.items():
            self._metrics[mode][f"oprl/{name}"].append(float(value))
        accumulation = getattr(self, "current_gradient_accumulation_steps", 1) if mode == "train" else 1
        return loss / accumulation  # as TRL's own loss: the accumulated gradient is the batch mean
