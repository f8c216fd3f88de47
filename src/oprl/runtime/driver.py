"""The driver: one event loop that wires explorers, buffer and trainer together on any backend.

It only submits calls and reacts to their completion; all computing happens in the workers. Each turn it
(1) hands the next batches whose policy version the synchronizer can provide to idle explorers (in
overlapped scheduled mode also queues one behind each busy explorer), (2) starts trainer step t once batch t
is in the buffer (``take`` then ``train``, queued back to back), then (3) waits for any call to finish.
After step t: publish version t if a batch needs it, evaluate if due, checkpoint if due. Rows of
``metrics.jsonl`` are written in step order once their evaluation is in; a checkpoint is committed only after
its step's row is written, so a resumed run never loses or repeats a row.

With ``runtime.overlap=false`` at most one worker call is in flight: the strictly sequential baseline. The
schedule (not timing) decides every number in scheduled mode, so both settings give the same metrics.

On a worker failure the driver stops submitting work, lets the trainer finish what it holds, writes a final
checkpoint (unless the trainer or the buffer is the one that failed) and raises ``WorkerFailure``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from oprl.runtime import checkpoint as ckpt
from oprl.runtime.failure import WorkerFailure
from oprl.runtime.resume import CheckpointWriter, resume_hint
from oprl.runtime.schedule import lag


@dataclass
class Call:
    kind: str
    """explore, put, train, eval, weights, part (of a checkpoint)."""
    component: str
    """The worker, as named in error messages (``explorer 0``, ``trainer``, ``buffer``)."""
    doing: str
    """What it was doing, for error messages."""
    data: dict = field(default_factory=dict)


class Driver:
    def __init__(self, *, config, run_dir: Path, backend, trainer, explorers, buffer, sync, logger, progress,
                 start_step: int, pending: list[int], ready: set[int]):
        self.cfg, self.run_dir, self.backend = config, Path(run_dir), backend
        self.trainer, self.explorers, self.buffer, self.sync = trainer, explorers, buffer, sync
        self.logger, self.progress = logger, progress
        self.steps = config.steps
        self.offline = config.mode == "offline"
        self.explore_only = config.mode == "explore"
        self.completed = start_step
        self.pending = sorted(pending)
        self.ready = set(ready)
        self.calls: dict = {}
        # Explore calls each explorer holds (running + queued). In scheduled overlap mode an explorer may hold
        # one queued call behind the running one: the next batch and its weights then wait in its inbox, and
        # the round trip through the driver (result -> dispatch -> weights load) leaves the critical path.
        self.holding = [0] * len(explorers)
        self.capacity = 2 if (config.runtime.overlap and config.sync.mode == "scheduled") else 1
        self.in_flight: dict[int, int] = {}  # batch -> explorer
        self.training = False
        self.rows: dict[int, dict] = {}
        self.waiting_eval: set[int] = set()
        # Steps whose rows are still to be written, in order (row 0 = the evaluation before training).
        first = 0 if start_step == 0 else start_step + 1
        self.expected = sorted(pending) if self.explore_only else list(range(first, self.steps + 1))
        self.batch_info: dict[int, dict] = {}
        self.explorer_clock = [{"busy_s": 0.0, "idle_s": 0.0} for _ in explorers]
        self.last_totals = {"explorer": (0.0, 0.0), "trainer": (0.0, 0.0)}
        self.failure: tuple[str, str, BaseException] | None = None
        self.started = self.last_step_time = time.perf_counter()
        self.checkpoints = CheckpointWriter(config, self.run_dir, backend, logger, self.started)
        self.last_reward = self.last_accuracy = 0.0

    # -- the loop ---------------------------------------------------------------------------------------
    def run(self) -> None:
        while True:
            if self.failure is None:
                if self._finished():
                    break
                self._launch()
            elif not self.calls:
                if self.checkpoints.final_attempted:
                    break
                if self.checkpoints.after_failure(self.completed):
                    self.start_checkpoint(self.completed)
                continue
            if not self.calls:
                raise RuntimeError("driver: nothing in flight but the run is not finished (a scheduling bug)")
            done = set(self.backend.wait_any(self.calls))
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
                getattr(self, f"_on_{call.kind}")(call, value)
            try:
                self._flush_rows()
                self.checkpoints.commit_ready(lambda future: future in self.calls, self._logged_through)
            except OSError as exc:  # disk full, read-only run directory: the run cannot go on
                message = f"driver failed writing the run directory: {type(exc).__name__}: {exc}"
                if self.failure is not None:  # the failure that started it all stays the one reported
                    message, exc = f"{self.failure[1]} (and then the {message})", self.failure[2]
                raise WorkerFailure(message + resume_hint(ckpt.resolve_checkpoint(self.run_dir))) from exc
        if self.failure is not None:
            _, message, exc = self.failure
            raise WorkerFailure(message + resume_hint(self.checkpoints.last)) from exc

    def _finished(self) -> bool:
        return not self.expected and not self.calls and not self.checkpoints.pending

    def _submit(self, future, kind: str, component: str, doing: str, **data) -> None:
        self.calls[future] = Call(kind, component, doing, data)

    def _may_submit(self) -> bool:
        return self.cfg.runtime.overlap or not self.calls

    def _room(self) -> bool:
        """Explorers stay within ``buffer.max_ready`` batches of the trainer's next step."""
        return self.explore_only or self.pending[0] <= self.completed + self.cfg.buffer.max_ready

    def _launch(self) -> None:
        while self.pending and self._may_submit() and self._room():
            # The least loaded explorer (lowest index on ties): idle explorers get work before any is queued.
            index = min(range(len(self.explorers)), key=lambda i: (self.holding[i], i), default=None)
            if index is None or self.holding[index] >= self.capacity:
                break
            batch = self.pending[0]
            version = self.sync.version_for(batch)
            if version is None:
                break
            self.pending.pop(0)
            self.holding[index] += 1
            weights = self.sync.weights_for(index, version)
            experiences, info = self.explorers[index].call("explore", batch, version, weights, num_returns=2)
            self._submit(info, "explore", f"explorer {index}", f"while generating batch {batch}",
                         index=index, batch=batch, experiences=experiences)
            self.in_flight[batch] = index
        step = self.completed + 1
        if (not self.explore_only and not self.training and step <= self.steps
                and (self.offline or step in self.ready) and self._may_submit()):
            batch, stats = self.buffer.call("take", step, num_returns=2)
            metrics = self.trainer.call("train", step, batch)
            self._submit(metrics, "train", "trainer", f"while training step {step}", step=step, stats=stats)
            self.ready.discard(step)
            self.training = True

    # -- completions -------------------------------------------------------------------------------------
    def _on_explore(self, call: Call, info: dict) -> None:
        index, batch = call.data["index"], call.data["batch"]
        self.explorer_clock[index] = info.pop("clock")
        self.batch_info[batch] = info
        put = self.buffer.call("put", batch, call.data["experiences"], not self.explore_only)
        self._submit(put, "put", "buffer", f"while storing batch {batch}", batch=batch)
        if not self.explore_only:
            self.ready.add(batch)
        del self.in_flight[batch]
        self.holding[index] -= 1

    def _on_put(self, call: Call, _size: int) -> None:
        batch = call.data["batch"]
        if self.explore_only:
            info = self.batch_info.pop(batch)
            self.rows[batch] = info["summary"] | self._generation_perf(info) | self._clock_perf()

    def _on_train(self, call: Call, metrics: dict) -> None:
        step = call.data["step"]
        self.training = False
        self.completed = step
        row = metrics | self.backend.get(call.data["stats"])
        row.update(self._step_perf(row, step))
        if self.cfg.sync.mode == "scheduled" and not self.offline:
            scheduled = self.sync.scheduled_version(step)
            if row["batch/version_max"] != scheduled:
                raise RuntimeError(f"step {step} trained on version {row['batch/version_max']}, not {scheduled}")
            row["lag/scheduled"] = float(lag(step, self.sync.k, self.sync.m))
        self.rows[step] = row
        outstanding = self.pending + sorted(self.in_flight)
        if self.explorers and self.sync.wants(step, self.pending):
            self.sync.publish(step, self._trainer_call("weights", f"while publishing version {step}"))
        self.sync.release(outstanding)
        interval = self.cfg.eval.interval
        if step == self.steps or (interval and step % interval == 0):
            self.request_eval(step)
        if self.checkpoints.due(step):
            self.start_checkpoint(step)

    def request_eval(self, step: int) -> None:
        future = self.trainer.call("evaluate", step)
        self._submit(future, "eval", "trainer", f"while evaluating step {step}", step=step)
        self.waiting_eval.add(step)
        self.rows.setdefault(step, {})

    def _on_eval(self, call: Call, result: dict) -> None:
        step = call.data["step"]
        self.rows[step].update(result)
        self.waiting_eval.discard(step)

    def _on_weights(self, call: Call, _weights) -> None:
        pass  # the snapshot future itself is what the synchronizer hands out

    def _trainer_call(self, method: str, doing: str, *args):
        future = self.trainer.call(method, *args)
        self._submit(future, "weights" if method == "weights" else "part", "trainer", doing)
        return future

    def _flush_rows(self) -> None:
        """Log finished rows in order (a step's row waits for its evaluation)."""
        while self.expected and self.expected[0] in self.rows and self.expected[0] not in self.waiting_eval:
            step = self.expected.pop(0)
            row = self.rows.pop(step)
            self.logger.log(step, row)
            self.last_reward = row.get("reward/mean", self.last_reward)
            self.last_accuracy = row.get("eval/accuracy", self.last_accuracy)
            self.progress.update(max(step, 0), reward=self.last_reward, accuracy=self.last_accuracy)

    def _logged_through(self, step: int) -> bool:
        return not self.expected or self.expected[0] > step

    # -- metrics ------------------------------------------------------------------------------------------
    def _clock_perf(self) -> dict[str, float]:
        busy = sum(c["busy_s"] for c in self.explorer_clock)
        idle = sum(c["idle_s"] for c in self.explorer_clock)
        last_busy, last_idle = self.last_totals["explorer"]
        self.last_totals["explorer"] = (busy, idle)
        return {
            "perf/explorer_busy_s": busy - last_busy,
            "perf/explorer_idle_s": idle - last_idle,
            "perf/explorer_utilization": busy / max(busy + idle, 1e-9),
            "perf/elapsed_s": time.perf_counter() - self.started,
        }

    @staticmethod
    def _generation_perf(info: dict) -> dict[str, float]:
        return {
            "perf/generate_s": info["generate_s"],
            "perf/reward_s": info["reward_s"],
            "perf/sync_s": info["sync_s"],
            "perf/generate_tokens_per_s": info["generated_tokens"] / max(info["generate_s"], 1e-9),
        }

    def _step_perf(self, row: dict, step: int) -> dict[str, float]:
        now = time.perf_counter()
        busy, idle = row.pop("perf/trainer_busy_total_s"), row.pop("perf/trainer_idle_total_s")
        last_busy, last_idle = self.last_totals["trainer"]
        self.last_totals["trainer"] = (busy, idle)
        out = {
            "perf/trainer_busy_s": busy - last_busy,
            "perf/trainer_idle_s": idle - last_idle,
            "perf/trainer_utilization": busy / max(busy + idle, 1e-9),
            "perf/step_s": now - self.last_step_time,
        }
        self.last_step_time = now
        if step in self.batch_info:
            out.update(self._generation_perf(self.batch_info.pop(step)))
        if self.explorers:
            out.update(self._clock_perf())
        else:
            out["perf/elapsed_s"] = now - self.started
        return out

    # -- checkpoints (written by oprl.runtime.resume) ------------------------------------------------------
    def start_checkpoint(self, step: int) -> None:
        outstanding = self.pending + sorted(self.in_flight)
        versions = [v for v in self.sync.needed_versions(outstanding) if v != step]
        snapshots = {v: self.sync.snapshots[v] for v in versions}
        trainer_part, buffer_part = self.checkpoints.start(step, self.trainer, self.buffer, outstanding, snapshots)
        self._submit(trainer_part, "part", "trainer", f"while checkpointing step {step}")
        self._submit(buffer_part, "part", "buffer", f"while checkpointing step {step}")

    def _on_part(self, call: Call, _value) -> None:
        pass  # completion is checked by CheckpointWriter.commit_ready

    # -- failures -----------------------------------------------------------------------------------------
    def _on_failure(self, call: Call, exc: BaseException) -> None:
        component, doing = call.component, call.doing
        if call.kind == "train":
            try:
                self.backend.get(call.data["stats"])
            except Exception:  # ``take`` failed and the trainer only saw its error
                component, doing = "buffer", f"while handing out batch {call.data['step']}"
        if self.failure is None:
            message = f"{component} failed {doing}: {self.backend.describe(exc)}"
            self.failure = (component, " ".join(message.split()), exc)
        for future in [f for f, c in self.calls.items() if c.kind == "explore"]:
            del self.calls[future]  # other explorers' batches are regenerated by a resumed run
        if component in ("trainer", "buffer"):
            # Its state can no longer be trusted: abandon everything; the last committed checkpoint stands.
            self.calls.clear()
            self.checkpoints.abandon()
