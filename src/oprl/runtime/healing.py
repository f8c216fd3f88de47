"""The supervisor of a self-healing run: which dead workers are restarted, within what budget, what each restart
cost, and how the run goes on (docs/runtime.md#self-healing-runs).

When an explorer's process dies (killed, out of memory, a lost Ray node) the driver asks the ``Supervisor``
whether to heal it (``heals_explorer``), puts the explorer's batches back and has the supervisor start a new
process (``restart_explorer``): the batches are generated again with their own versions and seeds. When the
trainer's or the teacher's dies, ``oprl.runtime.run`` asks ``heals(failure)`` and starts every worker again from
the newest checkpoint. ``runtime.max_restarts`` restarts are allowed within any ``runtime.restart_window_s``
seconds (``Restarts``): a long run survives a preemption now and then, a worker that dies again at once (a crash
loop) stops the run as before, with a checkpoint and one line.

Each restart is one log line once the new worker is ready (which worker, why, which batches, seconds lost),
is counted in the next row of ``metrics.jsonl`` after the death (``perf/restarts``: under ``perf/``, because
whether and when a process dies is not a function of the config and seed; every other column of a healed run
equals the undisturbed run's) and is listed in ``summary.json`` (``restarts``: worker, cause, batches,
seconds to ready, seconds lost). A restarted explorer's clock starts at 0: the supervisor adds its earlier
processes' busy and idle seconds to its results, so the ``perf/explorer_*`` columns count the whole run.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oprl.backends import failure as failures
from oprl.backends.failure import WorkerFailure
from oprl.backends.faults import FaultPlan
from oprl.config import RunConfig

if TYPE_CHECKING:  # annotations only
    from oprl.messages import ExploreResult
    from oprl.roles import ExplorerHandle
    from oprl.runtime.resume import OpenRun
    from oprl.runtime.synchronizer import Synchronizer


@dataclass
class Restart:
    """One restart: of ``worker``, after ``cause``, for ``batches``."""

    worker: str
    cause: str
    batches: list[int]
    work_lost_s: float
    """Seconds the lost call had been computing when the worker died (an estimate: since it was dispatched or
    since the worker's previous result, whichever is later)."""
    kind: str = ""
    """What died: ``explorer``, ``trainer``, ``teacher``, ``judge``, ``buffer`` or ``vllm-engine`` (an explorer's
    engine process); '' = the worker's own kind (its name's first word)."""
    started: float = field(default_factory=time.perf_counter)
    ready_s: float | None = None
    """Seconds from the death being noticed to the new worker being ready (start-up and model load)."""

    @property
    def lost_s(self) -> float:
        return self.work_lost_s + (self.ready_s or 0.0)

    def record(self) -> dict:
        """The restart as ``summary.json`` lists it."""
        return {
            "worker": self.worker,
            "kind": self.kind or self.worker.split(" ")[0],
            "cause": self.cause,
            "batches": self.batches,
            "ready_s": self.ready_s,
            "seconds_lost": self.lost_s,
        }


class Restarts:
    """The restarts of a run: the budget (``max_restarts`` within ``window_s``), the log line, the columns."""

    def __init__(self, max_restarts: int, window_s: float, log=print, clock=time.monotonic):
        self.max_restarts, self.window_s, self.log, self.clock = max_restarts, window_s, log, clock
        self.times: deque[float] = deque()
        self.done: list[Restart] = []
        self._uncounted = 0
        """Restarts started since the last row."""

    def allows(self) -> bool:
        """May one more worker be restarted now?"""
        now = self.clock()
        while self.times and self.times[0] <= now - self.window_s:
            self.times.popleft()
        return len(self.times) < self.max_restarts

    def spent(self) -> str:
        """Why a death was not healed, for the run's last line ('' when restarts are off)."""
        if not self.max_restarts or len(self.times) < self.max_restarts:
            return ""
        return (
            f" (runtime.max_restarts={self.max_restarts} restarts within runtime.restart_window_s={self.window_s:g}"
            " already used)"
        )

    def start(self, worker: str, cause: str, batches: list[int], work_lost_s: float, kind: str = "") -> Restart:
        self.times.append(self.clock())
        self._uncounted += 1
        return Restart(worker, cause, batches, work_lost_s, kind)

    def ready(self, restart: Restart, again: str) -> None:
        """``restart``'s worker is serving again: one line (``again``: what it does again)."""
        restart.ready_s = time.perf_counter() - restart.started
        self.done.append(restart)
        self.log(
            f"{restart.worker} died ({restart.cause}); restarted in {restart.ready_s:.1f} s "
            f"({len(self.times)} of runtime.max_restarts={self.max_restarts} within {self.window_s:g} s), "
            f"{again}; {restart.lost_s:.1f} s lost"
        )

    def columns(self) -> dict[str, float]:
        """``perf/restarts``: the restarts started since the previous row (none: no column)."""
        count, self._uncounted = self._uncounted, 0
        return {"perf/restarts": float(count)} if count else {}


STARTED_AGAIN = ("trainer", "teacher", "buffer", "judge")
"""Workers whose death starts every worker again from the newest checkpoint (a buffer dies alone only as a
Ray actor on a lost node: locally it is a thread of the driver)."""


class Supervisor:
    """A run's restarts across its segments (module docstring). Explorers are restarted in the driver's loop:
    each segment's driver hands them over (``watch``), asks ``heals_explorer`` of a failed call and has
    ``restart_explorer`` replace the explorer. A trainer, a teacher or a buffer (``STARTED_AGAIN``) whose process
    died ends a segment, and the run goes on from its newest checkpoint in this process, as ``resume=true`` would
    (before the first checkpoint: from the start, as ``resume=restart``), within the same budget (``heals``).
    The teacher holds no state, but its scores are already on their way to the buffer when it dies."""

    def __init__(self, config: RunConfig, log=print):
        self.config, self.began = config, time.time()
        self.restarts = Restarts(config.runtime.max_restarts, config.runtime.restart_window_s, log)
        self.plan = FaultPlan.from_environment()  # OPRL_FAULT: one plan for every segment, each fault fires once
        self.trainer: Restart | None = None
        """The trainer's (or teacher's) restart under way: ready once the next segment's workers serve."""
        self.backend: Any = None
        self.explorers: list[ExplorerHandle] = []
        self.busy_since: list[float] = []
        """When each explorer's running call began (its work is lost if it dies)."""
        self.clock_before: list[tuple[float, float]] = []
        """Each explorer's (busy, idle) seconds in its earlier processes: a restarted one's clock starts at 0."""

    # -- explorers, restarted in the driver's loop ------------------------------------------------------------
    def watch(self, backend, explorers: list[ExplorerHandle]) -> None:
        """The explorers of this segment, on ``backend`` (their clocks start now)."""
        self.backend, self.explorers = backend, explorers
        self.busy_since = [time.perf_counter()] * len(explorers)
        self.clock_before = [(0.0, 0.0)] * len(explorers)

    def dispatched(self, explorer: int) -> None:
        """An idle ``explorer`` was handed a batch: its work starts now."""
        self.busy_since[explorer] = time.perf_counter()

    def explored(self, explorer: int, result: ExploreResult) -> ExploreResult:
        """``explorer``'s ``result`` with the busy and idle seconds of its earlier processes added; its next call,
        if one is queued, starts now."""
        self.busy_since[explorer] = time.perf_counter()
        busy, idle = self.clock_before[explorer]
        return dataclasses.replace(result, busy_s=result.busy_s + busy, idle_s=result.idle_s + idle)

    def engine_lost(self, explorer: int, exc: BaseException) -> bool:
        """Did the vLLM engine process of ``explorer`` die under it (``rollout.engine_process``), in an explorer
        the backend can replace (``Backend.replaceable``: a process of its own)? On threads the engine is the
        driver's process's, shared with the trainer's evaluations: the run stops instead."""
        return failures.engine_died(exc) and self.backend.replaceable(self.explorers[explorer].actor)

    def explorer_lost(self, explorer: int, exc: BaseException) -> bool:
        """Did ``explorer``'s process or its engine's die (``exc`` is no error the explorer raised)?"""
        return self.backend.lost(exc, self.explorers[explorer].actor) or self.engine_lost(explorer, exc)

    def heals_explorer(self, explorer: int, exc: BaseException) -> bool:
        """Restart ``explorer``, whose call failed with ``exc``? Only when its process (or engine process) died and
        the budget allows. Not on worker processes that call the judge and die: a dead caller may leave the
        judge's reply in its pipe, where the new process would read it as the answer to its own first question
        (an explorer whose engine died was not in a call to the judge: it raised, with a clean pipe)."""
        if self.engine_lost(explorer, exc):
            return self.restarts.allows()
        if not self.backend.lost(exc, self.explorers[explorer].actor):
            return False
        if self.backend.name == "local" and self.config.judge.path is not None:
            return False
        return self.restarts.allows()

    def restart_explorer(
        self, explorer: int, worker: str, exc: BaseException, batches: list[int], clock: tuple[float, float]
    ) -> tuple[Any, Restart]:
        """Start ``explorer`` (named ``worker``) again after ``exc``, with ``batches`` lost and its clock at ``clock``
        (busy, idle seconds): the future of its readiness and the restart. The driver has dropped its calls and
        put its batches back."""
        self.clock_before[explorer] = clock
        worked = time.perf_counter() - self.busy_since[explorer]
        actor = self.explorers[explorer].actor
        if self.engine_lost(explorer, exc):  # the explorer lives, its engine does not: a new explorer, a new engine
            cause = "EngineDeadError: the engine process died"  # vLLM's own message points at a traceback
            restart = self.restarts.start(f"vLLM engine of {worker}", cause, batches, worked, "vllm-engine")
            return self.backend.restart(actor, alive=True), restart
        restart = self.restarts.start(worker, " ".join(self.backend.describe(exc).split()), batches, worked)
        return self.backend.restart(actor), restart

    def explorer_ready(self, restart: Restart, sync: Synchronizer) -> None:
        """``restart``'s explorer serves again: one line naming the batches it generates again (scheduled: with
        their versions)."""
        again = ", ".join(
            f"batch {b}" + (f" (version {sync.scheduled_version(b)})" if sync.scheduled else "")
            for b in restart.batches
        )
        self.restarts.ready(restart, f"generating {again or 'no batch'} again")

    def columns(self) -> dict[str, float]:
        """The next row's ``perf/restarts`` (``Restarts.columns``)."""
        return self.restarts.columns()

    def spent(self) -> str:
        """Why a dead explorer was not restarted, for the run's last line (``Restarts.spent``)."""
        return self.restarts.spent()

    # -- every worker, started again from a checkpoint ---------------------------------------------------------
    def heals(self, failure: WorkerFailure) -> bool | str | None:
        """How the run goes on after ``failure``: the ``resume`` of its next segment (true: from the newest
        checkpoint; ``restart``: from the start, with no checkpoint yet and the store in the run directory, whose
        batches are made again), or None: it stops (no worker of ``STARTED_AGAIN`` died, or the budget is
        spent)."""
        every = failure.component in STARTED_AGAIN or failure.starting  # a worker that died while starting: all
        if not every or not failure.lost or self.config.mode != "both":
            return None
        if failure.checkpoint is None and self.config.buffer.path is not None:
            return None
        if not self.restarts.allows():
            return None
        # Its work since the checkpoint is lost (the checkpoint directory's time is its commit).
        since = Path(failure.checkpoint).stat().st_mtime if failure.checkpoint is not None else self.began
        self.trainer = self.restarts.start(failure.component, failure.cause, [], max(0.0, time.time() - since))
        return True if failure.checkpoint is not None else "restart"

    def serving(self, opened: OpenRun) -> None:
        """The segment's workers are ready: the trainer restart (if one is under way) is done."""
        if self.trainer is not None:
            where = f"training from {opened.resumption.path}" if opened.resumption else "from the start (no checkpoint)"
            self.restarts.ready(self.trainer, f"every worker started again, {where}")
        self.trainer = None
