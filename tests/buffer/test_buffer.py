"""The buffer: fresh batches, replay, checkpoints (the store's parquet files: tests/checkpoint/test_store.py)."""

import pytest

from oprl.buffer.buffer import ExperienceBuffer
from oprl.checkpoint.store import ExperienceStore
from oprl.errors import OprlError
from recipes import make_batch


def test_take_returns_the_steps_batch_with_use_counts_owned_by_the_buffer():
    buffer = ExperienceBuffer()
    buffer.put(2, make_batch(2, 1))
    buffer.put(1, make_batch(1, 0))
    batch, stats = buffer.take(1)
    assert {e.task_id.split("/")[1] for e in batch} == {"1"} and all(e.use_count == 0 for e in batch)
    assert stats["replay/groups"] == 0 and stats["perf/buffer_batches_ready"] == 1
    with pytest.raises(RuntimeError, match="never put"):
        buffer.take(3)


def test_replay_priority_use_limit_and_capacity():
    buffer = ExperienceBuffer(replay_groups=1, max_uses=3, decay=1.0, capacity=3)
    for step in range(1, 6):
        buffer.put(step, make_batch(step, version=step - 1))
    picked = []
    for step in range(1, 6):
        batch, stats = buffer.take(step)
        replayed = batch[4:]
        picked.append([(e.group_id, e.use_count) for e in replayed[::2]])
        assert len(batch) == 4 + (2 if step > 1 else 0)
    # Step 2 replays the newest used group (batch 1, group 1; ties go to the lower id... of the newer batch).
    # priority = version - uses: at step 2 both groups of batch 1 have 0 - 1 = -1 -> lower group id first.
    assert picked[0] == [] and picked[1] == [(0, 1)]
    # Step 3: batch 2's groups (1 - 1 = 0) beat batch 1's (-1, -2).
    assert picked[2] == [(2, 1)]
    assert stats["buffer/replay_pool_groups"] <= 3 and stats["buffer/evicted_groups"] > 0
    assert stats["replay/age_mean"] >= 1 and stats["replay/use_count_mean"] >= 1


def test_groups_leave_after_max_uses():
    buffer = ExperienceBuffer(replay_groups=4, max_uses=2)
    buffer.put(1, make_batch(1, 0))
    buffer.put(2, make_batch(2, 1))
    buffer.put(3, make_batch(3, 2))
    buffer.take(1)
    batch, _ = buffer.take(2)
    assert {e.group_id for e in batch[4:]} == {0, 1}  # batch 1 replayed once: its second and last use
    batch, _ = buffer.take(3)
    assert {e.group_id for e in batch[4:]} == {2, 3}  # only batch 2 left to replay


def test_save_restore_round_trip(tmp_path):
    buffer = ExperienceBuffer(replay_groups=1, max_uses=3)
    for step in (1, 2, 3):
        buffer.put(step, make_batch(step, step - 1))
    buffer.take(1)
    assert buffer.save(str(tmp_path / "ckpt")) == [2, 3]
    other = ExperienceBuffer(replay_groups=1, max_uses=3)
    assert other.restore(str(tmp_path / "ckpt")) == [2, 3]
    a, b = buffer.take(2), other.take(2)
    assert [vars(e) for e in a[0]] == [vars(e) for e in b[0]] and a[1] == b[1]


def test_offline_source_reads_groups_in_order_with_passes(tmp_path):
    store = ExperienceStore(tmp_path)
    store.write(1, make_batch(1, 0, groups=3))
    store.write(2, make_batch(2, 0, groups=3))
    buffer = ExperienceBuffer(offline_dir=str(tmp_path), passes=2, prompts_per_step=4)
    seen = []
    for step in (1, 2, 3):
        batch, _ = buffer.take(step)
        seen.append([(e.group_id, e.use_count) for e in batch[::2]])
    assert seen[0] == [(0, 0), (1, 0), (2, 0), (3, 0)]
    assert seen[1] == [(4, 0), (5, 0), (0, 1), (1, 1)]  # second pass: one earlier use
    with pytest.raises(OprlError, match=r"raise buffer\.passes"):
        buffer.take(4)
