"""Resume is honest (issue 18): it continues with the run's saved settings, refuses instead of silently
starting over, falls back past a corrupt checkpoint to the newest one that verifies, and never deletes
anything before a checkpoint has verified. Checkpoints carry a manifest (sizes, SHA-256) and finite weights."""

import json
import shutil

import pytest
import torch
import yaml
from safetensors.torch import save_file

from oprl.checkpoint import manifest
from oprl.cli import main
from oprl.metrics import deterministic_view, read_metrics

RUN = [
    "tensorboard=false",
    "runtime.torch_threads=1",
    "steps=4",
    "checkpoint.interval=1",
    "checkpoint.keep=10",
    "eval.interval=0",
    "eval.num_problems=8",
    "rollout.prompts_per_step=2",
    "rollout.group_size=2",
    "optim.lr_schedule=cosine",  # a schedule whose position the checkpoint must carry: step 2 is mid-warmup
    "optim.warmup_steps=3",
]


@pytest.fixture(scope="module")
def whole(tmp_path_factory, cache_dir):
    import os

    os.environ["OPRL_CACHE_DIR"] = str(cache_dir)
    from conftest import SMALL

    root = tmp_path_factory.mktemp("resume-safety")
    assert main(["train", *SMALL, *RUN, f"output_dir={root}", "run_name=whole"]) == 0
    return root / "whole"


def copy_of(whole, tmp_path, name: str, *, stopped_after: int | None = None):
    """A copy of the finished run; with ``stopped_after`` as if killed right after that step's checkpoint."""
    run_dir = tmp_path / name
    shutil.copytree(whole, run_dir)
    (run_dir / ".oprl.lock").unlink(missing_ok=True)  # a finished run removed it
    if stopped_after is not None:
        for checkpoint in (run_dir / "checkpoints").iterdir():
            if int(checkpoint.name.split("-")[1]) > stopped_after:
                shutil.rmtree(checkpoint)
        rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["step"] <= stopped_after]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        for batch in (run_dir / "experiences").glob("batch-*.parquet"):
            if int(batch.stem.split("-")[1]) > stopped_after:
                batch.unlink()
        for leftover in ("summary.json", "metrics.png", "final"):
            shutil.rmtree(run_dir / leftover) if (run_dir / leftover).is_dir() else (run_dir / leftover).unlink()
    return run_dir


def resume(run_dir, *args) -> int:
    return main(
        ["train", f"output_dir={run_dir.parent}", f"run_name={run_dir.name}", "resume=true", "progress=false", *args]
    )


def files_of(run_dir) -> dict:
    return {
        p.relative_to(run_dir).as_posix(): p.read_bytes()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.name != ".oprl.lock"
    }


def one_line(text: str) -> str:
    text = text.strip()
    assert len(text.splitlines()) == 1 and "Traceback" not in text, text
    return text


def test_resume_continues_with_the_saved_settings(whole, tmp_path):
    run_dir = copy_of(whole, tmp_path, "stopped", stopped_after=2)
    assert resume(run_dir) == 0  # no settings given: steps=4 and checkpoint.interval=1 come from config.yaml
    assert deterministic_view(read_metrics(run_dir / "metrics.jsonl")) == deterministic_view(
        read_metrics(whole / "metrics.jsonl")
    )
    rates = [row["optim/lr"] for row in read_metrics(run_dir / "metrics.jsonl") if "optim/lr" in row]
    assert rates == pytest.approx([0.0, 1e-4, 2e-4, 3e-4])  # warmup to optim.lr, resumed at step 2
    assert (run_dir / "final" / "model.safetensors").read_bytes() == (
        whole / "final" / "model.safetensors"
    ).read_bytes()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [f"step-00000{s}" for s in (1, 2, 3, 4)]
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["steps"] == 4
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 4


def test_a_non_resumable_change_is_refused(whole, tmp_path, capsys):
    run_dir = copy_of(whole, tmp_path, "changed", stopped_after=2)
    assert resume(run_dir, "optim.lr=0.5") == 2
    assert "optim.lr differs" in one_line(capsys.readouterr().err)


def test_a_finished_run_resumed_with_fewer_steps_is_refused(whole, tmp_path, capsys):
    run_dir = copy_of(whole, tmp_path, "finished")
    before = files_of(run_dir)
    assert resume(run_dir, "steps=2") == 2
    assert "already trained 4 steps" in one_line(capsys.readouterr().err)
    assert files_of(run_dir) == before


@pytest.mark.parametrize("damage", ["no-state", "no-checkpoints"])
def test_resume_without_a_usable_checkpoint_is_refused_and_deletes_nothing(whole, tmp_path, capsys, damage):
    run_dir = copy_of(whole, tmp_path, damage)
    if damage == "no-state":
        for state in (run_dir / "checkpoints").glob("*/state.json"):
            state.unlink()
    else:
        shutil.rmtree(run_dir / "checkpoints")
    before = files_of(run_dir)
    assert resume(run_dir) == 2
    err = one_line(capsys.readouterr().err)
    assert "nothing was deleted" in err and "resume=restart" in err
    assert ("state.json is missing" in err) == (damage == "no-state")
    assert files_of(run_dir) == before  # rows, experiences and checkpoints all still there
    if damage == "no-state":
        assert (
            main(
                ["train", f"output_dir={tmp_path}", f"run_name={damage}", "resume=restart", "steps=1", "progress=false"]
            )
            == 0
        )  # asked explicitly: starts over (saved settings, steps=1)
        assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")] == [0, 1]
        assert sorted(p.name for p in (run_dir / "experiences").iterdir()) == ["batch-000001.parquet"]


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_a_weight_byte(path):
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x10  # inside the tensor data; the safetensors header stays valid
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage, file",
    [
        (_truncate, "trainer/model.safetensors"),
        (_flip_a_weight_byte, "trainer/model.safetensors"),
        (_truncate, "state.json"),
        (_truncate, "manifest.json"),
    ],
)
def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_one(whole, tmp_path, capsys, damage, file):
    run_dir = copy_of(whole, tmp_path, "corrupt")
    damage(run_dir / "checkpoints" / "step-000004" / file)
    # keep=1: the previous checkpoint must survive until a newer one has verified (it used to be pruned first).
    assert resume(run_dir, "steps=4", "checkpoint.keep=1") == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("resume:"))
    assert f"step-000004/{file}" in line and "resuming from step-000003" in line
    assert "is unreadable is unusable" not in line  # the phrase of 9981eb2's message for a garbled manifest
    assert deterministic_view(read_metrics(run_dir / "metrics.jsonl")) == deterministic_view(
        read_metrics(whole / "metrics.jsonl")
    )
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step-000004"]
    assert manifest.verify(run_dir / "checkpoints" / "step-000004") is None


def test_when_no_checkpoint_verifies_the_file_is_named(whole, tmp_path, capsys):
    run_dir = copy_of(whole, tmp_path, "ruined")
    for model in (run_dir / "checkpoints").glob("*/trainer/model.safetensors"):
        _truncate(model)
    before = files_of(run_dir)
    assert resume(run_dir) == 2
    err = one_line(capsys.readouterr().err)
    assert "no checkpoint" in err and "step-000004/trainer/model.safetensors" in err and "truncated" in err
    assert files_of(run_dir) == before
    assert main(["eval", str(run_dir / "checkpoints" / "step-000004"), "progress=false"]) == 2
    assert "model.safetensors" in one_line(capsys.readouterr().err)


def test_non_finite_weights_are_refused_at_save_and_at_load(tmp_path):
    checkpoint = tmp_path / "step-000001"
    (checkpoint / "trainer").mkdir(parents=True)
    (checkpoint / "state.json").write_text("{}")
    save_file({"w": torch.ones(3)}, str(checkpoint / "trainer" / "model.safetensors"))
    manifest.seal(checkpoint)
    assert manifest.verify(checkpoint) is None
    (checkpoint / "weights").mkdir()
    save_file({"w": torch.tensor([1.0, float("nan"), 0.0])}, str(checkpoint / "weights" / "v.safetensors"))
    with pytest.raises(manifest.CheckpointError, match=r"weights/v\.safetensors holds non-finite values"):
        manifest.seal(checkpoint)
    # At load, even with a manifest that matches the bytes (written by hand here), NaN weights are refused.
    files = json.loads((checkpoint / "manifest.json").read_text())["files"]
    path = checkpoint / "weights" / "v.safetensors"
    files["weights/v.safetensors"] = {"size": path.stat().st_size, "sha256": manifest._sha256(path)}
    (checkpoint / "manifest.json").write_text(json.dumps({"files": files}))
    assert "non-finite" in manifest.verify(checkpoint)


def test_resume_takes_true_false_or_restart():
    from oprl.config import load_config
    from oprl.errors import OprlError

    values = [load_config(None, [f"resume={v}", "run_name=x"]).resume for v in ("true", "false", "restart")]
    assert values == [True, False, "restart"]
    with pytest.raises(OprlError, match=r"resume: .*expected true, false or restart"):
        load_config(None, ["resume=maybe"])


def _optimizer_json_holds_a_list(checkpoint):
    (checkpoint / "trainer" / "optimizer.json").write_text("[1, 2]")


def _model_lacks_a_tensor(checkpoint):
    from safetensors.torch import load_file

    path = checkpoint / "trainer" / "model.safetensors"
    tensors = load_file(str(path))
    del tensors[sorted(tensors)[-1]]
    save_file(tensors, str(path))


@pytest.mark.parametrize(
    "damage, file", [(_optimizer_json_holds_a_list, "optimizer.json"), (_model_lacks_a_tensor, "model.safetensors")]
)
def test_a_checkpoint_that_verifies_but_does_not_load_changes_no_file(whole, tmp_path, capsys, damage, file):
    """Issue 25, item 4: the manifest is recomputed over the damage, so only parsing or loading finds it;
    the resume used to cut metrics.jsonl and delete store batches before it failed with a bare TypeError."""
    run_dir = copy_of(whole, tmp_path, "unloadable", stopped_after=3)
    with (run_dir / "metrics.jsonl").open("a") as rows:  # rows and a batch after the checkpoint: kept
        rows.write(json.dumps({"step": 4, "reward/mean": 0.5}) + "\n")
    shutil.copy(whole / "experiences" / "batch-000004.parquet", run_dir / "experiences")
    for checkpoint in (run_dir / "checkpoints").iterdir():
        damage(checkpoint)
        manifest.seal(checkpoint)  # what a careful forger (or a buggy writer) leaves: a manifest that matches
        assert manifest.verify(checkpoint) is None
    before = files_of(run_dir)
    assert resume(run_dir) == 2
    err = one_line(capsys.readouterr().err)
    assert f"step-000003/trainer/{file}" in err and "nothing was deleted" in err, err
    assert files_of(run_dir) == before


def test_a_newest_checkpoint_that_does_not_load_falls_back_to_the_previous_one(whole, tmp_path, capsys):
    run_dir = copy_of(whole, tmp_path, "fallback")
    newest = run_dir / "checkpoints" / "step-000004"
    _model_lacks_a_tensor(newest)
    manifest.seal(newest)
    assert resume(run_dir, "checkpoint.keep=1") == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("resume:"))
    assert "step-000004/trainer/model.safetensors" in line and "resuming from step-000003" in line, line
    assert deterministic_view(read_metrics(run_dir / "metrics.jsonl")) == deterministic_view(
        read_metrics(whole / "metrics.jsonl")
    )


def test_restart_deletes_only_the_runs_own_outputs(whole, tmp_path):
    """resume=restart starts over without touching the user's files in the run directory (issue #25)."""
    from oprl.checkpoint.rundir import LOCK_NAME, is_run_output

    run_dir = copy_of(whole, tmp_path, "restarted")
    assert all(is_run_output(p.name) for p in run_dir.iterdir() if p.name != LOCK_NAME), sorted(
        p.name for p in run_dir.iterdir()
    )  # every file a run writes is known to the restart, so none is left behind
    (run_dir / "NOTES.md").write_text("my notes\n")
    (run_dir / "analysis").mkdir()
    (run_dir / "analysis" / "plot.py").write_text("print('mine')\n")
    restart = ["train", f"output_dir={tmp_path}", "run_name=restarted", "resume=restart", "steps=1", "progress=false"]
    assert main(restart) == 0
    assert (run_dir / "NOTES.md").read_text() == "my notes\n"
    assert (run_dir / "analysis" / "plot.py").read_text() == "print('mine')\n"
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")] == [0, 1]
