"""A user's reward function, agent function or task class as the import path it travels by to worker processes.

The inverse of ``oprl.plugins`` (which turns a configured name into an object): ``oprl.train(reward=f,
task=MyTask)`` records each object as a name a fresh process imports again, ``module:function`` when a fresh
worker process finds that module, else ``/path/file.py:function``, and the run's ``config.yaml`` keeps that name,
so the run can be resumed and repeated. A function defined in a notebook cell, a nested function or a lambda has
no such name: one line says to put it in a ``.py`` file. A plug-in task class is named the same way
(``module:Class`` or ``file.py:Class``).
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from oprl.errors import OprlError


def reward_spec(reward: Any) -> str | list[str]:
    """``task.reward``'s value for ``reward``: a spec string as is, a function as ``module:function`` (or
    ``file.py:function`` when it lives in the script being run), a list element-wise."""
    if isinstance(reward, str):
        return reward
    if isinstance(reward, (list, tuple)):
        return [function_spec(r) for r in reward]
    return function_spec(reward)


def function_spec(function: Any, key: str = "task.reward") -> str:
    """The name a function travels by to the processes that run it (module docstring): ``module:function``
    when a fresh worker process imports that module too (installed, on ``PYTHONPATH`` or in the current
    directory), else its file's ``path/file.py:function`` (a module imported through a ``sys.path`` entry
    added at run time, the notebook pattern); a function of such a package module is one line giving the
    exact string to pass instead."""
    if isinstance(function, str):
        return function
    what = "reward" if key == "task.reward" else "agent"
    if not callable(function):
        raise OprlError(f"{key}: expected a function or 'file.py:function', got {type(function).__name__}")
    name = getattr(function, "__qualname__", "")
    module = getattr(function, "__module__", None)
    if not name or "<" in name or "." in name or module is None:
        raise OprlError(
            f"{key}: {name or function!r} is not a module-level function; {what}s run in worker processes "
            "that import them by name: define it at the top level of a .py file"
        )
    source = inspect.getsourcefile(function)
    if module != "__main__":
        if _importable_in_workers(module) or source is None:
            return f"{module}:{name}"
        by_file = f"{Path(source).resolve()}:{name}"
        if "." not in module:  # a top-level module: its file names the same function for the workers
            return by_file
        raise OprlError(
            f"{key}: {module}:{name} cannot be imported by the worker processes ({module.split('.')[0]!r} is on "
            f"this process's sys.path only); pass {by_file!r} instead, or make the package importable "
            "(pip install -e, PYTHONPATH)"
        )
    main_file = getattr(sys.modules["__main__"], "__file__", None)
    if main_file is None:
        raise OprlError(
            f"{key}: {name} is defined in a notebook or an interactive session; {what}s run in worker "
            "processes that import them by name: put it in a .py file and pass 'file.py:function' (docs/api.md)"
        )
    return f"{Path(inspect.getfile(function)).resolve()}:{name}"


def _importable_in_workers(module: str) -> bool:
    """Whether a fresh Python process started here (as reward workers are: the current directory, the
    environment's ``PYTHONPATH``, site-packages) finds ``module``'s top-level package."""
    import importlib.machinery

    top = module.split(".")[0]
    if top in sys.builtin_module_names or top in getattr(sys, "stdlib_module_names", ()):
        return True

    search = _worker_sys_path(os.getcwd(), os.environ.get("PYTHONPATH", ""))
    return importlib.machinery.PathFinder.find_spec(top, list(search)) is not None


@functools.cache
def _worker_sys_path(cwd: str, pythonpath: str) -> tuple[str, ...]:
    """``sys.path`` of a fresh interpreter started in ``cwd`` with this environment (``PYTHONPATH`` keys the
    cache with ``cwd``)."""
    import subprocess

    code = "import json, sys; print(json.dumps(sys.path))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=cwd)
    return tuple(entry or cwd for entry in json.loads(result.stdout))


def task_values(task: Any) -> Any:
    """The ``task`` section's values for a task name, section, dict or built task."""
    if isinstance(task, str):
        return {"name": task}
    plugin = _plugin_name(task)
    if isinstance(task, type) and plugin:  # a plug-in task class: its section's defaults
        return {"name": plugin}
    section = getattr(task, "config", task)  # a built task carries its section
    if hasattr(section, "model_dump"):
        values = section.model_dump(mode="json")
        return {**values, "name": plugin} if plugin and not _resolvable(values.get("name")) else values
    if isinstance(section, Mapping):
        values = dict(section)
        if callable(values.get("agent")):  # task={"name": "agent", "agent": rollout}: by name, like a reward
            values["agent"] = function_spec(values["agent"], key="task.agent")
        if values.get("reward") is not None and not isinstance(values["reward"], str):
            values["reward"] = reward_spec(values["reward"])
        return values
    raise OprlError(f"task: expected a task name, a task section or a task, got {type(task).__name__}")


def _plugin_name(task: Any) -> str | None:
    """For a task class (or a built task) defined outside oprl: the import path the run records for it,
    ``module:Class``, or ``file.py:Class`` for a class from a file oprl loaded or a script; else None."""
    cls = task if isinstance(task, type) else type(task)
    if cls.__module__.split(".")[0] == "oprl" or not hasattr(cls, "Config") or not hasattr(cls, "problems"):
        return None
    module = sys.modules.get(cls.__module__)
    by_file = cls.__module__ == "__main__" or cls.__module__.startswith("_oprl_plugin_")
    target = getattr(module, "__file__", None) if by_file else cls.__module__
    return f"{target}:{cls.__qualname__}" if target else None


def _resolvable(name: Any) -> bool:
    """Whether a section's ``name`` finds its task again: a built-in, an import path or an entry point."""
    from oprl.plugins import entry_point
    from oprl.tasks import TASKS

    return isinstance(name, str) and (name in TASKS or ":" in name or entry_point("task", name) is not None)
