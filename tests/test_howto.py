"""The recipes of docs/architecture.md, done exactly as the page says: a loss variant is one function plus one
registry entry in ``oprl.algorithms``; an engine is a callable building an ``Engine``, one entry in ``ENGINES``;
a plug-in engine gains partial rollouts by declaring them in its ``capabilities``; a sampling option is one
field of ``Sampling``."""

import json
from pathlib import Path

import torch

import recipes
from oprl.algorithms import LossParams, losses
from oprl.cli import main
from oprl.config import algorithm_of, load_config
from oprl.rollout import ENGINES, LeanEngine, Sampling


def _only_positive(ratio, advantages, params):
    """M = 1 on tokens of responses with A > 0: a loss that only pushes good responses up."""
    return (advantages > 0).expand_as(ratio)


def test_a_loss_variant_is_a_function_and_a_registry_entry(monkeypatch):
    monkeypatch.setitem(losses.CLIP_MODES, "only-positive", _only_positive)
    config = load_config(None, ["algorithm.clip_mode=only-positive"])  # the config checks the live registry
    assert algorithm_of(config).loss.clip_mode == "only-positive"
    logprobs = torch.full((2, 3), -1.0, requires_grad=True)
    advantages = torch.tensor([1.0, -1.0])
    mask = torch.ones(2, 3)
    loss, _ = losses.policy_loss(logprobs, logprobs.detach(), advantages, mask, LossParams(clip_mode="only-positive"))
    loss.backward()
    assert logprobs.grad is not None
    assert torch.all(logprobs.grad[0] < 0) and torch.all(logprobs.grad[1] == 0)  # the negative row is masked
    full = torch.full((2, 3), -1.0, requires_grad=True)
    losses.policy_loss(full, full.detach(), advantages, mask)[0].backward()
    assert full.grad is not None and torch.all(full.grad[1] != 0)  # clip_mode=none trains it


def test_a_loss_knob_is_one_field_of_the_typed_settings(monkeypatch):
    """docs/architecture.md "How to add a loss knob": a knob is a field of ``LossParams`` (in oprl: one
    ``knob(...)`` line in ``oprl.algorithms.spec``, which makes its config field); a rule reads it by attribute.
    Here the same outside oprl: a subclass adds ``positive_floor`` and a mask registered at test time uses it."""
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class FloorParams(losses.LossParams):
        positive_floor: float = 0.0
        """Tokens of responses whose advantage is below this get no gradient."""

    def floor_mask(ratio, advantages, params):
        return advantages >= params.positive_floor

    monkeypatch.setitem(losses.CLIP_MODES, "floor", floor_mask)
    logprobs = torch.full((3, 2), -1.0, requires_grad=True)
    advantages, mask = torch.tensor([1.0, 0.2, -1.0]), torch.ones(3, 2)
    params = FloorParams(clip_mode="floor", positive_floor=0.5)
    losses.policy_loss(logprobs, logprobs.detach(), advantages, mask, params)[0].backward()
    assert logprobs.grad is not None
    assert torch.all(logprobs.grad[0] < 0) and torch.all(logprobs.grad[1:] == 0)


def test_every_loss_setting_is_a_config_key_with_one_default():
    """In oprl a loss knob is one line, a ``LossParams`` field declared with ``knob(...)`` in
    ``oprl.algorithms.spec``; its default in ``ALGORITHM_DEFAULTS`` and its ``algorithm.<name>`` config field (None
    = the preset's value) are generated from it."""
    from oprl.algorithms import ALGORITHM_DEFAULTS
    from oprl.config.algorithm import AlgorithmConfig

    for name in losses.SETTING_FIELDS:
        assert name in AlgorithmConfig.model_fields and AlgorithmConfig.model_fields[name].default is None, name
        assert getattr(losses.LossParams(), name) == ALGORITHM_DEFAULTS[name], name
    config = load_config(None, ["algorithm.preset=rec-oneside-nois", "algorithm.eps_high=2.0"])
    params = algorithm_of(config).loss
    assert (params.clip_mode, params.eps_high, params.weight) == ("one-side", 2.0, "none")


def test_an_engine_is_one_registry_entry_and_trains(monkeypatch, small_overrides, tmp_path):
    monkeypatch.setitem(ENGINES, "counting", recipes.counting_engine)  # a LeanEngine counting generate calls
    recipes.CALLS.clear()
    assert main(["train", *small_overrides, "steps=2", "run_name=howto", "rollout.engine=counting"]) == 0
    rows = (tmp_path / "runs" / "howto" / "metrics.jsonl").read_text().splitlines()
    assert len([r for r in map(json.loads, rows) if "reward/correct" in r]) == 2
    assert recipes.CALLS  # the registered engine sampled the batches


def test_a_plug_in_engine_gains_partial_rollouts_by_declaring_them(small_overrides, tmp_path, capsys):
    """recipes.SwitchingLoop declares ``capabilities = EngineCapabilities(partial_kv=("keep", "recompute"))``
    and runs 2 switching steps by import path; recipes.OwnLoop, the same engine without it, is refused in one line."""
    path = Path(recipes.__file__)
    partial = [*small_overrides, "steps=2", "sync.offset=1", "sync.partial=true", "sync.switch_step=2"]
    partial += ["eval.interval=0", "tensorboard=false"]
    assert main(["train", *partial, "run_name=declared", f"rollout.engine={path}:SwitchingLoop"]) == 0
    rows = [json.loads(r) for r in (tmp_path / "runs" / "declared" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/correct" in r]
    assert len(steps) == 2
    assert steps[1]["batch/switched_frac"] > 0  # batch 2 switched to version 1 at decode step 2
    capsys.readouterr()
    assert main(["train", *partial, "run_name=undeclared", f"rollout.engine={path}:OwnLoop"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "sync.partial=true" in err and "rollout.engine" in err, err
    assert not (tmp_path / "runs" / "undeclared").exists()  # refused before anything started


def test_a_sampling_option_is_one_field_of_sampling():
    """docs/architecture.md "How to add a sampling option": an option is a field of ``Sampling`` (in oprl: the
    field, its ``rollout.<name>`` config field, and its mapping in the engines that sample elsewhere); one that
    removes tokens extends ``kept``, through which the lean engine samples and the trainer scores. Here the same
    outside oprl: a subclass adds min-p, S = {i : p_i >= min_p * max_j p_j}, and ρ = 1 on-policy under it."""
    from dataclasses import dataclass
    from types import SimpleNamespace

    from oprl.models.batching import right_pad_values
    from oprl.models.chat import encode_prompt
    from oprl.models.logprobs import grouped_response_logprobs
    from oprl.models.tiny import build_model, build_tokenizer

    @dataclass(frozen=True)
    class MinP(Sampling):
        min_p: float = 0.0
        """Tokens less likely than min_p times the most likely one cannot be drawn; 0 = off."""

        @property
        def truncates(self) -> bool:
            return super().truncates or self.min_p > 0

        def kept(self, scores):
            probs = scores.softmax(-1)
            return super().kept(scores) & (probs >= self.min_p * probs.max(-1, keepdim=True).values)

    section = SimpleNamespace(temperature=0.8, top_k=0, top_p=1.0, min_p=0.3)  # rollout.min_p, read by name
    sampling = MinP.of(section)
    assert sampling == MinP(temperature=0.8, min_p=0.3)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    prompts = [encode_prompt(tokenizer, [{"role": "user", "content": t}]) for t in ["1+2=", "35+47-9="] * 4]
    rollout = LeanEngine(model, tokenizer, sampling=sampling, max_new_tokens=8).generate(prompts, seed=0)
    with torch.no_grad():
        scored, _, mask = grouped_response_logprobs(
            model, prompts, rollout.response_ids, tokenizer.pad_token_id, sampling=sampling
        )
        whole, _, _ = grouped_response_logprobs(
            model, prompts, rollout.response_ids, tokenizer.pad_token_id, sampling=Sampling(temperature=0.8)
        )
    behavior = right_pad_values(rollout.behavior_logprobs, mask.shape[1])  # (B, T)
    assert mask.sum() > 30
    assert (scored - behavior)[mask].abs().max() < 1e-5  # ρ = 1: the trainer scores what the sampler drew from
    # Renormalised over a smaller set, no drawn token is less likely than under the whole softmax, and min-p did
    # remove mass (the whole softmax would read it as a policy change).
    assert (whole - behavior)[mask].max() < 1e-5 and (whole - behavior)[mask].min() < -0.05


def test_every_sampling_field_is_a_rollout_key_with_one_default():
    """In oprl a sampling option is a ``Sampling`` field and a ``rollout.<name>`` config field with the same
    default, which ``Sampling.of`` reads by name; evaluation reads the ``eval.*`` fields it has."""
    from dataclasses import fields

    from oprl.config.sections import RolloutConfig

    for field in fields(Sampling):
        assert RolloutConfig.model_fields[field.name].default == field.default, field.name
    config = load_config(None, ["rollout.temperature=0.7", "rollout.top_k=5", "rollout.top_p=0.9", "eval.top_p=0.95"])
    assert Sampling.of(config.rollout) == Sampling(temperature=0.7, top_k=5, top_p=0.9)
    assert Sampling.of(config.eval) == Sampling(temperature=1.0, top_k=0, top_p=0.95)  # no top-k in evaluation
