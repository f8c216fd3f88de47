"""The no-signal warning: from the trainer's rows, once, naming the cause and the setting to change."""

from oprl.runtime.health import WINDOW, SignalHealth


def rows(zero: float, truncated: float, n: int = WINDOW + 3):
    return [{"adv/zero_groups_frac": zero, "response/truncated_frac": truncated, "reward/mean": 0.0}] * n


def observed(zero, truncated, *, warm_started=True, distills=False):
    lines: list[str] = []
    health = SignalHealth(8, lines.append, warm_started=warm_started, distills=distills)
    health.observe({"eval/accuracy": 0.4})  # an evaluation row carries no training signal figures
    for row in rows(zero, truncated):
        health.observe(row)
    return lines


def test_a_run_with_signal_says_nothing():
    # The default job's first steps (measured): 6-19 % of groups with equal rewards, nothing truncated.
    assert observed(0.15, 0.0) == []
    assert observed(0.89, 0.89) == []


def test_truncation_is_named_as_the_cause_of_equal_rewards():
    (line,) = observed(1.0, 1.0)
    assert "100% of groups had equal rewards" in line
    assert "100% of responses were cut at rollout.max_new_tokens=8" in line and "raise rollout.max_new_tokens" in line


def test_truncation_alone_is_no_warning():
    """#53: an own model's first 5 steps, 90 % of replies cut but 72 % of groups with signal, said "no learning
    signal ... raise rollout.max_new_tokens"; the run went 0.125 -> 0.450. Groups that differ are signal."""
    assert observed(0.28, 0.90) == []
    assert observed(0.0, 1.0) == []


def test_a_distillation_run_has_signal_whatever_the_rewards():
    """The teacher's per-token log-probs are the signal (algorithm.distill_coef > 0), rewards are only logged."""
    assert observed(1.0, 0.0, distills=True) == []
    assert len(observed(1.0, 0.0, distills=False)) == 1


def test_equal_rewards_name_format_length_and_warm_start():
    (line,) = observed(0.95, 0.1, warm_started=False)
    assert "95% of groups had equal rewards" in line and "answer format" in line
    assert "rollout.max_new_tokens=8" in line and "warmstart.pretrained=true" in line
    (line,) = observed(0.95, 0.1, warm_started=True)
    assert "warmstart" not in line
