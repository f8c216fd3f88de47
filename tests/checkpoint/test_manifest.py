"""``manifest.seal`` / ``verify``: a checkpoint proves its bytes (size, SHA-256 of every file) and finite weights."""

import hashlib
import json

import pytest
import torch
from safetensors.torch import save_file

from oprl.checkpoint import manifest


def _checkpoint(root, weight=1.0):
    (root / "trainer").mkdir(parents=True)
    save_file({"w": torch.full((3, 2), weight), "steps": torch.arange(3)}, str(root / "trainer" / "model.safetensors"))
    (root / "state.json").write_text(json.dumps({"step": 4}))
    return root


def test_a_sealed_checkpoint_verifies_and_its_manifest_lists_every_file(tmp_path):
    root = _checkpoint(tmp_path / "step-000004")
    manifest.seal(root)
    assert manifest.verify(root) is None
    listed = json.loads((root / manifest.MANIFEST).read_text())["files"]
    assert sorted(listed) == ["state.json", "trainer/model.safetensors"]
    state = root / "state.json"
    assert listed["state.json"] == {
        "size": state.stat().st_size,
        "sha256": hashlib.sha256(state.read_bytes()).hexdigest(),
    }


def test_verify_names_a_changed_a_truncated_and_a_missing_file(tmp_path):
    root = _checkpoint(tmp_path / "step-000004")
    manifest.seal(root)
    state = root / "state.json"
    original = state.read_text()
    state.write_text(original.replace("4", "5"))  # same size, other bytes
    assert manifest.verify(root) == "state.json does not match its SHA-256 in the manifest (corrupted)"
    state.write_text(original[:-1])
    assert manifest.verify(root) == (
        f"state.json has {len(original) - 1} bytes, the manifest says {len(original)} (truncated or replaced)"
    )
    state.unlink()
    assert manifest.verify(root) == "state.json is missing"


def test_verify_names_a_missing_or_unreadable_manifest(tmp_path):
    root = _checkpoint(tmp_path / "step-000004")
    assert manifest.verify(root).startswith("manifest.json is missing")
    (root / manifest.MANIFEST).write_text("{not json")
    assert manifest.verify(root) == "manifest.json is unreadable"
    (root / manifest.MANIFEST).write_text(json.dumps({"no files": 1}))
    assert manifest.verify(root) == "manifest.json is unreadable"


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_at_seal_and_at_verify(tmp_path, bad):
    root = _checkpoint(tmp_path / "sealed", weight=bad)
    with pytest.raises(manifest.CheckpointError, match=r"trainer/model.safetensors holds non-finite values .* in w"):
        manifest.seal(root)
    assert not (root / manifest.MANIFEST).exists()  # nothing sealed
    # A manifest that matches the bytes (written by hand) does not make the weights usable.
    files = {
        p.relative_to(root).as_posix(): {"size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        for p in root.rglob("*")
        if p.is_file()
    }
    (root / manifest.MANIFEST).write_text(json.dumps({"files": files}))
    assert manifest.verify(root) == "trainer/model.safetensors holds non-finite values (NaN or inf) in w"


def test_weights_that_do_not_parse_are_named(tmp_path):
    root = tmp_path / "step-000001"
    (root / "weights").mkdir(parents=True)
    (root / "weights" / "explorer-0.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    with pytest.raises(manifest.CheckpointError, match=r"^weights/explorer-0.safetensors is unreadable \("):
        manifest.seal(root)
