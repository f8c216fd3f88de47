"""``rollout.record_top_k`` through a whole run: recorded by the explorer in its worker process, carried to the
store and the checkpoint's unconsumed batch, and changing no number of the run (its metrics equal the run
without it); without it, the store's files hold no top-K column."""

import itertools

import pyarrow.parquet as pq

from oprl.checkpoint.store import read_parquet
from oprl.cli import main
from oprl.metrics import deterministic_view, read_metrics
from recipes import top_k_bits

RUN = [
    "tensorboard=false",
    "runtime.torch_threads=1",
    "steps=3",
    "sync.offset=1",  # batch 3 is sampled while step 2 trains: the step-2 checkpoint holds it unconsumed
    "checkpoint.interval=2",
    "eval.interval=0",
]


def test_a_run_recording_top_k_in_worker_processes_equals_the_run_without(small_overrides, tmp_path):
    args = [*small_overrides, *RUN]
    assert main(["train", *args, "run_name=off"]) == 0
    assert main(["train", *args, "run_name=on", "rollout.record_top_k=3", "runtime.workers=processes"]) == 0
    runs = tmp_path / "runs"
    off, on = (read_metrics(runs / name / "metrics.jsonl") for name in ("off", "on"))
    assert deterministic_view(on) == deterministic_view(off)
    for batch in (1, 2, 3):
        plain = pq.read_schema(runs / "off" / "experiences" / f"batch-{batch:06d}.parquet")
        assert "top_k_ids" not in plain.names and plain.metadata[b"oprl_schema"] == b"4"
        rows = read_parquet(runs / "on" / "experiences" / f"batch-{batch:06d}.parquet")
        without = read_parquet(runs / "off" / "experiences" / f"batch-{batch:06d}.parquet")
        assert [e.response_ids for e in rows] == [e.response_ids for e in without]
        for e in rows:
            assert [len(p) for p in e.top_k_ids] == [3] * len(e.response_ids) == [len(p) for p in e.top_k_logprobs]
            assert all(a >= b for p in e.top_k_logprobs for a, b in itertools.pairwise(p))  # most likely first
    # Which batches the step-2 checkpoint holds unconsumed depends on how far the explorer got (batch 3 is usually
    # there, not always under load); each one it holds carries its top-K bit for bit. The buffer checkpoint's
    # round trip itself is tests/backends/test_top_k_wire.py's.
    buffer = runs / "on" / "checkpoints" / "step-000002" / "buffer"
    assert buffer.is_dir()
    for ready in sorted(buffer.glob("ready-*.parquet")):
        batch = int(ready.stem.split("-")[1])
        stored = read_parquet(runs / "on" / "experiences" / f"batch-{batch:06d}.parquet")
        assert top_k_bits(read_parquet(ready)) == top_k_bits(stored)
