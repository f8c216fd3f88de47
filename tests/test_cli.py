"""Bad input gives one line on stderr and a non-zero exit, no traceback (unless --debug)."""

import subprocess
import sys
from pathlib import Path

import pytest

from oprl.cli import main

CASES = {
    "missing file": (["train", "/nonexistent/run.yaml"], "not found"),
    "unknown preset": (
        ["train", "algorithm.preset=grpoo"],
        "algorithm.preset: unknown preset 'grpoo' (did you mean 'grpo'?)",
    ),
    "out of range": (["train", "algorithm.eps_low=-1"], "algorithm.eps_low: eps_low must be >= 0"),
    "renamed mode": (["train", "mode=train"], "mode: 'train' was renamed 'offline'"),
    "renamed setting": (["train", "algorithm.temperature=2"], "'temperature' was renamed 'weight_temperature'"),
    "renamed value": (["train", "algorithm.regularizer=k2"], "'k2' was renamed 'squared-log-ratio'"),
    "truncation cap": (
        ["train", "algorithm.preset=tis-token", "algorithm.is_cap=0"],
        "algorithm.is_cap: is_cap must be > 0",
    ),
    "mask band": (
        ["train", "algorithm.mask_low=2", "algorithm.mask_high=1"],
        "algorithm.mask_low: mask_low must be < mask_high",
    ),
    "top_p training, plug-in engine": (  # recipes.OwnLoop declares no capabilities (exact_truncation)
        ["train", "rollout.top_p=0.9", f"rollout.engine={Path(__file__).parent / 'recipes.py'}:OwnLoop"],
        f"rollout.top_p=0.9: rollout.engine={Path(__file__).parent / 'recipes.py'}:OwnLoop samples by its own",
    ),
    "unknown key": (["train", "rollout.gruop_size=4"], "did you mean group_size"),
    "unknown section": (["train", "optimizer.lr=1"], "unknown key 'optimizer'"),
    "wrong type": (["train", "steps=many"], "steps"),
    "bad literal": (["train", "algorithm.clip_mode=sideways"], "algorithm.clip_mode"),
    "empty dataset": (["train", "task.train_size=0"], "task.train_size"),
    "not key=value": (["train", "steps=3", "oops"], "expected key=value"),
    "unknown command": (["trian"], "unknown command"),
    "infinite lr": (["train", "optim.lr=inf"], "optim.lr: Input should be a finite number"),
    "nan clip": (["train", "algorithm.eps_high=.nan"], "algorithm.eps_high: Input should be a finite number"),
    "bool steps": (["train", "steps=true"], "steps: Value error, true/false is not a number"),
    "long run_name": (["train", "run_name=" + "r" * 300], "run_name: 'rrrr"),
}


@pytest.mark.parametrize("name", CASES)
def test_bad_input_is_one_line(name, capsys):
    argv, expected = CASES[name]
    assert main(argv) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert expected in err
    assert "Traceback" not in err


def test_subprocess_exit_code_and_debug_traceback():
    command = [sys.executable, "-m", "oprl.cli", "train", "algorithm.preset=nope"]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    debug = subprocess.run([*command, "--debug"], capture_output=True, text=True)
    assert debug.returncode != 0 and "Traceback" in debug.stderr


def test_config_command_prints_resolved_preset(capsys):
    assert main(["config", "algorithm.preset=rec-oneside-nois", "algorithm.eps_high=2.0"]) == 0
    out = capsys.readouterr().out
    assert "clip_mode: one-side" in out and "weight: none" in out and "eps_high: 2.0" in out
    assert main(["config", "--help"]) == 0
    assert "sync.interval" in capsys.readouterr().out


HEAVY = ("torch", "transformers", "vllm", "ray", "trl", "tensorboard", "matplotlib", "pyarrow", "pandas", "wandb")
COMMANDS = ("train", "explore", "eval", "config", "bandit", "sweep", "plot", "report")


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_everywhere_is_instant(flag):
    """``oprl --help`` and every subcommand's help exit 0 and import none of the heavy libraries (the speed
    itself is measured by benchmarks/startup.py, not asserted here)."""
    probe = (
        "import json, sys, contextlib, io\n"
        "from oprl.cli import main\n"
        "out = {}\n"
        f"for argv in [[{flag!r}], *[[c, {flag!r}] for c in {COMMANDS!r}]]:\n"
        "    text = io.StringIO()\n"
        "    with contextlib.redirect_stdout(text):\n"
        "        code = main(argv)\n"
        f"    out[' '.join(argv)] = [code, text.getvalue(), sorted(m for m in {HEAVY!r} if m in sys.modules)]\n"
        "print(json.dumps(out))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    import json

    for argv, (code, text, heavy) in json.loads(result.stdout).items():
        assert code == 0, argv
        assert heavy == [], (argv, heavy)
        assert "usage" in text.lower() or "= " in text, (argv, text[:200])
        if argv.split()[0] in ("train", "explore", "eval"):
            assert "oprl config --help" in text and "key=value" in text
    assert "oprl train" in json.loads(result.stdout)[flag][1]


def test_eval_of_a_missing_checkpoint_says_checkpoint(tmp_path, capsys):
    assert main(["eval", str(tmp_path / "runs" / "r" / "checkpoints" / "step-000050")]) == 2
    err = capsys.readouterr().err
    assert "checkpoint" in err and "config file" not in err and "checkpoint.keep" in err


def test_help_into_a_closed_pipe_exits_0_quietly():
    """#42: ``oprl config --help | head`` ended in BrokenPipeError and exit 1 (the reader closes its end before
    the 40 KB of help are written)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "oprl.cli", "config", "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    process.stdout.close()  # before the interpreter has even started: every write hits a closed pipe
    assert process.wait(timeout=60) == 0
    assert process.stderr.read() == b""


def test_sweep_dry_run_writes_nothing(tmp_path, capsys):
    """#42: ``oprl sweep --dry-run`` wrote the output directory and its sweep.yaml."""
    import yaml

    from oprl.experiments import sweep_spec

    spec = sweep_spec.load_spec(Path("configs/sweeps/smoke.yaml")) | {"output_dir": str(tmp_path / "out")}
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    assert main(["sweep", str(path), "--dry-run"]) == 0
    assert "oprl train" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smoke.yaml"]


def test_python_dash_m_oprl_is_the_oprl_command():
    """#53: `python -m oprl` (the convention) was 'No module named oprl.__main__'."""
    result = subprocess.run([sys.executable, "-m", "oprl", "train", "steps", "10"], capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.startswith("error: argument 'steps'"), result.stderr
    usage = subprocess.run([sys.executable, "-m", "oprl", "--help"], capture_output=True, text=True)
    assert usage.returncode == 0 and "oprl train" in usage.stdout


def test_a_setting_without_its_equals_sign_is_blamed_not_its_value(capsys):
    """#53: `oprl train steps 10` said "argument '10': expected key=value"."""
    assert main(["train", "steps", "10"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: argument 'steps': a setting takes key=value: steps=10") and "'10'" not in err
    assert main(["train", "rollout.group_size", "4"]) == 2
    assert "argument 'rollout.group_size': a setting takes key=value: rollout.group_size=4" in capsys.readouterr().err


def test_teacher_score_of_a_missing_run_directory_names_the_nearest(tmp_path, monkeypatch, capsys):
    """#53: `oprl teacher-score runs/nope` said "config file runs/nope: not found"."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "tiny-explore").mkdir(parents=True)
    assert main(["teacher-score", "runs/tiny-explor", "teacher.path=tiny"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: teacher-score: 'runs/tiny-explor' not found") and "config file" not in err
    assert "nearest: runs/tiny-explore" in err and "give a run directory" in err


@pytest.mark.parametrize("backend", ["threads", "processes", "ray"])
def test_a_mistake_a_worker_finds_exits_2_without_its_class_name(backend, monkeypatch, capsys):
    """#53: a reward failing on every row of a batch stopped the run with 'OprlError: task.reward: ...', exit 1.
    The mistake reaches the CLI chained to a WorkerFailure: as itself (threads), as a worker process's
    RemoteError, or inside a Ray task error's ``cause``."""
    import oprl.cli
    from oprl.backends.failure import WorkerFailure
    from oprl.backends.processes import RemoteError
    from oprl.errors import OprlError

    mistake = OprlError("task.reward: r.py:f failed on all 8 rows of a batch")
    ray_error = RuntimeError("RayTaskError(OprlError)")
    ray_error.cause = mistake  # type: ignore[attr-defined]  (what ray.exceptions.RayTaskError carries)
    cause = {"threads": mistake, "processes": RemoteError("OprlError", str(mistake)), "ray": ray_error}[backend]

    def fail(args):
        raise WorkerFailure(f"explorer 0 failed while generating batch 1: OprlError: {mistake}") from cause

    monkeypatch.setattr(oprl.cli, "_train", fail)
    assert main(["train"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: explorer 0 failed while generating batch 1: task.reward: r.py:f"), err
    assert "OprlError" not in err

    def crash(args):
        raise WorkerFailure("trainer failed at step 3: RuntimeError: CUDA error") from RuntimeError("CUDA error")

    monkeypatch.setattr(oprl.cli, "_train", crash)
    assert main(["train"]) == 1  # a crash stays exit 1
