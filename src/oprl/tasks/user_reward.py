"""User reward functions: named by ``task.reward``, run in the timed worker pool of ``oprl.tasks.verify``.

The contract (docs/tasks.md): ``fn(prompt, completion, reference, **row) -> float | dict[str, float]`` where
``prompt`` is the row's prompt (a string or a list of chat messages), ``completion`` the model's response,
``reference`` the row's reference column (None without one) and ``row`` the row's other columns. A float is
the reward; a dict's values are named components (logged as ``reward/<name>``) summing to the reward.

A function is named ``package.module:function`` (imported from the current directory or the environment) or
``path/to/file.py:function``. The parent imports it once to check the name and the signature, so a typo is
one ``OprlError`` line naming ``task.reward`` before anything trains; the workers import it again. Each
``(row, function)`` call is one request to a worker process under ``task.reward_timeout``: a call that hangs
is killed, one that raises or returns something other than a finite number (or a dict of them) scores 0,
and both are counted per row (components ``reward_timeout`` and ``reward_error``). A function that fails on
every row of a batch stops the run with one line saying why.

Run one worker by hand: ``echo '{"fn": 0, "prompt": "1+1=", "completion": "2", "reference": "2", "row": {}}'
| python -m oprl.tasks.user_reward examples/arithmetic_reward.py:reward``.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from oprl.errors import OprlError
from oprl.tasks.base import Reward
from oprl.tasks.verify import WorkerPool, fatal, serve

KEY = "task.reward"
PROBE = 8
"""Calls per worker sent before the rest of a batch: when every one of them fails for some function, the
batch stops there instead of waiting out a timeout on every row."""


def load_reward(spec: str, *, key: str = KEY) -> Callable[..., Any]:
    """The function named by ``spec`` (``module:function`` or ``file.py:function``); one-line ``OprlError``."""
    target, sep, attribute = spec.rpartition(":")
    if not sep or not target or not attribute:
        raise OprlError(f"{key}: {spec!r} must be package.module:function or path/to/file.py:function")
    try:
        if target.endswith(".py") or "/" in target or os.sep in target:
            path = Path(target)
            if not path.is_file():
                raise OprlError(f"{key}: file {target!r} not found (from {os.getcwd()})")
            module_spec = importlib.util.spec_from_file_location(f"_oprl_reward_{path.stem}", path)
            if module_spec is None or module_spec.loader is None:
                raise OprlError(f"{key}: cannot import {target!r} as a Python file")
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path:  # as `python -m` would: modules next to the user's data import
                sys.path.append(os.getcwd())
            module = importlib.import_module(target)
    except OprlError:
        raise
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise OprlError(f"{key}: cannot import {target!r}: {type(exc).__name__}: {_first_line(exc)}") from None
    function = getattr(module, attribute, None)
    if not callable(function):
        raise OprlError(f"{key}: {target!r} has no function {attribute!r}")
    return function


def check_signature(function: Callable[..., Any], spec: str, extra_columns: Sequence[str], *, key: str = KEY) -> None:
    """One-line ``OprlError`` unless ``function(prompt, completion, reference, **row)`` binds for these columns."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return  # a builtin or C function: no signature to check; a wrong call then fails every row
    try:
        signature.bind("prompt", "completion", "reference", **dict.fromkeys(extra_columns))
    except TypeError as exc:
        raise OprlError(
            f"{key}: {spec} has the wrong signature {attribute_name(spec)}{signature} ({exc}); expected "
            f"fn(prompt, completion, reference, **row) -> float | dict[str, float]"
        ) from None


def attribute_name(spec: str) -> str:
    return spec.rpartition(":")[2]


def reward_value(value: Any) -> dict[str, float] | float:
    """``value`` as a finite float or a ``{name: finite float}`` dict; ``TypeError`` naming what it was."""
    if isinstance(value, dict):
        out = {}
        for name, item in value.items():
            number = reward_value(item)
            if not isinstance(name, str) or isinstance(number, dict):
                raise TypeError(f"returned a dict with {name!r}: {type(item).__name__}; need dict[str, float]")
            out[name] = number
        return out
    if isinstance(value, bool) or (not isinstance(value, (int, float)) and not hasattr(value, "__float__")):
        raise TypeError(f"returned {type(value).__name__} {str(value)[:40]!r}; need a float or dict[str, float]")
    number = float(value)
    if not math.isfinite(number):
        raise TypeError(f"returned {number}; need a finite float")
    return number


class UserRewards:
    """The reward functions of ``specs`` weighted by ``weights``, scored in ``workers`` timed processes."""

    def __init__(
        self,
        specs: Sequence[str],
        weights: Sequence[float] | None,
        *,
        timeout: float,
        workers: int,
        extra_columns: Sequence[str] = (),
    ):
        self.specs = list(specs)
        if not self.specs or not all(self.specs):
            raise OprlError(f"{KEY}: task.name=dataset needs a reward function: {KEY}=path/to/file.py:function")
        self.weights = [1.0] * len(self.specs) if weights is None else [float(w) for w in weights]
        if len(self.weights) != len(self.specs):
            raise OprlError(f"task.reward_weights: {len(self.weights)} weights for {len(self.specs)} reward functions")
        for spec in self.specs:
            check_signature(load_reward(spec), spec, extra_columns)
        self.names = [attribute_name(spec) for spec in self.specs]
        self.pool = WorkerPool(
            ["oprl.tasks.user_reward", *self.specs],
            workers,
            timeout,
            what=f"reward worker ({KEY}={','.join(self.specs)})",
        )
        self.counts = {"calls": 0, "timeout": 0, "error": 0}

    def score(self, rows: Sequence[dict[str, Any]]) -> list[Reward]:
        """Rewards of ``rows``, each ``{"prompt", "completion", "reference", "row"}``."""
        requests = [dict(row, fn=f) for row in rows for f in range(len(self.specs))]
        head = PROBE * self.pool.num_workers * len(self.specs)
        replies = self.pool.run(requests[:head])
        self._stop_if_all_failed(replies, len(rows) if len(requests) <= head else None)
        if len(requests) > head:
            replies += self.pool.run(requests[head:])
            self._stop_if_all_failed(replies, len(rows))
        per_row = len(self.specs)
        return [self._reward(replies[i * per_row : (i + 1) * per_row]) for i in range(len(rows))]

    def _reward(self, replies: list[dict]) -> Reward:
        total, components = 0.0, {}
        timeouts = errors = 0
        for name, weight, reply in zip(self.names, self.weights, replies, strict=True):
            self.counts["calls"] += 1
            if "value" not in reply:
                kind = "timeout" if reply.get("verdict") == "timeout" else "error"
                self.counts[kind] += 1
                timeouts, errors = timeouts + (kind == "timeout"), errors + (kind == "error")
                continue
            value = reply["value"]
            parts = value if isinstance(value, dict) else {name: value}
            for part, number in parts.items():
                if part in components:
                    raise OprlError(f"{KEY}: two reward functions return the component {part!r}; rename one")
                components[part] = float(number)
            total += weight * sum(parts.values())
        components["reward_timeout"] = float(timeouts)
        components["reward_error"] = float(errors)
        return Reward(total=total, components=components)

    def _stop_if_all_failed(self, replies: list[dict], rows: int | None) -> None:
        """``OprlError`` when some function failed on every call so far (``rows``: the batch is complete)."""
        per_row = len(self.specs)
        for f, spec in enumerate(self.specs):
            mine = replies[f::per_row]
            if mine and all("value" not in reply for reply in mine):
                why = mine[0].get("error") or "timed out"
                if mine[0].get("verdict") == "timeout":
                    why = f"timed out after {self.pool.timeout:g}s (task.reward_timeout)"
                scope = f"all {rows} rows of a batch" if rows else f"the first {len(mine)} rows of a batch"
                raise OprlError(f"{KEY}: {spec} failed on {scope}: {why}")

    def close(self) -> None:
        self.pool.close()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else ""


# ---------------------------------------------------------------- the worker side (a separate process)


def _worker_main(specs: list[str]) -> None:
    try:
        functions = [load_reward(spec) for spec in specs]
    except OprlError as exc:
        return fatal(str(exc))

    def handle(request: dict) -> dict:
        function = functions[request["fn"]]
        row = {k: v for k, v in request["row"].items() if k not in ("prompt", "completion", "reference")}
        return {"value": reward_value(function(request["prompt"], request["completion"], request["reference"], **row))}

    serve(handle, memory_limit=None)  # user code may import torch etc.; the timeout still bounds it


if __name__ == "__main__":
    _worker_main(sys.argv[1:])
