"""Checks made before any work starts (oprl.runtime.preflight, RunConfig's validators): a length that cannot
fit the model's context is one line naming the setting that fixes it, or the model when none can, before the
warm start builds (or loads) any model."""

import json

import pytest

import oprl.models.tiny
import oprl.trainer.warmstart  # imported before `no_model` patches: it binds build_model when imported
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


class _SingleTurn:
    """A task without an environment (replies of one turn)."""


def test_partial_rollouts_that_cannot_switch_are_a_warning_before_the_run():
    from oprl.runtime.preflight import noop_warnings

    def warnings(*overrides):
        return noop_warnings(load_config(None, ["sync.partial=true", *overrides]), _SingleTurn())

    (line,) = warnings()  # the default job: k=1, m=0, the trainer waits for every batch
    assert line.startswith("warning: sync.partial=true does nothing here: with sync.interval=1 sync.offset=0")
    (line,) = warnings("sync.offset=1")  # a schedule that could switch, but replies of 8 end first
    assert "sync.switch_step=8, and rollout.max_new_tokens=8 ends every reply before it" in line
    assert warnings("sync.offset=1", "sync.switch_step=4") == []
    assert warnings("sync.mode=async") == [] and noop_warnings(load_config(), _SingleTurn()) == []


def test_settings_a_run_shows_did_nothing_are_a_warning_after_it():
    from oprl.runtime.preflight import outcome_warnings

    rows = [{"step": s, "lag/max": 0.0, "batch/switched_frac": 0.0, "response/length_mean": 3.0} for s in (1, 2)]
    config = load_config(None, ["sync.mode=async", "sync.partial=true"])
    partial, ahead = outcome_warnings(config, rows)
    assert partial.startswith("warning: sync.partial=true made no switch in 2 steps (replies of 3.0 tokens")
    assert ahead.startswith("warning: sync.mode=async never ran ahead: every batch of 2 steps")
    rows[1] |= {"lag/max": 1.0, "batch/switched_frac": 0.25}
    assert outcome_warnings(config, rows) == []


def test_the_default_job_with_partial_rollouts_says_so(small_overrides):
    """#42: ``sync.partial=true`` on the default job switched nothing and said nothing."""
    import oprl

    lines: list[str] = []
    overrides = dict(item.split("=", 1) for item in [*small_overrides, "steps=2", "sync.partial=true"])
    oprl.train(log=lines.append, **overrides)
    assert sum("sync.partial=true does nothing here" in line for line in lines) == 1, lines
    assert sum("sync.partial=true made no switch in 2 steps" in line for line in lines) == 1, lines


# -- #53: what needs the machine, checked before any model is built (paths, chat template, teacher tokens, reward)


@pytest.fixture
def no_network(monkeypatch):
    """Any connection attempt is recorded and refused; the test asserts none was made (no hub download)."""
    import socket

    import huggingface_hub.constants

    attempts: list[object] = []

    def refuse(self, address, *args, **kwargs):
        attempts.append(address)
        raise OSError("the network is off in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # online: a hub id would be fetched
    return attempts


@pytest.fixture
def no_pretrained(monkeypatch):
    """Loading any model from a directory or the hub fails the test."""
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the checks refused the run")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


@pytest.fixture(scope="module")
def own_model(tmp_path_factory):
    """A small model directory of one's own (the embedded architecture and tokenizer, saved)."""
    from oprl.models.tiny import build_model, build_tokenizer

    path = tmp_path_factory.mktemp("own-model")
    tokenizer = build_tokenizer()
    build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.parametrize("key", ["model.path", "teacher.path", "judge.path"])
def test_a_path_typo_names_the_nearest_runs_without_the_hub(key, tmp_path, monkeypatch, capsys, no_model, no_network):
    """Before: `runs/<typo>` is shaped like a hub id, so it went to huggingface.co (127 s of retries for
    model.path, ~60 s for teacher/judge.path) and never said "no such directory"."""
    monkeypatch.chdir(tmp_path)
    for name in ("tiny-teacher", "tiny-distill"):
        (tmp_path / "runs" / name).mkdir(parents=True)
    extra = ["algorithm.preset=distill"] if key == "teacher.path" else []
    code = main(["train", f"{key}=runs/tiny-teachr", *extra, "steps=1"])
    out, err = capsys.readouterr()
    assert code == 2 and err.startswith(f"error: {key}: 'runs/tiny-teachr' not found") and "\n" not in err.strip()
    assert "nearest: runs/tiny-teacher" in err
    assert "oprl: train" not in out  # refused before the headline
    assert no_network == []


def test_a_runs_path_is_local_even_before_any_run_exists(tmp_path, monkeypatch, capsys, no_model, no_network):
    monkeypatch.chdir(tmp_path)  # a fresh clone: no runs/ folder
    assert main(["train", "model.path=runs/nope", "steps=1"]) == 2
    assert "error: model.path: 'runs/nope' not found" in capsys.readouterr().err and no_network == []


def test_a_missing_store_and_a_name_in_use_are_refused_before_the_headline(tmp_path, monkeypatch, capsys, no_model):
    """#71: ``mode=offline buffer.path=runs/nope`` failed after the headline and the warm start (5.6 s warm, 3
    minutes cold), a ``run_name`` in use after the headline (3 s); both are one line before it now. A store
    directory without batches is refused before the warm start (``ExperienceStore.locate``)."""
    monkeypatch.chdir(tmp_path)
    assert main(["train", "mode=offline", "buffer.path=runs/nope", "progress=false"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: buffer.path: runs/nope is not a directory; mode=offline reads the experience")
    assert out == "" and not (tmp_path / "runs").exists()
    run = tmp_path / "runs" / "taken"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("seed: 0\n")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    assert main(["train", "run_name=taken", "progress=false"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "error: run_name: runs/taken already holds a run; choose another run_name" in err
    (tmp_path / "empty").mkdir()
    assert main(["train", "mode=offline", "buffer.path=empty", "progress=false"]) == 2  # no_model: no warm start
    assert "error: buffer.path: no batch-*.parquet files in empty" in capsys.readouterr().err


def test_no_chat_template_is_refused_before_any_model_with_how_to_set_one(
    own_model, tmp_path, capsys, no_model, no_pretrained
):
    """Before: refused by the trainer's load after the headline, advising only 'use an instruction-tuned model'."""
    bare = tmp_path / "bare"
    bare.mkdir()
    for item in own_model.iterdir():
        if item.name != "chat_template.jinja":
            (bare / item.name).write_bytes(item.read_bytes())
    config = json.loads((bare / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    assert main(["train", f"model.path={bare}", "steps=1", f"output_dir={tmp_path / 'runs'}"]) == 2
    out, err = capsys.readouterr()
    assert "oprl: train" not in out  # from the directory's files, before the headline and transformers
    assert f"error: model.path: '{bare}' has no chat template" in err
    assert f"write a Jinja chat template to {bare}/chat_template.jinja" in err and "tokenizer.chat_template" in err


def test_a_teacher_on_another_tokenizer_is_refused_before_any_model(
    own_model, tmp_path, capsys, no_model, no_pretrained
):
    from transformers import AutoTokenizer

    other = tmp_path / "other-teacher"
    other.mkdir()
    for item in own_model.iterdir():
        (other / item.name).write_bytes(item.read_bytes())
    tokenizer = AutoTokenizer.from_pretrained(other)
    tokenizer.add_tokens(["<extra>"])
    tokenizer.save_pretrained(other)
    argv = ["train", f"model.path={own_model}", f"teacher.path={other}", "algorithm.preset=distill", "steps=1"]
    assert main([*argv, f"output_dir={tmp_path / 'runs'}"]) == 2
    out, err = capsys.readouterr()
    assert f"error: teacher.path: {other}'s vocabulary (104 tokens) is not model.path" in err
    assert "oprl: train" not in out  # from the two tokenizer.json files, before the headline
    # A teacher the files cannot settle (a hub id, a student of the embedded model): from the loaded tokenizers.
    from oprl.models.tiny import build_tokenizer
    from oprl.runtime.preflight import check_teacher_tokens

    config = load_config(None, [f"teacher.path={other}", "algorithm.preset=distill"])
    with pytest.raises(OprlError, match=r"teacher\.path: .*other-teacher's vocabulary \(104 tokens\) is not"):
        check_teacher_tokens(config, build_tokenizer())


def test_a_reward_that_fails_on_every_row_is_refused_before_any_model(
    own_model, tmp_path, monkeypatch, capsys, no_model, no_pretrained
):
    """Before: the first evaluation failed after the model loaded, exit 1, 'OprlError:' in the text."""
    monkeypatch.chdir(tmp_path)
    rows = [{"prompt": f"{i}+1=", "reference": str(i + 1)} for i in range(8)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "reward.py").write_text(
        "def reward(prompt, completion, reference, **row):\n    raise ValueError('boom')\n"
    )
    args = ["task.name=dataset", "task.train_file=train.jsonl", "task.reward=reward.py:reward", "steps=1"]
    assert main(["train", f"model.path={own_model}", *args, f"output_dir={tmp_path / 'runs'}"]) == 2
    err = capsys.readouterr().err
    assert "error: task.reward: reward.py:reward failed on every one of the first 4 train rows" in err
    assert "ValueError: boom" in err and "OprlError" not in err
