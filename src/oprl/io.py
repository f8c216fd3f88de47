"""Durable files: the one home of write-to-a-temporary-name-then-rename, with ``fsync`` at every commit.

A rename alone survives ``kill -9`` (the name points at the old file or the whole new one) but not a power
loss: the kernel may write the directory entry to disk before the file's data, leaving an empty or partial
file behind a committed name. So every commit here is: write the temporary file, ``fsync`` it, rename it
over the final name, ``fsync`` the directory (which makes the rename itself durable).

- ``atomic_write_bytes/text/json(path, data)``: a whole small file (configs, JSON state, summaries);
- ``atomic_path(path)``: a context manager yielding the temporary path for writers that open files
  themselves (parquet, safetensors); committed when the block ends without an exception, removed otherwise;
- ``commit_dir(staging, final)``: a directory assembled under a temporary name (checkpoints, cached models);
- ``fsync_dir(path)`` and ``fsync_file(path)`` for the rest (``metrics.jsonl`` rows before a checkpoint).

An ``OSError`` while writing is re-raised with the same type and errno but naming the *final* file (the
temporary name means nothing to a user), e.g. ``PermissionError: [Errno 13] Permission denied:
'runs/x/experiences/batch-000016.parquet'``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from contextlib import contextmanager, suppress
from pathlib import Path


def fsync_file(path: str | Path) -> None:
    """Flush one file's data and metadata to the device."""
    fd = os.open(path, os.O_RDONLY)
    try:
        _sync(fd, Path(path))
    finally:
        os.close(fd)


def fsync_dir(path: str | Path) -> None:
    """Flush a directory's entries (a rename or a new file in it) to the device."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        _sync(fd, Path(path))
    finally:
        os.close(fd)


def _sync(fd: int, path: Path) -> None:
    """``os.fsync``; the single point every commit goes through (tests inject disk-full errors here)."""
    os.fsync(fd)


@contextmanager
def atomic_path(path: str | Path):
    """Yield a temporary path next to ``path``; on success it is synced and renamed to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield temporary
        fsync_file(temporary)
        os.replace(temporary, path)
        fsync_dir(path.parent)
    except OSError as exc:
        _remove(temporary)
        raise _naming(exc, path) from exc
    except BaseException:
        _remove(temporary)
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as temporary, open(temporary, "wb") as handle:
        handle.write(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | Path, data, **dumps) -> None:
    atomic_write_text(path, json.dumps(data, **dumps))


def commit_dir(staging: str | Path, final: str | Path, *, replace: bool = True) -> None:
    """Make a fully written ``staging`` directory ``final``: sync every file and directory under it, rename
    (replacing an existing ``final``; with ``replace=False`` an existing non-empty one makes the rename fail
    with ``OSError``, for caches that a concurrent identical build may have filled), sync the parent. A crash
    at any point leaves the old or the new directory whole."""
    staging, final = Path(staging), Path(final)
    try:
        for root, _dirs, files in os.walk(staging):
            for name in files:
                fsync_file(Path(root) / name)
            fsync_dir(root)
        if replace and final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
        fsync_dir(final.parent)
    except OSError as exc:
        raise _naming(exc, final) from exc


@contextmanager
def named(path: str | Path):
    """An ``OSError`` inside (or a library's wrapped one: safetensors reports ``... (os error 28)``) is
    re-raised as an ``OSError`` of the same errno naming ``path``: one line that says which file."""
    try:
        yield
    except OSError as exc:
        raise _naming(exc, Path(path)) from exc
    except Exception as exc:
        found = re.search(r"Os \{ code: (\d+)|os error (\d+)", str(exc))
        if found is None:
            raise
        code = int(found.group(1) or found.group(2))
        raise OSError(code, os.strerror(code), str(path)) from exc


def _naming(exc: OSError, path: Path) -> OSError:
    """The same kind of error, naming the file the user knows (not the temporary one)."""
    if exc.errno is None:
        return exc
    try:
        return type(exc)(exc.errno, exc.strerror, str(path))
    except TypeError:  # an OSError subclass with another constructor
        return exc


def _remove(path: Path) -> None:
    with suppress(OSError):
        path.unlink()
