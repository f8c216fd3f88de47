"""Checkpoint directories of a run: which is the newest, which are usable, what pruning keeps."""

import json

import pytest
import torch
from safetensors.torch import save_file

from oprl.checkpoint import files
from oprl.errors import OprlError


def _commit(run_dir, step: int):
    """A small checkpoint assembled in staging and committed (sealed, renamed, verified), as a run does."""
    staging = files.staging_dir(run_dir, step)
    (staging / "trainer").mkdir()
    save_file({"w": torch.full((2,), float(step))}, str(staging / "trainer" / "model.safetensors"))
    (staging / "notes.json").write_text(json.dumps({"step": step}))
    final = files.step_dir(run_dir, step)
    files.commit(staging, final)
    return final


def test_resolve_checkpoint_picks_the_newest_committed_checkpoint(tmp_path):
    run = tmp_path / "run"
    assert files.resolve_checkpoint(run) is None
    old, new = _commit(run, 9), _commit(run, 10)  # step-000010 after step-000009: by number, not by mtime
    _commit(run, 2)
    files.staging_dir(run, 12)  # a checkpoint still being written is never chosen
    assert files.checkpoints(run) == [files.step_dir(run, 2), old, new]
    assert files.resolve_checkpoint(run) == new
    assert files.resolve_checkpoint(old) == old  # a checkpoint directory is itself


def test_usable_checkpoints_skip_a_corrupted_newest_one_and_say_why(tmp_path):
    run = tmp_path / "run"
    first, second = _commit(run, 1), _commit(run, 2)
    assert files.usable_checkpoints(run) == ([second, first], [])
    (second / "notes.json").write_text(json.dumps({"step": 3}))  # same size, other bytes
    usable, problems = files.usable_checkpoints(run)
    assert usable == [first]
    assert problems == [f"{second}/notes.json does not match its SHA-256 in the manifest (corrupted)"]
    (first / "trainer" / "model.safetensors").unlink()
    with pytest.raises(OprlError, match=r"no checkpoint of .* verifies \(newest: .*step-000002/notes.json"):
        files.usable_checkpoints(run)
    with pytest.raises(OprlError, match="has no checkpoint"):
        files.usable_checkpoints(tmp_path / "empty")


def test_prune_keeps_the_newest_and_removes_staging_leftovers(tmp_path):
    run = tmp_path / "run"
    for step in (1, 2, 3):
        _commit(run, step)
    files.staging_dir(run, 4)
    files.prune(run, keep=2)
    assert files.checkpoints(run) == [files.step_dir(run, 2), files.step_dir(run, 3)]
    assert not list((run / files.CHECKPOINTS).glob(".tmp-*"))


def test_commit_refuses_non_finite_weights_and_leaves_no_checkpoint(tmp_path):
    run = tmp_path / "run"
    staging = files.staging_dir(run, 5)
    (staging / "trainer").mkdir()
    save_file({"w": torch.tensor([1.0, float("nan")])}, str(staging / "trainer" / "model.safetensors"))
    with pytest.raises(ValueError, match="non-finite"):
        files.commit(staging, files.step_dir(run, 5))
    assert files.checkpoints(run) == []
