"""Data-parallel trainer ranks (gloo, CPU): world_size 2 computes the one-process loss, gradient norm and weights.

The batch has unequal response lengths, so the two ranks hold different token counts: normalising each rank's
loss by its own count (or dividing by the world size again) moves the numbers far beyond the 1e-5 tolerance.
"""

import copy

import pytest
import torch

from oprl.config import load_config
from oprl.errors import OprlError
from oprl.models.tiny import build_model, build_tokenizer
from oprl.runtime.trainer_ranks import ShardedTrainer, check_trainer_config
from oprl.runtime.workers import TrainerWorker
from test_trainer import make_batch

TOL = 1e-5
COMPARED = ("loss/total", "loss/pg_loss", "loss/clip_frac", "entropy/mean", "optim/grad_norm", "loss/ratio_max")


def _save_model(directory, hidden, layers, heads):
    tokenizer = build_tokenizer()
    build_model(tokenizer, hidden_size=hidden, num_layers=layers, num_heads=heads, seed=3).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return _save_model(tmp_path_factory.mktemp("tiny"), 32, 2, 2)


def _config(path, sharding, world_size, **extra):
    overrides = [f"model.path={path}", f"trainer.sharding={sharding}", f"trainer.world_size={world_size}",
                 "rollout.prompts_per_step=3", "rollout.group_size=4", "optim.micro_batch_size=2",
                 "optim.mini_batches=2", "optim.lr=1e-4", "runtime.torch_threads=1"]
    return load_config(None, overrides + [f"{k}={v}" for k, v in extra.items()])


def _batches(tokenizer):
    # Three steps, groups of unequal lengths (1-5 tokens + EOS); group ids differ per step.
    batches = []
    for step in range(3):
        batch = make_batch(tokenizer, groups=3, k=4, seed=step)
        for e in batch:
            e.group_id += 10 * step
        batches.append(batch)
    return batches


def _run(worker, batches):
    metrics = [worker.train(step + 1, copy.deepcopy(batch)) for step, batch in enumerate(batches)]
    return metrics, {k: v.clone() for k, v in worker.weights().items()}


def _compare(reference, sharded):
    (ref_metrics, ref_weights), (metrics, weights) = reference, sharded
    for step, (a, b) in enumerate(zip(ref_metrics, metrics)):
        for key in COMPARED:
            assert b[key] == pytest.approx(a[key], abs=TOL, rel=TOL), (step, key, a[key], b[key])
    assert ref_weights.keys() == weights.keys()
    for name, value in ref_weights.items():
        assert torch.allclose(weights[name], value, atol=TOL, rtol=0), (name, (weights[name] - value).abs().max())


def _reference(config, path):
    worker = TrainerWorker(config.model_copy(update={"trainer": config.trainer.model_copy(
        update={"sharding": "none", "world_size": 1})}), path)
    return _run(worker, _batches(worker.tokenizer))


@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_two_ranks_equal_one_process(tiny_path, sharding):
    config = _config(tiny_path, sharding, 2)
    reference = _reference(config, tiny_path)
    trainer = ShardedTrainer(config, tiny_path)
    try:
        _compare(reference, _run(trainer, _batches(build_tokenizer())))
    finally:
        trainer.stop()


@pytest.mark.slow  # ~1 min on an idle 2-core machine (both processes train an 11 M model)
def test_two_fsdp_ranks_equal_one_process_11m(tmp_path):
    path = _save_model(tmp_path, 512, 4, 8)  # ~11 M parameters
    config = _config(path, "fsdp", 2, **{"algorithm.loss_agg": "seq-mean-token-mean"})
    reference = _reference(config, path)
    trainer = ShardedTrainer(config, path)
    try:
        _compare(reference, _run(trainer, _batches(build_tokenizer())))
    finally:
        trainer.stop()


@pytest.mark.parametrize("overrides, message", [
    ({"trainer.world_size": 2}, "needs trainer.sharding=ddp or fsdp"),
    ({"trainer.world_size": 4, "trainer.sharding": "fsdp"}, "exceeds the groups per step"),
    ({"trainer.dist_backend": "nccl", "trainer.sharding": "ddp"}, "needs CUDA tensors"),
    ({"model.device": "cuda", "trainer.world_size": 2, "trainer.sharding": "fsdp"}, "needs 2 GPUs"),
])
def test_bad_trainer_config_is_one_line(overrides, message):
    config = load_config(None, ["rollout.prompts_per_step=3"] + [f"{k}={v}" for k, v in overrides.items()])
    with pytest.raises(OprlError, match=message) as info:
        check_trainer_config(config, gpus=0)
    assert "\n" not in str(info.value)
