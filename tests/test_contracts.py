"""The plug-in contracts hold: every registered engine is an ``Engine``, both backends are ``Backend``s, both
trainer workers are ``TrainerRole``s (same method names and keyword arguments as the protocols)."""

import inspect

import pytest
import torch

from oprl.backends.base import Backend, TrainerRole
from oprl.backends.local import LocalBackend
from oprl.models.tiny import build_model, build_tokenizer
from oprl.rollout import ENGINES, Engine, VLLMEngine
from oprl.trainer.ranks import ShardedTrainer
from oprl.trainer.trainer import TrainerWorker


def members(protocol) -> set[str]:
    return {n for n in vars(protocol) if not n.startswith("_")} | set(protocol.__annotations__)


def keywords(function) -> set[str]:
    return {p.name for p in inspect.signature(function).parameters.values() if p.kind is p.KEYWORD_ONLY}


def test_the_torch_engines_are_engines_and_load_weights_changes_what_they_sample():
    tokenizer = build_tokenizer()
    prompts = [[7, 8, 9], [10, 11]]
    for name in ("lean", "hf-generate"):
        model = build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0)
        engine = ENGINES[name](model, tokenizer, max_new_tokens=4)
        assert isinstance(engine, Engine), name
        before = engine.generate(prompts, seed=3)
        other = build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=1)
        engine.load_weights({k: v.detach().clone() for k, v in other.named_parameters()})
        assert all(torch.equal(p, q) for p, q in zip(model.parameters(), other.parameters(), strict=True)), name
        assert engine.generate(prompts, seed=3).behavior_logprobs != before.behavior_logprobs, name


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_every_registered_engine_has_the_engine_methods(name):
    engine_type = (
        VLLMEngine
        if name == "vllm"
        else type(
            ENGINES[name](build_model(build_tokenizer(), hidden_size=8, num_layers=1, num_heads=1), build_tokenizer())
        )
    )
    assert issubclass(engine_type, Engine)
    assert (
        keywords(engine_type.generate)
        == keywords(Engine.generate)
        == {
            "seed",
            "temperature",
            "top_p",
            "batch_size",
            "row_seeds",
            "switch",
        }
    )


def test_backends_offer_what_the_driver_calls():
    local = LocalBackend()
    assert isinstance(local, Backend)
    ray_backend = pytest.importorskip("oprl.backends.ray_backend")
    missing = [n for n in members(Backend) if not hasattr(ray_backend.RayBackend, n)]
    assert not missing, missing


@pytest.mark.parametrize("worker", [TrainerWorker, ShardedTrainer])
def test_trainer_workers_are_trainer_roles(worker):
    assert issubclass(worker, TrainerRole)
    for name in members(TrainerRole):
        expected = list(inspect.signature(getattr(TrainerRole, name)).parameters)
        assert list(inspect.signature(getattr(worker, name)).parameters) == expected, (worker, name)
