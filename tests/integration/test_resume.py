"""Checkpoints and resume: after ``kill -9`` or a dying worker, ``resume=true`` reproduces the uninterrupted
run's metrics exactly and its experience store without a lost or duplicated batch."""

import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from oprl.cli import main
from oprl.metrics import deterministic_view, read_metrics
from oprl.tasks.arithmetic import ArithmeticTask
from recipes import kill_9_after

# Stale by one step: at every checkpoint the explorer has already generated a batch the trainer has not
# used, so checkpoints must carry unconsumed experiences and an older weights version.
RUN = [
    "tensorboard=false",
    "runtime.torch_threads=1",
    "steps=6",
    "sync.offset=2",
    "checkpoint.interval=2",
    "eval.interval=3",
]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, cache_dir):
    os.environ["OPRL_CACHE_DIR"] = str(cache_dir)
    from conftest import SMALL

    root = tmp_path_factory.mktemp("resume")
    args = [*SMALL, *RUN, f"output_dir={root / 'runs'}"]
    assert main(["train", *args, "run_name=whole"]) == 0
    return root, args


def store_contents(run_dir):
    files = sorted((run_dir / "experiences").iterdir())
    return [p.name for p in files], [pq.read_table(p).drop_columns(["extra"]) for p in files]


def assert_same_run(root, name):
    whole = read_metrics(root / "runs" / "whole" / "metrics.jsonl")
    resumed = read_metrics(root / "runs" / name / "metrics.jsonl")
    assert [r["step"] for r in resumed] == list(range(7))
    assert deterministic_view(resumed) == deterministic_view(whole)
    names, tables = store_contents(root / "runs" / name)
    whole_names, whole_tables = store_contents(root / "runs" / "whole")
    assert names == whole_names and all(a.equals(b) for a, b in zip(tables, whole_tables, strict=True))


def test_kill_9_then_resume_equals_the_uninterrupted_run(uninterrupted):
    root, args = uninterrupted
    kill_9_after([*args, "run_name=killed"], root / "runs" / "killed" / "checkpoints" / "step-000002" / "state.json")
    assert len(read_metrics(root / "runs" / "killed" / "metrics.jsonl")) < 7
    assert main(["train", *args, "run_name=killed", "resume=true"]) == 0
    assert_same_run(root, "killed")


def test_a_crashing_reward_stops_the_run_in_one_line_and_resume_completes_it(uninterrupted, monkeypatch, capsys):
    root, args = uninterrupted
    score = ArithmeticTask.score
    calls = {"train": 0}

    def crashing(self, problems, responses):
        if "/train/" in problems[0].task_id:
            calls["train"] += 1
            if calls["train"] == 5:
                raise ZeroDivisionError("reward function divided by zero")
        return score(self, problems, responses)

    monkeypatch.setattr(ArithmeticTask, "score", crashing)
    assert main(["train", *args, "run_name=crashed"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "explorer 0 failed while generating batch 5: ZeroDivisionError: reward function divided by zero" in err
    assert "resume=true" in err
    monkeypatch.setattr(ArithmeticTask, "score", score)
    assert main(["train", *args, "run_name=crashed", "resume=true"]) == 0
    assert_same_run(root, "crashed")


def test_resume_refuses_a_changed_config(uninterrupted, capsys):
    _root, args = uninterrupted
    assert main(["train", *args, "run_name=whole", "resume=true", "algorithm.preset=reinforce"]) == 2
    assert "differs" in capsys.readouterr().err


def test_resume_can_extend_a_finished_run(uninterrupted, tmp_path, capsys):
    root, args = uninterrupted
    # v(7) = 4 with sync.offset=2: the final checkpoint of a 6-step run no longer holds version 4.
    assert main(["train", *args, "run_name=whole", "resume=true", "steps=7"]) == 2
    assert "policy version 4" in capsys.readouterr().err
    on_policy = [*args, "sync.offset=0", "steps=2", "eval.interval=0", "run_name=short"]
    assert main(["train", *on_policy]) == 0
    assert main(["train", *on_policy[:-2], "steps=3", "run_name=short", "resume=true"]) == 0
    rows = read_metrics(root / "runs" / "short" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and "eval/accuracy" in rows[2] and "eval/accuracy" in rows[3]


def test_explore_resumes_from_its_store(small_overrides, tmp_path):
    args = [*small_overrides, "tensorboard=false", "runtime.torch_threads=1", "run_name=data"]
    assert main(["explore", *args, "steps=2"]) == 0
    run_dir = tmp_path / "runs" / "data"
    second = pq.read_table(run_dir / "experiences" / "batch-000002.parquet")
    # As if killed after batch 2's file was written but before its row: the batch is made again.
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    (run_dir / "metrics.jsonl").write_text(lines[0] + "\n" + lines[1][:20])
    assert main(["explore", *args, "steps=3", "resume=true"]) == 0
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")] == [1, 2, 3]
    names, tables = store_contents(run_dir)
    assert names == [f"batch-{b:06d}.parquet" for b in (1, 2, 3)]
    assert tables[1].equals(second.drop_columns(["extra"]))


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT to the process group"])
def test_a_signal_stops_a_processes_run_in_one_line_and_resume_equals(uninterrupted, how):
    """Issue 25, item 6: SIGTERM ended the run with rc -15, no line, no final checkpoint and workers alive
    ~3 s; a Ctrl-C to the group printed 20-39 lines of worker tracebacks."""
    root, args = uninterrupted
    name = "sigterm" if how == "SIGTERM" else "sigint"
    command = [sys.executable, "-m", "oprl.cli", "train", *args, "runtime.workers=processes", f"run_name={name}"]
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    rows = root / "runs" / name / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while (not rows.exists() or len(rows.read_text().splitlines()) < 2) and time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read()[-500:]
        time.sleep(0.02)
    signum = signal.SIGTERM if how == "SIGTERM" else signal.SIGINT
    if how == "SIGTERM":
        os.kill(process.pid, signum)
    else:
        os.killpg(process.pid, signum)  # what Ctrl-C in a terminal does: every process of the group
    _, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signum, err
    lines = [line for line in err.strip().splitlines() if " INFO oprl: " not in line]  # progress log lines
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"interrupted by {signum.name} at step ") and "resume=true" in lines[0], lines[0]
    step = int(lines[0].split(" at step ")[1].split(";")[0])
    if step:  # the checkpoint of the last completed step was written
        assert (root / "runs" / name / "checkpoints" / f"step-{step:06d}" / "state.json").is_file(), lines[0]
    deadline = time.monotonic() + 2
    while group_alive(process.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = subprocess.run(["ps", "-o", "pid,args", "-g", str(process.pid)], capture_output=True, text=True).stdout
    assert not group_alive(process.pid), f"a process of the run outlived it: {left}"
    # runtime.* may change on resume (RESUMABLE_CHANGES): the SIGINT case resumes in threads, which also checks
    # that a processes run's checkpoint is complete without worker processes, and saves their start-up.
    workers = "processes" if how == "SIGTERM" else "threads"
    assert main(["train", *args, f"runtime.workers={workers}", f"run_name={name}", "resume=true"]) == 0
    assert_same_run(root, name)
