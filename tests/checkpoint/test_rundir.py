"""The run directory: which directories a new run may take, what ``overwrite`` deletes, one writer at a time."""

import json

import pytest

from oprl.checkpoint import rundir
from oprl.errors import OprlError


def _run(directory, last_step: int):
    directory.mkdir(parents=True)
    (directory / "config.yaml").write_text("steps: 3\n")
    (directory / "metrics.jsonl").write_text(json.dumps({"step": last_step}) + "\n")
    return directory


def test_a_new_run_takes_a_missing_or_empty_directory_and_holds_its_lock(tmp_path):
    run = tmp_path / "runs" / "a"
    lock = rundir.open_new(run)  # returned held
    assert (run / rundir.LOCK_NAME).is_file()
    with pytest.raises(OprlError, match=r"^run_name: .*/runs/a is in use by process \d+ on host"):
        rundir.RunLock(run).acquire()
    lock.release()
    assert not (run / rundir.LOCK_NAME).exists()
    rundir.open_new(run).release()  # still empty: taken again


def test_a_directory_that_is_not_a_run_is_refused_naming_what_it_holds(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "b.csv").write_text("x")
    (tmp_path / "data" / "a.csv").write_text("x")
    with pytest.raises(OprlError, match=r"is not an oprl run directory \(it holds 'a.csv' \.\.\.\)"):
        rundir.open_new(tmp_path / "data", overwrite=True)  # overwrite never deletes someone else's files
    (tmp_path / "file").write_text("x")
    with pytest.raises(OprlError, match="exists and is not a directory"):
        rundir.open_new(tmp_path / "file")


def test_a_trained_run_is_refused_unless_overwrite_which_deletes_only_run_outputs(tmp_path):
    run = _run(tmp_path / "run", last_step=2)
    (run / "checkpoints" / "step-000002").mkdir(parents=True)
    (run / "notes.md").write_text("my analysis")
    with pytest.raises(OprlError, match="already holds a run; choose another run_name, resume=true"):
        rundir.open_new(run)
    assert not (run / rundir.LOCK_NAME).exists()  # the refusal released the lock
    rundir.open_new(run, overwrite=True).release()
    assert sorted(p.name for p in run.iterdir()) == ["notes.md"]


def test_a_run_that_never_reached_step_1_is_marked_and_replaced(tmp_path):
    run = _run(tmp_path / "run", last_step=0)
    assert rundir.never_started(run)
    rundir.mark_incomplete(run, "KeyboardInterrupt")
    assert "stopped before step 1: KeyboardInterrupt" in (run / rundir.INCOMPLETE).read_text()
    said: list[str] = []
    rundir.open_new(run, log=said.append).release()
    assert said == [f"run_name: {run} holds a run that stopped before step 1 (nothing to continue); replacing it"]
    assert not (run / rundir.INCOMPLETE).exists() and not (run / "config.yaml").exists()
    trained = _run(tmp_path / "trained", last_step=1)
    rundir.mark_incomplete(trained, "late error")
    assert not rundir.never_started(trained) and not (trained / rundir.INCOMPLETE).exists()


def test_resume_needs_a_run(tmp_path):
    with pytest.raises(OprlError, match=r"^resume: .* holds no run to resume \(no config.yaml\)$"):
        rundir.open_existing(tmp_path)
    run = _run(tmp_path / "run", last_step=3)
    lock = rundir.open_existing(run)
    assert (run / rundir.LOCK_NAME).is_file()
    lock.release()
