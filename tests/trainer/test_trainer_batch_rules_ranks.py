"""M2PO and BAPO on two data-parallel trainer ranks (gloo, CPU; #70): the mask's statistic spans every rank's rows of
the mini-batch (``Trainer._batch_rule`` gathers them through ``DataParallel.gather_objects``), so two ranks (DDP, and
FSDP for m2po) train the one-process trainer's steps: its losses, clip fractions, rule metrics (M̂₂, BAPO's bounds),
gradient norms and weights within 1e-5 (``tests/integration/test_distributed.py``'s tolerance: float32 forwards of
other micro-batch compositions differ in the last bits). The check can fail: the same ranks with each rank's own
statistic (the scope before; run once on a copy of the tree whose ``Trainer._batch_rule`` passes no gather) moved
m2po's first-step ``loss/total`` from −0.43172 to −0.49595 and bapo's ``loss/bapo_positive_share`` from 0.42335 to
0.41429 (its bounds and loss stayed: the preset's target holds at the start bounds in each half as in the whole). The
per-rank scope moving every rule's gradient is shown on the rule alone, in float64
(``tests/algorithms/test_batch_rules_ranks.py``)."""

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from oprl.algorithms import PRESETS as ALL_PRESETS
from oprl.algorithms.method import Method
from oprl.config import OptimConfig, load_config
from oprl.models.tiny import build_model, build_tokenizer
from oprl.models.truncation import Sampling
from oprl.trainer.ranks import ShardedTrainer
from oprl.trainer.role import TrainerWorker
from oprl.trainer.trainer import Trainer
from trainer_helpers import make_batch

TOL = 1e-5
RULES = {"m2po": ("loss/m2", "loss/m2_kept"), "bapo": ("loss/bapo_clip_low", "loss/bapo_positive_share")}
COMPARED = ("loss/total", "loss/pg_loss", "loss/clip_frac", "optim/grad_norm")


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny")
    tokenizer = build_tokenizer()
    build_model(tokenizer, hidden_size=32, num_layers=2, num_heads=2, seed=3).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


def _config(path, preset, world_size, sharding="ddp"):
    overrides = [
        f"model.path={path}",
        f"trainer.sharding={sharding if world_size > 1 else 'none'}",
        f"trainer.world_size={world_size}",
        f"algorithm.preset={preset}",
        "rollout.prompts_per_step=3",
        "rollout.group_size=4",
        "optim.micro_batch_size=2",  # several micro-batches per rank as well
        "optim.mini_batches=2",
        "optim.lr=1e-4",
        "runtime.torch_threads=1",
    ]
    return load_config(None, overrides)


@pytest.fixture(scope="module")
def batches(tiny_path):
    """Two steps of ``make_batch``'s groups with behaviour log-probs = the tiny model's own plus N(0, 0.3²) noise
    (``test_trainer_batch_rules.off_policy_batch``): ratios near 1 with a spread, where the rules mask some tokens
    and which ones moves the gradient (far-off ratios would have every rank mask all its harmful tokens)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    tokenizer = build_tokenizer()
    method = Method.of(ALL_PRESETS["m2po"], max_response_tokens=8)
    trainer = Trainer(model, pad_id=tokenizer.pad_token_id, method=method, optim=OptimConfig(), sampling=Sampling())
    generator = torch.Generator().manual_seed(0)
    out = []
    for step in range(2):
        batch = make_batch(tokenizer, groups=3, k=4, seed=step)
        for row, values in zip(batch, trainer.inputs.proximal_logprobs(batch), strict=True):
            row.group_id += 10 * step
            noise = 0.3 * torch.randn(len(values), generator=generator)
            row.behavior_logprobs = (torch.tensor(values) + noise).tolist()
        out.append(batch)
    return out


def _train(worker, batches):
    metrics = [worker.train(step + 1, copy.deepcopy(batch)).metrics for step, batch in enumerate(batches)]
    return metrics, {k: v.clone() for k, v in worker.weights().items()}


@pytest.mark.slow  # two spawned ranks and one in-process trainer per preset: ~30-60 s on a loaded 2-core machine
@pytest.mark.parametrize(("preset", "sharding"), [("m2po", "ddp"), ("bapo", "ddp"), ("m2po", "fsdp")])
def test_two_ranks_train_the_one_process_steps(tiny_path, batches, preset, sharding):
    reference_metrics, reference_weights = _train(TrainerWorker(_config(tiny_path, preset, 1), tiny_path), batches)
    trainer = ShardedTrainer(_config(tiny_path, preset, 2, sharding), tiny_path)
    try:
        metrics, weights = _train(trainer, batches)
    finally:
        trainer.stop()
    for step, (a, b) in enumerate(zip(reference_metrics, metrics, strict=True)):
        assert 0 < a["loss/clip_frac"] < 1, (step, a["loss/clip_frac"])  # the rule masks some tokens, not all
        for key in (*COMPARED, *RULES[preset]):
            assert b[key] == pytest.approx(a[key], abs=TOL, rel=TOL), (step, key, a[key], b[key])
    for name, value in reference_weights.items():
        assert torch.allclose(weights[name], value, atol=TOL, rtol=0), (name, (weights[name] - value).abs().max())
