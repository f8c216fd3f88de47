"""The supervised warm start on demonstrations: of a pretrained model directory (``warmstart.pretrained``), its
targets (a task's demonstrations, problems without one left out), and when it applies."""

import json

import pytest
import torch
from safetensors.torch import load_file

from oprl.config import RunConfig
from oprl.errors import OprlError
from oprl.models.tiny import build_model, build_tokenizer
from oprl.runtime.launch import model_path
from oprl.tasks import build_task
from oprl.tasks.base import Problem
from oprl.trainer.warmstart_sft import demonstrable, examples

TASK = {"name": "arithmetic", "train_size": 400, "test_size": 16}
WARM = {"max_steps": 30, "batch_size": 64, "check_interval": 10, "val_problems": 32, "target_accuracy": 0.99}


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A Hugging Face model directory standing in for a pretrained model (random tiny weights, seed 7)."""
    path = tmp_path_factory.mktemp("pretrained")
    tokenizer = build_tokenizer()
    build_model(tokenizer, seed=7).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _config(path, **warm):
    return RunConfig.model_validate(
        {"model": {"path": str(path)}, "task": TASK, "warmstart": WARM | warm, "progress": False}
    )


def test_a_pretrained_model_is_used_as_is_unless_asked(pretrained):
    config = _config(pretrained)
    assert model_path(config, build_task(config.task), log=lambda _: None) == str(pretrained)


def test_pretrained_warm_start_fine_tunes_the_given_weights(pretrained):
    config = _config(pretrained, pretrained=True)
    logs = []
    path = model_path(config, build_task(config.task), log=logs.append)
    assert path != str(pretrained) and "warm-" in path and str(pretrained) in logs[0]
    report = json.loads((pretrained.parent / path / "oprl_recipe.json").read_text())
    assert report["model"] == {"path": str(pretrained), "dtype": "float32"}
    history = report["result"]["history"]
    assert len(history) == 3 and history[-1]["loss"] < history[0]["loss"]
    before, after = load_file(pretrained / "model.safetensors"), load_file(f"{path}/model.safetensors")
    assert before.keys() == after.keys()
    # Fine-tuned from these weights: changed, but by a few AdamW steps, not re-initialised.
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert all((before[k] - after[k]).abs().max() < 0.2 for k in before)
    logged = len(logs)
    again = model_path(config, build_task(config.task), log=logs.append)
    assert again == path and len(logs) == logged  # cached: the second call trains nothing (logs nothing)


class _Demonstrated:
    """A single-turn task whose demonstrations differ from its reference answers; problem 1 has none."""

    name = "fake"

    def __init__(self):
        self._problems = [
            Problem(task_id=f"fake/{i}", messages=({"role": "user", "content": f"{i}+0="},), answer="ref")
            for i in range(3)
        ]

    def problems(self, split):
        return self._problems

    def score(self, problems, responses):
        raise AssertionError("not scored here")

    def demonstration(self, problem):
        return None if problem.task_id == "fake/1" else [f"={problem.task_id[-1]}"]


def test_targets_are_demonstrations_and_problems_without_one_are_left_out():
    tokenizer, task = build_tokenizer(), _Demonstrated()
    kept, skipped = demonstrable(task, list(task.problems("train")))
    assert [p.task_id for p in kept] == ["fake/0", "fake/2"] and skipped == 1
    _, answers, masks, limits = examples(tokenizer, task, kept)
    assert [tokenizer.decode(a[:-1]) for a in answers] == ["=0", "=2"]  # the demonstration, not "ref"
    assert all(a[-1] == tokenizer.eos_token_id for a in answers) and masks == [[1, 1, 1], [1, 1, 1]]
    assert limits["max_turns"] == 1
    task.demonstration = lambda problem: None
    with pytest.raises(OprlError, match="no train problem has one"):
        demonstrable(task, list(task.problems("train")))


def test_holding_out_every_train_problem_is_one_line(pretrained):
    config = _config(pretrained, pretrained=True, val_problems=400)
    with pytest.raises(OprlError, match=r"warmstart\.val_problems=400 holds out all 400 train problems"):
        model_path(config, build_task(config.task), log=lambda _: None)


def test_a_reward_named_by_file_or_by_module_keys_the_same_warm_start(tmp_path, monkeypatch):
    """``oprl.train(reward=reward)`` records ``module:function``; ``task.reward=file.py:function`` names the
    same function: one cached warm start, not two."""
    from oprl.config import load_config
    from oprl.trainer.warmstart import recipe

    (tmp_path / "my_reward.py").write_text("def reward(prompt, completion, reference, **row):\n    return 1.0\n")
    (tmp_path / "train.jsonl").write_text('{"prompt": "1+1=", "reference": "2"}\n')
    monkeypatch.chdir(tmp_path)

    def key(reward):
        config = load_config(None, ["task.name=dataset", "task.train_file=train.jsonl", f"task.reward={reward}"])
        return recipe(config.model, config.task, config.warmstart)

    by_file = key("my_reward.py:reward")
    assert by_file == key("my_reward:reward") == key(f"{tmp_path}/my_reward.py:reward")
    assert by_file != key("my_reward.py:other")


def test_a_killed_warm_start_continues_where_it_was_saved(tmp_path, monkeypatch):
    """A warm start killed after its first validation keeps that step's state (``SAVE_EVERY_S=0``: every
    check); the next run continues from it and ends with the weights of an uninterrupted warm start."""
    from oprl.trainer import warmstart_sft

    config = RunConfig.model_validate({"task": TASK, "warmstart": WARM, "progress": False})
    task = build_task(config.task)
    monkeypatch.setattr(warmstart_sft, "SAVE_EVERY_S", 0.0)
    monkeypatch.setenv("OPRL_CACHE_DIR", str(tmp_path / "whole"))
    whole = load_file(model_path(config, task, log=lambda _: None) + "/model.safetensors")

    monkeypatch.setenv("OPRL_CACHE_DIR", str(tmp_path / "killed"))
    validate, calls = warmstart_sft._validate, []

    def killed_at_the_second_check(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return validate(*args, **kwargs)

    monkeypatch.setattr(warmstart_sft, "_validate", killed_at_the_second_check)
    with pytest.raises(KeyboardInterrupt):
        model_path(config, task, log=lambda _: None)
    (partial,) = (tmp_path / "killed" / "models").glob(".partial-tiny-*")
    assert json.loads((partial / "warm_state.json").read_text())["step"] == 10
    monkeypatch.setattr(warmstart_sft, "_validate", validate)
    logs: list[str] = []
    resumed = model_path(config, task, log=logs.append)
    assert any("warm start: continuing from step 10" in line for line in logs), logs
    assert not partial.exists()  # the finished model replaces its partial state
    after = load_file(resumed + "/model.safetensors")
    assert after.keys() == whole.keys() and all(torch.equal(after[k], whole[k]) for k in whole)


def test_an_agent_task_warm_starts_on_its_problems_whatever_the_agent_and_endpoint(tmp_path, monkeypatch):
    """#41: the agent file, host, port and batch wait do not key the warm start, which is its problems'
    task's own (the same cache as ``task.name=tool-arithmetic``), never run through the agent."""
    from oprl.config import load_config
    from oprl.trainer.warmstart import _target, warm_task

    monkeypatch.chdir(tmp_path)
    for name in ("a", "b"):
        (tmp_path / f"{name}.py").write_text("def rollout(client, problem):\n    raise AssertionError('agent')\n")

    def target(*overrides):
        config = load_config(None, list(overrides))
        return _target(config.model, config.task, config.warmstart, build_task(config.task))[1]

    first = target("task.name=agent", "task.agent=a.py:rollout")
    assert first == target("task.name=agent", "task.agent=b.py:rollout", "task.port=5000", "task.host=0.0.0.0")
    assert first == target("task.name=agent", "task.agent=a.py:rollout", "task.batch_wait_s=1")
    assert first == target("task.name=tool-arithmetic")
    assert first != target("task.name=agent", "task.agent=a.py:rollout", "task.problems.train_size=100")
    config = load_config(None, ["task.name=agent", "task.agent=a.py:rollout"])
    section, learned = warm_task(config.task, build_task(config.task))
    assert learned.name == "tool-arithmetic" and section.name == "tool-arithmetic"


def test_a_plugin_task_by_entry_point_or_by_file_keys_one_warm_start(tmp_path, monkeypatch):
    """The same class named by an installed entry point and by its file's path: one warm start, not two."""
    from oprl.config import load_config
    from oprl.trainer.warmstart import _target
    from recipes import install_package
    from tasks.test_plugins import PLUGIN

    entry = "[oprl.tasks]\ndoubling = doubling_pkg:DoublingTask\n"
    site = install_package(tmp_path / "site", "doubling_pkg", PLUGIN, entry, monkeypatch)

    def target(name):
        config = load_config(None, [f"task.name={name}"])
        return _target(config.model, config.task, config.warmstart, build_task(config.task))[1]

    by_entry_point = target("doubling")
    assert by_entry_point == target(f"{site}/doubling_pkg/__init__.py:DoublingTask")
    assert by_entry_point == target("doubling_pkg:DoublingTask")
