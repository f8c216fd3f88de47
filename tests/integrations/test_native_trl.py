"""oprl's presets against TRL 1.16's own GRPO losses (#70): on identical tensors, ``GRPOTrainer._compute_loss`` (TRL's
code, unchanged) and ``oprl.algorithms.policy_loss`` give the same gradient for every ``loss_type`` TRL has: dapo,
bnpo, grpo, dr_grpo, cispo, sapo, vespo, luspo, and GSPO (``loss_type="grpo"`` at ``importance_sampling_level=
"sequence"``). Where the two losses have the same form (cispo, vespo) their values are equal too; where TRL writes
PPO's surrogate −min(ρA, clip(ρ)A) (or SAPO's gate) and oprl −M·w·A·log π with w detached, the values differ and
the gradients must not (∇(ρA) = ρ·A·∇log π).

TRL's ``_compute_loss`` is a method of a trainer that owns a model; it is called here on a namespace holding the
attributes ``GRPOTrainer.__init__`` sets from the ``GRPOConfig`` (grpo_trainer.py, lines 782-983 of 1.16.0), with
the model's forward (``_get_per_token_logps_and_entropies``) returning the test's log-probs. One process, no
gradient accumulation, no vLLM, β = 0. The advantages' difference (TRL's group std is the sample std) is measured
in test_trl_grpo_equivalence.py; the table is docs/algorithms.md#native-cross-checks.
"""

import types
from collections import defaultdict

import pytest
import torch

pytest.importorskip("trl")

from trl import GRPOConfig, GRPOTrainer

from oprl.algorithms import LossParams, policy_loss, resolve_preset

B, T = 6, 5


def batch(seed=0):
    """(old, new with grad, advantages (B,), mask): ratios on both sides of every band; rows 0-1 move by ~1e-4 so
    GSPO's narrow band (3e-4, 4e-4) keeps some responses."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(B, T)
    mask[1, 3:] = 0  # responses of different lengths
    mask[4, 1:] = 0
    old = -torch.rand(B, T, generator=g) * 2 - 0.05
    scale = torch.tensor([1e-4, 1e-4, 0.5, 0.5, 0.5, 0.5])[:, None]
    new = (old + scale * torch.randn(B, T, generator=g)).requires_grad_()
    advantages = torch.randn(B, generator=g)
    return old, new, advantages, mask


class _OneProcess:
    """``accelerator`` as ``_compute_loss`` uses it on one process."""

    num_processes = 1

    def gather(self, tensor):
        return tensor

    def reduce(self, tensor, reduction="sum"):
        return tensor

    gather_for_metrics = gather


def trl_loss(config: GRPOConfig, logprobs, old, advantages, mask):
    """TRL's ``GRPOTrainer._compute_loss`` on these tensors."""
    trainer = types.SimpleNamespace(
        args=config,
        loss_type=config.loss_type,
        importance_sampling_level=config.importance_sampling_level,
        epsilon_low=config.epsilon,
        epsilon_high=config.epsilon_high if config.epsilon_high is not None else config.epsilon,
        beta=config.beta,
        top_entropy_quantile=config.top_entropy_quantile,
        off_policy_mask_threshold=config.off_policy_mask_threshold,
        max_completion_length=config.max_completion_length,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        aux_loss_enabled=False,
        _entropy_bonus_enabled=False,
        current_gradient_accumulation_steps=1,
        accelerator=_OneProcess(),
        model=types.SimpleNamespace(training=True),
        _metrics=defaultdict(lambda: defaultdict(list)),
        get_gamma_weights=GRPOTrainer.get_gamma_weights,
        _get_per_token_logps_and_entropies=lambda *args, **kwargs: (logprobs, torch.zeros_like(logprobs), None),
    )
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": advantages,
        "old_per_token_logps": old,
        "num_items_in_batch": mask.sum(),
    }
    return GRPOTrainer._compute_loss(trainer, None, inputs)


def config(**overrides) -> GRPOConfig:
    settings = {"output_dir": "unused", "use_cpu": True, "bf16": False, "report_to": "none", "beta": 0.0}
    return GRPOConfig(**(settings | {"max_completion_length": T} | overrides))


# (id, TRL's settings, oprl's preset, oprl's overrides, whether the loss values are equal too). oprl's presets also
# fix the advantages (std or not); only their loss is compared here, on the same advantages.
CASES = [
    ("dapo", {"loss_type": "dapo", "epsilon_high": 0.28}, "grpo", {"eps_high": 0.28}, False),
    ("bnpo", {"loss_type": "bnpo"}, "grpo", {}, False),
    ("grpo", {"loss_type": "grpo"}, "grpo", {"loss_agg": "seq-mean-token-mean"}, False),
    ("dr_grpo", {"loss_type": "dr_grpo"}, "dr-grpo", {}, False),
    # TRL's cispo caps ρ at epsilon_high itself (no 1 +): oprl's cap 1 + eps_high = 2 is TRL's epsilon_high = 2.
    ("cispo", {"loss_type": "cispo", "epsilon_high": 2.0}, "cispo", {}, True),
    ("sapo", {"loss_type": "sapo"}, "sapo", {}, False),
    ("vespo", {"loss_type": "vespo"}, "vespo", {}, True),
    ("luspo", {"loss_type": "luspo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4},
     "luspo", {}, False),
    ("gspo", {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4},
     "gspo", {}, False),
]  # fmt: skip


@pytest.mark.parametrize(("trl_settings", "preset", "overrides", "same_value"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_trl_loss_type_has_oprls_gradient(trl_settings, preset, overrides, same_value):
    old, new, advantages, mask = batch()
    theirs = trl_loss(config(**trl_settings), new, old, advantages, mask)
    mine_new = new.detach().clone().requires_grad_()
    params = LossParams.of(resolve_preset(preset, **overrides), normalizer=float(T))  # Dr. GRPO: the budget T
    mine, _ = policy_loss(mine_new, old, advantages, mask, params)
    theirs.backward()
    mine.backward()
    assert new.grad.abs().sum() > 0  # some token keeps a gradient, so the comparison is not vacuous
    torch.testing.assert_close(mine_new.grad, new.grad, rtol=1e-5, atol=1e-7)
    if same_value:
        torch.testing.assert_close(mine, theirs)


def test_dr_grpo_normalizes_by_the_completion_budget_as_trl_does():
    """TRL's dr_grpo divides by B·max_completion_length; oprl's seq-mean-token-sum-norm by rows·normalizer, the
    trainer's normalizer being rollout.max_new_tokens: with a budget above the padded width both still agree."""
    old, new, advantages, mask = batch(1)
    budget = 3 * T
    theirs = trl_loss(config(loss_type="dr_grpo", max_completion_length=budget), new, old, advantages, mask)
    mine_new = new.detach().clone().requires_grad_()
    mine, _ = policy_loss(mine_new, old, advantages, mask, LossParams.of(resolve_preset("dr-grpo"), normalizer=budget))
    theirs.backward()
    mine.backward()
    torch.testing.assert_close(mine_new.grad, new.grad)
