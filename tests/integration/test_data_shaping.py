"""Data shaping and trainer precision through whole runs on the embedded model: DAPO's dynamic sampling with
the overlong soft penalty trains and repeats itself bit for bit; bfloat16 autocast trains, with rho != 1
on-policy (the trainer's log-probs are bfloat16-rounded, the sampler's float32)."""

from oprl.cli import main
from oprl.metrics import read_metrics

SKIP = ("perf/", "time/")


def _run(small_overrides, tmp_path, name, *extra):
    args = [*small_overrides, "steps=3", "eval.interval=0", "tensorboard=false", f"run_name={name}", *extra]
    assert main(["train", *args]) == 0
    return read_metrics(tmp_path / "runs" / name / "metrics.jsonl")


def test_dynamic_sampling_with_overlong_penalty_trains_and_is_deterministic(small_overrides, tmp_path):
    shaping = ["rollout.dynamic_sampling=true", "rollout.dynamic_max_extra_prompts=16", "rollout.overlong_buffer=4"]
    first = _run(small_overrides, tmp_path, "a", *shaping)
    steps = [row for row in first if "loss/total" in row]
    assert len(steps) == 3
    for row in steps:
        assert row["dynamic/extra_prompts"] >= 0 and "dynamic/degenerate_groups" in row
        assert row["response/tokens"] > 0 and row["optim/grad_norm"] > 0
        assert row["adv/abs_mean"] > 0  # groups with mixed rewards: non-zero advantages
    assert any(row["dynamic/extra_prompts"] > 0 for row in steps)  # the warm-started model solves some groups
    second = _run(small_overrides, tmp_path, "b", *shaping)
    for a, b in zip(first, second, strict=True):
        assert {k: v for k, v in a.items() if not k.startswith(SKIP)} == {
            k: v for k, v in b.items() if not k.startswith(SKIP)
        }


def test_bfloat16_autocast_trains_off_policy_by_rounding_only(small_overrides, tmp_path):
    exact = [r for r in _run(small_overrides, tmp_path, "fp32") if "loss/total" in r]
    mixed = [r for r in _run(small_overrides, tmp_path, "bf16", "trainer.autocast=bfloat16") if "loss/total" in r]
    for fp32, bf16 in zip(exact, mixed, strict=True):
        assert bf16["lag/max"] == 0 and bf16["optim/grad_norm"] > 0
        assert bf16["kl/behavior_k3"] > 100 * fp32["kl/behavior_k3"]
