"""An experience store given as ``buffer.path``: who wrote its batches, and one writer at a time.

A store outside the run directory outlives the run, so a later run pointed at it must not adopt its batches
by accident (an explore run used to count another seed's batches as its own). ``claim`` is called once the
run directory is locked and the config is resolved, for a run that writes a store at ``buffer.path``
(``mode=explore``, or ``mode=both`` with ``buffer.persist``):

- it locks the store (``rundir.RunLock`` on ``<store>/.oprl.lock``): a second run writing it is refused;
- ``store.json`` records each run that wrote batches there: its run directory, its first batch and its
  settings. A store that holds batches is refused unless this run is the one that wrote them being resumed
  (same run directory, ``resume=true``; the settings are the saved ones) or the run asks to add to it with
  ``buffer.append=true`` (``mode=explore``): then the store's model, warm start and task must be this run's
  (the token ids and rewards mean the same), and the new batches are numbered after the last one held;
- ``resume=restart`` deletes the batches the run itself wrote there earlier (another run's stay).

``explore_batches`` are the batch indices an explore run writes: ``first .. first + steps - 1``.
Not here: the store's files (``oprl.checkpoint.store``), the run directory's lock (``rundir``).
"""

from __future__ import annotations

import json
from pathlib import Path

from oprl.checkpoint import rundir
from oprl.checkpoint.store import ExperienceStore
from oprl.config import RunConfig
from oprl.errors import OprlError
from oprl.io import atomic_write_json

RECORD = "store.json"
COMPATIBLE = ("model.", "warmstart.", "task.")
"""Settings every run appending to one store must share: what its token ids and rewards mean."""


def external_store(config: RunConfig) -> Path | None:
    """The store a run writes at ``buffer.path`` (None: it writes none, or the one in its run directory)."""
    writes = config.mode == "explore" or (config.mode == "both" and config.buffer.persist)
    return Path(config.buffer.path) if writes and config.buffer.path else None


def claim(config: RunConfig, run_dir: Path) -> rundir.RunLock | None:
    """Lock the store ``config`` writes at ``buffer.path`` and check this run may write it (module docstring);
    None when there is no such store."""
    root = external_store(config)
    if root is None:
        return None
    if root.exists() and not root.is_dir():
        raise OprlError(f"buffer.path: {root} exists and is not a directory")
    root.mkdir(parents=True, exist_ok=True)
    lock = rundir.RunLock(root, label="buffer.path").acquire()
    try:
        _admit(config, run_dir.resolve(), root)
    except BaseException:
        lock.release()
        raise
    return lock


def _admit(config: RunConfig, run_dir: Path, root: Path) -> None:
    store, record = ExperienceStore(root), _read(root)
    runs = record["runs"]
    mine = [r for r in runs if r["run_dir"] == str(run_dir)]
    if config.resume is True and mine:  # the same run, resumed: resumed_config has checked its settings
        mine[-1]["steps"] = max(mine[-1]["steps"], config.steps)
        atomic_write_json(root / RECORD, record, indent=1, sort_keys=True)
        return
    if mine:  # resume=restart (its run directory was cleared): the batches it wrote here go too
        present = set(store.batches())
        store.discard([b for r in mine for b in _range_of(r) if b in present])
        runs = [r for r in runs if r["run_dir"] != str(run_dir)]
    held = store.batches()
    if held and not config.buffer.append:
        who = f"written by {runs[-1]['run_dir']}" if runs else "not written by a run this oprl recorded"
        raise OprlError(
            f"buffer.path: {root} already holds {len(held)} batches ({who}); choose another buffer.path, "
            "resume that run (resume=true), or add to it with mode=explore buffer.append=true"
        )
    if held and config.mode != "explore":
        raise OprlError("buffer.append=true: only mode=explore adds batches to a store that holds some")
    settings = _settings(config)
    for other in runs[-1:]:
        differ = [
            k for k in sorted(settings.keys() | other["settings"].keys()) if settings.get(k) != other["settings"].get(k)
        ]
        if differ:
            raise OprlError(
                f"buffer.append=true: {differ[0]}={_short(settings.get(differ[0]))} differs from the store's "
                f"{_short(other['settings'].get(differ[0]))} ({root / RECORD}); appended batches must share "
                f"{', '.join(p + '*' for p in COMPATIBLE)}"
            )
    first = max(held, default=0) + 1
    entry = {"run_dir": str(run_dir), "first_batch": first, "steps": config.steps, "settings": settings}
    atomic_write_json(root / RECORD, {"oprl_store": 1, "runs": [*runs, entry]}, indent=1, sort_keys=True)


def explore_batches(config: RunConfig, run_dir: Path) -> list[int]:
    """The batch indices an explore run writes (``1..steps``, or after the batches it appended to)."""
    root = external_store(config)
    first = 1
    if root is not None:
        mine = [r for r in _read(root)["runs"] if r["run_dir"] == str(Path(run_dir).resolve())]
        first = mine[-1]["first_batch"] if mine else 1
    return list(range(first, first + config.steps))


def _range_of(entry: dict) -> range:
    return range(entry["first_batch"], entry["first_batch"] + entry["steps"])


def _read(root: Path) -> dict:
    path = root / RECORD
    if not path.is_file():
        return {"runs": []}
    try:
        data = json.loads(path.read_text())
        assert isinstance(data["runs"], list) and all(isinstance(r["settings"], dict) for r in data["runs"])
    except Exception:
        raise OprlError(f"buffer.path: {path} is not a readable store record (remove it to adopt the store)") from None
    return data


def _settings(config: RunConfig) -> dict:
    flat: dict = {}

    def walk(data: dict, prefix: str) -> None:
        for key, value in data.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            elif f"{prefix}{key}".startswith(COMPATIBLE):
                flat[f"{prefix}{key}"] = value

    walk(config.model_dump(mode="json"), "")
    return flat


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
