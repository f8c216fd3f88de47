"""Rows of a dataset split from a local file (JSONL, JSON, parquet, CSV) or a Hugging Face ``datasets`` dataset.

Every row comes back with its 1-based row number (the line number for JSONL), so a task can name the exact
rows it had to skip. Lines that are not JSON objects are returned as malformed rows rather than raised, and
``RowReport`` turns the skipped row numbers into the one warning a user sees. An unreadable file, an unknown
extension or a split with no usable row is an ``OprlError`` naming the config key and the file.

Not here: what a row means (each task converts rows to problems), downloading anything except through
``datasets.load_dataset`` when the user asked for a hub dataset.
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oprl.errors import OprlError

log = logging.getLogger("oprl.tasks")
SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")


@dataclass
class Row:
    number: int
    """1-based row number in the source (line number for JSONL)."""
    data: dict[str, Any] | None
    """The row's fields, or None when the row is not a JSON object at all."""


def read_rows(path: str | Path, *, key: str) -> list[Row]:
    """All rows of a ``.jsonl``, ``.json`` (a list of objects), ``.parquet`` or ``.csv`` file (a header line, every
    value a string); ``key`` names the config key."""
    path = Path(path)
    if not path.is_file():
        raise OprlError(f"{key}: file {str(path)!r} not found")
    if path.suffix not in SUFFIXES:
        raise OprlError(f"{key}: {str(path)!r} has an unsupported extension; use one of {', '.join(SUFFIXES)}")
    try:
        if path.suffix == ".jsonl":
            return list(_jsonl_rows(path))
        if path.suffix == ".json":
            records = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(records, list):
                raise OprlError(f"{key}: {path} must hold a JSON list of objects (or use .jsonl)")
        elif path.suffix == ".csv":  # every value a string: the reward decides what "42" or "007" means
            with path.open(encoding="utf-8", newline="") as handle:
                records = list(csv.DictReader(handle))
        else:
            import pyarrow.parquet as pq

            records = pq.read_table(path).to_pylist()
    except OprlError:
        raise
    except (OSError, ValueError, csv.Error) as exc:  # unreadable, not UTF-8, not JSON, not parquet, bad CSV
        raise OprlError(f"{key}: cannot read {path}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}") from None
    return [Row(i, r if isinstance(r, dict) else None) for i, r in enumerate(records, start=1)]


def _jsonl_rows(path: Path) -> Iterator[Row]:
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            yield Row(number, record if isinstance(record, dict) else None)


NEEDS_DATASETS = "reading a Hugging Face dataset needs datasets: pip install 'oprl[data]'"
"""The line a task that reads through ``datasets`` gives without the extra (here, and before the headline:
``oprl.runtime.preflight``)."""


def _datasets(key: str):
    """The ``datasets`` module, an extra (the default job never reads a hub dataset): one line naming it when
    missing."""
    try:
        import datasets
    except ImportError:
        raise OprlError(f"{key}: {NEEDS_DATASETS}") from None
    return datasets


def hub_rows(hub_id: str, config_name: str | None, split: str, *, key: str) -> list[Row]:
    """Rows of ``split`` of a hub dataset through ``datasets`` (needs the network or a local HF cache)."""
    datasets = _datasets(key)

    try:
        dataset = datasets.load_dataset(hub_id, config_name, split=split)
    except Exception as exc:
        reason = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise OprlError(
            f"{key}: cannot load {hub_id!r} split {split!r} from the Hugging Face hub ({reason}); "
            "offline, point task.train_file / task.test_file at local JSONL or parquet files"
        ) from None
    return [Row(i, dict(r)) for i, r in enumerate(dataset, start=1)]


def datasets_rows(name: str, config_name: str | None, split: str, *, key: str) -> list[Row] | None:
    """Rows of ``split`` of a ``datasets`` dataset: a directory written by ``save_to_disk``, a directory of
    data files, or a hub name; None when the dataset has no such split."""
    datasets = _datasets(key)

    try:
        if Path(name).is_dir() and any((Path(name) / f).is_file() for f in ("dataset_dict.json", "state.json")):
            loaded = datasets.load_from_disk(name)
            if isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    return None
                loaded = loaded[split]
            elif split != "train":
                return None  # a single saved Dataset is the training split
        else:
            splits = datasets.get_dataset_split_names(name, config_name)
            if split not in splits:
                return None
            loaded = datasets.load_dataset(name, config_name, split=split)
    except Exception as exc:
        reason = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise OprlError(f"{key}: cannot load {name!r} split {split!r} ({reason})") from None
    return [Row(i, dict(r)) for i, r in enumerate(loaded, start=1)]


def find_split_file(directory: str | Path, split: str, *, key: str) -> Path:
    """The one file under ``directory`` whose name starts with ``split`` (``train.jsonl``, ``test-0000.parquet``)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise OprlError(f"{key}: directory {str(directory)!r} not found")
    found = sorted(p for p in directory.rglob(f"{split}*") if p.is_file() and p.suffix in SUFFIXES)
    if len(found) != 1:
        what = "no" if not found else f"{len(found)}"
        raise OprlError(
            f"{key}: found {what} {split}* file(s) with extension {'/'.join(SUFFIXES)} under {directory}"
            + (f" ({', '.join(str(p.relative_to(directory)) for p in found[:4])})" if found else "")
            + f"; set task.{split}_file explicitly"
        )
    return found[0]


_WARNED_ENV = "OPRL_WARNED"


def warn_once(message: str) -> None:
    """``log.warning(message)`` unless this process or the one that started it already said it: a run
    builds its task in the driver, each explorer and the evaluator (threads or child processes), and the
    skipped-rows warning is one line, not three. Said messages are kept by hash in an environment variable,
    which child processes inherit."""
    digest = hashlib.sha256(message.encode()).hexdigest()[:12]
    said = os.environ.get(_WARNED_ENV, "").split(",")
    if digest in said:
        return
    os.environ[_WARNED_ENV] = ",".join([*said[-200:], digest]).strip(",")
    log.warning("%s", message)


@dataclass
class RowReport:
    """Rows skipped while converting one split, with the reason for each (for the warning and for tests)."""

    source: str
    skipped: dict[int, str] = field(default_factory=dict)
    kept: int = 0

    def skip(self, row: Row, reason: str) -> None:
        self.skipped[row.number] = reason

    def finish(self, *, key: str) -> None:
        """Warn about skipped rows; an empty split is an error."""
        if self.skipped:
            warn_once(f"{key}: {self.source}: {self.summary()}")
        if self.kept == 0:
            raise OprlError(f"{key}: {self.source} has no usable rows ({self.summary() or 'it is empty'})")

    def summary(self) -> str:
        if not self.skipped:
            return ""
        by_reason: dict[str, list[int]] = {}
        for number, reason in self.skipped.items():
            by_reason.setdefault(reason, []).append(number)
        parts = [
            f"row{'s' if len(rows) > 1 else ''} {', '.join(map(str, rows[:8]))}{' ...' if len(rows) > 8 else ''}: "
            + reason
            for reason, rows in by_reason.items()
        ]
        return f"skipped {len(self.skipped)} malformed row(s): {'; '.join(parts)}"


def split_rows(
    split: str,
    *,
    source: str,
    hub_id: str,
    hub_config: str | None,
    path: str | None,
    train_file: str | None,
    test_file: str | None,
) -> tuple[list[Row], str, str]:
    """``(rows, where they came from, the config key to blame)`` for ``split`` ("train" or "test").

    ``source="auto"`` means files when any of ``path`` / ``train_file`` / ``test_file`` is set, else the hub.
    """
    file = train_file if split == "train" else test_file
    if source == "auto":
        source = "files" if (path or train_file or test_file) else "hub"
    if source == "files":
        key = f"task.{split}_file"
        if file is None:
            if path is None:
                raise OprlError(f"task.source=files needs task.{split}_file or task.path (a directory of split files)")
            found = find_split_file(path, split, key="task.path")
            return read_rows(found, key="task.path"), str(found), "task.path"
        return read_rows(file, key=key), str(file), key
    if source != "hub":
        raise OprlError(f"task.source: {source!r} is not available for this task")
    return hub_rows(hub_id, hub_config, split, key="task.hub_id"), f"{hub_id} split {split!r}", "task.hub_id"


def string_field(row: Row, field_name: str) -> tuple[str | None, str | None]:
    """``(value, None)`` for a non-empty string field, else ``(None, reason it is malformed)``."""
    if row.data is None:
        return None, "not a JSON object"
    value = row.data.get(field_name)
    if value is None:
        return None, f"no {field_name!r} field"
    if not isinstance(value, str) or not value.strip():
        return None, f"{field_name!r} is not a non-empty string"
    return value, None


def load_problems(split: str, convert, *, limit: int | None, **source) -> tuple[list, dict[int, str]]:
    """Problems of ``split``: ``convert(split, row) -> (problem or None, reason)`` over the source's rows.

    Keeps the first ``limit`` usable rows (None = all); returns them with the skipped ``{row: reason}``.
    ``source`` are the keyword arguments of ``split_rows``.
    """
    rows, where, key = split_rows(split, **source)
    return convert_rows(split, rows, convert, limit=limit, where=where, key=key)


def convert_rows(split: str, rows: list[Row], convert, *, limit: int | None, where: str, key: str):
    """``convert(split, row)`` over ``rows``, keeping the first ``limit`` usable problems (None = all); skipped
    rows are reported once (``RowReport``, blaming ``key``). Returns ``(problems, {row: reason})``."""
    report = RowReport(where)
    problems: list[Any] = []
    for row in rows:
        problem, reason = convert(split, row)
        if problem is None:
            report.skip(row, reason)
        elif limit is None or len(problems) < limit:
            problems.append(problem)
    report.kept = len(problems)
    report.finish(key=key)
    return problems, report.skipped
