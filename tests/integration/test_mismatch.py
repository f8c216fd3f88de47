"""rollout.dtype: a bf16 sampler against an fp32 trainer makes ρ ≠ 1 on-policy (no staleness), and the ρ
distribution is logged every step."""

import pytest
import torch

from oprl.algorithms import ratio_stats
from oprl.cli import main
from oprl.config import load_config
from oprl.errors import OprlError
from oprl.metrics import read_metrics


def test_ratio_stats_on_a_hand_made_batch():
    behavior = torch.zeros(2, 3)
    logprobs = torch.tensor([[0.0, 0.5, -0.5], [0.1, 9.0, 9.0]]).log1p()  # ρ = 1, 1.5, 0.5 | 1.1, pad, pad
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    stats = ratio_stats(logprobs, behavior, mask)
    assert stats["mean"].item() == pytest.approx((1 + 1.5 + 0.5 + 1.1) / 4)
    assert stats["min"].item() == pytest.approx(0.5) and stats["max"].item() == pytest.approx(1.5)
    assert stats["outside_frac"].item() == pytest.approx(2 / 4)  # 1.5 and 0.5 leave [0.8, 1.25]
    empty = ratio_stats(logprobs, behavior, torch.zeros(2, 3))
    assert [empty[k].item() for k in ("mean", "min", "max", "outside_frac")] == [1, 1, 1, 0]


def test_rollout_dtype_is_checked():
    assert load_config(overrides=["rollout.dtype=bfloat16"]).rollout.dtype == "bfloat16"
    assert load_config().rollout.dtype is None  # = model.dtype
    with pytest.raises(OprlError, match=r"rollout\.dtype"):
        load_config(overrides=["rollout.dtype=float16"])


def _spread(row):
    return row["rho/behavior_max"] - row["rho/behavior_min"]


def test_bf16_sampler_is_off_policy_without_staleness(small_overrides, tmp_path):
    rows = {}
    for dtype in ("float32", "bfloat16"):
        args = [*small_overrides, "steps=2", "eval.interval=0", f"rollout.dtype={dtype}", f"run_name={dtype}"]
        assert main(["train", *args, "tensorboard=false"]) == 0
        rows[dtype] = read_metrics(tmp_path / "runs" / dtype / "metrics.jsonl")[1:]
    for fp32, bf16 in zip(rows["float32"], rows["bfloat16"], strict=True):
        assert fp32["lag/max"] == bf16["lag/max"] == 0  # on-policy both times
        for key in ("rho/behavior_mean", "rho/behavior_min", "rho/behavior_max", "rho/behavior_outside_frac"):
            assert key in fp32 and key in bf16
        assert fp32["rho/ess"] == pytest.approx(1.0, abs=1e-6) and bf16["rho/ess"] < fp32["rho/ess"]  # #55
        assert 0 < bf16["rho/ess_seq"] < 1 and fp32["rho/ess_seq"] == pytest.approx(1.0, abs=1e-4)
        assert _spread(fp32) < 1e-4  # the fp32 sampler matches the trainer up to float error
        assert _spread(bf16) > 100 * _spread(fp32)  # the bf16 sampler's ρ is the mismatch alone
        assert bf16["kl/behavior_k3"] > 100 * fp32["kl/behavior_k3"]
