"""``task.name=dataset``: your prompts (a file or a ``datasets`` dataset), your reward function(s).

Rows come from ``task.train_file`` / ``task.test_file`` (JSONL, JSON, parquet, CSV) or ``task.hf_name`` (a
``datasets`` hub name, ``save_to_disk`` directory or directory of data files) with ``task.train_split`` /
``task.test_split``. Each row gives one problem: ``task.prompt_column`` is a string (one user message, after
``task.system_prompt`` if set) or a list of ``{"role", "content"}`` messages; ``task.reference_column`` (if
set) is handed to the reward as ``reference`` and is the warm-start target of the embedded tiny model.
Rows missing either are skipped and reported in one warning with their row numbers; a column that no row
has is an ``OprlError`` naming the setting and the columns there are.

Scoring calls the user's functions (``oprl.tasks.rewards.user``) in timed reward processes with the row's
prompt, the completion, the reference and the row's other columns.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field

from oprl.errors import OprlError
from oprl.tasks.base import Problem, Reward
from oprl.tasks.data.files import Row, convert_rows, datasets_rows, read_rows
from oprl.tasks.rewards.user import UserRewards
from oprl.tasks.section import TaskSection, task_section

RESERVED = ("prompt", "completion", "reference")
"""Argument names of the reward; columns of these names reach it only through them."""


class DatasetTaskConfig(TaskSection):
    """Your data, your reward: prompts from a JSONL / JSON / parquet / CSV file or a Hugging Face ``datasets``
    name or directory, scored by your own Python function(s) (see docs/tasks.md for the reward contract)."""

    name: Literal["dataset"] = "dataset"
    train_file: str | None = None
    """Training split file: .jsonl, .json (a list of objects), .parquet or .csv. Or set task.hf_name."""
    test_file: str | None = None
    """Test split file (evaluation); None = the training file (evaluation then measures training prompts)."""
    hf_name: str | None = None
    """Instead of files: a ``datasets`` dataset: a hub name (needs the network or the HF cache), a local
    directory written by ``Dataset(Dict).save_to_disk``, or a local directory of data files."""
    hf_config: str | None = None
    """hf_name's configuration name (None = its default)."""
    train_split: str = "train"
    """hf_name's split used for training."""
    test_split: str | None = "test"
    """hf_name's split used for evaluation; None (or a split the dataset lacks) = the training split."""
    prompt_column: str = "prompt"
    """Column holding the prompt: a string (sent as one user message) or a list of chat messages
    ``[{"role": ..., "content": ...}, ...]``."""
    reference_column: str | None = "reference"
    """Column handed to the reward as ``reference`` (None = no reference column; the reward gets None)."""
    system_prompt: str | None = None
    """System message put before string prompts (None = none)."""
    reward: str | list[str] = ""
    """Your reward function(s): ``package.module:function`` (importable from the current directory or the
    environment) or ``path/to/file.py:function``, or a list of them. Called as
    ``fn(prompt, completion, reference, **row) -> float | dict[str, float]`` in reward processes; a dict's
    values are named components (logged as ``reward/<name>``) and its reward is their sum."""
    reward_weights: list[float] | None = None
    """Weight of each reward function in the total (None = 1.0 each), as TRL's ``reward_weights``."""
    reward_timeout: float = Field(5.0, gt=0.0)
    """Seconds one reward call may take; past that its worker is killed, the call scores 0 and
    ``reward/reward_timeout`` counts it."""
    reward_workers: int = Field(1, gt=0)
    """Reward worker processes (each imports your reward module once)."""
    reward_memory_mb: int = Field(4096, ge=0)
    """Address-space limit of each reward process in MB (``resource.setrlimit``; 0 = none). A call that
    allocates past it fails with a ``MemoryError`` and scores 0. Importing torch and transformers takes ~700."""
    reward_import_timeout: float = Field(60.0, gt=0.0)
    """Seconds a reward process may take to start (import your module); past that the run stops with one line."""
    reward_max_error_fraction: float = Field(1.0, gt=0.0, le=1.0)
    """The run stops when a reward function fails (raises, times out, returns a non-number) on at least this
    share of a batch's rows; below it, failed rows score 0 and are counted (``reward/reward_error``,
    ``reward/reward_timeout``). 1.0 = stop only when every row of a batch fails."""
    train_size: int | None = Field(None, gt=0)
    """Use only the first train_size usable training rows (None = all)."""
    test_size: int | None = Field(None, gt=0)
    """Use only the first test_size usable test rows (None = all)."""


class DatasetTask:
    """Problems from a dataset's rows, scored by ``task.reward``; built from a ``DatasetTaskConfig``."""

    Config = DatasetTaskConfig

    def __init__(self, config: DatasetTaskConfig | None = None, **fields) -> None:
        self.config = c = task_section(DatasetTaskConfig, config, fields)
        self.name = c.name
        if bool(c.train_file) == bool(c.hf_name):
            raise OprlError("task.train_file: task.name=dataset needs exactly one of task.train_file, task.hf_name")
        self.skipped: dict[str, dict[int, str]] = {}
        self._rows: dict[str, dict[str, Any]] = {}  # task_id -> the reward's arguments
        self._splits = {split: self._load(split) for split in ("train", "test")}
        train = [(p.messages, p.answer) for p in self._splits["train"]]
        self.data_fingerprint = hashlib.sha256(json.dumps(train).encode()).hexdigest()[:16]
        """Hash of the training problems: the tiny model's warm-start cache is keyed by the data, not the path."""
        specs = [c.reward] if isinstance(c.reward, str) else list(c.reward)
        extra = {column for row in self._rows.values() for column in row["row"]}
        self.rewards = UserRewards(
            specs,
            c.reward_weights,
            timeout=c.reward_timeout,
            processes=c.reward_workers,
            extra_columns=sorted(extra),
            memory_mb=c.reward_memory_mb,
            import_timeout=c.reward_import_timeout,
            max_error_fraction=c.reward_max_error_fraction,
        )

    def _source(self, split: str) -> tuple[list[Row], str, str]:
        """``(rows, where they came from, the setting to blame)``; the test split falls back to train."""
        c = self.config
        if c.hf_name:
            wanted = c.train_split if split == "train" else (c.test_split or c.train_split)
            rows = datasets_rows(c.hf_name, c.hf_config, wanted, key="task.hf_name")
            if rows is None and split == "test":
                wanted, rows = c.train_split, datasets_rows(c.hf_name, c.hf_config, c.train_split, key="task.hf_name")
            if rows is None:
                raise OprlError(f"task.{split}_split: {c.hf_name!r} has no split {wanted!r}")
            return rows, f"{c.hf_name} split {wanted!r}", "task.hf_name"
        file, key = c.train_file or "", "task.train_file"
        if split == "test" and c.test_file:
            file, key = c.test_file, "task.test_file"
        return read_rows(file, key=key), file, key

    def _load(self, split: str) -> list[Problem]:
        c = self.config
        rows, where, key = self._source(split)
        columns = {name for row in rows if row.data for name in row.data}
        for setting, column in (("prompt_column", c.prompt_column), ("reference_column", c.reference_column)):
            if column is not None and columns and column not in columns:
                raise OprlError(
                    f"task.{setting}: no column {column!r} in {where} (columns: {', '.join(sorted(columns))})"
                )
        limit = c.train_size if split == "train" else c.test_size
        problems, self.skipped[split] = convert_rows(split, rows, self._problem, limit=limit, where=where, key=key)
        return problems

    def _problem(self, split: str, row: Row) -> tuple[Problem | None, str]:
        c = self.config
        if row.data is None:
            return None, "not a JSON object"
        prompt = row.data.get(c.prompt_column)
        messages, reason = _messages(prompt, c.system_prompt)
        if messages is None:
            return None, f"{c.prompt_column!r} {reason}"
        reference = None
        if c.reference_column is not None:
            reference = row.data.get(c.reference_column)
            if reference is None:
                return None, f"no {c.reference_column!r} value"
        task_id = f"{self.name}/{split}/{row.number:06d}"
        extra = {k: v for k, v in row.data.items() if k not in (c.prompt_column, c.reference_column, *RESERVED)}
        arguments = {"prompt": prompt, "reference": reference, "row": extra}
        self._rows[task_id] = json.loads(json.dumps(arguments, default=str))  # what reaches the reward process, as JSON
        answer = reference if isinstance(reference, str) else json.dumps(reference, default=str)
        return Problem(task_id=task_id, messages=messages, answer=answer), ""

    def problems(self, split: str) -> Sequence[Problem]:
        if split not in self._splits:
            raise OprlError(f"task {self.name}: unknown split {split!r}; valid: {sorted(self._splits)}")
        return self._splits[split]

    def score(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[Reward]:
        rows = [dict(self._rows[p.task_id], completion=r) for p, r in zip(problems, responses, strict=True)]
        return self.rewards.score(rows, [p.task_id for p in problems])


def _messages(prompt: Any, system_prompt: str | None) -> tuple[tuple[dict, ...] | None, str]:
    """Chat messages of a prompt value, or ``(None, why it is not a prompt)``."""
    if isinstance(prompt, str):
        if not prompt.strip():
            return None, "is empty"
        user = ({"role": "user", "content": prompt},)
        return (({"role": "system", "content": system_prompt}, *user) if system_prompt else user), ""
    if isinstance(prompt, (list, tuple)) and prompt:
        if all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt
        ):
            return tuple({"role": m["role"], "content": m["content"]} for m in prompt), ""
        return None, "is a list but not of {'role': str, 'content': str} messages"
    return None, "is missing" if prompt is None else f"is a {type(prompt).__name__}, not a string or message list"
