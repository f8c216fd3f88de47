"""The two recipes of docs/architecture.md, done exactly as the page says: a loss variant is one function plus one
registry entry in ``oprl.algorithms``; an engine is a callable building an ``Engine``, one entry in ``ENGINES``."""

import json

import torch

import recipes
from oprl.algorithms import losses
from oprl.cli import main
from oprl.config import algorithm_settings, load_config
from oprl.rollout import ENGINES


def _only_positive(ratio, advantages, params):
    """M = 1 on tokens of responses with A > 0: a loss that only pushes good responses up."""
    return (advantages > 0).expand_as(ratio)


def test_a_loss_variant_is_a_function_and_a_registry_entry(monkeypatch):
    monkeypatch.setitem(losses.CLIP_MODES, "only-positive", _only_positive)
    config = load_config(None, ["algorithm.clip_mode=only-positive"])  # the config checks the live registry
    assert algorithm_settings(config)["clip_mode"] == "only-positive"
    logprobs = torch.full((2, 3), -1.0, requires_grad=True)
    advantages = torch.tensor([1.0, -1.0])
    mask = torch.ones(2, 3)
    loss, _ = losses.policy_loss(logprobs, logprobs.detach(), advantages, mask, clip_mode="only-positive")
    loss.backward()
    assert logprobs.grad is not None
    assert torch.all(logprobs.grad[0] < 0) and torch.all(logprobs.grad[1] == 0)  # the negative row is masked
    full = torch.full((2, 3), -1.0, requires_grad=True)
    losses.policy_loss(full, full.detach(), advantages, mask)[0].backward()
    assert full.grad is not None and torch.all(full.grad[1] != 0)  # clip_mode=none trains it


def test_an_engine_is_one_registry_entry_and_trains(monkeypatch, small_overrides, tmp_path):
    monkeypatch.setitem(ENGINES, "counting", recipes.counting_engine)  # a LeanEngine counting generate calls
    recipes.CALLS.clear()
    assert main(["train", *small_overrides, "steps=2", "run_name=howto", "rollout.engine=counting"]) == 0
    rows = (tmp_path / "runs" / "howto" / "metrics.jsonl").read_text().splitlines()
    assert len([r for r in map(json.loads, rows) if "reward/correct" in r]) == 2
    assert recipes.CALLS  # the registered engine sampled the batches
