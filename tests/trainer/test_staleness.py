"""Every token knows its policy: the store's schema version 3 (``behavior_versions``; versions 1 and 2 still
load), the per-token lag metrics, and the stale-token mask (data shaping before the loss)."""

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from oprl.checkpoint.store import SCHEMA, read_parquet, write_parquet
from oprl.messages import Experience
from oprl.trainer.staleness import mask_stale_tokens, token_lag_metrics, token_versions

DATA = Path(__file__).parents[1] / "data"


def _row(versions, policy_version=0, loss_mask=None):
    n = len(versions) if versions is not None else 3
    return Experience(
        prompt_ids=[1, 2],
        response_ids=list(range(3, 3 + n)),
        behavior_logprobs=[-0.5] * n,
        reward=1.0,
        reward_components={},
        group_id=0,
        task_id="t",
        policy_version=policy_version,
        response_text="x",
        loss_mask=loss_mask,
        behavior_versions=versions,
    )


def test_schema_3_round_trip(tmp_path):
    rows = [_row([2, 2, 3, 3]), _row(None, policy_version=4), _row([1, 1, 2], 1, loss_mask=[1, 0, 1])]
    write_parquet(tmp_path / "batch-000001.parquet", rows, 1)
    table = pq.read_table(tmp_path / "batch-000001.parquet")
    assert table.schema.metadata[b"oprl_schema"] == b"4" and "behavior_versions" in SCHEMA.names
    assert table.column("behavior_versions").to_pylist() == [[2, 2, 3, 3], None, [1, 1, 2]]
    back = read_parquet(tmp_path / "batch-000001.parquet")
    assert [vars(e) for e in back] == [vars(e) for e in rows]
    assert token_versions(back[1]) == [4, 4, 4]


def test_a_store_written_by_the_schema_2_code_loads():
    """tests/data/schema2-batch-000005.parquet was written by oprl at 9981eb2 (schema version 2)."""
    path = DATA / "schema2-batch-000005.parquet"
    assert pq.read_schema(path).metadata[b"oprl_schema"] == b"2"
    rows = read_parquet(path)
    assert [e.behavior_versions for e in rows] == [None, None]
    assert [token_versions(e) for e in rows] == [[3, 3, 3], [3, 3]]
    assert rows[1].loss_mask == [1, 0] and rows[0].behavior_logprobs == [-0.5, -0.25, -1.0]


def test_per_token_lag_metrics():
    # trainer at version 3; row a: 2 tokens of v1, 2 of v2; row b: 4 tokens of v2; row c: env token (mask 0) of v0
    a, b, c = _row([1, 1, 2, 2], 1), _row(None, 2), _row([0, 0, 2], 0, loss_mask=[1, 0, 1])
    m = token_lag_metrics([a, b, c], 3)
    # model tokens: lags 2,2,1,1 | 1,1,1 | 3,1  (b has 3 tokens)
    assert m["lag/token_min"] == 1 and m["lag/token_max"] == 3
    assert m["lag/token_mean"] == pytest.approx((2 + 2 + 1 + 1 + 1 + 1 + 1 + 3 + 1) / 9)
    assert m["lag/token_frac_1"] == pytest.approx(6 / 9) and m["lag/token_frac_2"] == pytest.approx(2 / 9)
    assert m["batch/version_min"] == 0 and m["batch/version_max"] == 2
    assert m["batch/switched_frac"] == pytest.approx(2 / 3)


def test_mask_stale_tokens_keeps_only_recent_ones():
    a, b = _row([1, 1, 2, 2], 1), _row([0, 0, 2], 0, loss_mask=[1, 0, 1])
    masked, frac = mask_stale_tokens([a, b], 2, max_lag=0)
    assert masked[0].loss_mask == [0, 0, 1, 1] and masked[1].loss_mask == [0, 0, 1]
    assert frac == pytest.approx(3 / 6)
    assert a.loss_mask is None and b.loss_mask == [1, 0, 1]  # the buffer's rows are untouched
    same, none = mask_stale_tokens([a], 2, max_lag=1)
    assert same[0] is a and none == 0.0
