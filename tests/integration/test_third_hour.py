"""What a new user met in the third hour (#53), on runs: the no-signal warning is right on a run that learns
(silent, though nearly every reply is cut) and on one that cannot (one line); ``oprl eval runs/<run>`` names the
checkpoint it evaluated; a reward that fails only during the run exits 2 without a class name; the judge example
runs offline on what ``make setup`` installs.

The runs use a small model of one's own (the embedded architecture, saved, not warm-started: ~1 s a run) on a
JSONL task whose reward is the share of digits in the reply, so rewards differ inside every group."""

import json
from pathlib import Path

import pytest

import oprl
from oprl.cli import main
from oprl.config import load_config
from oprl.metrics import read_metrics

EXAMPLES = Path(__file__).resolve().parents[2] / "configs" / "examples"
REWARDS = """
def digits(prompt, completion, reference, **row):
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)


def constant(prompt, completion, reference, **row):
    return 0.0


def picky(prompt, completion, reference, **row):
    if completion.strip() != reference:
        raise ValueError("not the reference")
    return 1.0
"""


@pytest.fixture(scope="module")
def own_model(tmp_path_factory):
    from oprl.models.tiny import build_model, build_tokenizer

    path = tmp_path_factory.mktemp("own-model")
    tokenizer = build_tokenizer()
    build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def digits_task(own_model, tmp_path, monkeypatch):
    """Settings of a 10-step run on the digits task (replies of at most 4 tokens: nearly all cut)."""
    monkeypatch.chdir(tmp_path)
    rows = [{"prompt": f"Write digits for {i}", "reference": str(i)} for i in range(64)]
    (tmp_path / "digits.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "rewards.py").write_text(REWARDS)
    return [
        f"model.path={own_model}",
        "task.name=dataset",
        "task.train_file=digits.jsonl",
        "rollout.max_new_tokens=4",
        "rollout.prompts_per_step=4",
        "rollout.group_size=4",
        "eval.interval=0",
        "eval.num_problems=8",
        "steps=10",
        "optim.lr=1e-2",
        "progress=false",
        "tensorboard=false",
        f"output_dir={tmp_path / 'runs'}",
    ]


def _train(settings: list[str]) -> tuple[list[str], list[dict]]:
    lines: list[str] = []
    values = {key: value for key, _, value in (s.partition("=") for s in settings)}
    result = oprl.train(log=lines.append, **values)
    return lines, read_metrics(result.metrics_path)


def test_the_signal_warning_is_silent_on_a_run_that_learns_and_speaks_on_one_that_cannot(digits_task):
    """Before (4db1016): the learning run below warned "no learning signal ... 95% of responses were cut at
    rollout.max_new_tokens=4; raise rollout.max_new_tokens" (the rule fired on truncation alone)."""
    lines, rows = _train([*digits_task, "task.reward=rewards.py:digits", "run_name=learns"])
    trained = [r for r in rows if "adv/zero_groups_frac" in r][:5]
    assert sum(r["response/truncated_frac"] for r in trained) / 5 >= 0.9  # nearly every reply cut...
    assert sum(r["adv/zero_groups_frac"] for r in trained) / 5 < 0.5  # ...yet most groups carry a gradient
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    assert evals[-1] > evals[0] + 0.1, evals  # and it learns (measured: 0.104 -> 0.406)
    assert not [line for line in lines if "no learning signal" in line], lines

    lines, _ = _train([*digits_task, "task.reward=rewards.py:constant", "run_name=cannot", "steps=5"])
    (warning,) = [line for line in lines if "no learning signal" in line]
    assert "in the first 5 steps: 100% of groups had equal rewards" in warning


def test_eval_of_a_run_names_the_checkpoint_it_evaluated(digits_task, capsys):
    """Before: the headline said 'eval of task dataset, <base model>' and the directory was named after the base
    model (eval-grpo-k1-m0-<model>-dataset-s0-...), although the run's checkpoint was what scored."""
    assert main(["train", *digits_task, "task.reward=rewards.py:digits", "run_name=r", "steps=2"]) == 0
    capsys.readouterr()
    assert main(["eval", "runs/r", "eval.num_problems=8"]) == 0
    out = capsys.readouterr().out
    assert "oprl: eval of checkpoint runs/r/checkpoints/step-000002 (task dataset)" in out
    assert "eval accuracy of checkpoint step 2 (runs/r) " in out
    (made,) = [p.name for p in Path("runs").iterdir() if p.name.startswith("eval-")]
    assert made.startswith("eval-r-step-000002-"), made


def test_a_reward_failing_during_the_run_exits_2_without_a_class_name(digits_task, capsys):
    """It passes the pre-run probe (the reference as the reply scores 1) and fails on every sampled reply.
    Before: 'error: trainer failed while evaluating step 0: OprlError: task.reward: ...', exit 1."""
    assert main(["train", *digits_task, "task.reward=rewards.py:picky", "run_name=picky"]) == 2
    err = capsys.readouterr().err
    assert "task.reward: rewards.py:picky failed on all" in err and "OprlError" not in err


def test_the_judge_example_runs_offline(small_overrides, monkeypatch):
    """configs/examples/tiny-judge.yaml: the embedded model judges, no network, nothing beyond `make setup`.
    Before: the only judge example needed the SmolLM2 wheel, and `judge.yes_text=yes` was the boolean True."""
    import socket

    def refuse(self, address, *args, **kwargs):
        raise AssertionError(f"the judge example reached for the network: {address}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    example = EXAMPLES / "tiny-judge.yaml"
    config = load_config(example, ["judge.yes_text=yes"])
    assert (config.judge.path, config.judge.yes_text, config.judge.no_text) == ("tiny", "yes", "no")
    settings = [*small_overrides, "steps=2", "eval.interval=0", "run_name=judged", "tensorboard=false"]
    assert main(["train", str(example), *settings]) == 0
    root = Path(next(s for s in small_overrides if s.startswith("output_dir=")).removeprefix("output_dir="))
    rows = [r for r in read_metrics(root / "judged" / "metrics.jsonl") if "reward/mean" in r]
    assert len(rows) == 2 and all(r["reward/judge"] != 0 and r["reward/judge_unparsed"] == 0 for r in rows)
