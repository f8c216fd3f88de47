"""Worker processes that die and come back: ``ProcessActor.restart`` and the ``OPRL_FAULT`` switch
(``oprl.backends.faults``), on a stand-in worker (a ``dict`` in its own process: ``get(step)`` is a call whose
first argument is the step)."""

import os
import signal
import time
from types import SimpleNamespace

import pytest

from oprl.backends.failure import engine_died
from oprl.backends.faults import ENGINE, SWITCH, VARIABLE, FaultPlan
from oprl.backends.local import LocalBackend
from oprl.backends.make import make_backend
from oprl.backends.processes import RemoteError
from oprl.config import load_config
from oprl.errors import OprlError


def started(backend, name="explorer 0"):
    actor = backend.start(name, dict, [(4, "four")], threads=1)
    backend.wait_ready(actor)
    return actor


def test_a_killed_worker_fails_its_calls_as_lost_and_a_restart_serves_again():
    backend = LocalBackend("processes")
    actor = started(backend)
    try:
        with pytest.raises(RemoteError) as raised:
            actor.call("pop", 99).result(timeout=60)  # KeyError: the same call would raise again after a restart
        assert raised.value.kind == "KeyError" and not backend.lost(raised.value, actor)
        first = actor.pid
        os.kill(first, signal.SIGKILL)
        with pytest.raises(RemoteError) as failed:
            actor.call("get", 4).result(timeout=60)
        assert backend.lost(failed.value, actor) and "worker process exited (-9)" in str(failed.value)
        assert not backend.lost(failed.value, SimpleNamespace(name="explorer 1"))  # another worker's death
        assert backend.restart(actor).result(timeout=60) is True
        assert actor.pid != first and actor.call("get", 4).result(timeout=60) == "four"
    finally:
        backend.shutdown([actor])
    with pytest.raises(RuntimeError, match="stopped, not restarted"):
        actor.restart()


def test_oprl_fault_kills_the_named_worker_at_its_step_once(monkeypatch):
    monkeypatch.setenv(VARIABLE, "explorer:1@step=4, explorer:1@step=5+0.2")
    backend = LocalBackend("processes", FaultPlan.from_environment())
    bystander, target = started(backend, "explorer 0"), started(backend, "explorer 1")
    try:
        assert bystander.call("get", 4).result(timeout=60) == "four"  # another worker: not killed
        with pytest.raises(RemoteError, match=r"ProcessDied: worker process exited \(-9\)"):
            target.call("get", 4).result(timeout=60)
        backend.restart(target).result(timeout=60)
        assert target.call("get", 4).result(timeout=60) == "four"  # fired once: the batch is made again
        # +0.2: the call returns first, the process dies 0.2 s later; the calls after that fail as lost
        assert target.call("get", 5).result(timeout=60) is None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                target.call("get", 6).result(timeout=60)
            except RemoteError as exc:
                assert backend.lost(exc, target), exc  # never a BrokenPipeError of a call sent as it died
                break
            time.sleep(0.02)
        else:
            pytest.fail("explorer 1 outlived its fault")
    finally:
        backend.shutdown([bystander, target])


@pytest.mark.parametrize(
    "text, faults",
    [
        ("", []),
        ("explorer:0@step=5", [("explorer 0", 5, 0.0, "step")]),
        ("trainer@step=3+0.5,teacher@step=1", [("trainer", 3, 0.5, "step"), ("teacher", 1, 0.0, "step")]),
        ("explorer@switch=4,trainer@save=6", [("explorer", 4, 0.0, "switch"), ("trainer", 6, 0.0, "save")]),
    ],
)
def test_the_fault_switch_parses_worker_point_step_and_delay(monkeypatch, text, faults):
    monkeypatch.setenv(VARIABLE, text)
    plan = FaultPlan.from_environment()
    assert [(f.worker, f.step, f.after, f.point) for f in plan.faults] == faults


def test_switch_and_save_faults_fire_on_their_call_once(monkeypatch):
    monkeypatch.setenv(VARIABLE, "explorer@switch=4,trainer@save=6")
    plan = FaultPlan.from_environment()
    assert plan.due("explorer 1", (3, 2)) is None and plan.due("explorer 1", (4, 2)) == SWITCH
    assert plan.due("explorer 0", (4, 2)) is None  # fired once
    assert plan.due("trainer", ("/run/checkpoints/.tmp-step-000004/trainer",)) is None
    assert plan.due("trainer", (6, [])) is None  # train(6) is not the save of step 6
    assert plan.due("trainer", ("/run/checkpoints/.tmp-step-000006/trainer",)) == 0.0


@pytest.mark.parametrize(
    "text", ["explorer 0@step=5", "explorer:0@batch=5", "explorer:0@step=five", "explorer@switch=4+0.5"]
)
def test_a_malformed_fault_is_one_line_naming_the_form(monkeypatch, text):
    monkeypatch.setenv(VARIABLE, text)
    with pytest.raises(
        OprlError, match=r"is not WORKER@step=N\[\+SECONDS\], WORKER@switch=N, WORKER@save=N or WORKER@call=N"
    ):
        FaultPlan.from_environment()


def test_a_fault_on_threads_is_refused(monkeypatch):
    monkeypatch.setenv(VARIABLE, "explorer:0@step=5")
    with pytest.raises(OprlError, match=r"needs runtime\.workers=processes or backend=ray"):
        make_backend(load_config(None, []))


def test_rank_faults_are_handed_over_once_per_run(monkeypatch):
    """A sharded trainer's ranks are started by its front, anew in each restarted segment: the driver's plan
    hands their faults over once, so a healed run is not killed again by the same fault."""
    monkeypatch.setenv(VARIABLE, "trainer-rank:1@step=4,explorer@step=2,trainer-rank:0@save=6")
    plan = FaultPlan.from_environment()
    handed = plan.hand_over("trainer-rank")
    assert handed == ("trainer-rank:1@step=4", "trainer-rank:0@save=6") and plan.hand_over("trainer-rank") == ()
    ranks = FaultPlan.parse(handed)
    assert ranks.due("trainer-rank 0", (4, [])) is None and ranks.due("trainer-rank 1", (4, [])) == 0.0
    assert plan.due("explorer 0", (2, 0)) == 0.0  # the others stay the driver's


def test_a_call_fault_counts_the_workers_calls():
    """``judge@call=N``: for a worker whose calls name no step, the N-th call to it dies."""
    plan = FaultPlan.parse(("judge@call=2",))
    assert plan.due("judge", ([("p", "c", "r")],)) is None and plan.due("explorer 0", (2, 0)) is None
    assert plan.due("judge", ([("p", "c", "r")],)) == 0.0 and plan.due("judge", ([],)) is None


def test_an_engine_fault_names_an_explorers_engine_and_fires_once(monkeypatch):
    """``engine@step=N``: the explorer generating batch N has its engine process killed (``ENGINE``: the worker
    lives on); ``engine:1`` names explorer 1's. Only at a step's call: a switch, a save, a call count or a delay
    is refused in one line."""
    plan = FaultPlan.parse(("engine@step=3", "engine:1@step=5"))
    assert plan.due("trainer", (3, [])) is None  # a trainer's step 3 is not an explorer's batch
    assert plan.due("explorer 0", (3, 1)) == ENGINE and plan.due("explorer 1", (3, 1)) is None
    assert plan.due("explorer 0", (5, 1)) is None and plan.due("explorer 1", (5, 1)) == ENGINE
    for text in ("engine@switch=3", "engine@step=3+0.5"):
        monkeypatch.setenv(VARIABLE, text)
        with pytest.raises(OprlError, match=r"an engine is killed as a step's call reaches it: engine\[:N\]@step=N"):
            FaultPlan.from_environment()


def test_an_engine_fault_needs_an_engine_process(monkeypatch):
    monkeypatch.setenv(VARIABLE, "engine:0@step=3")
    with pytest.raises(OprlError, match=r"engine:0 kills a vLLM engine's own process: it needs rollout.engine=vllm"):
        make_backend(load_config(None, ["runtime.workers=processes"]))


def test_a_dead_engine_is_recognised_by_vllms_own_error_wherever_it_was_raised():
    """vLLM's ``EngineDeadError`` (its class, not a stand-in) is a dead engine in a thread, from a worker process
    (``RemoteError.kind``) and from a Ray actor (``RayTaskError``, an instance of the cause's class too); a
    worker that raised anything else, or died itself, is not."""
    exceptions = pytest.importorskip("vllm.v1.engine.exceptions")
    dead = exceptions.EngineDeadError()
    assert engine_died(dead) and engine_died(RemoteError("EngineDeadError", str(dead)))
    assert not engine_died(RemoteError("ProcessDied", "worker process exited (-9)", worker="explorer 0"))
    assert not engine_died(RemoteError("ValueError", "EngineDeadError in a message is not one"))
    assert not engine_died(ValueError("no")) and not engine_died(None)
    ray = pytest.importorskip("ray")
    wrapped = ray.exceptions.RayTaskError("call", "traceback", dead)
    assert engine_died(wrapped) and engine_died(wrapped.as_instanceof_cause())
    assert not engine_died(ray.exceptions.RayTaskError("call", "traceback", ValueError("no")))
