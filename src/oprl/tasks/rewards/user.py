"""User reward functions: named by ``task.reward``, run in the timed reward processes of
``oprl.tasks.rewards.processes``.

The contract (docs/tasks.md): ``fn(prompt, completion, reference, **row) -> float | dict[str, float]`` where
``prompt`` is the row's prompt (a string or a list of chat messages), ``completion`` the model's response,
``reference`` the row's reference column (None without one) and ``row`` the row's other columns. A float is
the reward; a dict's values are named components (logged as ``reward/<name>``) summing to the reward.

A function is named ``package.module:function`` (imported from the current directory or the environment),
``path/to/file.py:function``, or by the name of an installed package's entry point in the group
``oprl.rewards`` (``oprl.plugins``: ``[project.entry-points."oprl.rewards"] exact = "my_pkg.rewards:exact"``,
then ``task.reward=exact``), which resolves to its ``module:function`` before anything imports it. Only the
reward processes (``oprl.tasks.rewards.processes``) import it: each checks the name and the signature at start-up, so a
typo is one ``OprlError`` line naming ``task.reward`` before anything trains, and a module that blocks at
import is one line after ``task.reward_import_timeout``. Each ``(row, function)`` call is one request to a
reward process under ``task.reward_timeout`` and ``task.reward_memory_mb``; replies come back on the processes' private
channel, checked against the request they answer, and what the function prints goes to
``<run_dir>/workers.log``. A call that hangs is killed; one that raises, runs out of memory, or returns
something other than a number within ±``MAX_ABS_REWARD`` (or a dict of them) fails. **A failed call scores 0
for its row** and is counted (components ``reward_timeout`` and ``reward_error``, logged as ``reward/...``;
the first failure of each kind is one warning line); the run stops only when a function fails on at least
``task.reward_max_error_fraction`` of a batch's rows (default 1.0: every row), with one line showing one
failed row. Before any of that, a run calls each function on its first train rows with their own reference as
the reply (``UserRewards.probe``, ``oprl.runtime.preflight.check_rewards``): one that fails on every such row
is that one line before any model loads.

``model:PATH`` names a sequence-classification model instead (``oprl.tasks.rewards.classifier``): it scores in this
process, batched, and its score joins the functions' as the component ``reward_model``.

Run one reward process by hand: ``echo '{"fn": 0, "prompt": "1+1=", "completion": "2", "reference": "2", "row": {}}'
| python -m oprl.tasks.rewards.user '{"specs": ["examples/arithmetic_reward.py:reward"], "columns": []}'``.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import inspect
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from oprl import plugins
from oprl.errors import OprlError
from oprl.tasks.base import Reward
from oprl.tasks.rewards.classifier import ClassifierReward, is_model_spec
from oprl.tasks.rewards.processes import RewardPool, fatal, serve, start_reward_process

KEY = "task.reward"
MAX_ABS_REWARD = 1e6
"""A reward (or component) beyond ±this is refused for its row like a NaN: 1e308 is finite, but a batch mean
or an ``eval/accuracy`` over it is inf, and (r − mean)/std loses every digit of the honest rewards."""
log = logging.getLogger("oprl.tasks")


def reward_spec(name: str, *, key: str = KEY) -> str:
    """``name`` as ``module:function``: itself, or the value of its entry point in ``oprl.rewards`` (read from
    the installed metadata; nothing is imported here); one ``OprlError`` line naming ``key`` otherwise."""
    return plugins.import_path("reward", name, key=key, what="function")


def load_reward(spec: str, *, key: str = KEY) -> Callable[..., Any]:
    """The function named by ``spec`` (``module:function`` or ``file.py:function``); one-line ``OprlError``.
    The import is ``oprl.plugins.load_object``, the one loader of every plug-in."""
    function = plugins.load_object(spec, key=key, what="function")
    if not callable(function):
        raise OprlError(f"{key}: {spec.rpartition(':')[0]!r} has no function {attribute_name(spec)!r}")
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
    if not math.isfinite(number) or abs(number) > MAX_ABS_REWARD:
        raise ValueError(f"returned {number!r}; a reward must be finite and within ±{MAX_ABS_REWARD:g}")
    return number


class UserRewards:
    """The reward functions of ``specs`` weighted by ``weights``, scored in ``processes`` timed reward processes.

    The processes start here and import the functions there (never in this process, so a module that blocks,
    crashes or prints at import cannot touch the run): a typo or a wrong signature is one ``OprlError`` line
    before anything trains, and so is a module that does not import within ``import_timeout`` seconds."""

    def __init__(
        self,
        specs: Sequence[str],
        weights: Sequence[float] | None,
        *,
        timeout: float,
        processes: int,
        extra_columns: Sequence[str] = (),
        memory_mb: int = 0,
        import_timeout: float = 60.0,
        max_error_fraction: float = 1.0,
    ):
        if not specs or not all(specs):
            raise OprlError(f"{KEY}: task.name=dataset needs a reward function: {KEY}=path/to/file.py:function")
        self.specs = [spec if is_model_spec(spec) else reward_spec(spec) for spec in specs]
        self.weights = [1.0] * len(self.specs) if weights is None else [float(w) for w in weights]
        if len(self.weights) != len(self.specs):
            raise OprlError(f"task.reward_weights: {len(self.weights)} weights for {len(self.specs)} reward functions")
        # Classifiers (model:PATH) score here, batched, on this process's device; functions in the reward processes.
        self.models = {i: ClassifierReward(spec) for i, spec in enumerate(self.specs) if is_model_spec(spec)}
        self.functions = [spec for i, spec in enumerate(self.specs) if i not in self.models]
        for spec in self.functions:
            _check_spec(spec)
        self.names = [self.models[i].name if i in self.models else attribute_name(s) for i, s in enumerate(self.specs)]
        self.memory_mb = memory_mb
        self.max_error_fraction = max_error_fraction
        self.counts = {"calls": 0, "timeout": 0, "error": 0}
        self._warned: set[tuple[str, str]] = set()
        self._probing = False
        self.pool: RewardPool | None = None
        if not self.functions:
            return
        self.pool = RewardPool(
            ["oprl.tasks.rewards.user", json.dumps({"specs": self.functions, "columns": list(extra_columns)})],
            processes,
            timeout,
            startup_timeout=import_timeout,
            what=f"{KEY}: the reward process for {','.join(self.functions)}",
            memory_mb=memory_mb or None,
        )
        try:
            self.pool.start()
        except OprlError as exc:
            self.pool.close()
            message = str(exc)
            fatal_message = message.partition(" failed to start: ")[2]
            if fatal_message.startswith(KEY):  # the reward process's own one-line diagnosis (import, name, signature)
                raise OprlError(fatal_message) from None
            if "did not start within" in message:
                message += f" (task.reward_import_timeout={import_timeout:g})"
            raise OprlError(message) from None

    @contextlib.contextmanager
    def probe(self) -> Iterator[None]:
        """Scores made inside are the pre-run check (``oprl.runtime.preflight.check_rewards``): rows given their
        reference as the reply, where a function that fails on every row is one ``OprlError`` line saying so,
        and one that fails on some says nothing (the run counts those). A classifier (``model:PATH``) scores 0
        here: its config was checked when it was named, and its weights load where the rewards are scored."""
        self._probing = True
        try:
            yield
        finally:
            self._probing = False

    def score(self, rows: Sequence[dict[str, Any]], ids: Sequence[str] | None = None) -> list[Reward]:
        """Rewards of ``rows``, each ``{"prompt", "completion", "reference", "row"}``; ``ids`` name the rows
        in messages. A call that fails scores 0 and is counted; ``_check_failures`` decides whether to stop."""
        requests = [dict(row, fn=f) for row in rows for f in range(len(self.functions))]
        answered = iter(self.pool.run(requests) if self.pool is not None and requests else [])
        scored = {i: [0.0] * len(rows) if self._probing else model.score(rows) for i, model in self.models.items()}
        replies = [{"value": scored[f][r]} if f in scored else next(answered)
                   for r in range(len(rows)) for f in range(len(self.specs))]  # fmt: skip
        ids = list(ids) if ids is not None else [f"row {i}" for i in range(len(rows))]
        self._check_failures(replies, ids)
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

    def _why(self, reply: dict) -> str:
        if reply.get("verdict") == "timeout":
            timeout = self.pool.timeout if self.pool is not None else math.nan
            return f"timed out after {timeout:g}s (task.reward_timeout)"
        why = str(reply.get("error") or "failed")
        return f"{why} (task.reward_memory_mb={self.memory_mb})" if reply.get("memory") else why

    def _check_failures(self, replies: list[dict], ids: list[str]) -> None:
        """Per function: ``OprlError`` when at least ``max_error_fraction`` of the batch's calls failed (1.0:
        every one), else one warning per kind of failure the first time it is seen; failed rows score 0."""
        per_row = len(self.specs)
        for f, spec in enumerate(self.specs):
            mine = replies[f::per_row]
            failed = [(row, reply) for row, reply in zip(ids, mine, strict=True) if "value" not in reply]
            if not failed:
                continue
            row, reply = failed[0]
            example = f"e.g. {row}: {self._why(reply)}"
            if self._probing:
                if len(failed) == len(mine):
                    raise OprlError(
                        f"{KEY}: {spec} failed on every one of the first {len(mine)} train rows, each given its "
                        f"reference as the reply, before the run started; {example}"
                    )
                continue
            if len(failed) >= self.max_error_fraction * len(mine):
                scope = f"all {len(mine)} rows" if len(failed) == len(mine) else f"{len(failed)} of {len(mine)} rows"
                raise OprlError(
                    f"{KEY}: {spec} failed on {scope} of a batch (task.reward_max_error_fraction="
                    f"{self.max_error_fraction:g}); {example}"
                )
            kind = (spec, self._why(reply).partition(":")[0])
            if kind not in self._warned:
                self._warned.add(kind)
                log.warning(
                    "%s: %s failed on %d of %d rows of a batch (each scores 0, counted in reward/reward_error and "
                    "reward/reward_timeout; said once); %s",
                    KEY,
                    spec,
                    len(failed),
                    len(mine),
                    example,
                )

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


def _check_spec(spec: str) -> None:
    """What can be checked without importing: the ``module:function`` form and that a named file exists."""
    target, sep, attribute = spec.rpartition(":")
    if not sep or not target or not attribute:
        raise OprlError(f"{KEY}: {spec!r} must be package.module:function or path/to/file.py:function")
    if (target.endswith(".py") or "/" in target or os.sep in target) and not Path(target).is_file():
        raise OprlError(f"{KEY}: file {target!r} not found (from {os.getcwd()})")


# ---------------------------------------------------------------- the reward process's side


def _process_main(argument: str) -> None:
    memory_mb = start_reward_process()  # before the user's module allocates anything
    settings = json.loads(argument)
    try:
        functions = [load_reward(spec) for spec in settings["specs"]]
        for function, spec in zip(functions, settings["specs"], strict=True):
            check_signature(function, spec, settings["columns"])
    except OprlError as exc:
        return fatal(str(exc))
    except MemoryError:
        return fatal(f"{KEY}: importing {settings['specs']} ran past task.reward_memory_mb={memory_mb}")

    def handle(request: dict) -> dict:
        function = functions[request["fn"]]
        row = {k: v for k, v in request["row"].items() if k not in ("prompt", "completion", "reference")}
        return {"value": reward_value(function(request["prompt"], request["completion"], request["reference"], **row))}

    serve(handle, memory_mb=memory_mb)


if __name__ == "__main__":
    _process_main(sys.argv[1])


def canonical_spec(spec: str) -> str:
    """One name per reward function, for cache keys: ``file.py:function`` as the file's absolute path, and a
    top-level ``module:function`` as the path of the file it would import (found without importing it);
    an entry point's name as the function it names; anything else as given. A function passed as an object
    (``module:function``) and the same function named by its file then key the same warm start."""
    if is_model_spec(spec):  # a classifier: keyed by its directory
        path = spec.partition(":")[2]
        return f"model:{Path(path).resolve()}" if Path(path).exists() else spec
    if ":" not in spec:  # an entry point's name: keyed as the function it names
        spec = plugins.entry_point("reward", spec) or spec
    target, sep, attribute = spec.rpartition(":")
    if not sep:
        return spec
    if target.endswith(".py") or "/" in target or os.sep in target:
        return f"{Path(target).resolve()}:{attribute}"
    if "." in target:  # finding a submodule would import its packages: only reward processes import user code
        return spec
    search = [*sys.path, os.getcwd()] if os.getcwd() not in sys.path else sys.path
    found = importlib.machinery.PathFinder.find_spec(target, search)
    origin = getattr(found, "origin", None)
    return f"{Path(origin).resolve()}:{attribute}" if origin and origin.endswith(".py") else spec
