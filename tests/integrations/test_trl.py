"""oprl's algorithms inside TRL's GRPOTrainer: on the same batch its loss is oprl.algorithms.policy_loss with
oprl's group advantages, and a few steps train the tiny model on CPU."""

import pytest
import torch

pytest.importorskip("trl")

from datasets import Dataset
from trl import GRPOConfig

from oprl.algorithms import LossParams, advantage_settings, group_advantages, policy_loss, resolve_preset
from oprl.integrations.trl import OprlGRPOTrainer, grpo_schedule
from oprl.models.tiny import build_model, build_tokenizer


def digits_reward(completions, **kwargs):
    """Rewards completions made of digits: varied enough within a group to give non-zero advantages."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def make_trainer(tmp_path, preset, steps=2, schedule=None, **algorithm):
    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    prompts = Dataset.from_list([{"prompt": f"{a}+{b}="} for a in range(4) for b in range(4)])
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=4,
        max_steps=steps,
        learning_rate=5e-2,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        beta=0.0,
        seed=0,
        temperature=1.0,
        **(schedule or {}),
    )
    return OprlGRPOTrainer(
        model=model,
        reward_funcs=[digits_reward],
        args=args,
        train_dataset=prompts,
        processing_class=tokenizer,
        preset=preset,
        algorithm=algorithm or None,
    )


@pytest.mark.parametrize("preset", ["rec-oneside-nois", "opmd", "red-drop", "bapo-dual"])
def test_loss_on_a_batch_equals_oprl_policy_loss(tmp_path, preset):
    trainer = make_trainer(tmp_path, preset)
    trainer.model.train()
    batch = [{"prompt": f"{i}+{i}="} for i in range(2)] * 4  # TRL's sampler repeats each prompt per group
    batch = sorted(batch, key=lambda row: row["prompt"])
    inputs = trainer._generate_and_score_completions(batch)

    # Independently: rewards from the completions, oprl's advantages, log-probs from a plain forward pass.
    texts = trainer.processing_class.batch_decode(inputs["completion_ids"], skip_special_tokens=True)
    rewards = torch.tensor(digits_reward(texts), dtype=torch.float32)
    settings = resolve_preset(preset)
    advantage_kwargs, loss_kwargs = advantage_settings(settings), settings
    generator = torch.Generator().manual_seed(0)
    adv = group_advantages(rewards, torch.arange(8) // 4, generator=generator, **advantage_kwargs)
    assert torch.allclose(inputs["advantages"], adv.advantages) and adv.advantages.abs().sum() > 0
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    width = inputs["completion_ids"].size(1)
    logits = trainer.model(input_ids=ids, attention_mask=attention).logits[:, -width - 1 : -1] / 1.0
    logprobs = torch.log_softmax(logits.float(), dim=-1).gather(-1, inputs["completion_ids"][..., None])[..., 0]
    mask = inputs["completion_mask"] * adv.keep[:, None]
    expected, _ = policy_loss(logprobs, logprobs.detach(), adv.advantages, mask, LossParams.of(loss_kwargs))

    loss = trainer.compute_loss(trainer.model, inputs)  # outside train(): no gradient accumulation divisor
    assert torch.allclose(loss, expected, atol=1e-6), (float(loss), float(expected))


def test_decoupled_ppo_takes_the_proximal_from_old_per_token_logps(tmp_path):
    """decoupled-ppo: behaviour = TRL's sampler log-probs, π_prox = its old_per_token_logps (the trainer's own,
    before the update), as oprl's trainer would pass them; without recompute_proximal the same batch's loss
    differs (the behaviour weight and the clip move)."""
    trainer = make_trainer(tmp_path, "decoupled-ppo")
    trainer.model.train()
    batch = sorted([{"prompt": f"{i}+{i}="} for i in range(2)] * 4, key=lambda row: row["prompt"])
    inputs = trainer._generate_and_score_completions(batch)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    width = inputs["completion_ids"].size(1)
    logits = trainer.model(input_ids=ids, attention_mask=attention).logits[:, -width - 1 : -1]
    logprobs = torch.log_softmax(logits.float(), dim=-1).gather(-1, inputs["completion_ids"][..., None])[..., 0]
    noise = torch.Generator().manual_seed(1)
    proximal = logprobs.detach() + 0.4 * (torch.rand(logprobs.shape, generator=noise) - 0.5)
    sampling = proximal + 0.8 * (torch.rand(logprobs.shape, generator=noise) - 0.5)
    inputs["old_per_token_logps"], inputs["sampling_per_token_logps"] = proximal, sampling
    loss_kwargs = resolve_preset("decoupled-ppo")
    mask = inputs["completion_mask"].to(logprobs.dtype)
    expected, _ = policy_loss(
        logprobs, sampling, inputs["advantages"], mask, LossParams.of(loss_kwargs), proximal_logprobs=proximal
    )
    without, _ = policy_loss(logprobs, sampling, inputs["advantages"], mask, LossParams.of(loss_kwargs))
    assert not torch.allclose(expected, without, atol=1e-4)
    loss = trainer.compute_loss(trainer.model, inputs)
    assert torch.allclose(loss, expected, atol=1e-6), (float(loss), float(expected))


def test_a_few_steps_train_the_tiny_model(tmp_path):
    trainer = make_trainer(tmp_path, "rec-oneside-nois", steps=3)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert len(changed) == len(before)
    logged = [row for row in trainer.state.log_history if "loss" in row]
    assert len(logged) == 3 and all(any(key.startswith("oprl/") for key in row) for row in logged)
    assert all(torch.isfinite(torch.tensor(row["loss"])) for row in logged)


def test_a_preset_that_needs_oprls_trainer_is_refused(tmp_path):
    """vcpo scales the optimizer step and needs per-response gradient norms: GRPOTrainer would drop both."""
    with pytest.raises(ValueError, match="'vcpo' needs oprl's own trainer for ess_lr=sqrt"):
        make_trainer(tmp_path, "vcpo")
    make_trainer(tmp_path, "vcpo", ess_lr="none", baseline="mean")  # its loss alone is fine
    with pytest.raises(ValueError, match=r"'aspo-entropy' needs oprl's own trainer for entropy_eps=0\.4"):
        make_trainer(tmp_path, "aspo-entropy")  # its band reads the trainer forward's token entropies


@pytest.mark.parametrize(
    ("kind", "warmup"),
    [("cosine", {"warmup_ratio": 0.25}), ("linear", {"warmup_steps": 2}), ("constant", {"warmup_steps": 3})],
)
def test_grpo_schedule_gives_oprls_rates_in_trl(tmp_path, kind, warmup):
    from oprl.algorithms.lr_schedule import LrSchedule
    from oprl.config import OptimConfig

    steps = 10
    trainer = make_trainer(tmp_path, "rec-oneside-nois", steps=steps, schedule=grpo_schedule(kind, **warmup))
    trainer.create_optimizer_and_scheduler(num_training_steps=steps)  # what TRL's train() builds
    ours = LrSchedule.of(OptimConfig(lr=5e-2, lr_schedule=kind, **warmup), steps)
    rates = []
    for _ in range(steps):
        rates.append(trainer.lr_scheduler.get_last_lr()[0])
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
    assert rates == pytest.approx([5e-2 * ours.factor(t) for t in range(steps)], abs=1e-12)
    assert ours.warmup > 0 and rates[0] == 0.0
    with pytest.raises(ValueError, match="give one of them"):
        grpo_schedule("cosine", warmup_steps=1, warmup_ratio=0.1)
