"""Training runs with rollout.top_p=0.9 rollout.top_k=20 (issue 44): on-policy, the logged ratio of every step is
1 (the trainer scores the truncated distribution the sampler drew from), on the lean and the vllm engine; the
same run with the trainer scoring the full softmax would log rho ~ the kept mass (measured in
tests/rollout/test_truncated_sampling.py)."""

import pytest

from oprl.cli import main
from oprl.metrics import read_metrics

TRUNCATED = ["rollout.top_p=0.9", "rollout.top_k=20", "steps=2", "eval.interval=0", "tensorboard=false"]


@pytest.mark.parametrize("engine", ["lean", "vllm"])
def test_on_policy_rho_is_one_in_a_truncated_run(small_overrides, tmp_path, engine):
    if engine == "vllm":
        pytest.importorskip("vllm")
    name = f"truncated-{engine}"
    assert main(["train", *small_overrides, *TRUNCATED, f"rollout.engine={engine}", f"run_name={name}"]) == 0
    rows = [r for r in read_metrics(tmp_path / "runs" / name / "metrics.jsonl") if "lag/max" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["lag/max"] == 0
        assert abs(row["rho/behavior_min"] - 1) < 1e-5 and abs(row["rho/behavior_max"] - 1) < 1e-5, row
        assert row["rho/behavior_outside_frac"] == 0
