"""The restart budget of a self-healing run, what each restart cost, and how a run goes on after its trainer
or teacher died (docs/runtime.md#self-healing-runs).

When an explorer's process dies (killed, out of memory, a lost Ray node) the driver restarts it and generates
its lost batches again (``oprl.runtime.driver``); when the trainer's or the teacher's dies, ``oprl.runtime.run``
starts every worker again from the newest checkpoint (``Healing``). ``runtime.max_restarts`` restarts
are allowed within any ``runtime.restart_window_s`` seconds: a long run survives a preemption now and then, a
worker that dies again at once (a crash loop) stops the run as before, with a checkpoint and one line.

Each restart is one log line once the new worker is ready (which worker, why, which batches, seconds lost),
is counted in the next row of ``metrics.jsonl`` after the death (``perf/restarts``: under ``perf/``, because
whether and when a process dies is not a function of the config and seed; every other column of a healed run
equals the undisturbed run's) and is listed in ``summary.json`` (``restarts``: worker, cause, batches,
seconds to ready, seconds lost).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from oprl.backends.failure import WorkerFailure
from oprl.backends.faults import FaultPlan
from oprl.config import RunConfig

if TYPE_CHECKING:  # annotations only
    from oprl.runtime.resume import OpenRun


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


class Healing:
    """A run's restarts across its segments: explorers are restarted by the driver; a trainer, a teacher or a
    buffer (``STARTED_AGAIN``) whose process died ends a segment, and the run goes on from its newest
    checkpoint in this process, as ``resume=true`` would (before the first checkpoint: from the start, as
    ``resume=restart``), within the same budget (``runtime.max_restarts``; docs/runtime.md#self-healing-runs).
    The teacher holds no state, but its scores are already on their way to the buffer when it dies."""

    def __init__(self, config: RunConfig, log):
        self.config, self.began = config, time.time()
        self.restarts = Restarts(config.runtime.max_restarts, config.runtime.restart_window_s, log)
        self.plan = FaultPlan.from_environment()  # OPRL_FAULT: one plan for every segment, each fault fires once
        self.trainer: Restart | None = None
        """The trainer's (or teacher's) restart under way: ready once the next segment's workers serve."""

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
