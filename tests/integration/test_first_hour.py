"""What a new user meets in a run's first hour: log lines without a terminal, the no-signal warning, strict
``summary.json`` in every mode, a resume that names its checkpoint, no lock left behind, ``overwrite``."""

import json
import logging

import pytest

import oprl
from oprl.cli import main


def strict_json(path):
    """``json.loads`` that refuses NaN and Infinity (what JSON parsers other than Python's do)."""

    def refuse(name):
        raise ValueError(f"{path}: {name} is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.fixture
def train_run(small_overrides, tmp_path, caplog):
    """A 6-step run without a terminal, logging every 2 steps (SMALL evaluates every 2 steps too)."""
    with caplog.at_level(logging.INFO, logger="oprl"):
        assert main(["train", *small_overrides, "steps=6", "run_name=a", "logging.interval=2"]) == 0
    return tmp_path / "runs" / "a", [r for r in caplog.records if r.name == "oprl"]


def test_non_tty_run_writes_log_lines(train_run):
    run_dir, records = train_run
    lines = [r.getMessage() for r in records if r.getMessage().startswith("train step")]
    # Step 0 (the evaluation before training), then every logging.interval = 2 steps up to the last.
    assert [line.split()[2] for line in lines] == ["0/6", "2/6", "4/6", "6/6"], lines
    assert all(r.levelno == logging.INFO for r in records)
    for line in lines[1:]:
        for field in ("reward ", "eval acc ", "len ", "truncated ", "lag ", " s/step", "elapsed "):
            assert field in line, (field, line)
    assert "eta " in lines[1] and "eta " not in lines[-1]
    accuracy = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["eval/accuracy"]
    assert f"eval acc {accuracy:.3f} (step 6)" in lines[-1]


def test_a_finished_run_leaves_no_lock_and_strict_summaries(train_run, small_overrides, tmp_path, capsys, caplog):
    run_dir, _ = train_run
    assert not (run_dir / ".oprl.lock").exists()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    (config,) = events.Tensors("config/text_summary")  # the resolved config, in TensorBoard's TEXT tab
    assert b"steps: 6" in config.tensor_proto.string_val[0]
    first = strict_json(run_dir / "summary.json")
    assert first["mode"] == "both" and first["seconds"] == first["segment_seconds"]
    # Resume: one more step from the final checkpoint, named; seconds count both segments (#42: only the last).
    saved = json.loads((run_dir / "checkpoints" / "step-000006" / "state.json").read_text())["total_s"]
    assert main(["train", *small_overrides, "steps=7", "run_name=a", "resume=true"]) == 0
    out = capsys.readouterr().out
    assert f"resuming a from checkpoint {run_dir / 'checkpoints' / 'step-000006'} (step 6 of 7)" in out
    resumed = strict_json(run_dir / "summary.json")
    assert resumed["seconds"] == pytest.approx(saved + resumed["segment_seconds"])
    # The checkpoint of the last step counts the first segment up to it: all but writing final/ and the summary.
    assert first["seconds"] / 2 < saved <= first["seconds"] and resumed["segment_seconds"] < resumed["seconds"]
    runs = tmp_path / "runs"
    assert main(["explore", *small_overrides, "steps=2", "run_name=x"]) == 0
    explore = strict_json(runs / "x" / "summary.json")
    assert explore["eval_accuracy_before"] is None and explore["eval_accuracy_after"] is None
    assert main(["train", *small_overrides, "mode=offline", f"buffer.path={runs / 'x'}", "steps=2", "run_name=o"]) == 0
    with caplog.at_level(logging.INFO, logger="oprl"):
        assert main(["eval", str(run_dir), *small_overrides[:-1], "run_name=e"]) == 0
    assert any(r.getMessage().startswith("evaluate run 1/1  eval acc ") for r in caplog.records)
    for name, mode in (("o", "offline"), ("e", "eval")):
        assert strict_json(runs / name / "summary.json")["mode"] == mode
        assert not (runs / name / ".oprl.lock").exists()


def test_overwrite_replaces_a_run(small_overrides, tmp_path, capsys):
    assert main(["train", *small_overrides, "steps=2", "run_name=w", "tensorboard=false"]) == 0
    assert main(["train", *small_overrides, "steps=1", "run_name=w", "tensorboard=false"]) == 2
    assert "overwrite=true" in capsys.readouterr().err
    assert main(["train", *small_overrides, "steps=1", "run_name=w", "tensorboard=false", "overwrite=true"]) == 0
    rows = (tmp_path / "runs" / "w" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in rows] == [0, 1]
    assert main(["train", *small_overrides, "run_name=w", "overwrite=true", "resume=true"]) == 2


def test_cut_replies_with_signal_are_no_signal_warning(small_overrides):
    """``rollout.max_new_tokens=1`` cuts every reply, yet single-digit answers still score, so about a quarter of
    the groups differ in reward: the run has a signal, and only the warm start's length warning speaks (naming
    the setting). Before #53 this also said "no learning signal" (the rule fired on truncation alone); a run
    that truly cannot learn (every group equal) is tests/integration/test_third_hour.py's."""
    lines: list[str] = []
    result = oprl.train(log=lines.append, **_as_kwargs([*small_overrides, "steps=5", "rollout.max_new_tokens=1"]))
    rows = [r for r in result.metrics() if "adv/zero_groups_frac" in r]
    assert all(r["response/truncated_frac"] == 1.0 for r in rows)
    assert sum(r["adv/zero_groups_frac"] for r in rows) / len(rows) < 0.9  # some groups carry a gradient
    assert not [line for line in lines if "no learning signal" in line], lines
    (length,) = [line for line in lines if line.startswith("warning: rollout.max_new_tokens=1 is shorter")]
    assert "raise rollout.max_new_tokens to >= " in length


def _as_kwargs(overrides: list[str]) -> dict:
    import yaml

    return {key: yaml.safe_load(value) for key, _, value in (o.partition("=") for o in overrides)}


def test_default_names_show_what_differs():
    from oprl.config import load_config
    from oprl.runtime.run import run_label

    assert run_label(load_config()) == "grpo-k1-m0-s0"
    settings = ["backend=ray", "rollout.engine=vllm", "sync.mode=async", "model.dtype=bfloat16", "seed=3"]
    assert run_label(load_config(None, settings)) == "grpo-k1-async1-vllm-ray-bf16-s3"  # async: the lag bound
    assert run_label(load_config(None, ["sync.mode=async", "sync.max_staleness=4"])) == "grpo-k1-async4-s0"
    assert run_label(load_config(None, ["algorithm.preset=opmd", "mode=explore"])) == "explore-opmd-k1-m0-s0"
    assert run_label(load_config(None, ["replay.groups_per_step=8", "trainer.sharding=fsdp"])) == (
        "grpo-k1-m0-replay8-fsdp-s0"
    )


def test_a_final_model_evaluates_as_its_run(small_overrides, tmp_path, capsys):
    """#42: ``final/`` carries its run's config and step, so ``oprl eval runs/X/final`` and ``oprl eval
    model.path=runs/X/final`` evaluate the run's task with its eval settings, and score exactly what ``oprl
    eval runs/X`` (its last checkpoint, the same weights) scores. Before: model.path took the default task and
    500 problems, and an evaluation of step 0's random numbers (0.402 against the checkpoint's 0.392)."""
    runs = tmp_path / "runs"
    assert main(["train", *small_overrides, "steps=2", "run_name=f"]) == 0
    final = runs / "f" / "final"
    assert json.loads((final / "oprl_final.json").read_text())["step"] == 2
    assert (final / "oprl_config.yaml").read_text() == (runs / "f" / "config.yaml").read_text()
    common = [f"output_dir={runs}", "progress=false"]
    assert main(["eval", str(runs / "f"), *common, "run_name=by-checkpoint"]) == 0
    assert main(["eval", str(final), *common, "run_name=by-final"]) == 0
    assert main(["eval", f"model.path={final}", *common, "run_name=by-path"]) == 0
    assert "evaluating its run's task arithmetic" in capsys.readouterr().out
    rows = {name: strict_json(runs / name / "metrics.jsonl") for name in ("by-checkpoint", "by-final", "by-path")}
    assert {r["eval/num_problems"] for r in rows.values()} == {32.0}  # the run's eval.num_problems, not 500
    assert {r["eval/checkpoint_step"] for r in rows.values()} == {2.0}
    for key in ("eval/accuracy", "eval/response_length"):  # the same samples, not only the same score
        assert len({r[key] for r in rows.values()}) == 1, rows


def test_a_run_that_stopped_before_step_1_does_not_block_its_name(small_overrides, tmp_path, capsys, monkeypatch):
    """#42: a run that died in its warm start left config.yaml; the rerun was refused ("resume=true to continue
    it") and resume=true then failed (no checkpoint)."""
    import oprl.runtime.run

    def dies_in_the_warm_start(*args, **kwargs):
        raise KeyboardInterrupt

    run_dir = tmp_path / "runs" / "b"
    with monkeypatch.context() as patched:
        patched.setattr(oprl.runtime.run, "model_path", dies_in_the_warm_start)
        assert main(["train", *small_overrides, "steps=1", "run_name=b"]) == 130
    assert "stopped before step 1: KeyboardInterrupt" in (run_dir / "INCOMPLETE").read_text()
    capsys.readouterr()
    assert main(["train", *small_overrides, "steps=1", "run_name=b", "resume=true"]) == 2
    err = capsys.readouterr().err
    assert "stopped before step 1 (no checkpoint, no trained step)" in err and "without resume=true" in err
    assert main(["train", *small_overrides, "steps=1", "run_name=b"]) == 0
    assert "holds a run that stopped before step 1 (nothing to continue); replacing it" in capsys.readouterr().out
    assert not (run_dir / "INCOMPLETE").exists() and (run_dir / "final").is_dir()
    assert main(["train", *small_overrides, "steps=1", "run_name=b"]) == 2  # a finished run still blocks it
    assert "already holds a run" in capsys.readouterr().err
