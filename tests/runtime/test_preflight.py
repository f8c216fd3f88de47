"""Checks made before any work starts (oprl.runtime.preflight, RunConfig's validators): a length that cannot
fit the model's context is one line naming the setting that fixes it, or the model when none can, before the
warm start builds (or loads) any model."""

import json

import pytest

import oprl.models.tiny
from oprl.cli import main
from oprl.config import load_config
from oprl.errors import OprlError


@pytest.fixture
def no_model(monkeypatch):
    """Building the embedded model fails the test: every check here must come before any model exists."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was built before the checks refused the run")

    monkeypatch.setattr(oprl.models.tiny, "build_model", refuse)


def test_reasoning_gym_on_the_tiny_model_names_its_context_before_the_warm_start(tmp_path, capsys, no_model):
    """The docs' reasoning-gym line: its prompts (~500 characters) cannot fit the tiny model's 128 positions.
    Before: 7.5 minutes of warm start, then an error naming the warm start's own max_new_tokens=24."""
    pytest.importorskip("reasoning_gym")
    code = main(
        ["train", "task.name=reasoning-gym", "task.datasets=[basic_arithmetic]", "steps=3", f"output_dir={tmp_path}"]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("error: task reasoning-gym: a train prompt of ") and "\n" not in err
    assert "the embedded tiny model's context of 128 positions" in err and "max_new_tokens" not in err.split(":")[1]
    assert not any(tmp_path.iterdir())  # no run directory left to block the name


def test_a_reply_budget_past_the_context_names_rollout_max_new_tokens(tmp_path, capsys, no_model):
    code = main(["train", "rollout.max_new_tokens=120", "steps=1", f"output_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 2 and "error: rollout.max_new_tokens=120: a train prompt of " in err
    assert "exceeds the embedded tiny model's context of 128 positions" in err and "lower it to <= " in err
    with pytest.raises(OprlError, match=r"rollout\.max_new_tokens=128: the embedded tiny model's context is 128"):
        load_config(None, ["rollout.max_new_tokens=128"])  # no machine needed: refused by the config itself


def test_demonstrations_longer_than_the_context_name_the_model(tmp_path, monkeypatch, capsys, no_model):
    """Short prompts, long answers: only the warm start's replies overflow; no setting shortens them."""
    monkeypatch.chdir(tmp_path)
    rows = [{"prompt": f"{i}?", "reference": "x" * 150} for i in range(300)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "reward.py").write_text("def reward(prompt, completion, reference, **row):\n    return 0.0\n")
    args = ["task.name=dataset", "task.train_file=train.jsonl", "task.reward=reward.py:reward", "steps=1"]
    assert main(["train", *args, f"output_dir={tmp_path / 'runs'}"]) == 2
    err = capsys.readouterr().err
    expected = "demonstrations need 162 positions (a prompt of 7 tokens + replies of up to 155)"
    assert f"error: task dataset: the warm start's {expected}" in err
    assert "the embedded tiny model's context of 128: no setting shortens them" in err
