"""The synchronizer owns the schedule after the config (issue #54): lag, switch targets and each batch's
``SwitchPlan`` come from it, read from ``config.sync`` once, and agree with ``oprl.schedule``'s rule."""

import pickle

import pytest

from oprl.config.loading import load_config
from oprl.messages import SwitchPlan
from oprl.runtime.synchronizer import Synchronizer
from oprl.schedule import lag, switch_version


def synchronizer(*overrides, explorers=1):
    return Synchronizer.of(load_config(None, list(overrides)), explorers)


@pytest.mark.parametrize("k, m", [(1, 0), (1, 4), (3, 2), (4, 0)])
def test_lag_and_switch_target_follow_the_schedule(k, m):
    sync = synchronizer(f"sync.interval={k}", f"sync.offset={m}", "sync.partial=true")
    assert (sync.interval, sync.offset) == (k, m)
    for batch in range(1, 30):
        assert sync.lag(batch) == lag(batch, k, m)
        assert sync.switch_target(batch) == switch_version(batch, k, m)
    plain = synchronizer(f"sync.interval={k}", f"sync.offset={m}")
    assert all(plain.switch_target(b) is None for b in range(1, 30))  # no partial rollouts: no switch


def test_the_plan_sent_with_a_batch(tmp_path):
    sync = synchronizer("sync.offset=2", "sync.partial=true", "sync.switch_step=3", "sync.partial_kv=recompute")
    assert sync.switch_plan(5) is None  # before the board is open: nothing to read weights from
    sync.open_board(tmp_path / "board", 0, resolve=lambda snapshot: snapshot)
    try:
        plan = sync.switch_plan(5)  # v(5) = 2, the next sync version 3 <= 4: it takes over at step 3
        assert plan == SwitchPlan(str(tmp_path / "board"), target=3, at_step=3, kv="recompute")
        assert sync.switch_plan(1).target is None  # v(1) = 0 and version 1 comes only after step 1
        assert pickle.loads(pickle.dumps(plan)) == plan  # it travels to worker processes and Ray actors
    finally:
        sync.close()
    free = synchronizer("sync.mode=async", "sync.max_staleness=2", "sync.partial=true")
    free.open_board(tmp_path / "free", 0, resolve=lambda snapshot: snapshot)
    try:
        assert free.switch_plan(7) == SwitchPlan(str(tmp_path / "free"), free=True, newest=6, kv="keep")
    finally:
        free.close()
    explore = synchronizer("mode=explore", "sync.partial=true", "sync.offset=2")
    assert explore.mode == "fixed" and explore.switch_plan(5) is None


@pytest.mark.parametrize(
    "overrides, mode, scheduled, free_running, decided_ahead",
    [
        ((), "scheduled", True, False, True),
        (("sync.mode=async",), "async", False, True, False),
        (("mode=explore",), "fixed", False, False, True),  # explore samples every batch with version 0
        (("mode=explore", "sync.mode=async"), "fixed", False, False, True),  # ... whatever the sync section says
        (("mode=offline", "buffer.path=/nonexistent"), "scheduled", True, False, True),
    ],
)
def test_callers_ask_the_synchronizer_which_mode_the_run_is_in(overrides, mode, scheduled, free_running, decided_ahead):
    """The driver, checkpoints, resume and the warnings read these, never ``config.sync.mode`` (issue #69)."""
    sync = synchronizer(*overrides)
    assert (sync.mode, sync.scheduled, sync.free_running, sync.decided_ahead) == (
        mode,
        scheduled,
        free_running,
        decided_ahead,
    )


def test_a_trained_step_is_checked_against_the_schedule():
    sync = synchronizer("sync.offset=2")
    assert sync.check_trained(5, started=2) == {"lag/scheduled": 2.0}  # v(5) = 2: lag 5 - 1 - 2
    with pytest.raises(RuntimeError, match=r"step 5 trained on version 3, not 2"):
        sync.check_trained(5, started=3)
    assert synchronizer("sync.mode=async").check_trained(5, started=3) == {}  # free-running: nothing to check


def test_the_board_is_closed_only_where_the_synchronizer_opened_one(tmp_path):
    from oprl.checkpoint.board import is_closed

    sync = synchronizer("sync.offset=1", "sync.partial=true")
    sync.close_board()  # no board opened (the run stopped before its workers started): nothing to do
    sync.open_board(tmp_path / "board", 0, resolve=lambda snapshot: snapshot)
    try:
        sync.posts[0].future.result()  # the board is opened on the writer's thread
        assert not is_closed(tmp_path / "board")
        sync.close_board()  # explorers waiting for a version that will never come give up
        assert is_closed(tmp_path / "board")
    finally:
        sync.close()
