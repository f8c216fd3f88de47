"""End to end on the embedded model: the run directory, its contents, and bit-for-bit repeatability."""

import json

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from oprl.cli import main
from oprl.metrics import deterministic_view, read_metrics

REQUIRED_STEP_KEYS = [
    "reward/mean",
    "reward/std",
    "response/length_mean",
    "loss/total",
    "loss/pg_loss",
    "optim/grad_norm",
    "loss/clip_frac",
    "loss/clip_frac_low",
    "loss/clip_frac_high",
    "loss/ratio_mean",
    "loss/ratio_min",
    "loss/ratio_max",
    "lag/mean",
    "lag/max",
    "perf/generate_tokens_per_s",
    "perf/train_tokens_per_s",
    "perf/generate_s",
    "perf/train_s",
    "entropy/mean",
    "lag/min",
    "lag/scheduled",
    "perf/trainer_busy_s",
    "perf/trainer_idle_s",
    "perf/explorer_busy_s",
    "perf/explorer_idle_s",
    "perf/buffer_batches_ready",
]


def test_train_writes_a_complete_run_directory(small_overrides, tmp_path, capsys):
    assert main(["train", *small_overrides, "steps=4", "run_name=a", "tensorboard=true"]) == 0
    out = capsys.readouterr().out
    assert "eval accuracy before -> after" in out
    run_dir = tmp_path / "runs" / "a"
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert "eval/accuracy" in rows[0] and "eval/accuracy" in rows[2] and "eval/accuracy" in rows[4]
    assert "eval/accuracy" not in rows[1]
    for row in rows[1:]:
        missing = [k for k in REQUIRED_STEP_KEYS if k not in row]
        assert not missing, missing
        assert row["lag/max"] == 0  # on-policy by default
    assert (run_dir / "config.yaml").read_text().count("clip_mode: one-side") == 1  # preset resolved
    assert (run_dir / "metrics.png").stat().st_size > 1000
    assert len(list((run_dir / "experiences").glob("batch-*.parquet"))) == 4
    assert (run_dir / "checkpoints" / "step-000004" / "state.json").is_file()  # the final checkpoint
    assert any((run_dir / "tensorboard").iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_accuracy_after"] == rows[-1]["eval/accuracy"]
    model = AutoModelForCausalLM.from_pretrained(run_dir / "final")
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "final")
    assert model.config.vocab_size == len(tokenizer)


def test_same_seed_same_metrics(small_overrides, tmp_path):
    for name in ("x", "y"):
        assert main(["train", *small_overrides, "steps=3", "seed=5", f"run_name={name}", "tensorboard=false"]) == 0
    x = read_metrics(tmp_path / "runs" / "x" / "metrics.jsonl")
    y = read_metrics(tmp_path / "runs" / "y" / "metrics.jsonl")
    assert deterministic_view(x) == deterministic_view(y)
    assert set(x[1]) == set(y[1])
    assert main(["train", *small_overrides, "steps=3", "seed=6", "run_name=z", "tensorboard=false"]) == 0
    z = read_metrics(tmp_path / "runs" / "z" / "metrics.jsonl")
    assert deterministic_view(z) != deterministic_view(x)


def test_fixed_eval_seed_gives_common_random_numbers(small_overrides, tmp_path):
    """eval.seed=N: runs with different seeds evaluate the same initial weights on the same samples."""
    evals = {}
    for seed, eval_seed in ((1, "7"), (2, "7"), (2, "null")):
        name = f"s{seed}-{eval_seed}"
        assert (
            main(
                [
                    "train",
                    *small_overrides,
                    "steps=1",
                    f"seed={seed}",
                    f"eval.seed={eval_seed}",
                    "eval.temperature=3.0",
                    f"run_name={name}",
                    "tensorboard=false",
                ]
            )
            == 0
        )
        evals[name] = read_metrics(tmp_path / "runs" / name / "metrics.jsonl")[0]
    assert evals["s1-7"]["eval/response_length"] == evals["s2-7"]["eval/response_length"]
    assert evals["s1-7"]["eval/accuracy"] == evals["s2-7"]["eval/accuracy"]
    assert evals["s2-null"]["eval/response_length"] != evals["s2-7"]["eval/response_length"]


@pytest.mark.parametrize("interval, offset", [(1, 2), (3, 0)])
def test_stale_schedules_record_the_scheduled_versions(small_overrides, tmp_path, interval, offset):
    name = f"k{interval}m{offset}"
    args = [
        *small_overrides,
        "steps=6",
        f"sync.interval={interval}",
        f"sync.offset={offset}",
        "eval.interval=0",
        "tensorboard=false",
        "algorithm.preset=rec-oneside-nois",
        f"run_name={name}",
    ]
    assert main(["train", *args]) == 0
    rows = read_metrics(tmp_path / "runs" / name / "metrics.jsonl")[1:]
    from oprl.schedule import lag

    assert [r["lag/max"] for r in rows] == [float(lag(t, interval, offset)) for t in range(1, 7)]
    # Off-policy batches show ratios away from 1 once the trainer has moved.
    assert max(r["loss/ratio_max"] for r in rows if r["lag/max"] > 0) > 1.0


def test_existing_run_dir_is_refused(small_overrides, capsys):
    assert main(["train", *small_overrides, "steps=1", "run_name=dup", "tensorboard=false"]) == 0
    assert main(["train", *small_overrides, "steps=1", "run_name=dup", "tensorboard=false"]) == 2
    assert "already holds a run" in capsys.readouterr().err
