"""Plug-ins without editing oprl: one way to turn a configured name into an object (a task, an engine, a reward).

A name resolves, in this order, through

1. the built-in registry (``oprl.tasks.TASKS``, ``oprl.rollout.ENGINES``, ``oprl.algorithms.CLIP_MODES``, ...);
2. an installed package's entry point in the group of its kind (``GROUPS``: ``oprl.tasks``, ``oprl.engines``,
   ``oprl.rewards``, ``oprl.clip_modes``, ``oprl.weights``, ...), found with ``importlib.metadata.entry_points``:
   a package declares
   ``[project.entry-points."oprl.tasks"] my-task = "my_pkg.tasks:MyTask"`` and ``task.name=my-task`` works;
3. an import path: ``package.module:Name`` (imported from the current directory or the environment) or
   ``path/to/file.py:Name`` (a file, relative to the current directory).

Every failure (an unknown name, a module that does not import, a missing attribute) is one ``OprlError`` line
naming the configuration key and the name. A leaf: it imports nothing of oprl but ``oprl.errors``.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from oprl.errors import OprlError

GROUPS = {
    "task": "oprl.tasks",
    "engine": "oprl.engines",
    "reward": "oprl.rewards",
    # the algorithm settings whose value names a function of a registry (oprl.config.choices)
    "clip_mode": "oprl.clip_modes",
    "weight": "oprl.weights",
    "ratio_level": "oprl.ratio_levels",
    "regularizer": "oprl.regularizers",
    "loss_agg": "oprl.loss_aggregations",
    "objective": "oprl.objectives",
    "baseline": "oprl.baselines",
    "drop": "oprl.drop_rules",
}
"""The entry-point group of each kind of plug-in."""


def is_path(target: str) -> bool:
    """Whether the module part of a spec names a file (``x.py``, ``dir/x``) rather than a dotted module."""
    return target.endswith(".py") or "/" in target or os.sep in target


def load_object(spec: str, *, key: str, what: str = "object") -> Any:
    """The attribute named by ``spec`` (``module:Name`` or ``file.py:Name``); one-line ``OprlError`` naming ``key``.

    A file is imported under a private module name (``_oprl_plugin_<stem>``) and registered in ``sys.modules``
    so that classes defined in it (pydantic models, dataclasses) resolve their own module."""
    target, sep, attribute = spec.rpartition(":")
    if not sep or not target or not attribute:
        raise OprlError(f"{key}: {spec!r} must be package.module:{what} or path/to/file.py:{what}")
    try:
        module = _import(target, key)
    except OprlError:
        raise
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise OprlError(f"{key}: cannot import {target!r}: {type(exc).__name__}: {first_line(exc)}") from None
    found = getattr(module, attribute, None)
    if found is None:
        names = [name for name in vars(module) if not name.startswith("_")]
        close = difflib.get_close_matches(attribute, names, n=1, cutoff=0.6)
        hint = f" (did you mean {target}:{close[0]}?)" if close else ""
        raise OprlError(f"{key}: {target!r} has no {what} {attribute!r}{hint}")
    return found


def _import(target: str, key: str) -> Any:
    if is_path(target):
        path = Path(target)
        if not path.is_file():
            raise OprlError(f"{key}: file {target!r} not found (from {os.getcwd()})")
        name = f"_oprl_plugin_{path.stem}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise OprlError(f"{key}: cannot import {target!r} as a Python file")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        return module
    if os.getcwd() not in sys.path:  # as `python -m` would: modules next to the user's data import
        sys.path.append(os.getcwd())
    return importlib.import_module(target)


def entry_point(kind: str, name: str) -> str | None:
    """The ``module:Name`` value of the entry point ``name`` in ``kind``'s group, or None without one."""
    for point in importlib.metadata.entry_points(group=GROUPS[kind]):
        if point.name == name:
            return str(point.value)
    return None


def entry_point_names(kind: str) -> list[str]:
    """Names installed packages register in ``kind``'s group (for error messages and help)."""
    return sorted({point.name for point in importlib.metadata.entry_points(group=GROUPS[kind])})


def resolve(kind: str, name: str, builtins: Mapping[str, Any], *, key: str, what: str = "class") -> Any:
    """What ``name`` names: ``builtins[name]``, else an installed entry point, else an import path."""
    if name in builtins:
        return builtins[name]
    value = entry_point(kind, name)
    if value is not None:
        return load_object(value, key=f"{key} (entry point {name!r} of {GROUPS[kind]})", what=what)
    return load_object(import_path(kind, name, list(builtins), key=key, what=what), key=key, what=what)


def import_path(kind: str, name: str, builtins: Sequence[str] = (), *, key: str, what: str = "class") -> str:
    """``name`` as ``module:Name``: itself when it is one, else the value of its entry point in ``kind``'s
    group (read from the installed metadata, nothing imported); else one ``OprlError`` line naming ``key``,
    the closest known name and every known one (built-in, then installed)."""
    value = entry_point(kind, name)
    if value is not None:
        return value
    if ":" not in name:
        known = [*builtins, *entry_point_names(kind)]
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        label = kind.replace("_", " ")
        raise OprlError(
            f"{key}: unknown {label} {name!r}{hint}; choose from {', '.join(known)}, "
            f"or give package.module:{what} or path/to/file.py:{what}"
        )
    return name


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else ""
