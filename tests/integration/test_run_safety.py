"""The run directory cannot be corrupted by the user's own hand: one writer per run, run names that stay under
output_dir, no overwriting of foreign directories, settings that would train nothing, and inputs that give a
one-line error (issue 18). Durable writes live in ``oprl.io``; reward-text scanning is linear."""

import errno
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from oprl.cli import main
from oprl.config import load_config
from oprl.errors import OprlError

SRC = Path(__file__).resolve().parents[2] / "src" / "oprl"
FAST = ["tensorboard=false", "runtime.torch_threads=1", "eval.interval=0", "eval.num_problems=8"]


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.fixture
def holder(tmp_path):
    """Another process holding runs/held, as a running oprl run does."""
    run_dir = tmp_path / "runs" / "held"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("steps: 1\n")
    code = (
        f"import sys, time; from oprl.checkpoint.rundir import RunLock; RunLock({str(run_dir)!r}).acquire(); "
        "print('locked', flush=True); time.sleep(120)"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONPATH": str(SRC.parent)},
    )
    assert process.stdout.readline().strip() == "locked"
    yield process
    process.kill()
    process.wait()


@pytest.mark.parametrize("command", [["train"], ["explore"], ["train", "resume=true"]])
def test_a_second_run_on_a_locked_directory_is_refused_naming_the_holder(
    holder, small_overrides, tmp_path, capsys, command
):
    run_dir = tmp_path / "runs" / "held"
    before = sorted(p.name for p in run_dir.iterdir())
    assert main([command[0], *small_overrides, *FAST, "steps=1", "run_name=held", *command[1:]]) == 2
    err = one_line_error(capsys)
    assert f"process {holder.pid} on host {socket.gethostname()}" in err and "in use" in err
    assert sorted(p.name for p in run_dir.iterdir()) == before  # nothing written


def test_a_run_holds_its_directory_until_it_ends(small_overrides, tmp_path, monkeypatch):
    from oprl.checkpoint.rundir import RunLock
    from oprl.runtime.driver import Driver

    run_dir = tmp_path / "runs" / "mine"
    seen = []
    real_run = Driver.run

    def run_and_probe(self):
        with pytest.raises(OprlError, match=f"in use by process {os.getpid()}"):
            RunLock(run_dir).acquire()  # a second open file description: refused like another process
        seen.append(True)
        real_run(self)

    monkeypatch.setattr(Driver, "run", run_and_probe)
    assert main(["train", *small_overrides, *FAST, "steps=1", "run_name=mine", "checkpoint.interval=1"]) == 0
    assert seen == [True]
    RunLock(run_dir).acquire().release()  # released at the end


@pytest.mark.parametrize("name", ["../escaped", "a/b", "..", ".", "/tmp/absolute"])
def test_run_name_must_be_one_path_component(small_overrides, tmp_path, capsys, name):
    assert main(["train", *small_overrides, *FAST, "steps=1", f"run_name={name}"]) == 2
    assert "run_name" in one_line_error(capsys)
    assert not (tmp_path / "escaped").exists() and not Path("/tmp/absolute").exists()


def test_an_existing_directory_that_is_not_a_run_is_refused(small_overrides, tmp_path, capsys):
    foreign = tmp_path / "runs" / "photos"
    foreign.mkdir(parents=True)
    (foreign / "holiday.jpg").write_bytes(b"not a run")
    assert main(["train", *small_overrides, *FAST, "steps=1", "run_name=photos"]) == 2
    assert "not an oprl run directory" in one_line_error(capsys)
    assert sorted(p.name for p in foreign.iterdir()) == ["holiday.jpg"]


def test_group_size_one_is_refused_for_group_relative_presets(capsys):
    for preset in ("grpo", "reinforce", "opmd", "red-drop"):
        with pytest.raises(OprlError, match="all advantages are 0"):  # RunConfig's validator: at load
            load_config(None, [f"algorithm.preset={preset}", "rollout.group_size=1"])
    load_config(None, ["rollout.group_size=2"])
    # A shifted baseline (AsymRE's delta) is not relative to the group alone: A = delta, which trains.
    load_config(None, ["rollout.group_size=1", "algorithm.baseline_shift=0.1"])
    assert main(["train", "rollout.group_size=1", "progress=false"]) == 2
    assert "rollout.group_size=1" in one_line_error(capsys)


@pytest.mark.parametrize(
    "text",
    [
        "\\boxed{" * 14_300,
        "<answer>" * 12_500,
        "<think>" + "</think><answer>x" * 6_000,
        "\\boxed{" + "{" * 100_000,
        "1," * 50_000,
    ],
)
def test_reward_text_scanning_is_linear(text):
    from oprl.tasks.rewards.builtin import answer_tag, has_r1_format, last_boxed, last_number

    assert len(text) >= 100_000
    for scan in (last_boxed, answer_tag, has_r1_format, last_number):
        best = min(_seconds(scan, text) for _ in range(3))  # best of three: the machine is shared
        assert best < 0.05, f"{scan.__name__} took {best:.3f}s on {text[:12]!r}..."


def _seconds(function, argument) -> float:
    start = time.perf_counter()
    function(argument)
    return time.perf_counter() - start


def test_last_boxed_keeps_its_meaning():
    from oprl.tasks.rewards.builtin import last_boxed

    assert last_boxed(r"a \boxed{x{y}} b \boxed{z") == "x{y}"  # the last one never closes
    assert last_boxed(r"\boxed{1} } \boxed{ {2} }") == "{2}"
    assert last_boxed(r"}} \fbox {é{x}}") == "é{x}"
    assert last_boxed("no box") is None and last_boxed(r"\boxed{") is None


def test_an_empty_model_directory_says_config_json_is_missing(small_overrides, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["train", *small_overrides, *FAST, "steps=1", f"model.path={tmp_path / 'empty'}"]) == 2
    assert "config.json" in one_line_error(capsys)


def test_a_store_with_unrelated_columns_names_the_file(tmp_path):
    from oprl.buffer.buffer import ExperienceBuffer

    store = tmp_path / "store"
    store.mkdir()
    pq.write_table(pa.table({"city": ["Paris"], "population": [2_100_000]}), store / "batch-000001.parquet")
    with pytest.raises(OprlError) as error:
        ExperienceBuffer(offline_dir=str(store))
    message = str(error.value)
    assert "batch-000001.parquet" in message and "not an oprl experience table" in message
    assert len(message.splitlines()) == 1


def test_durable_writes_sync_the_file_and_its_directory_and_name_the_final_file(tmp_path, monkeypatch):
    from oprl import io

    synced = []
    monkeypatch.setattr(io, "_sync", lambda fd, path: synced.append(Path(path)))
    io.atomic_write_json(tmp_path / "a" / "state.json", {"step": 3})
    assert (tmp_path / "a" / "state.json").read_text() == '{"step": 3}'
    assert synced[-1] == tmp_path / "a" and synced[-2].name.startswith(".state.json.tmp")

    def full(fd, path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(io, "_sync", full)
    with pytest.raises(OSError) as error:
        io.atomic_write_text(tmp_path / "a" / "state.json", "partial")
    assert error.value.errno == errno.ENOSPC and error.value.filename == str(tmp_path / "a" / "state.json")
    assert (tmp_path / "a" / "state.json").read_text() == '{"step": 3}'  # the old file stands
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["state.json"]  # no temporary left


def test_one_home_for_write_then_rename():
    """Every rename that commits a file or directory goes through ``oprl.io`` (which syncs it)."""
    offenders = [
        path.relative_to(SRC).as_posix()
        for path in SRC.rglob("*.py")
        if path.name != "io.py" and ("os.replace(" in path.read_text() or ".rename(" in path.read_text())
    ]
    assert offenders == []
