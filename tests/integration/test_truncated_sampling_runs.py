"""Training runs with rollout.top_p=0.9 rollout.top_k=20 (issue 44): on-policy, the logged ratio of every step is
1 (the trainer scores the truncated distribution the sampler drew from), on the lean and the vllm engine; the
same run with the trainer scoring the full softmax would log rho ~ the kept mass (measured in
tests/rollout/test_truncated_sampling.py)."""

import pytest

from oprl.cli import main
from oprl.metrics import read_metrics

TRUNCATED = ["rollout.top_p=0.9", "rollout.top_k=20", "eval.interval=0", "tensorboard=false"]


@pytest.mark.parametrize("engine", ["lean", "vllm"])
def test_on_policy_rho_is_one_in_a_truncated_run(small_overrides, tmp_path, engine):
    if engine == "vllm":
        pytest.importorskip("vllm")
    name = f"truncated-{engine}"
    args = [*small_overrides, *TRUNCATED, "steps=2", f"rollout.engine={engine}", f"run_name={name}"]
    assert main(["train", *args]) == 0
    rows = [r for r in read_metrics(tmp_path / "runs" / name / "metrics.jsonl") if "lag/max" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["lag/max"] == 0
        assert abs(row["rho/behavior_min"] - 1) < 1e-5 and abs(row["rho/behavior_max"] - 1) < 1e-5, row
        assert row["rho/behavior_outside_frac"] == 0


def test_stale_truncated_batches_train_with_finite_ratios(small_overrides, tmp_path):
    """sync.offset=2: batches sampled up to 2 versions back, under another policy's kept set; every token is
    scored (outside the current set: on it plus itself), so the ratios and the loss stay finite."""
    import math

    name = "truncated-stale"
    extra = ["steps=3", "sync.offset=2", "optim.lr=3e-3"]
    assert main(["train", *small_overrides, *TRUNCATED, *extra, f"run_name={name}"]) == 0
    rows = [r for r in read_metrics(tmp_path / "runs" / name / "metrics.jsonl") if "lag/max" in r]
    assert max(r["lag/max"] for r in rows) > 0
    for row in rows:
        values = [row[k] for k in ("rho/behavior_min", "rho/behavior_max", "loss/total", "optim/grad_norm")]
        assert all(math.isfinite(v) for v in values) and row["rho/behavior_min"] > 0, row
    assert any(abs(r["rho/behavior_max"] - 1) > 1e-3 for r in rows if r["lag/max"] > 0)  # stale: rho moved
