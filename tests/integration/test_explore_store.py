"""An experience store at ``buffer.path`` belongs to the runs that wrote it (issue 25, item 3): another run is
refused unless it asks to append (and shares the model and task), the run that wrote it resumes into it,
and one run at a time writes it (the store is locked like a run directory)."""

import json

import pytest

from oprl.checkpoint.rundir import RunLock
from oprl.cli import main
from oprl.metrics import read_metrics

EXPLORE = ["tensorboard=false", "runtime.torch_threads=1", "rollout.prompts_per_step=2", "rollout.group_size=2"]


@pytest.fixture
def explore(small_overrides, tmp_path):
    store = tmp_path / "store"

    def run(name: str, *args: str) -> int:
        return main(["explore", *small_overrides, *EXPLORE, f"buffer.path={store}", f"run_name={name}", *args])

    return run, store


def batches(store) -> list[str]:
    return sorted(p.name for p in store.glob("batch-*.parquet"))


def one_line(text: str) -> str:
    text = text.strip()
    assert len(text.splitlines()) == 1 and "Traceback" not in text, text
    return text


def test_explore_into_a_store_of_another_run_is_refused_unless_appended(explore, capsys):
    run, store = explore
    assert run("seed0", "seed=0", "steps=2") == 0
    first = {name: (store / name).read_bytes() for name in batches(store)}
    capsys.readouterr()
    assert run("seed1", "seed=1", "steps=3") == 2  # used to report "explored 3 batches", holding 2 + 1 seeds
    err = one_line(capsys.readouterr().err)
    assert "already holds 2 batches" in err and "seed0" in err and "buffer.append=true" in err, err
    assert {name: (store / name).read_bytes() for name in batches(store)} == first
    # Another task cannot be appended: its prompts and rewards mean something else.
    assert run("other-task", "seed=1", "steps=1", "buffer.append=true", "task.train_size=500") == 2
    assert "task.train_size=500 differs" in one_line(capsys.readouterr().err)
    assert run("seed1-append", "seed=1", "steps=3", "buffer.append=true") == 0
    assert "explored 3 batches" in capsys.readouterr().out
    assert batches(store) == [f"batch-{b:06d}.parquet" for b in range(1, 6)]
    assert {name: (store / name).read_bytes() for name in batches(store) if name in first} == first
    record = json.loads((store / "store.json").read_text())
    assert [(r["run_dir"].rsplit("/", 1)[-1], r["first_batch"]) for r in record["runs"]] == [
        ("seed0", 1),
        ("seed1-append", 3),
    ]
    rows = read_metrics(store.parent / "runs" / "seed1-append" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [3, 4, 5]


def test_the_run_that_wrote_the_store_resumes_into_it_with_the_right_count(explore, capsys):
    run, store = explore
    assert run("mine", "steps=2") == 0
    capsys.readouterr()
    # No steps given: the saved steps=2 (it printed the default 300 before), and nothing to redo.
    assert run("mine", "resume=true") == 0
    assert "explored 2 batches" in capsys.readouterr().out
    assert run("mine", "resume=true", "steps=3") == 0
    assert "explored 3 batches" in capsys.readouterr().out
    assert batches(store) == [f"batch-{b:06d}.parquet" for b in (1, 2, 3)]


def test_a_store_in_use_is_refused(explore, capsys):
    run, store = explore
    store.mkdir()
    with RunLock(store, label="buffer.path"):  # what a concurrent explore holds while it writes
        assert run("second", "steps=1") == 2
    err = one_line(capsys.readouterr().err)
    assert err.startswith("error: buffer.path:") and "is in use by process" in err, err
    assert batches(store) == []
    assert run("second", "steps=1") == 0  # once it is free
