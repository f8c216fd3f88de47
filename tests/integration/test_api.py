"""The Python API: ``oprl.train`` / ``oprl.evaluate`` run the same jobs as the CLI and return typed results;
tasks and rewards go in as Python objects as well as by name."""

from pathlib import Path

import pytest
import yaml

import oprl
from oprl.api import RunResult, resolve, reward_spec
from oprl.config import RunConfig
from oprl.errors import OprlError
from oprl.tasks import DatasetTask
from oprl.tasks.data.dataset import DatasetTaskConfig

ROOT = Path(__file__).resolve().parents[2]
TRAIN = str(ROOT / "examples" / "arithmetic_train.jsonl")


def module_level_reward(prompt, completion, reference, **row):
    return float(completion.strip() == reference)


def as_values(overrides: list[str]) -> dict:
    """conftest's ``key=value`` strings as the keyword arguments a Python user would write."""
    return {key: yaml.safe_load(value) for key, value in (o.split("=", 1) for o in overrides)}


def test_train_runs_the_default_job_and_evaluate_reads_its_checkpoint(small_overrides):
    run = oprl.train(**as_values(small_overrides), steps=2, run_name="api")
    assert isinstance(run, RunResult) and run.run_dir.name == "api"
    assert run.config.steps == 2 and run.config.task.name == "arithmetic"
    assert run.metrics_path.is_file() and run.config_path.is_file() and run.final_model is not None
    assert {"reward/mean", "eval/accuracy", "loss/total"} <= set(run.final_metrics)
    assert run.final_metrics["eval/accuracy"] == run.accuracy_after == run.summary["eval_accuracy_after"]
    assert [r["step"] for r in run.metrics() if "reward/mean" in r] == [1, 2]
    evaluated = oprl.evaluate(checkpoint=run.run_dir, eval={"num_problems": 8, "samples": 3})
    assert evaluated.config.mode == "eval" and evaluated.run_dir != run.run_dir
    metrics = evaluated.final_metrics
    assert metrics["eval/checkpoint_step"] == 2.0 and metrics["eval/num_problems"] == 8.0
    assert 0.0 <= evaluated.accuracy_after <= metrics["eval/pass_at_k"] <= 1.0  # 24 rows, 8 problems
    assert metrics["eval/majority"] <= metrics["eval/pass_at_k"]


def test_settings_from_a_config_a_dict_nested_and_dotted_keywords(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("steps: 7\nrollout:\n  group_size: 4\n  prompts_per_step: 3\n")
    config = resolve(str(path), ["seed=5"], rollout={"group_size": 6}, **{"algorithm.preset": "opmd"})
    assert (config.steps, config.seed, config.rollout.group_size, config.rollout.prompts_per_step) == (7, 5, 6, 3)
    assert config.algorithm.preset == "opmd" and config.algorithm.baseline is not None  # preset resolved
    again = resolve(config, steps=8)
    assert isinstance(again, RunConfig) and again.steps == 8 and again.rollout.group_size == 6
    assert resolve({"steps": 3, "rollout": {"group_size": 5}}).rollout.group_size == 5
    with pytest.raises(OprlError, match=r"rollout\.gruop_size.*did you mean group_size"):
        resolve(rollout={"gruop_size": 4})


def test_task_and_reward_as_python_objects():
    section = DatasetTaskConfig(train_file=TRAIN, train_size=8)
    config = resolve(task=section, reward=module_level_reward)
    assert config.task.name == "dataset" and config.task.train_size == 8
    # This module is imported through pytest's sys.path entry, which worker processes do not have: its file.
    assert config.task.reward == f"{Path(__file__).resolve()}:module_level_reward"
    config = resolve({"task": {"name": "gsm8k", "source": "synthetic"}}, task="arithmetic")  # replaces the section
    assert config.task.name == "arithmetic"
    built = DatasetTask(train_file=TRAIN, train_size=8, reward="examples/arithmetic_reward.py:reward")
    assert resolve(task=built).task == built.config
    assert reward_spec([module_level_reward, "x.py:f"]) == [f"{Path(__file__).resolve()}:module_level_reward", "x.py:f"]
    with pytest.raises(OprlError, match=r"task\.reward: .*lambda.*not a module-level function"):
        resolve(task=section, reward=lambda prompt, completion, reference: 1.0)

    def nested(prompt, completion, reference):
        return 1.0

    with pytest.raises(OprlError, match="module-level"):
        reward_spec(nested)


def test_a_reward_imported_through_sys_path_reaches_the_workers(tmp_path, monkeypatch, small_overrides, capfd):
    """#42, the notebook pattern: ``sys.path.append(dir); from rev import rev_reward; oprl.train(reward=rev_reward)``
    failed in the reward processes ("cannot import 'rev'"). A top-level module travels by its file; a package
    module the workers cannot import is one line with the exact string to pass."""
    import importlib
    import json
    import sys

    (tmp_path / "rev.py").write_text(
        "def rev_reward(prompt, completion, reference, **row):\n"
        "    print('rev_reward was called')\n"
        "    return float(completion.strip() == reference)\n"
    )
    (tmp_path / "revpkg").mkdir()
    (tmp_path / "revpkg" / "__init__.py").write_text("")
    (tmp_path / "revpkg" / "rewards.py").write_text((tmp_path / "rev.py").read_text())
    monkeypatch.syspath_prepend(str(tmp_path))
    rev, rewards = importlib.import_module("rev"), importlib.import_module("revpkg.rewards")
    assert reward_spec(rev.rev_reward) == f"{tmp_path / 'rev.py'}:rev_reward"
    with pytest.raises(OprlError) as error:
        reward_spec(rewards.rev_reward)
    assert f"pass '{tmp_path / 'revpkg' / 'rewards.py'}:rev_reward' instead" in str(error.value)
    assert reward_spec(json.dumps) == "json:dumps"  # importable everywhere: by its module
    agent = resolve(task={"name": "agent", "agent": rev.rev_reward}).task.agent  # an agent given as an object
    assert agent == f"{tmp_path / 'rev.py'}:rev_reward"
    values = as_values([*small_overrides, "steps=1", "warmstart.max_steps=20", "warmstart.val_problems=16"])
    values.pop("task.train_size"), values.pop("task.test_size")
    section = DatasetTaskConfig(train_file=TRAIN, train_size=64)
    run = oprl.train(task=section, reward=rev.rev_reward, log=lambda _: None, **values)
    assert run.config.task.reward == f"{tmp_path / 'rev.py'}:rev_reward" and run.final_model is not None
    assert "reward/mean" in run.final_metrics
    # Its prints, the warm start's validation included (checked before the run directory existed), are in
    # workers.log, not on the terminal.
    assert "rev_reward was called" in (run.run_dir / "workers.log").read_text()
    assert "rev_reward was called" not in capfd.readouterr().err
    sys.modules.pop("rev", None)
