"""The run directory: where it is, whether it may be written, and one writer at a time.

- ``RunLock``: an exclusive ``fcntl.flock`` on ``<run_dir>/.oprl.lock``, taken before anything is written and
  held until the run ends (train, explore, resume; with ``backend=ray`` the driver process holds it, and it
  is the driver that decides what is written). The file records the holder's PID, host and start time, so
  a second run on the same directory stops with one line naming them. The holder deletes the file when it
  releases the lock (a run that ends, cleanly or with an error); the OS drops the lock when the holder
  exits, even after ``kill -9``, so a stale lock file never blocks a resume;
- ``open_new``/``open_existing``: lock a run directory for a new run (a missing or empty directory only; one
  holding another run is refused unless ``overwrite``, anything that is not an oprl run always is) or for
  a resumed one (it must hold a run).

Not here: what a run writes (``run.py``), checkpoints (``checkpoint.py``), the rule that ``run_name`` is one
path component under ``output_dir`` (a validator of ``oprl.config.RunConfig``, checked at load).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import time
from pathlib import Path

from oprl.errors import OprlError

LOCK_NAME = ".oprl.lock"
FINAL_CONFIG = "oprl_config.yaml"
"""In ``final/``: a copy of the run's ``config.yaml``, so that ``oprl eval runs/X/final`` (or ``model.path=``
it in mode=eval) evaluates the run's task with the run's eval settings."""
FINAL_INFO = "oprl_final.json"
"""In ``final/``: ``{"step": N}``, the step whose weights it holds (an evaluation of them draws the random
numbers an evaluation of checkpoint N draws, so both score the same)."""


def is_run_dir(path: Path) -> bool:
    """Written by oprl: holds a ``config.yaml`` or this module's lock file."""
    return (path / "config.yaml").is_file() or (path / LOCK_NAME).is_file()


def final_config(model_dir: str | Path) -> Path | None:
    """The run config a run's ``final/`` directory carries; None for any other model directory."""
    path = Path(model_dir) / FINAL_CONFIG
    return path if path.is_file() else None


def final_step(model_dir: str | Path) -> int | None:
    """The step whose weights a run's ``final/`` directory holds; None for any other model directory."""
    import json

    path = Path(model_dir) / FINAL_INFO
    return int(json.loads(path.read_text())["step"]) if path.is_file() else None


INCOMPLETE = "INCOMPLETE"
"""Written into a run directory whose run stopped before step 1 (what stopped it): a rerun replaces it."""


def never_started(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run that left nothing to continue: no trained step (a ``metrics.jsonl`` row
    of step >= 1), no checkpoint, no stored batch, no ``final/`` or ``summary.json`` (a bad import, a context
    error, a kill during the warm start). Such a run does not block its name."""
    import json

    run_dir = Path(run_dir)
    if not is_run_dir(run_dir) or (run_dir / "summary.json").exists() or (run_dir / "final").exists():
        return False
    if any((run_dir / "checkpoints").glob("step-*")) or any((run_dir / "experiences").glob("batch-*")):
        return False
    metrics = run_dir / "metrics.jsonl"
    for line in metrics.read_text().splitlines() if metrics.is_file() else []:
        try:
            if json.loads(line).get("step", 0) >= 1:
                return False
        except (ValueError, AttributeError):  # a torn last line
            continue
    return True


def mark_incomplete(run_dir: Path, reason: str) -> None:
    """Leave ``INCOMPLETE`` in a run directory whose run stopped before step 1 (``never_started``). Best effort:
    it is written while another error propagates (a full disk, a read-only directory), which must stay the one
    reported; a rerun finds such a run by its contents anyway."""
    try:
        if never_started(run_dir):
            (Path(run_dir) / INCOMPLETE).write_text(
                f"This run stopped before step 1: {reason}\nRunning it again with the same run_name replaces it.\n"
            )
    except OSError:
        pass


def check_new(run_dir: Path, *, overwrite: bool = False) -> None:
    """``open_new``'s refusals, made without the lock so that a run makes them before it prints anything
    (``oprl.runtime.preflight.check_paths``); ``open_new`` makes them again, the last one under the lock."""
    if run_dir.exists() and not run_dir.is_dir():
        raise OprlError(f"run_name: {run_dir} exists and is not a directory")
    others = sorted(p.name for p in run_dir.iterdir()) if run_dir.is_dir() else []
    if others and not is_run_dir(run_dir):
        raise OprlError(
            f"run_name: {run_dir} exists and is not an oprl run directory (it holds {others[0]!r}"
            f"{' ...' if len(others) > 1 else ''}); choose another run_name or output_dir"
        )
    if _holds_run(run_dir) and not overwrite and not never_started(run_dir):
        raise _in_use(run_dir)


def _holds_run(run_dir: Path) -> bool:
    return (run_dir / "metrics.jsonl").exists() or (run_dir / "config.yaml").exists()


def _in_use(run_dir: Path) -> OprlError:
    return OprlError(
        f"run_name: {run_dir} already holds a run; choose another run_name, resume=true to continue it "
        "or overwrite=true to replace it"
    )


def open_new(run_dir: Path, *, overwrite: bool = False, log=print) -> RunLock:
    """Lock ``run_dir`` for a new run (creating it); refuse one that is not oprl's, and one that holds a run
    unless ``overwrite`` (then its outputs are deleted, under the lock) or that run never reached step 1
    (``never_started``: replaced, with a line saying so)."""
    check_new(run_dir, overwrite=overwrite)
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = RunLock(run_dir).acquire()
    if _holds_run(run_dir):  # checked again under the lock
        if overwrite:
            clear(run_dir)
            return lock
        if never_started(run_dir):
            log(f"run_name: {run_dir} holds a run that stopped before step 1 (nothing to continue); replacing it")
            clear(run_dir)
            return lock
        lock.release()
        raise _in_use(run_dir)
    return lock


def open_existing(run_dir: Path) -> RunLock:
    """Lock the run in ``run_dir`` to continue it (resume)."""
    if not (run_dir / "config.yaml").is_file():
        raise OprlError(f"resume: {run_dir} holds no run to resume (no config.yaml)")
    return RunLock(run_dir).acquire()


RUN_OUTPUTS = (
    "config.yaml",
    INCOMPLETE,
    "metrics.jsonl",
    "metrics.png",
    "summary.json",
    "workers.log",
    "tensorboard",
    "experiences",
    "checkpoints",
    "final",
    "wandb",
    "mlruns",
)
"""What a run writes into its directory (run.py, metrics.py, the store, checkpoints, trackers, workers).
``resume=restart`` deletes these (and their ``.<name>...`` temporaries) and nothing else."""


def is_run_output(name: str) -> bool:
    """``name`` is one of ``RUN_OUTPUTS`` or a temporary of one (``.metrics.jsonl.tmp-123``, ``.final...``)."""
    return name in RUN_OUTPUTS or any(name.startswith(f".{output}.") for output in RUN_OUTPUTS)


def clear(run_dir: Path) -> None:
    """Delete what a run wrote into ``run_dir`` (``resume=restart``): ``RUN_OUTPUTS`` only, so the user's own
    files there (notes, analysis) stay; the held lock file stays too."""
    for entry in Path(run_dir).iterdir():
        if not is_run_output(entry.name):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


class RunLock:
    """``with RunLock(run_dir):`` -- exclusive use of ``run_dir`` (see the module docstring)."""

    def __init__(self, run_dir: Path, label: str = "run_name"):
        self.path = Path(run_dir) / LOCK_NAME
        self.label = label
        """The setting that named the directory, in the refusal (``run_name``; ``buffer.path`` for a store)."""
        self._fd: int | None = None
        self._also: list[RunLock] = []

    def also(self, other: RunLock | None) -> RunLock:
        """Release ``other`` (a store's lock) with this one."""
        if other is not None:
            self._also.append(other)
        return self

    def acquire(self) -> RunLock:
        # The holder deletes the file on release: a lock won on a file already deleted (opened before the
        # previous holder removed it) guards nothing, so take the lock again on the file now at the path.
        while True:
            fd = self._lock_file()
            if self._is_current(fd):
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        os.pwrite(fd, f"process {os.getpid()} on host {socket.gethostname()} (since {stamp})\n".encode(), 0)
        self._fd = fd
        return self

    def _lock_file(self) -> int:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise OprlError(
                f"{self.label}: {self.path.parent} is in use by {holder}; wait for it to finish "
                "(or stop it) before starting, resuming or exploring this run"
            ) from None
        except OSError:
            os.close(fd)
            raise
        return fd

    def _is_current(self, fd: int) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def release(self) -> None:
        while self._also:
            self._also.pop().release()
        if self._fd is not None:
            with contextlib.suppress(FileNotFoundError):  # deleted while held: still ours to drop
                self.path.unlink()
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
