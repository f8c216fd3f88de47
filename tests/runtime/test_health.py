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


# rho/ess of the arena's runs (tiny model, seed 0, steps 1-24): REINFORCE offline collapses (eval 0.44 -> 0.26 by
# step 40); GRPO at lag 16 holds (0.44 -> 0.48), its worst 5 steps included (steps 100-104).
REINFORCE_OFFLINE = [1.0, 0.99, 0.99, 0.99, 0.98, 0.95, 0.87, 0.75, 0.92, 0.89, 0.83, 0.82, 0.85, 0.71, 0.83, 0.68,
                     0.3, 0.82, 0.79, 0.68, 0.71, 0.68, 0.57, 0.65]  # fmt: skip
GRPO_LAG16 = [1.0, 0.99, 0.99, 0.99, 0.98, 0.97, 0.93, 0.95, 0.85, 0.7, 0.92, 0.86, 0.83, 0.96, 0.95, 0.98]


def ess_lines(values):
    from oprl.runtime.health import EssWatch

    lines: list[str] = []
    watch = EssWatch(lines.append)
    for step, value in enumerate(values, start=1):
        watch.observe({"step": step, "rho/ess": value, "lag/max": 16.0})
        watch.observe({"step": step, "eval/accuracy": 0.4})  # rows without the metric change nothing
    return lines, watch.first_step


def test_a_falling_effective_sample_size_warns_once_before_the_collapse():
    """#55: the 5-step mean of rho/ess below 0.7 warns (once) on a run that collapses, never on one that holds."""
    lines, step = ess_lines(REINFORCE_OFFLINE)
    assert step == 17 and len(lines) == 1  # (0.85 + 0.71 + 0.83 + 0.68 + 0.3) / 5 = 0.67
    assert "rho/ess averaged 0.67 over the last 5 steps (step 17" in lines[0]
    assert ess_lines(GRPO_LAG16) == ([], None)
    assert ess_lines([0.1] * 4) == ([], None)  # fewer than 5 steps: no judgement yet


def test_the_signal_warning_carries_the_ess_watch():
    lines: list[str] = []
    health = SignalHealth(8, lines.append, warm_started=True)
    for step in range(1, 8):
        health.observe({"step": step, "rho/ess": 0.2})
    assert health.ess.first_step == 5 and len(lines) == 1


def test_the_ess_warning_names_the_step_of_a_live_row():
    """#71: live rows carry no ``step`` (the logger writes it), so the line said "(step 0, ..." when it fired at
    step 6-7; ``RowLog`` hands the step with the row."""
    from oprl.runtime.rows import RowLog

    class Quiet:
        def log(self, step, row):
            pass

        def update(self, *args, **kwargs):
            pass

    lines: list[str] = []
    health = SignalHealth(8, lines.append, warm_started=True, ess_advice="a lower optim.lr=0.001")
    log = RowLog(list(range(1, 9)), Quiet(), Quiet(), health)
    for step in range(1, 9):
        log.add(step, {"rho/ess": 0.2 if step > 1 else 1.0})
        log.flush()
    (line,) = lines
    assert "(step 5, below 0.7)" in line and line.endswith("; a lower optim.lr=0.001 keeps it up")


def advice(*settings):
    from oprl.config import load_config
    from oprl.runtime.health import ess_advice

    return ess_advice(load_config(None, list(settings)))


def test_the_ess_advice_fits_the_runs_mode_and_method():
    """#71: an offline REC-OneSide-NoIS run was told to use rec-oneside-nois and a smaller sync.offset; the advice
    names only settings the run can change, with their present values."""
    offline = advice("mode=offline", "buffer.path=runs/x", "algorithm.preset=rec-oneside-nois")
    assert "preset=" not in offline and "sync." not in offline
    assert offline == (
        "a narrower clip band (algorithm.eps_low=0.2, algorithm.eps_high=0.2), fewer steps on this fixed data "
        "(mode=offline: every step moves away from its sampler) or a lower optim.lr=0.0003"
    )
    stale = advice("algorithm.preset=reinforce", "sync.offset=4")
    assert stale.startswith("a clipped loss (algorithm.preset=rec-oneside-nois or grpo; this run: reinforce), ")
    assert "a smaller sync.offset=4 or a lower optim.lr" in stale and "interval" not in stale
    assert "a smaller sync.offset=1 or sync.interval=4 " in advice("sync.offset=1", "sync.interval=4")
    assert "a smaller sync.max_staleness=8 " in advice("sync.mode=async", "sync.max_staleness=8")
    assert "sync." not in advice() and "on-policy" in advice()
    assert "a narrower mask (algorithm.mask_low=0.5" in advice("algorithm.clip_mode=mask")
