"""What a checkpoint's files must hold, checked before a resume changes anything.

``manifest.verify`` proves the bytes are the ones written; this module proves they *parse* into what
``restore`` will read: every JSON file is JSON of the expected shape (``state.json``'s step and batch lists,
``trainer/optimizer.json``'s parameter groups and ``index/key`` scalars, ...), every safetensors file opens
and every parquet file is an oprl experience table. ``problem(checkpoint)`` returns the first thing wrong as
one phrase naming the file, or None. A manifest recomputed over a hand-edited file (``optimizer.json``
holding ``[1, 2]``) verifies, and is caught here, in the driver, before the workers load anything; what only
the model can tell (a tensor missing from ``model.safetensors``) is caught when the trainer loads it, which
``oprl.runtime.resume.restore`` also does before any file of the run changes.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import safe_open

from oprl.checkpoint.store import read_parquet
from oprl.errors import OprlError


class _Bad(ValueError):
    """A file's content does not have the expected shape (the message says what)."""


def problem(checkpoint: Path) -> str | None:
    """The first file of ``checkpoint`` that does not parse, as ``"<relative path>: <what>"``; None if all do."""
    root = Path(checkpoint)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        name = path.relative_to(root).as_posix()
        try:
            _check(root, name, path)
        except _Bad as exc:
            return f"{name} does not parse: {exc}"
        except OprlError as exc:  # read_parquet's one line names the whole path; keep its reason
            return f"{name} does not parse: {str(exc).split(': ', 1)[-1]}"
        except Exception as exc:  # JSON, OS and safetensors' own errors (a header it cannot parse)
            reason = str(exc).splitlines()[0][:160] if str(exc) else ""
            return f"{name} does not parse: {type(exc).__name__}: {reason}"
    return None


def _check(root: Path, name: str, path: Path) -> None:
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        check = _JSON.get(name) or _JSON.get(path.name)
        if check is not None:
            check(root, data)
    elif path.suffix == ".safetensors":
        with safe_open(str(path), framework="pt") as tensors:
            keys = list(tensors.keys())
        if name.endswith("optimizer.safetensors"):
            for key in keys:
                _index_key(key, "tensor name")
    elif path.suffix == ".parquet":
        read_parquet(path, columns=["group_id"])


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise _Bad(what)


def _ints(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _index_key(name, what: str) -> None:
    index, _, key = name.partition("/") if isinstance(name, str) else ("", "", "")
    _require(index.isdigit() and bool(key), f"{what} {str(name)[:40]!r} is not '<parameter index>/<state key>'")


def _state(root: Path, data) -> None:
    _require(isinstance(data, dict), "expected a JSON object")
    _require(_int(data.get("step")) and data["step"] >= 0, "'step' is not a non-negative integer")
    for key in ("ready", "outstanding", "weights_versions"):
        _require(_ints(data.get(key)), f"{key!r} is not a list of integers")
    for version in data["weights_versions"]:
        path = root / "weights" / f"version-{version:06d}.safetensors"
        _require(path.is_file(), f"names policy version {version}, but weights/{path.name} is missing")
    for batch in data["ready"]:
        _require((root / "buffer" / f"ready-{batch:06d}.parquet").is_file(), f"names ready batch {batch}, not saved")


def _trainer(_root: Path, data) -> None:
    _require(isinstance(data, dict) and _int(data.get("version")), "'version' is not an integer")


def _optimizer(_root: Path, data) -> None:
    _require(isinstance(data, dict), "expected a JSON object with 'param_groups' and 'scalars'")
    groups, scalars = data.get("param_groups"), data.get("scalars")
    _require(isinstance(groups, list) and bool(groups), "'param_groups' is not a non-empty list")
    for group in groups:
        _require(isinstance(group, dict) and _ints(group.get("params")), "a parameter group lacks its 'params' list")
    _require(isinstance(scalars, dict), "'scalars' is not an object")
    for key in scalars:
        _index_key(key, "scalar")


def _buffer(root: Path, data) -> None:
    _require(isinstance(data, dict), "expected a JSON object")
    _require(_ints(data.get("ready")) and _ints(data.get("pool_batches")), "'ready'/'pool_batches' not integer lists")
    _require(_int(data.get("evicted")), "'evicted' is not an integer")
    position = data.get("offline_position")
    _require(position is None or _int(position), "'offline_position' is not an integer")
    for batch in data["ready"]:
        name = f"ready-{batch:06d}.parquet"
        _require((root / "buffer" / name).is_file(), f"names ready batch {batch}, but buffer/{name} is missing")
    if data["pool_batches"]:
        _require((root / "buffer" / "replay.parquet").is_file(), "names a replay pool, but replay.parquet is missing")


def _rng(_root: Path, data) -> None:
    python = data.get("python") if isinstance(data, dict) else None
    _require(
        isinstance(python, list) and len(python) == 3 and _int(python[0]) and _ints(python[1]),
        "'python' is not a [version, state, gauss] triple",
    )


_JSON = {
    "state.json": _state,
    "trainer/trainer.json": _trainer,
    "trainer/optimizer.json": _optimizer,
    "buffer/buffer.json": _buffer,
    "rng.json": _rng,
}
"""Structure checks by path inside the checkpoint (``rng.json`` wherever it is: the driver's, the trainer's)."""
