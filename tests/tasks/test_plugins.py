"""Task plug-ins outside oprl (oprl.plugins): by file path, by import path, by an installed entry point."""

import importlib.metadata
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from oprl.cli import main
from oprl.config import load_config
from oprl.errors import OprlError
from oprl.tasks import build_task
from recipes import install_package

# A task as a user writes it: its own section (a field oprl has never heard of) and the Task protocol.
PLUGIN = textwrap.dedent(
    '''
    from typing import Literal

    from oprl.tasks import ArithmeticTask
    from oprl.tasks.section import TaskSection


    class DoublingConfig(TaskSection):
        name: Literal["doubling"] = "doubling"
        train_size: int = 600
        test_size: int = 64
        scale: int = 2
        """A field of the plug-in's own."""


    class DoublingTask:
        Config = DoublingConfig

        def __init__(self, config):
            self.config = config
            self.name = config.name
            self._inner = ArithmeticTask(train_size=config.train_size, test_size=config.test_size)

        def problems(self, split):
            return self._inner.problems(split)

        def score(self, problems, responses):
            return self._inner.score(problems, responses)
    '''
)


@pytest.fixture
def plugin_file(tmp_path):
    path = tmp_path / "doubling.py"
    path.write_text(PLUGIN)
    return path


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """A package ``doubling_pkg`` on sys.path with a dist-info declaring the entry point ``doubling``."""
    entry = "[oprl.tasks]\ndoubling = doubling_pkg:DoublingTask\n"
    return install_package(tmp_path / "site", "doubling_pkg", PLUGIN, entry, monkeypatch)


def test_a_task_by_file_path_validates_its_own_section(plugin_file):
    spec = f"{plugin_file}:DoublingTask"
    config = load_config(None, [f"task.name={spec}", "task.scale=3"])
    assert type(config.task).__name__ == "DoublingConfig" and config.task.scale == 3
    assert config.task.name == spec  # recorded as given: a resume resolves it again
    assert config.model_dump()["task"] == {"name": spec, "train_size": 600, "test_size": 64, "scale": 3}
    assert len(build_task(config.task).problems("test")) == 64
    with pytest.raises(OprlError, match=r"task.scale: .*task .*doubling.py:DoublingTask"):
        load_config(None, [f"task.name={spec}", "task.scale=x"])


def test_an_entry_point_and_an_import_path_resolve(installed):
    assert load_config(None, ["task.name=doubling"]).task.name == "doubling"
    assert type(load_config(None, ["task.name=doubling_pkg:DoublingTask"]).task).__name__ == "DoublingConfig"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("no-such-task", "task.name: unknown task 'no-such-task'; choose from arithmetic"),
        ("no_such_pkg.tasks:T", "task.name: cannot import 'no_such_pkg.tasks': ModuleNotFoundError"),
        ("nowhere/t.py:T", "task.name: file 'nowhere/t.py' not found"),
        ("oprl.tasks:Nothing", "task.name: 'oprl.tasks' has no class 'Nothing'"),
        ("oprl.tasks:build_task", "task.name: 'oprl.tasks:build_task' is not a task class with a Config"),
    ],
)
def test_an_unknown_or_broken_plugin_is_one_line_exit_2(name, expected, tmp_path, capsys):
    assert main(["train", f"task.name={name}", f"output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err, err


def test_a_plugin_that_fails_at_import_is_one_line(tmp_path, capsys):
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    assert main(["train", f"task.name={broken}:T", f"output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "task.name: cannot import" in err and "RuntimeError: boom" in err, err


def _trained_steps(run_dir) -> int:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return len([r for r in records if "reward/correct" in r])


def test_plugin_tasks_train_by_file_and_by_entry_point(small_overrides, plugin_file, installed, tmp_path):
    """Both train 2 steps with the tiny model; the entry point one in a fresh interpreter that finds it only
    through the dist-info on its path (importlib.metadata as installed packages are found)."""
    overrides = [o for o in small_overrides if not o.startswith("task.")] + ["steps=2"]
    assert main(["train", *overrides, f"task.name={plugin_file}:DoublingTask", "run_name=by-file"]) == 0
    run_dir = tmp_path / "runs" / "by-file"
    assert _trained_steps(run_dir) == 2
    assert f"{plugin_file}:DoublingTask" in (run_dir / "config.yaml").read_text()
    code = "import sys; from oprl.cli import main; sys.exit(main(sys.argv[1:]))"
    env_path = f"{installed}:{':'.join(p for p in sys.path if p)}"
    argv = [sys.executable, "-c", code, "train", *overrides, "task.name=doubling", "run_name=by-entry-point"]
    done = subprocess.run(argv, env={**_env(), "PYTHONPATH": env_path}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert _trained_steps(tmp_path / "runs" / "by-entry-point") == 2
    assert [p.name for p in importlib.metadata.entry_points(group="oprl.tasks")] == ["doubling"]


def _env() -> dict:
    import os

    return dict(os.environ)


def test_the_api_takes_a_plugin_task_class_or_object(plugin_file):
    from oprl.api import resolve
    from oprl.plugins import load_object

    cls = load_object(f"{plugin_file}:DoublingTask", key="test")
    assert resolve(None, task=cls).task.name == f"{plugin_file}:DoublingTask"
    built = cls(cls.Config(scale=5))
    config = resolve(None, task=built)
    assert config.task.name == f"{plugin_file}:DoublingTask" and config.task.scale == 5


def test_a_plugin_run_resumes(small_overrides, plugin_file, tmp_path):
    """config.yaml records the plug-in's name: resume=true finds the task again and trains on."""
    overrides = [o for o in small_overrides if not o.startswith("task.")] + ["run_name=resumed"]
    assert main(["train", *overrides, f"task.name={plugin_file}:DoublingTask", "task.scale=4", "steps=2"]) == 0
    assert main(["train", *overrides, "steps=3", "resume=true"]) == 0  # the task comes from config.yaml alone
    assert _trained_steps(tmp_path / "runs" / "resumed") == 3
    assert "scale: 4" in (tmp_path / "runs" / "resumed" / "config.yaml").read_text()


def test_an_engine_by_file_path_trains_and_a_bad_one_is_one_line(small_overrides, tmp_path, capsys):
    path = Path(__file__).parents[1] / "recipes.py"  # counting_engine: a LeanEngine counting generate calls
    overrides = [*small_overrides, "steps=2", "run_name=engine", f"rollout.engine={path}:counting_engine"]
    assert main(["train", *overrides]) == 0
    assert _trained_steps(tmp_path / "runs" / "engine") == 2
    assert sys.modules["_oprl_plugin_recipes"].CALLS  # the plug-in (its own copy of the module) sampled
    capsys.readouterr()
    assert main(["train", "rollout.engine=warp-drive", f"output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "rollout.engine: unknown engine 'warp-drive'; choose from lean" in err, err


def test_a_misspelt_function_name_gets_the_close_one(tmp_path):
    """#42: ``task.reward=rewards.py:exact_mach`` said only "has no function"."""
    from oprl.plugins import load_object

    path = tmp_path / "rewards.py"
    path.write_text("def exact_match(prompt, completion, reference):\n    return 1.0\n")
    with pytest.raises(OprlError) as error:
        load_object(f"{path}:exact_mach", key="task.reward", what="function")
    assert str(error.value) == (
        f"task.reward: {str(path)!r} has no function 'exact_mach' (did you mean {path}:exact_match?)"
    )
    with pytest.raises(OprlError, match=r"has no function 'zzz'$"):
        load_object(f"{path}:zzz", key="task.reward", what="function")
