"""The experience store's parquet files: every schema version it reads, foreign files refused in one line."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from oprl.checkpoint.store import (
    OPTIONAL,
    SCHEMA,
    SCHEMA_VERSION,
    WITHOUT_TOP_K,
    ExperienceStore,
    read_parquet,
    to_table,
    write_parquet,
)
from oprl.errors import OprlError
from oprl.messages import Experience
from recipes import make_batch, top_k_bits

DATA = Path(__file__).resolve().parent.parent / "data"


ADDED_IN = {"loss_mask": 2, "behavior_versions": 3, "teacher_logprobs": 4, "top_k_ids": 5, "top_k_logprobs": 5}
"""The schema version that added each optional column (store.SCHEMA_VERSION's docstring)."""


def _rows() -> list[Experience]:
    full = Experience(
        prompt_ids=[5, 6, 7],
        response_ids=[8, 9, 2],
        behavior_logprobs=[-0.5, -0.25, -1.0],
        reward=1.0,
        reward_components={"correct": 1.0, "format": 0.5},
        group_id=3,
        task_id="train-17",
        policy_version=2,
        response_text="42",
        truncated=True,
        use_count=1,
        extra={"explorer": 0, "turns": [1, 2]},
        loss_mask=[1, 0, 1],
        behavior_versions=[2, 2, 3],
        teacher_logprobs=[-0.75, -0.5, -0.125],
        top_k_ids=[[8, 3], [9, 1], [2, 0]],
        top_k_logprobs=[[-0.5, -1.5], [-0.25, -2.0], [-1.0, float("-inf")]],
    )
    plain = Experience([1], [4, 2], [-0.125, -2.0], 0.0, {}, 4, "train-3", 0, "")
    return [full, plain]


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5])
def test_every_schema_version_reads_back_what_it_holds(tmp_path, version):
    """A file of version v (the columns it had) reads as the experiences, with the later fields unset."""
    assert SCHEMA_VERSION == "5" and set(OPTIONAL) == set(ADDED_IN)
    rows = _rows()
    table = to_table(rows, 7)
    later = [name for name, added in ADDED_IN.items() if added > version]
    table = table.drop_columns(later).replace_schema_metadata({"oprl_schema": str(version)})
    pq.write_table(table, tmp_path / "batch-000007.parquet")
    back = read_parquet(tmp_path / "batch-000007.parquet")
    for name in later:
        for row in rows:
            setattr(row, name, None)
    assert [vars(e) for e in back] == [vars(e) for e in rows]


def test_the_schema_2_file_of_tests_data_rewrites_as_the_current_schema(tmp_path):
    old = read_parquet(DATA / "schema2-batch-000005.parquet")
    write_parquet(tmp_path / "batch-000005.parquet", old, 5)
    # No top-K recorded: the current schema without its top-K columns (version 4's).
    assert pq.read_schema(tmp_path / "batch-000005.parquet").metadata[b"oprl_schema"] == b"4"
    assert [vars(e) for e in read_parquet(tmp_path / "batch-000005.parquet")] == [vars(e) for e in old]
    assert read_parquet(tmp_path / "batch-000005.parquet", columns=["batch"]).column("batch").to_pylist() == [5, 5]


def test_a_foreign_parquet_file_is_one_line_naming_it_and_the_missing_columns(tmp_path):
    path = tmp_path / "batch-000001.parquet"
    pq.write_table(pa.table({"prompt": ["2+2"], "answer": ["4"]}), path)
    with pytest.raises(OprlError) as caught:
        read_parquet(path)
    message = str(caught.value)
    assert message == f"experience file {path}: not an oprl experience table (missing batch, group_id, task_id ...)"
    pq.write_table(to_table(_rows(), 1).drop_columns(["reward"]), path)
    with pytest.raises(OprlError, match=r"\(missing reward\)$"):  # one column short: named alone
        read_parquet(path, columns=["group_id"])


def test_the_store_lists_whole_batches_only_and_discards_leftovers(tmp_path):
    store = ExperienceStore(tmp_path / "experiences")
    assert store.batches() == []
    store.write(12, _rows())
    store.write(3, _rows()[:1])
    (store.root / ".batch-000013.parquet.tmp-99").write_bytes(b"half")  # a writer killed mid-file
    (store.root / "notes.txt").write_text("mine")
    assert store.batches() == [3, 12]
    assert [e.task_id for e in store.read(3)] == ["train-17"]
    store.discard([12])
    assert store.batches() == [3] and sorted(p.name for p in store.root.iterdir()) == [
        "batch-000003.parquet",
        "notes.txt",
    ]


# Moved from tests/buffer/test_buffer.py (the store was buffer/store.py).
def test_store_round_trip_is_exact_and_atomic(tmp_path):
    store = ExperienceStore(tmp_path / "exp")
    batch = make_batch(3, version=2)
    store.write(3, batch)
    assert store.batches() == [3]
    assert [p.name for p in (tmp_path / "exp").iterdir()] == ["batch-000003.parquet"]  # no temporary left
    # float32 storage of log-probs is lossless for the sampler's (float32) numbers.
    assert [vars(e) for e in store.read(3)] == [vars(e) for e in batch]
    table = pq.read_table(store.path_of(3))
    assert table.schema.equals(WITHOUT_TOP_K, check_metadata=False)
    assert table.schema.metadata[b"oprl_schema"] == b"4"
    assert table.column("batch").to_pylist() == [3] * 4


def test_store_is_readable_without_oprl(tmp_path):
    write_parquet(tmp_path / "batch-000001.parquet", make_batch(1, 0), 1)
    rows = pq.read_table(tmp_path / "batch-000001.parquet").to_pylist()
    assert rows[1]["reward"] == pytest.approx(1.1) and dict(rows[1]["reward_components"])["correct"] == 1.0
    assert json.loads(rows[0]["extra"]) == {"explorer": 1}


def test_locate_and_bad_files(tmp_path):
    with pytest.raises(OprlError, match="not a directory"):
        ExperienceStore.locate(tmp_path / "missing")
    (tmp_path / "run" / "experiences").mkdir(parents=True)
    with pytest.raises(OprlError, match="no batch"):
        ExperienceStore.locate(tmp_path / "run")
    (tmp_path / "run" / "experiences" / "batch-000001.parquet").write_text("not parquet")
    with pytest.raises(OprlError, match="unreadable"):
        read_parquet(tmp_path / "run" / "experiences" / "batch-000001.parquet")


def test_top_k_round_trips_bit_for_bit_and_only_files_that_record_it_hold_its_columns(tmp_path):
    import torch

    torch.manual_seed(0)
    rows = _rows()
    logp = torch.log_softmax(torch.randn(2, 5, 50), dim=-1)
    logp[0, :, 40:] = float("-inf")  # a truncating sampler: tokens outside the kept set
    ids, values = logp[0].topk(12, dim=-1)[::-1]  # 10 finite, 2 at -inf per position
    rows[1].top_k_ids, rows[1].top_k_logprobs = ids[:2].tolist(), values[:2].tolist()
    rows[0].top_k_ids = [r[:12] for r in ids.tolist()][:3]
    rows[0].top_k_logprobs = [r[:12] for r in values.tolist()][:3]
    write_parquet(tmp_path / "batch-000001.parquet", rows, 1)
    assert pq.read_schema(tmp_path / "batch-000001.parquet").metadata[b"oprl_schema"] == b"5"
    back = read_parquet(tmp_path / "batch-000001.parquet")
    assert top_k_bits(back) == top_k_bits(rows) and [vars(e) for e in back] == [vars(e) for e in rows]
    # A mixed file (a replay pool of two runs): the rows without top-K read back without.
    rows[1].top_k_ids = rows[1].top_k_logprobs = None
    write_parquet(tmp_path / "batch-000002.parquet", rows, 2)
    assert [e.top_k_ids is None for e in read_parquet(tmp_path / "batch-000002.parquet")] == [False, True]
    # K = 0: no top-K column at all, the file version 4's.
    rows[0].top_k_ids = rows[0].top_k_logprobs = None
    write_parquet(tmp_path / "batch-000003.parquet", rows, 3)
    schema = pq.read_schema(tmp_path / "batch-000003.parquet")
    assert "top_k_ids" not in schema.names and "top_k_logprobs" not in schema.names
    assert schema.metadata[b"oprl_schema"] == b"4" and schema.equals(WITHOUT_TOP_K, check_metadata=False)
    assert set(SCHEMA.names) - set(schema.names) == {"top_k_ids", "top_k_logprobs"}
