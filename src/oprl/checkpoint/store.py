"""The persistent experience store: one parquet file per batch, in an open schema (docs/runtime.md).

A store is a directory of ``batch-NNNNNN.parquet`` files, NNNNNN being the batch index (the trainer step the
batch was generated for). Each file is written to a temporary name and renamed, so a reader (or a run resumed
after ``kill -9``) sees whole batches or nothing. Files are immutable: ``use_count`` is the count when the
batch was written (0 for fresh experiences); live counts live in the buffer and its checkpoints.

Deliberately not here: pickle (never: the store must be readable without oprl), advantages (the trainer
computes them per group, so one store can be trained with any preset), and any notion of scheduling.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import overload

import pyarrow as pa
import pyarrow.parquet as pq

from oprl.errors import OprlError
from oprl.io import atomic_path
from oprl.messages import Experience

SCHEMA_VERSION = "5"
"""2 added ``loss_mask`` (multi-turn episodes), 3 ``behavior_versions`` (partial rollouts: the policy version
of each token), 4 ``teacher_logprobs`` (distillation: the teacher's log-prob of each token), 5 ``top_k_ids`` and
``top_k_logprobs`` (``rollout.record_top_k``: the sampler's K most likely tokens at each token; written only
when a row of the file carries them, so a file without them is still a version-4 file). Older files still
load: version 1 as all-model tokens, versions 1-2 as one policy per row, versions 1-3 as unscored by a
teacher, versions 1-4 as recording no top-K."""
TOP_K = ("top_k_ids", "top_k_logprobs")
"""The top-K columns, absent from a file none of whose rows recorded them (``rollout.record_top_k=0``: the
files are what they were without the option)."""
OPTIONAL = ("loss_mask", "behavior_versions", "teacher_logprobs", *TOP_K)
"""Columns a file may lack: those added after schema version 1."""
STORE_DIRNAME = "experiences"
_BATCH_FILE = re.compile(r"batch-(\d+)\.parquet")

SCHEMA = pa.schema(
    [
        pa.field("batch", pa.int64()),
        pa.field("group_id", pa.int64()),
        pa.field("task_id", pa.string()),
        pa.field("policy_version", pa.int64()),
        pa.field("prompt_ids", pa.list_(pa.int32())),
        pa.field("response_ids", pa.list_(pa.int32())),
        pa.field("behavior_logprobs", pa.list_(pa.float32())),
        pa.field("reward", pa.float64()),
        pa.field("reward_components", pa.map_(pa.string(), pa.float64())),
        pa.field("response_text", pa.string()),
        pa.field("truncated", pa.bool_()),
        pa.field("use_count", pa.int32()),
        pa.field("extra", pa.string()),
        pa.field("loss_mask", pa.list_(pa.int8())),
        pa.field("behavior_versions", pa.list_(pa.int64())),
        pa.field("teacher_logprobs", pa.list_(pa.float32())),
        # int32 ids as prompt_ids; float32 log-probs as behavior_logprobs (the samplers' float32: lossless).
        pa.field("top_k_ids", pa.list_(pa.list_(pa.int32()))),
        pa.field("top_k_logprobs", pa.list_(pa.list_(pa.float32()))),
    ],
    metadata={"oprl_schema": SCHEMA_VERSION},
)
WITHOUT_TOP_K = pa.schema([f for f in SCHEMA if f.name not in TOP_K], metadata={"oprl_schema": "4"})
"""The schema of a file no row of which recorded top-K: version 4's, byte for byte what oprl wrote before."""


def to_table(experiences: list[Experience], batch: int | list[int]) -> pa.Table:
    """Experiences as an arrow table with ``SCHEMA``; ``batch`` is one index for all rows or one per row."""
    columns = {
        "batch": [batch] * len(experiences) if isinstance(batch, int) else list(batch),
        "group_id": [e.group_id for e in experiences],
        "task_id": [e.task_id for e in experiences],
        "policy_version": [e.policy_version for e in experiences],
        "prompt_ids": [e.prompt_ids for e in experiences],
        "response_ids": [e.response_ids for e in experiences],
        # Behaviour log-probs come from float32 scores, so float32 storage is lossless.
        "behavior_logprobs": [e.behavior_logprobs for e in experiences],
        "reward": [e.reward for e in experiences],
        "reward_components": [list(e.reward_components.items()) for e in experiences],
        "response_text": [e.response_text for e in experiences],
        "truncated": [e.truncated for e in experiences],
        "use_count": [e.use_count for e in experiences],
        "extra": [json.dumps(e.extra, sort_keys=True) for e in experiences],
        # null for single-turn rows (every token the model's): no column of ones to store.
        "loss_mask": [e.loss_mask for e in experiences],
        # null for rows sampled by one policy (policy_version says which).
        "behavior_versions": [e.behavior_versions for e in experiences],
        # null for rows no teacher scored; float32 like the teacher's scores, so lossless.
        "teacher_logprobs": [e.teacher_logprobs for e in experiences],
    }
    if not any(e.top_k_ids is not None for e in experiences):
        return pa.Table.from_pydict(columns, schema=WITHOUT_TOP_K)
    # null for rows that recorded none (a replayed pool may mix runs' rows).
    columns["top_k_ids"] = [e.top_k_ids for e in experiences]
    columns["top_k_logprobs"] = [e.top_k_logprobs for e in experiences]
    return pa.Table.from_pydict(columns, schema=SCHEMA)


def from_table(table: pa.Table) -> list[Experience]:
    """Experiences from a table with ``SCHEMA`` (extra columns are ignored; a version-1 table has no
    ``loss_mask``: every token is the model's; versions 1-2 no ``behavior_versions``: one policy per row;
    versions 1-3 no ``teacher_logprobs``: no teacher scored them; no top-K columns: none recorded)."""
    rows = table.to_pydict()
    masks = rows.get("loss_mask") or [None] * table.num_rows
    versions = rows.get("behavior_versions") or [None] * table.num_rows
    teacher = rows.get("teacher_logprobs") or [None] * table.num_rows
    top_ids = rows.get("top_k_ids") or [None] * table.num_rows
    top_logprobs = rows.get("top_k_logprobs") or [None] * table.num_rows
    return [
        Experience(
            prompt_ids=rows["prompt_ids"][i],
            response_ids=rows["response_ids"][i],
            behavior_logprobs=rows["behavior_logprobs"][i],
            reward=rows["reward"][i],
            reward_components=dict(rows["reward_components"][i]),
            group_id=rows["group_id"][i],
            task_id=rows["task_id"][i],
            policy_version=rows["policy_version"][i],
            response_text=rows["response_text"][i],
            truncated=rows["truncated"][i],
            use_count=rows["use_count"][i],
            extra=json.loads(rows["extra"][i] or "{}"),
            loss_mask=masks[i],
            behavior_versions=versions[i],
            teacher_logprobs=teacher[i],
            top_k_ids=top_ids[i],
            top_k_logprobs=top_logprobs[i],
        )
        for i in range(table.num_rows)
    ]


def write_parquet(path: Path, experiences: list[Experience], batch: int | list[int]) -> None:
    """Write atomically and durably (``oprl.io.atomic_path``: a synced temporary file, then rename)."""
    with atomic_path(path) as temporary:
        pq.write_table(to_table(experiences, batch), temporary)


@overload
def read_parquet(path: Path, columns: None = None) -> list[Experience]: ...
@overload
def read_parquet(path: Path, columns: list[str]) -> pa.Table: ...
def read_parquet(path: Path, columns: list[str] | None = None) -> list[Experience] | pa.Table:
    """The experiences of an oprl parquet file; with ``columns``, just those columns as a table. A file that is
    unreadable or lacks oprl's columns is a one-line ``OprlError`` naming it."""
    try:
        names = pq.read_schema(path).names
        # loss_mask (2), behavior_versions (3), teacher_logprobs (4) and the top-K columns (5, written only when
        # recorded) may be absent: older files still load.
        missing = [name for name in SCHEMA.names if name not in names and name not in OPTIONAL]
        if missing:
            raise OprlError(
                f"experience file {path}: not an oprl experience table (missing "
                f"{', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''})"
            )
        table = pq.read_table(path, columns=columns or [name for name in SCHEMA.names if name in names])
    except (OSError, pa.ArrowException) as exc:
        raise OprlError(f"experience file {path}: unreadable ({str(exc).splitlines()[0][:160]})") from None
    return table if columns else from_table(table)


class ExperienceStore:
    """A directory of batch files."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    @classmethod
    def locate(cls, path: str | Path) -> ExperienceStore:
        """The store at ``path``, or at ``path/experiences`` when ``path`` is a run directory."""
        root = Path(path)
        if (root / STORE_DIRNAME).is_dir():
            root = root / STORE_DIRNAME
        if not root.is_dir():
            raise OprlError(f"buffer.path: {path} is not a directory")
        store = cls(root)
        if not store.batches():
            raise OprlError(f"buffer.path: no batch-*.parquet files in {root}")
        return store

    def path_of(self, batch: int) -> Path:
        return self.root / f"batch-{batch:06d}.parquet"

    def write(self, batch: int, experiences: list[Experience]) -> None:
        write_parquet(self.path_of(batch), experiences, batch)

    def read(self, batch: int) -> list[Experience]:
        return read_parquet(self.path_of(batch))

    def batches(self) -> list[int]:
        """Indices of the complete batch files, ascending (temporary files are not listed)."""
        if not self.root.is_dir():
            return []
        found = (_BATCH_FILE.fullmatch(p.name) for p in self.root.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def discard(self, batches) -> None:
        """Delete these batch files and any half-written temporary file (a resumed run regenerates them)."""
        for index in batches:
            self.path_of(index).unlink(missing_ok=True)
        if self.root.is_dir():
            for leftover in self.root.glob(".batch-*.tmp-*"):
                leftover.unlink()
