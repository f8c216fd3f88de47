"""GRPO equals GRPO (#55 item 4): on one batch, oprl's ``grpo`` update equals TRL's ``GRPOTrainer``
(``loss_type="dapo"``) to float tolerance once every setting is aligned: advantages, loss, gradient (before and
after clipping), AdamW's state and the weights after one optimizer step.

TRL's side runs TRL's own code: ``_generate_and_score_completions`` samples and scores the batch and computes
the advantages (grpo_trainer.py, the ``sum_then_normalize`` branch), ``compute_loss`` → ``_compute_loss`` gives
the loss, and ``create_optimizer`` the optimizer transformers' ``Trainer`` would build from the ``GRPOConfig``; the
gradient is clipped as ``Trainer`` clips it (``clip_grad_norm_`` at ``max_grad_norm``). oprl's side is
``oprl.trainer.Trainer.step`` on the same prompts, completions and rewards as ``Experience`` rows.

Settings that had to be aligned (TRL 1.16 defaults on the left):
- ``learning_rate`` 1e-6 → oprl's ``optim.lr``; ``lr_scheduler_type`` "linear" → "constant" (oprl's lr is constant);
  ``warmup_steps`` 0; ``weight_decay`` 0 (both); betas (0.9, 0.999) and eps 1e-8 (both defaults);
  ``max_grad_norm`` 1.0 → ``optim.grad_clip``.
- ``loss_type`` "dapo" (token-mean over the whole batch = oprl's ``loss_agg=token-mean``), ``epsilon`` 0.2 (=
  ``eps_low``/``eps_high``), ``beta`` 0 (no reference KL), ``num_iterations`` 1, ``scale_rewards`` "group".
- ``temperature`` 1.0, ``top_k`` 0, ``top_p`` 1.0 (the distribution both score log-probs under).
- The group std: TRL divides by the *sample* std (Bessel, ``nanstd``) + 1e-4, oprl by the *population* std + 1e-6
  (``oprl.algorithms.advantages``). No option of either side selects the other's, so the aligned run replaces
  TRL's ``nanstd`` by the population std (shifted so that TRL's + 1e-4 becomes oprl's + 1e-6);
  ``test_the_group_std_is_the_one_difference`` measures the unaligned gap: TRL's advantages are oprl's times
  √((K − 1)/K) (0.935 at K = 8), up to the eps.
"""

import copy

import pytest
import torch

pytest.importorskip("trl")

from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer
from trl.trainer import grpo_trainer as trl_grpo
from trl.trainer.utils import nanstd

from oprl.algorithms import PRESETS, advantage_settings, group_advantages
from oprl.algorithms.advantages import STD_EPS
from oprl.algorithms.method import Method
from oprl.config import OptimConfig
from oprl.messages import Experience
from oprl.models.tiny import build_model, build_tokenizer
from oprl.models.truncation import Sampling
from oprl.trainer.trainer import Trainer

TRL_STD_EPS = 1e-4  # grpo_trainer.py: `advantages = advantages / (std_rewards + 1e-4)`
GROUP, PROMPTS, MAX_NEW = 4, 3, 6
LR, CLIP = 1e-2, 0.05  # a clip below the gradient's norm, so the clipping is part of what is compared


def reward(completions, **kwargs):
    """Share of digits in the completion: varied within a group (non-zero advantages, unequal stds)."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def population_std_as_trl_uses_it(tensor, dim=None, keepdim=False):
    """TRL's ``nanstd`` replaced by the population std, minus TRL's eps plus oprl's: std + 1e-4 = oprl's denominator."""
    return tensor.std(dim=dim, correction=0, keepdim=keepdim) - TRL_STD_EPS + STD_EPS


def make_pair(tmp_path):
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    oprl_model = copy.deepcopy(model)  # before TRL touches it: the same start
    args = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        seed=0,
        max_steps=1,
        per_device_train_batch_size=PROMPTS * GROUP,
        num_generations=GROUP,
        max_completion_length=MAX_NEW,
        learning_rate=LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=CLIP,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        beta=0.0,
        loss_type="dapo",
        scale_rewards="group",
        epsilon=0.2,
        num_iterations=1,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
    )
    prompts = Dataset.from_list([{"prompt": f"{a}+{b}="} for a in range(4) for b in range(4)])
    trl = GRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=prompts, processing_class=tokenizer)
    oprl = Trainer(
        oprl_model,
        pad_id=tokenizer.pad_token_id,
        method=Method.of(PRESETS["grpo"], max_response_tokens=MAX_NEW),
        optim=OptimConfig(lr=LR, grad_clip=CLIP, weight_decay=0.0, betas=(0.9, 0.999)),
        sampling=Sampling(),
        seed=0,
    )
    return trl, oprl, tokenizer


def trl_batch(trl):
    """One generation batch through TRL's own sampling and scoring (prompts of unequal length: left padding)."""
    torch.manual_seed(0)
    rows = [{"prompt": p} for p in ("1+2=", "13+4=", "2+31=") for _ in range(GROUP)]
    trl.model.train()
    return trl._generate_and_score_completions(rows)


def experiences(inputs, rewards, behavior):
    """TRL's batch as oprl rows: the same prompt and completion tokens (padding and what follows EOS removed)."""
    out = []
    for i in range(len(rewards)):
        prompt = inputs["prompt_ids"][i][inputs["prompt_mask"][i].bool()].tolist()
        response = inputs["completion_ids"][i][inputs["completion_mask"][i].bool()].tolist()
        out.append(
            Experience(
                prompt_ids=prompt,
                response_ids=response,
                behavior_logprobs=behavior[i][: len(response)],
                reward=float(rewards[i]),
                reward_components={},
                group_id=i // GROUP,
                task_id=str(i // GROUP),
                policy_version=0,
                response_text="",
            )
        )
    return out


@pytest.mark.parametrize("stale", [False, True], ids=["on-policy", "stale-behaviour"])
def test_one_grpo_update_equals_trls(tmp_path, monkeypatch, stale):
    """stale-behaviour: TRL's ``old_per_token_logps`` and oprl's behaviour log-probs are the current ones plus
    noise (ρ up to ~e^±0.6), so the clip (TRL's min(ρA, clip(ρ)A), oprl's one-side mask × ρ) decides tokens."""
    monkeypatch.setattr(trl_grpo, "nanstd", population_std_as_trl_uses_it)
    trl, oprl, _ = make_pair(tmp_path)
    inputs = trl_batch(trl)
    texts = trl.processing_class.batch_decode(inputs["completion_ids"], skip_special_tokens=True)
    rewards = torch.tensor(reward(texts), dtype=torch.float32)  # what TRL's reward function returned

    # oprl's behaviour log-probs: its trainer's own log-probs of the batch (TRL on-policy uses the current ones).
    rows = experiences(inputs, rewards, [[0.0] * MAX_NEW] * len(rewards))
    current = oprl.inputs.proximal_logprobs(rows)
    # The log-probs both sides score: TRL's (left-padded prompt + completion, one forward) and oprl's (each
    # prompt once per group, its cache shared by the group's responses).
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad():
        trl_logprobs, _, _ = trl._get_per_token_logps_and_entropies(
            trl.model, ids, attention, inputs["completion_ids"].size(1)
        )
    for i, values in enumerate(current):
        torch.testing.assert_close(torch.tensor(values), trl_logprobs[i, : len(values)], atol=2e-6, rtol=1e-5)
    behavior = [list(values) for values in current]
    if stale:
        noise = torch.Generator().manual_seed(1)
        width = inputs["completion_ids"].size(1)
        shift = 1.2 * (torch.rand(len(rows), width, generator=noise) - 0.5)  # (B, T)
        behavior = [[v + float(shift[i, t]) for t, v in enumerate(values)] for i, values in enumerate(current)]
        padded = torch.zeros(len(rows), width)
        for i, values in enumerate(behavior):
            padded[i, : len(values)] = torch.tensor(values)
        inputs["old_per_token_logps"] = padded
    rows = experiences(inputs, rewards, behavior)

    # Advantages: TRL's (computed inside _generate_and_score_completions) against oprl's.
    oprl_adv = group_advantages(rewards, torch.arange(len(rows)) // GROUP, **advantage_settings(PRESETS["grpo"]))
    assert (oprl_adv.advantages != 0).sum() >= 2 * GROUP  # two groups vary (a third may be all equal: A = 0)
    torch.testing.assert_close(inputs["advantages"], oprl_adv.advantages, atol=1e-6, rtol=1e-6)

    # TRL: loss, backward, clip as Trainer does, the optimizer Trainer builds from the config.
    trl_model = trl.model
    trl.current_gradient_accumulation_steps = 1  # what Trainer's loop sets for the step (no accumulation here)
    optimizer = trl.create_optimizer()
    assert type(optimizer.optimizer if hasattr(optimizer, "optimizer") else optimizer) is torch.optim.AdamW
    trl_loss = trl.compute_loss(trl_model, inputs)
    trl_loss.backward()
    trl_norm = torch.nn.utils.clip_grad_norm_(trl_model.parameters(), CLIP)
    trl_grads = {n: p.grad.detach().clone() for n, p in trl_model.named_parameters()}
    optimizer.step()

    metrics = oprl.step(rows)

    assert trl_norm > CLIP  # the clip acted
    # The two losses are different surrogates of one gradient: TRL's value is −min(ρA, clip(ρ)A), oprl's
    # −M·ρ·A·log π with ρ detached (∇(ρA) = ρ·A·∇log π); their values differ, their gradients must not.
    assert torch.isfinite(trl_loss) and metrics["loss/pg_loss"] != pytest.approx(float(trl_loss.detach()))
    assert metrics["optim/grad_norm"] == pytest.approx(float(trl_norm), rel=1e-5)
    if stale:
        assert metrics["loss/clip_frac"] > 0  # the clip masked tokens, and both sides agree on which
    oprl_params = dict(oprl.model.named_parameters())
    opt_state = optimizer.state
    for name, param in trl_model.named_parameters():
        mine = oprl_params[name]
        torch.testing.assert_close(mine.grad, trl_grads[name], atol=1e-6, rtol=1e-4)
        ours, theirs = oprl.optimizer.state[mine], opt_state[param]
        torch.testing.assert_close(ours["exp_avg"], theirs["exp_avg"], atol=1e-7, rtol=1e-4)
        torch.testing.assert_close(ours["exp_avg_sq"], theirs["exp_avg_sq"], atol=1e-10, rtol=1e-4)
        # Adam's first step moves a weight by lr·g/(|g| + 1e-8): a gradient of ~1e-8 turns its float noise into
        # a visible share of lr (measured: at most 3e-6 on steps of lr = 1e-2); atol is 1e-3·lr.
        torch.testing.assert_close(mine.detach(), param.detach(), atol=1e-3 * LR, rtol=0)


def test_the_group_std_is_the_one_difference():
    """Unaligned, TRL's advantage (grpo_trainer.py: `(rewards - mean) / (nanstd(group) + 1e-4)`, the formula copied
    here with TRL's own ``nanstd``) is oprl's times √((K − 1)/K) up to the eps: smaller by 6.5 % at K = 8."""
    k = 8
    rewards = torch.tensor([1.0, 0, 0, 1, 1, 0, 0, 0] + [1.0] * 7 + [0.0], dtype=torch.float32)  # binary, 2 groups
    grouped = rewards.view(-1, k)
    mean = grouped.mean(dim=1).repeat_interleave(k)
    std = nanstd(grouped, dim=1).repeat_interleave(k)
    trl_adv = (rewards - mean) / (std + TRL_STD_EPS)
    oprl_adv = group_advantages(rewards, torch.arange(len(rewards)) // k, **advantage_settings(PRESETS["grpo"]))
    ratio = trl_adv / oprl_adv.advantages
    torch.testing.assert_close(ratio, torch.full_like(ratio, ((k - 1) / k) ** 0.5), atol=5e-4, rtol=0)
