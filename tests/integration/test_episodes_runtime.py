"""Multi-turn episodes end to end on the tiny model (task tool-arithmetic): every schedule, overlap equal to
sequential, offline equal to the offline schedule, async with replay, and resume after ``kill -9`` in the
middle of an episode batch equal to the uninterrupted run."""

import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from oprl.cli import main
from oprl.metrics import deterministic_view, read_metrics
from oprl.schedule import policy_version
from recipes import EPISODES as RECIPE

EPISODES = ["task.name=tool-arithmetic", "task.train_size=600", "task.test_size=64", *RECIPE]


def rows_of(root, name):
    return read_metrics(root / "runs" / name / "metrics.jsonl")


@pytest.fixture
def args(tmp_path):
    return [*EPISODES, f"output_dir={tmp_path / 'runs'}"]


@pytest.mark.parametrize("k,m", [(1, 0), (1, 1), (2, 0), (2, 1)])
def test_every_schedule_trains_on_episodes(args, tmp_path, k, m):
    assert main(["train", *args, "steps=4", f"sync.interval={k}", f"sync.offset={m}", "run_name=s"]) == 0
    rows = rows_of(tmp_path, "s")
    assert [r["lag/scheduled"] for r in rows[1:]] == [t - 1 - policy_version(t, k, m) for t in range(1, 5)]
    for row in rows[1:]:
        assert 0 < row["response/model_tokens"] < row["response/tokens"]  # environment tokens are not trained
        assert 1.0 <= row["episode/turns_mean"] <= 3.0
    assert "eval/accuracy" in rows[2] and "reward/tool_calls" in rows[1]
    table = pq.read_table(tmp_path / "runs" / "s" / "experiences" / "batch-000004.parquet")
    assert table.schema.metadata[b"oprl_schema"] == b"4" and table.num_rows == 16
    masks = table.column("loss_mask").to_pylist()
    assert all(len(mask) == len(ids) for mask, ids in zip(masks, table.column("response_ids").to_pylist(), strict=True))
    assert any(0 in mask for mask in masks)  # some episodes called the calculator
    for row in rows[1:]:
        if row["lag/max"] == 0:  # on-policy: the trainer recomputes exactly the sampler's log-probs of model tokens
            assert abs(row["rho/behavior_max"] - 1) < 1e-4 and abs(row["rho/behavior_min"] - 1) < 1e-4
    if (k, m) == (1, 1):
        assert main(["train", *args, "steps=4", "sync.offset=1", "runtime.overlap=false", "run_name=seq"]) == 0
        assert deterministic_view(rows_of(tmp_path, "seq")) == deterministic_view(rows)


@pytest.mark.slow  # vLLM's start-up (~70 s on a busy 2-core machine)
@pytest.mark.parametrize("k,m", [(1, 0), (2, 1)])
def test_vllm_engine_runs_episodes(args, tmp_path, k, m):
    pytest.importorskip("vllm")
    assert (
        main(
            [
                "train",
                *args,
                "rollout.engine=vllm",
                "steps=3",
                "eval.interval=0",
                f"sync.interval={k}",
                f"sync.offset={m}",
                "run_name=v",
            ]
        )
        == 0
    )
    rows = rows_of(tmp_path, "v")[1:]
    assert [r["batch/version_max"] for r in rows] == [policy_version(t, k, m) for t in range(1, 4)]
    for row in rows:
        assert 0 < row["response/model_tokens"] < row["response/tokens"]
        if row["lag/max"] == 0:
            assert abs(row["rho/behavior_max"] - 1) < 1e-4 and abs(row["rho/behavior_min"] - 1) < 1e-4


def test_explore_then_offline_equals_the_offline_schedule(args, tmp_path):
    common = [*args, "steps=3"]
    assert main(["train", *common, "sync.interval=300", "sync.offset=199", "run_name=both"]) == 0
    assert main(["explore", *common, "run_name=explored"]) == 0
    store = tmp_path / "runs" / "explored"
    assert main(["train", *common, "mode=offline", f"buffer.path={store}", "run_name=offline"]) == 0
    both = [{k: v for k, v in r.items() if k != "lag/scheduled"} for r in deterministic_view(rows_of(tmp_path, "both"))]
    assert deterministic_view(rows_of(tmp_path, "offline")) == both


def test_async_with_replay_on_episodes(args, tmp_path):
    assert (
        main(
            [
                "train",
                *args,
                "steps=4",
                "sync.mode=async",
                "sync.max_staleness=1",
                "replay.groups_per_step=2",
                "replay.max_uses=2",
                "run_name=async",
            ]
        )
        == 0
    )
    rows = rows_of(tmp_path, "async")[1:]
    assert all((t - 1) - r["batch/version_max"] <= 1 for t, r in zip(range(1, 5), rows, strict=True))
    assert [r["replay/groups"] for r in rows] == [0.0, 2.0, 2.0, 2.0]
    assert all(r["response/model_tokens"] < r["response/tokens"] for r in rows)


@pytest.mark.slow  # three 6-step runs, one of them a fresh process (~40 s on a busy 2-core machine)
def test_kill_9_mid_episode_batch_then_resume_equals_the_uninterrupted_run(args, tmp_path):
    run = [*args, "steps=6", "sync.offset=2", "checkpoint.interval=2", "eval.interval=3"]
    assert main(["train", *run, "run_name=whole"]) == 0
    process = subprocess.Popen(
        [sys.executable, "-m", "oprl.cli", "train", *run, "run_name=killed"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    first = tmp_path / "runs" / "killed" / "checkpoints" / "step-000002" / "state.json"
    deadline = time.monotonic() + 240
    while not first.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert process.poll() is None, f"the run ended before it could be killed: {process.stderr.read()[-500:]}"
    os.kill(process.pid, signal.SIGKILL)  # the explorer is generating episodes for a later batch by now
    process.wait()
    assert len(rows_of(tmp_path, "killed")) < 7
    assert main(["train", *run, "run_name=killed", "resume=true"]) == 0
    assert deterministic_view(rows_of(tmp_path, "killed")) == deterministic_view(rows_of(tmp_path, "whole"))
    for name in sorted(p.name for p in (tmp_path / "runs" / "whole" / "experiences").iterdir()):
        whole = pq.read_table(tmp_path / "runs" / "whole" / "experiences" / name).drop_columns(["extra"])
        killed = pq.read_table(tmp_path / "runs" / "killed" / "experiences" / name).drop_columns(["extra"])
        assert whole.equals(killed), name


def test_episodes_on_worker_processes_and_ray_repeat_the_threads_run(args, tmp_path):
    """docs/runtime.md's determinism contract holds for episodic jobs: worker processes and Ray actors (two
    explorers) log the threads run's deterministic rows. Ray's part is skipped without Ray."""
    common = [*args, "steps=3", "sync.offset=1", "checkpoint.interval=2"]
    assert main(["train", *common, "run_name=threads"]) == 0
    assert main(["train", *common, "runtime.workers=processes", "run_name=processes"]) == 0
    threads = deterministic_view(rows_of(tmp_path, "threads"))
    assert threads[1]["episode/turns_mean"] >= 1.0
    assert deterministic_view(rows_of(tmp_path, "processes")) == threads
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        assert main(["train", *common, "backend=ray", "runtime.explorers=2", "run_name=ray"]) == 0
    finally:
        ray.shutdown()
    assert deterministic_view(rows_of(tmp_path, "ray")) == threads
    table = pq.read_table(tmp_path / "runs" / "ray" / "experiences" / "batch-000003.parquet")
    assert any(0 in mask for mask in table.column("loss_mask").to_pylist())
