"""The run's ``Supervisor`` (oprl.runtime.healing) with stand-ins: which dead explorer it restarts, within the budget,
how, and the clock a restarted explorer carries. tests/runtime/test_driver.py runs it under the driver (deaths with
the rows equal to the undisturbed run's); tests/integration/test_self_healing.py kills real processes."""

from types import SimpleNamespace

from oprl.config import load_config
from oprl.messages import ExploreResult, Timing
from oprl.runtime.healing import Supervisor


class Died(Exception):
    pass


class EngineDeadError(RuntimeError):
    """vLLM's error for a dead engine process, matched by name (``backends.failure.engine_died``)."""


class Backend:
    """What the supervisor asks of a backend: a ``Died`` is a lost process; a restart is recorded."""

    name = "processes"

    def __init__(self):
        self.restarted: list[tuple[str, bool]] = []

    def lost(self, exc, actor):
        return isinstance(exc, Died)

    def replaceable(self, actor):
        return True

    def restart(self, actor, *, alive=False):
        self.restarted.append((actor.name, alive))
        return f"ready {actor.name}"

    def describe(self, exc):
        return f"{type(exc).__name__}: {exc}"


def supervisor(*overrides, explorers=2):
    lines: list[str] = []
    watched = Supervisor(load_config(None, list(overrides)), lines.append)
    handles = [SimpleNamespace(actor=SimpleNamespace(name=f"explorer {i}")) for i in range(explorers)]
    backend = Backend()
    watched.watch(backend, handles)
    return watched, backend, lines


def result(explorer: int, busy: float, idle: float) -> ExploreResult:
    return ExploreResult(explorer, 1, 0, Timing(0.0, 0.0, 0.0), 0.0, {}, busy_s=busy, idle_s=idle)


def test_a_dead_explorer_is_restarted_within_the_budget_and_its_clock_goes_on():
    watched, backend, lines = supervisor("runtime.max_restarts=1")
    assert watched.heals_explorer(0, Died("worker process exited (-9)"))
    assert not watched.heals_explorer(0, ValueError("reward function crashed"))  # raised: it would raise again
    ready, restart = watched.restart_explorer(0, "explorer 0", Died("exited (-9)"), [3, 4], clock=(2.0, 1.0))
    assert ready == "ready explorer 0" and backend.restarted == [("explorer 0", False)]
    assert (restart.worker, restart.cause, restart.batches) == ("explorer 0", "Died: exited (-9)", [3, 4])
    # The new process's clock starts at 0: its results carry the old process's seconds too; explorer 1's do not.
    carried = watched.explored(0, result(0, 0.5, 0.25))
    assert (carried.busy_s, carried.idle_s) == (2.5, 1.25)
    assert watched.explored(1, result(1, 0.5, 0.25)).busy_s == 0.5
    watched.explorer_ready(restart, SimpleNamespace(scheduled=True, scheduled_version=lambda b: b - 1))
    assert "generating batch 3 (version 2), batch 4 (version 3) again" in lines[0]
    assert watched.columns() == {"perf/restarts": 1.0} and watched.columns() == {}  # counted in one row
    assert not watched.heals_explorer(1, Died("again"))  # max_restarts=1 is spent
    assert watched.spent().startswith(" (runtime.max_restarts=1 restarts within")


def test_an_explorer_whose_engine_died_is_replaced_alive_and_named_by_its_engine():
    watched, backend, _ = supervisor()
    dead = EngineDeadError("EngineCore encountered an issue.")
    assert watched.engine_lost(0, dead) and watched.explorer_lost(0, dead) and watched.heals_explorer(0, dead)
    _, restart = watched.restart_explorer(0, "explorer 0", dead, [2], clock=(0.0, 0.0))
    assert backend.restarted == [("explorer 0", True)]
    assert (restart.worker, restart.kind) == ("vLLM engine of explorer 0", "vllm-engine")


def test_an_explorer_that_calls_a_judge_is_not_restarted_on_worker_processes():
    """A dead caller may leave the judge's reply in its pipe for the new process to read as its own."""
    watched, backend, _ = supervisor("judge.path=tiny")
    backend.name = "local"  # worker processes are the local backend's
    assert not watched.heals_explorer(0, Died("exited (-9)"))
    assert watched.explorer_lost(0, Died("exited (-9)"))  # lost all the same: the line says so
