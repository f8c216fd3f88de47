"""The sampler's top-K (``rollout.record_top_k``) through the wire of every backend, bit for bit: a batch put into
the real buffer worker and taken back, on a thread (``LocalActor``), in a worker process (``ProcessActor``:
pickled through a pipe; the Ray actor's: tests/integration/test_ray.py, on that module's Ray instance), then
through the buffer's checkpoint (``save``/``restore``: parquet) and into the trainer's padded tensors."""

import pytest
import torch

from oprl.backends.local import LocalActor
from oprl.backends.processes import ProcessActor
from oprl.buffer.buffer import ExperienceBuffer
from oprl.trainer.inputs import top_k_of
from recipes import recorded_batch, top_k_bits


@pytest.mark.parametrize("actor_class", [LocalActor, ProcessActor], ids=["threads", "processes"])
def test_top_k_crosses_the_local_backends_bit_for_bit(actor_class):
    sent = recorded_batch()
    actor = actor_class("buffer", ExperienceBuffer, (), 1)
    try:
        assert actor.call("put", 1, sent, True).result(timeout=120) == 4
        taken, _ = actor.call("take", 1).result(timeout=120)
    finally:
        actor.stop()
        actor.join(15)
    assert top_k_bits(taken) == top_k_bits(sent) and [vars(e) for e in taken] == [vars(e) for e in sent]


def test_top_k_survives_the_buffer_checkpoint_and_the_store(tmp_path):
    """Checkpoint and resume (the buffer's unconsumed batches, the replay pool) and the run's store, bit for bit."""
    buffer = ExperienceBuffer(store_dir=str(tmp_path / "store"), replay_groups=1, max_uses=2)
    buffer.put(1, recorded_batch())
    buffer.put(2, recorded_batch(3))
    buffer.take(1)  # batch 1's groups join the replay pool
    assert buffer.save(str(tmp_path / "ckpt")) == [2]
    resumed = ExperienceBuffer(replay_groups=1, max_uses=2)
    assert resumed.restore(str(tmp_path / "ckpt")) == [2]
    before, after = buffer.take(2)[0], resumed.take(2)[0]
    assert top_k_bits(after) == top_k_bits(before) and [vars(e) for e in after] == [vars(e) for e in before]
    assert top_k_bits(buffer.store.read(2)) == top_k_bits(recorded_batch(3))


def test_the_trainer_gets_padded_tensors_and_nothing_when_none_were_recorded():
    rows = recorded_batch()
    top = top_k_of(rows, 6)
    assert top is not None and top.ids.shape == top.logprobs.shape == (4, 6, 5)
    assert top.ids.dtype == torch.int64 and top.logprobs.dtype == torch.float32
    for b, e in enumerate(rows):
        n = len(e.response_ids)
        assert torch.equal(top.ids[b, :n], torch.tensor(e.top_k_ids))
        assert torch.equal(top.logprobs[b, :n], torch.tensor(e.top_k_logprobs))
        assert (top.ids[b, n:] == 0).all() and (top.logprobs[b, n:] == float("-inf")).all()  # padding: no mass
    for e in rows:
        e.top_k_ids = e.top_k_logprobs = None
    assert top_k_of(rows, 6) is None  # rollout.record_top_k=0: no tensor built


def test_a_batch_mixing_rows_with_and_without_top_k_is_one_line():
    from oprl.errors import OprlError

    rows = recorded_batch()
    rows[2].top_k_ids = rows[2].top_k_logprobs = None
    with pytest.raises(OprlError, match=r"^rollout.record_top_k: 3 of 4 rows carry the sampler's top-K"):
        top_k_of(rows, 4)
    rows = recorded_batch() + recorded_batch(3)
    with pytest.raises(OprlError, match=r"K = \[3, 5\]"):
        top_k_of(rows, 4)
