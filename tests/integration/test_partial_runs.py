"""Partial rollouts end to end: the deterministic switch gives the same rows, stores and final weights in
worker threads and worker processes, and responses really are sampled by two policies."""

import pyarrow.parquet as pq

from oprl.cli import main
from oprl.metrics import deterministic_view, read_metrics

PARTIAL = [
    "steps=4",
    "sync.offset=1",
    "sync.partial=true",
    "sync.switch_step=2",
    "eval.interval=0",
    "tensorboard=false",
]


def test_deterministic_partial_rollouts_are_equal_in_threads_and_processes(small_overrides, tmp_path):
    for workers in ("threads", "processes"):
        assert main(["train", *small_overrides, *PARTIAL, f"runtime.workers={workers}", f"run_name={workers}"]) == 0
    runs = tmp_path / "runs"
    threads, processes = (read_metrics(runs / n / "metrics.jsonl") for n in ("threads", "processes"))
    assert deterministic_view(threads) == deterministic_view(processes)
    assert max(r.get("batch/switched_frac", 0.0) for r in threads) > 0  # some responses crossed a switch
    for batch in range(1, 5):
        a, b = (
            pq.read_table(runs / n / "experiences" / f"batch-{batch:06d}.parquet") for n in ("threads", "processes")
        )
        assert a.drop_columns(["extra"]).equals(b.drop_columns(["extra"]))
    versions = pq.read_table(runs / "threads" / "experiences" / "batch-000003.parquet").column("behavior_versions")
    assert any(row[:2] == [1, 1] and set(row[2:]) == {2} for row in versions.to_pylist() if len(row) > 2)
    weights = [(runs / n / "final" / "model.safetensors").read_bytes() for n in ("threads", "processes")]
    assert weights[0] == weights[1]
