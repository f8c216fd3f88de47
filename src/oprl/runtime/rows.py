"""The rows of ``metrics.jsonl`` as the driver writes them: in step order, each once its evaluation is in
(``RowLog``), with the ``perf/*`` columns measured from the workers' clocks (``PerfClock``), and the one line
a progress bar or log shows per row (``progress_text``).

Deliberately not here: when calls are made (``oprl.runtime.driver``) or what the columns mean
(docs/metrics.md).
"""

from __future__ import annotations

import time

from oprl.messages import ExploreResult, ScoreResult, TrainResult


class RowLog:
    """Rows of ``metrics.jsonl`` waiting to be written: in step order, each once its evaluation is in."""

    def __init__(self, expected: list[int], logger, progress, health=None):
        self.expected = expected
        """Steps whose rows are still to be written, in order (row 0 = the evaluation before training)."""
        self.logger, self.progress, self.health = logger, progress, health
        self.rows: dict[int, dict] = {}
        self.waiting_eval: set[int] = set()
        self.last_eval: tuple[int, float] | None = None
        """(step, eval/accuracy) of the newest evaluation written."""

    def add(self, step: int, row: dict) -> None:
        self.rows[step] = row

    def expect_eval(self, step: int) -> None:
        self.waiting_eval.add(step)
        self.rows.setdefault(step, {})
        self.progress.update(self.progress_step, status=f"evaluating step {step}")

    def add_eval(self, step: int, result: dict) -> None:
        self.rows[step].update(result)
        self.waiting_eval.discard(step)

    @property
    def progress_step(self) -> int:
        """Steps written so far (for the progress bar)."""
        return max(0, self.expected[0] - 1) if self.expected else self.progress.total

    def flush(self) -> None:
        """Log finished rows in order (a step's row waits for its evaluation)."""
        while self.expected and self.expected[0] in self.rows and self.expected[0] not in self.waiting_eval:
            step = self.expected.pop(0)
            row = self.rows.pop(step)
            self.logger.log(step, row)
            if "eval/accuracy" in row:
                self.last_eval = (step, row["eval/accuracy"])
            if self.health is not None:  # a live row has no step (the logger writes it): its warnings name it
                self.health.observe({"step": step, **row})
            self.progress.update(max(step, 0), progress_text(row, self.last_eval), line="eval/accuracy" in row)

    def logged_through(self, step: int) -> bool:
        return not self.expected or self.expected[0] > step


def progress_text(row: dict, last_eval: tuple[int, float] | None) -> str:
    """What a progress bar or log line says about a row: reward, the reverse KL to a teacher (distillation), the
    newest eval accuracy, response length, truncated share, lag, step time (the fields a row has)."""
    parts = []
    if "reward/mean" in row:
        parts.append(f"reward {row['reward/mean']:.3f}")
    if "distill/reverse_kl" in row:  # distillation's signal beside the reward (distill_mix=replace only logs that)
        parts.append(f"rev-KL {row['distill/reverse_kl']:.3f}")
    if last_eval is not None:
        parts.append(f"eval acc {last_eval[1]:.3f} (step {last_eval[0]})")
    if "response/length_mean" in row:
        parts.append(f"len {row['response/length_mean']:.1f}")
    if "response/truncated_frac" in row:
        parts.append(f"truncated {row['response/truncated_frac']:.0%}")
    if "lag/mean" in row:
        parts.append(f"lag {row['lag/mean']:.1f}")
    if "perf/step_s" in row:
        parts.append(f"{row['perf/step_s']:.2f} s/step")
    return "  ".join(parts)


class PerfClock:
    """The ``perf/*`` columns: busy/idle seconds per role since the last row, generation timing per batch (with
    the judge's seconds in runs with ``judge.path``), the teacher's prefill per batch (distillation: columns
    only once a teacher reported)."""

    def __init__(self, explorers: int):
        self.started = self.last_step_time = time.perf_counter()
        self.explorer_clock = [(0.0, 0.0)] * explorers
        """Each explorer's (busy, idle) seconds since it started, as of its last result."""
        self.last_totals = {"explorer": (0.0, 0.0), "trainer": (0.0, 0.0), "teacher": (0.0, 0.0)}
        self.explored_batches: dict[int, ExploreResult] = {}
        self.teacher_clock: tuple[float, float] | None = None
        """The teacher's (busy, idle) seconds since it started, as of its last report (None: no teacher yet)."""
        self.scored_batches: dict[int, float] = {}
        """Each scored batch's prefill seconds until the batch's row."""

    def explored(self, result: ExploreResult) -> None:
        """Record an explorer's result (its clock, the batch's timing and summary) until the batch's row."""
        self.explorer_clock[result.explorer] = (result.busy_s, result.idle_s)
        self.explored_batches[result.batch] = result

    def scored(self, result: ScoreResult) -> None:
        """Record the teacher's report (its clock, the batch's prefill seconds) until the batch's row."""
        self.teacher_clock = (result.busy_s, result.idle_s)
        self.scored_batches[result.batch] = result.score_s

    def explore_row(self, batch: int) -> dict[str, float]:
        """The row of batch ``batch`` in mode=explore: its summary and generation timing."""
        result = self.explored_batches.pop(batch)
        return result.summary | self._generation(result) | self._explorers() | self._teacher(batch)

    def step_row(self, result: TrainResult, step: int, with_explorers: bool) -> dict[str, float]:
        """The ``perf/*`` columns of trainer step ``step`` (from the trainer's clock totals in ``result``)."""
        now = time.perf_counter()
        out = self._clock("trainer", result.busy_s, result.idle_s) | {"perf/step_s": now - self.last_step_time}
        self.last_step_time = now
        if step in self.explored_batches:
            out.update(self._generation(self.explored_batches.pop(step)))
        if with_explorers:
            out.update(self._explorers())
        else:
            out["perf/elapsed_s"] = now - self.started
        out.update(self._teacher(step))
        return out

    def _clock(self, role: str, busy: float, idle: float) -> dict[str, float]:
        """``perf/<role>_busy_s`` / ``_idle_s`` since the last row (from the role's clock totals ``busy``,
        ``idle``) and ``perf/<role>_utilization`` since its start."""
        last_busy, last_idle = self.last_totals[role]
        self.last_totals[role] = (busy, idle)
        return {
            f"perf/{role}_busy_s": busy - last_busy,
            f"perf/{role}_idle_s": idle - last_idle,
            f"perf/{role}_utilization": busy / max(busy + idle, 1e-9),
        }

    def _teacher(self, batch: int) -> dict[str, float]:
        """``perf/teacher_*``: the teacher's busy/idle seconds since the last row, its utilisation since the
        start, and the prefill seconds of batch ``batch`` (nothing without a teacher)."""
        if self.teacher_clock is None:
            return {}
        out = self._clock("teacher", *self.teacher_clock)
        if batch in self.scored_batches:
            out["perf/teacher_s"] = self.scored_batches.pop(batch)
        return out

    def _explorers(self) -> dict[str, float]:
        busy = sum(b for b, _ in self.explorer_clock)
        idle = sum(i for _, i in self.explorer_clock)
        last_busy, last_idle = self.last_totals["explorer"]
        self.last_totals["explorer"] = (busy, idle)
        return {
            "perf/explorer_busy_s": busy - last_busy,
            "perf/explorer_idle_s": idle - last_idle,
            "perf/explorer_utilization": busy / max(busy + idle, 1e-9),
            "perf/elapsed_s": time.perf_counter() - self.started,
        }

    @staticmethod
    def _generation(result: ExploreResult) -> dict[str, float]:
        timing = result.timing
        waits = {} if timing.switch_wait_s is None else {"perf/switch_wait_s": timing.switch_wait_s}
        judged = {} if timing.judge_s is None else {"perf/judge_s": timing.judge_s}
        return (
            {
                "perf/generate_s": timing.generate_s,
                "perf/reward_s": timing.reward_s,
                "perf/sync_s": result.sync_s,
                "perf/generate_tokens_per_s": timing.generated_tokens / max(timing.generate_s, 1e-9),
            }
            | timing.shaping
            | waits
            | judged
        )
