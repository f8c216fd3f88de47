"""Helpers shared by the trainer tests (tests/runtime) and the data-parallel runs (tests/integration): a hand-made
batch of experiences and a trainer on a one-layer tiny model. Importable as ``trainer_helpers`` because pytest
puts tests/ (the root conftest's directory) on sys.path."""

import torch

from oprl.algorithms import PRESETS
from oprl.algorithms.method import Method
from oprl.config import OptimConfig
from oprl.messages import Experience
from oprl.models.tiny import build_model, build_tokenizer
from oprl.models.truncation import Sampling
from oprl.trainer.trainer import Trainer


def make_batch(tokenizer, groups=3, k=4, seed=0):
    rng = torch.Generator().manual_seed(seed)
    batch = []
    for g in range(groups):
        prompt = tokenizer(f"<|user|>{g}+{g}=</s><|assistant|>", add_special_tokens=False).input_ids
        for i in range(k):
            length = int(torch.randint(1, 6, (1,), generator=rng))
            response = [*torch.randint(7, 40, (length,), generator=rng).tolist(), tokenizer.eos_token_id]
            batch.append(
                Experience(
                    prompt_ids=prompt,
                    response_ids=response,
                    behavior_logprobs=(-torch.rand(len(response), generator=rng) * 3 - 1).tolist(),
                    reward=float(i == 0 or (g == 1 and i == 1)),
                    reward_components={"correct": float(i == 0)},
                    group_id=g,
                    task_id=f"t{g}",
                    policy_version=0,
                    response_text="",
                )
            )
    return batch


def make_trainer(preset="grpo", seed=0, num_layers=1, activation_checkpointing=False, autocast=None, **optim):
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=32, num_layers=num_layers, num_heads=2, seed=seed)
    trainer = Trainer(
        model,
        pad_id=tokenizer.pad_token_id,
        method=Method.of(PRESETS[preset], max_response_tokens=8),
        optim=OptimConfig(**optim),
        sampling=Sampling(),
        seed=seed,
        activation_checkpointing=activation_checkpointing,
        autocast=autocast,
    )
    return trainer, tokenizer
