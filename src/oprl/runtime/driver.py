"""The driver: one event loop that wires explorers, buffer and trainer together on any backend.

It only submits calls and reacts to their completion; all computing happens in the workers. Each turn it
(1) hands the next batches whose policy version the synchronizer can provide to idle explorers (where a batch's
version is decided ahead, ``Synchronizer.decided_ahead``, and runs overlap, also queues one behind each busy
explorer), (2) starts trainer step t once batch t is in the buffer (``take`` then ``train``, queued back to
back), then (3) waits for any call to finish. After step t: publish version t if a batch needs it, evaluate if
due, checkpoint if due. Rows of ``metrics.jsonl`` are written in step order once their evaluation is in; a
checkpoint is committed only after its step's row is written, so a resumed run never loses or repeats a row.

With ``runtime.overlap=false`` at most one worker call is in flight: the strictly sequential baseline. The
schedule (not timing) decides every number in scheduled mode, so both settings give the same metrics.

An explorer whose process died (not one that raised: the same call would raise again) is restarted by the run's
``Supervisor`` (``oprl.runtime.healing``: the budget, the new process, its clock): the driver puts its batches
back to ``pending``, to be generated again by the new process with the weights of their version (the
synchronizer's snapshots, kept while a batch needs them) and their own seeds, so the run's numbers do not change
(docs/runtime.md#self-healing-runs). On any other worker failure, or past the budget, the driver stops
submitting work, lets the trainer finish what it holds, writes a final checkpoint (unless the trainer or the
buffer is the one that failed) and raises ``WorkerFailure`` with the line ``oprl.runtime.calls.blame`` made.

Its state is a few small objects: ``BatchTracker`` (``oprl.runtime.batches``: which batches are pending, in
flight, ready, which step is next), ``RowLog`` (rows waiting to be written in order) and ``PerfClock`` (the
``perf/*`` columns; both ``oprl.runtime.rows``), ``CheckpointWriter`` (``oprl.runtime.checkpointing``), the
``Supervisor``, the calls in flight (``oprl.runtime.calls.Call``) and at most one ``Failure``. Each completion
goes to the handler its kind names in ``Driver.handlers``. Workers are called through the typed handles of
``oprl.roles``; the trainer's ``TrainResult`` is read by attribute, so no control value travels in a row of
metrics.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oprl.backends import failure
from oprl.backends.failure import WorkerFailure
from oprl.checkpoint import files as ckpt
from oprl.runtime.batches import BatchTracker
from oprl.runtime.calls import Call, Failure, blame
from oprl.runtime.checkpointing import CheckpointWriter, resume_hint
from oprl.runtime.healing import Supervisor
from oprl.runtime.rows import PerfClock, RowLog

if TYPE_CHECKING:  # annotations only: the driver never builds one
    from oprl.messages import ExploreResult, ScoreResult, TrainResult
    from oprl.roles import BufferHandle, ExplorerHandle, TeacherHandle, TrainerHandle


class Driver:
    """Submits calls to the workers as the ``BatchTracker`` allows and reacts to each completion (module docstring)."""

    def __init__(
        self,
        *,
        config,
        run_dir: Path,
        backend,
        trainer: TrainerHandle | None,
        explorers: list[ExplorerHandle],
        buffer: BufferHandle,
        sync,
        logger,
        progress,
        start_step: int,
        pending: list[int],
        ready: set[int],
        health=None,
        teacher: TeacherHandle | None = None,
        log=print,
        supervisor: Supervisor | None = None,
    ):
        self.cfg, self.run_dir, self.backend = config, Path(run_dir), backend
        self.trainer, self.explorers, self.buffer, self.sync = trainer, explorers, buffer, sync
        self.teacher = teacher
        """Distillation: scores each batch between the explorer and the buffer (offline: before training)."""
        self.steps = config.steps
        self.offline = config.mode == "offline"
        self.explore_only = config.mode == "explore"
        # Scheduling: where every batch is, and the calls in flight.
        capacity = 2 if (config.runtime.overlap and sync.decided_ahead) else 1
        self.batches = BatchTracker(pending, ready, start_step, len(explorers), capacity)
        self.calls: dict[Any, Call] = {}
        # Reacting: rows in step order, their perf columns, checkpoints, the first failure.
        first = 0 if start_step == 0 else start_step + 1
        expected = sorted(pending) if self.explore_only else list(range(first, self.steps + 1))
        self.rows = RowLog(expected, logger, progress, health)
        self.perf = PerfClock(len(explorers))
        self.checkpoints = CheckpointWriter(config, self.run_dir, backend, logger, self.perf.started, sync)
        self.failure: Failure | None = None
        self.unscored: set[int] = set()
        """Batches whose put failed because the teacher died scoring them (``_teacher_lost_under``)."""
        # Self-healing: the run's supervisor (shared with ``oprl.runtime.run``, which restarts a lost trainer).
        self.supervisor = supervisor or Supervisor(config, log)
        self.supervisor.watch(backend, explorers)
        # Weights snapshots and checkpoint parts need no reaction: the snapshot future itself is what the
        # synchronizer hands out, and CheckpointWriter.commit_ready checks its parts.
        self.handlers: dict[str, Callable[[Call, Any], None]] = {
            "explore": self._on_explore,
            "put": self._on_put,
            "train": self._on_train,
            "eval": self._on_eval,
            "score": self._on_score,
            "restart": self._on_restart,
        }

    # -- the loop ---------------------------------------------------------------------------------------
    def run(self) -> None:
        with failure.deferring():  # SIGTERM/SIGINT: a clean stop, polled below (oprl.backends.failure)
            self._loop()

    def _loop(self) -> None:
        while True:
            if self.failure is None:
                self._track_posts()
                if self._finished():
                    break
                self._launch()
            elif not self.calls:
                if self.checkpoints.final_attempted:
                    break
                if self.checkpoints.after_failure(self.batches.completed):
                    self.start_checkpoint(self.batches.completed)
                continue
            if not self.calls:
                raise RuntimeError("driver: nothing in flight but the run is not finished (a scheduling bug)")
            self._react(set(self.backend.wait_any(self.calls, timeout=0.2)))
            if (signum := failure.stop_requested()) is not None and self.failure is None:
                self._on_interrupt(signum)
            try:
                self.rows.flush()
                self.checkpoints.commit_ready(lambda future: future in self.calls, self.rows.logged_through)
            except OSError as exc:  # disk full, read-only run directory: the run cannot go on
                message = f"driver failed writing the run directory: {type(exc).__name__}: {exc}"
                cause: BaseException = exc
                if self.failure is not None:  # the failure that started it all stays the one reported
                    message, cause = f"{self.failure.message} (and then the {message})", self.failure.cause
                raise WorkerFailure(message + resume_hint(ckpt.resolve_checkpoint(self.run_dir))) from cause
        if self.failure is not None and isinstance(self.failure.cause, failure.Interrupted):
            raise failure.Interrupted(self.failure.cause.signum, self._interrupted_line())
        if self.failure is not None:
            last, failed = self.checkpoints.last, self.failure
            reason = " ".join(self.backend.describe(failed.cause).split())
            line = failed.message + resume_hint(last)
            error = WorkerFailure(line, component=failed.component, lost=failed.lost, cause=reason, checkpoint=last)
            raise error from failed.cause

    def _react(self, done: set) -> None:
        # In submission order: when a batch's store write fails, the failed put explains the failed take
        # and train queued behind it, so it is the cause reported.
        for future in [f for f in self.calls if f in done]:
            call = self.calls.pop(future, None)
            if call is None:
                continue  # abandoned after a failure
            try:
                value = self.backend.get(future)
            except Exception as exc:  # a worker raised or died: stop the run cleanly
                self._on_failure(call, exc)
                continue
            handler = self.handlers.get(call.kind)
            if handler is not None:
                handler(call, value)

    def _track_posts(self) -> None:
        """Partial rollouts: wait for the synchronizer's weights board writes like any call (a failure stops the
        run with a line naming the board file)."""
        while self.sync.posts:
            post = self.sync.posts.pop(0)
            self._submit(post.future, Call("post", "synchronizer", post.doing))

    def _finished(self) -> bool:
        return not self.rows.expected and not self.calls and not self.checkpoints.pending

    def _submit(self, future, call: Call) -> None:
        self.calls[future] = call

    def _may_submit(self) -> bool:
        return self.cfg.runtime.overlap or not self.calls

    def _launch(self) -> None:
        batches = self.batches
        while batches.pending and self._may_submit() and batches.in_reach(self.sync.max_ready):
            index = batches.explorer_with_room()
            if index is None:
                break
            batch = batches.pending[0]
            version = self.sync.version_for(batch)
            if version is None:  # held back by the lag rule
                break
            if not batches.held(index):
                self.supervisor.dispatched(index)
            batches.dispatch(batch, index)
            weights = self.sync.weights_for(index, version, batch)
            switch = self.sync.switch_plan(batch)  # partial rollouts: other weights mid-batch, decided here
            experiences, result = self.explorers[index].explore(batch, version, weights, switch)
            self._submit(
                result,
                Call(
                    "explore",
                    f"explorer {index}",
                    f"while generating batch {batch}",
                    batch=batch,
                    explorer=index,
                    experiences=experiences,
                ),
            )
        step = batches.completed + 1
        if (
            not self.explore_only
            and not batches.training
            and step <= self.steps
            and (self.offline or step in batches.ready)
            and self._may_submit()
        ):
            assert self.trainer is not None, "a mode that trains has a trainer"
            experiences, stats = self.buffer.take(step)
            if self.offline and self.teacher is not None:  # stored rows without teacher log-probs get them now
                experiences = self._score(step, experiences)
            trained = self.trainer.train(step, experiences)
            self._submit(trained, Call("train", "trainer", f"while training step {step}", step=step, stats=stats))
            batches.take(step)

    # -- completions -------------------------------------------------------------------------------------
    def _on_explore(self, call: Call, result: ExploreResult) -> None:
        batch = call.batch
        self.perf.explored(self.supervisor.explored(call.explorer, result))  # with a restarted one's earlier clock
        experiences = call.experiences if self.teacher is None else self._score(batch, call.experiences)
        put = self.buffer.put(batch, experiences, not self.explore_only)
        self._submit(put, Call("put", "buffer", f"while storing batch {batch}", batch=batch))
        self.batches.explored(batch, to_train=not self.explore_only)

    def _score(self, batch: int, experiences):
        """The teacher's copy of ``experiences`` (a future, handed on unresolved); its report is waited for like
        any call, so a failure is named and the clock reaches the row."""
        assert self.teacher is not None
        scored, result = self.teacher.score(batch, experiences)
        self._submit(result, Call("score", "teacher", f"while scoring batch {batch}", batch=batch))
        return scored

    def _on_score(self, _call: Call, result: ScoreResult) -> None:
        self.perf.scored(result)

    def _take_score(self, batch: int) -> None:
        """React now to the teacher's report of batch ``batch`` if it is still in flight: it is done (the batch's
        put or training needed its experiences) but a backend may report it after the call that needed it."""
        self._react({f for f, c in self.calls.items() if c.kind == "score" and c.batch == batch})

    def _on_put(self, call: Call, _size: int) -> None:
        if self.explore_only:
            self._take_score(call.batch)
            self.rows.add(call.batch, self.perf.explore_row(call.batch))

    def _on_train(self, call: Call, result: TrainResult) -> None:
        step = call.step
        self.batches.trained(step)
        self._take_score(step)
        row = result.metrics | self.backend.get(call.stats)
        row.update(self.perf.step_row(result, step, with_explorers=bool(self.explorers)))
        row.update(self.supervisor.columns())
        if not self.offline:  # the newest version a response started with is the schedule's
            row.update(self.sync.check_trained(step, result.start_version))
        self.rows.add(step, row)
        outstanding = self.batches.outstanding()
        if self.explorers and self.sync.wants(step, outstanding):  # partial: in-flight batches may switch to it
            assert self.trainer is not None
            snapshot = self.trainer.weights()
            self._submit(snapshot, Call("weights", "trainer", f"while publishing version {step}"))
            self.sync.publish(step, snapshot)
        storing = [c.batch for c in self.calls.values() if c.kind == "put" and self.teacher is not None]
        self.sync.release(outstanding + storing)  # a put whose teacher dies leaves its batch to make again
        interval = self.cfg.eval.interval
        if step == self.steps or (interval and step % interval == 0):
            self.request_eval(step)
        if self.checkpoints.due(step):
            self.start_checkpoint(step)

    def request_eval(self, step: int) -> None:
        assert self.trainer is not None, "evaluations run in the trainer"
        future = self.trainer.evaluate(step)
        self._submit(future, Call("eval", "trainer", f"while evaluating step {step}", step=step))
        self.rows.expect_eval(step)

    def _on_eval(self, call: Call, result: dict) -> None:
        self.rows.add_eval(call.step, result)

    # -- checkpoints (written by oprl.runtime.checkpointing) ---------------------------------------------------
    def start_checkpoint(self, step: int) -> None:
        assert self.trainer is not None, "mode=explore writes no checkpoints (its store is its state)"
        outstanding = self.batches.outstanding()
        trainer_part, buffer_part = self.checkpoints.start(step, self.trainer, self.buffer, outstanding)
        self._submit(trainer_part, Call("part", "trainer", f"while checkpointing step {step}"))
        self._submit(buffer_part, Call("part", "buffer", f"while checkpointing step {step}"))

    # -- failures -----------------------------------------------------------------------------------------
    def _on_interrupt(self, signum: int) -> None:
        """SIGTERM/SIGINT: explorers stopped now; the trainer finishes its call, then the checkpoint of the
        last completed step is written (the failure path's ``after_failure``)."""
        name = signal.Signals(signum).name
        self.failure = Failure("driver", f"interrupted by {name}", failure.Interrupted(signum))
        for future in [f for f, c in self.calls.items() if c.kind in ("explore", "restart")]:
            del self.calls[future]  # regenerated by a resumed run
        for explorer in self.explorers:
            if hasattr(explorer.actor, "terminate"):  # a worker process: mid-generation, nothing of it to keep
                explorer.actor.terminate()

    def _interrupted_line(self) -> str:
        assert self.failure is not None
        last = self.checkpoints.last
        where = f"at step {self.batches.completed}"
        if self.explore_only:
            where = f"after {self.steps - len(self.rows.expected)} of {self.steps} batches"
        how = f"output_dir={self.run_dir.parent} run_name={self.run_dir.name} resume=true"
        saved = "" if last is None or self.explore_only else f" from {last}"
        return f"{self.failure.message} {where}; resume with {how}{saved}"

    def _unwritten(self, part) -> bool:
        """Is a checkpoint part still being written, or did it fail?"""
        if part in self.calls:
            return True
        try:
            self.backend.get(part)
        except Exception:
            return True
        return False

    def _restart_explorer(self, call: Call, exc: BaseException) -> None:
        """Explorer ``call.explorer`` died: forget its calls, put its batches back, have the supervisor start a new
        process."""
        index = call.explorer
        for future in [f for f, c in self.calls.items() if c.kind == "explore" and c.explorer == index]:
            del self.calls[future]  # the other call it held died with it
        lost = self.batches.lost(index)
        self.sync.forget(index)  # the new process holds the model's first weights: send the version along
        clock = self.perf.explorer_clock[index]
        ready, restart = self.supervisor.restart_explorer(index, call.component, exc, lost, clock)
        doing = f"while restarting after {restart.cause}"
        self._submit(ready, Call("restart", call.component, doing, explorer=index, restart=restart))

    def _on_restart(self, call: Call, _ready: bool) -> None:
        assert call.restart is not None
        self.batches.down.discard(call.explorer)
        self.supervisor.explorer_ready(call.restart, self.sync)

    def _teacher_lost_under(self, call: Call, exc: BaseException) -> int | None:
        """The batch the teacher was scoring when its process died, if ``call`` failed only because of that death.
        ``_score`` hands the scores on unresolved, so the teacher's death fails that batch's ``put`` too, with the
        teacher's death as its error (``Backend.lost`` is true of the teacher, not of the buffer: the put never ran),
        and then the ``take`` and ``train`` behind it (a batch never stored; seen after the put: ``_react``). The
        buffer and the trainer are intact: naming them would abandon the pending checkpoint (``_on_failure``), and
        a self-healing run would start again from the start, or not at all (#57). The batch is to be generated
        again: a checkpoint counts it outstanding, with the versions it needs (``_on_train`` keeps them while its
        put is in flight), also one already started (its buffer part, queued behind the put, lacks it)."""
        if self.teacher is None or call.kind not in ("put", "train"):
            return None
        batch = call.batch if call.kind == "put" else call.step
        if batch in self.unscored:  # the take and train of a batch whose put failed so
            return batch
        if call.kind == "train":  # offline, it took the teacher's scores: its take moved the cursor on, so no
            return None  # checkpoint may follow (the trainer's failure: abandon)
        # Both lost only where the backend cannot tell whose death it was (a Ray error naming no actor).
        if not self.backend.lost(exc, self.teacher.actor) or self.backend.lost(exc, self.buffer.actor):
            return None
        self.unscored.add(batch)
        self.batches.unstored(batch)
        self.checkpoints.count_again(batch)
        return batch

    def _on_failure(self, call: Call, exc: BaseException) -> None:
        if self.failure is None and call.kind == "explore" and self.supervisor.heals_explorer(call.explorer, exc):
            self._restart_explorer(call, exc)
            return
        scored = self._teacher_lost_under(call, exc)
        unhealed = call.kind == "explore" and self.supervisor.explorer_lost(call.explorer, exc)
        holders = {"trainer": self.trainer, "teacher": self.teacher, "buffer": self.buffer}
        failed = blame(call, exc, self.backend, holders, scored, self.supervisor.spent() if unhealed else "")
        if self.failure is None:  # the failure that started it all stays the one reported
            self.failure = failed
        for future in [f for f, c in self.calls.items() if c.kind in ("explore", "restart")]:
            del self.calls[future]  # other explorers' batches are regenerated by a resumed run
        if failed.component in ("trainer", "buffer"):
            # A checkpoint whose parts were both written before the failure is whole: commit it (a trainer that
            # dies as its next step arrives restarts from it). A write that fails now adds nothing to the line.
            with contextlib.suppress(OSError):
                self.rows.flush()
                self.checkpoints.commit_ready(self._unwritten, self.rows.logged_through)
            # Its state can no longer be trusted: abandon everything; the last committed checkpoint stands.
            self.calls.clear()
            self.checkpoints.abandon()
