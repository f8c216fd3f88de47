"""Where metrics go: ``metrics.jsonl`` (one row per trainer step), tensorboard, and the PNG plot.

Keys are ``group/name``. Every key except those under ``perf/`` (wall-clock timings and throughput) is a
deterministic function of the config and seed on CPU, so two runs with the same seed produce identical rows
once ``perf/*`` is set aside.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sys
import time
from pathlib import Path

from oprl.errors import OprlError
from oprl.io import fsync_file

NONDETERMINISTIC_PREFIX = "perf/"


class MetricsLogger:
    """Rows to ``metrics.jsonl`` first, then to tensorboard and the experiment ``trackers``
    (``oprl.trackers``); a tracker that fails is dropped after one ``warn`` line, never the file.

    Each row is one ``os.write`` of the whole line to a file opened ``O_APPEND``; a write that fails part
    way (a full disk) is cut back to the last whole row, so ``metrics.jsonl`` never ends in a torn line.
    A failed write of the file or of TensorBoard's events is an ``OSError`` naming that file (one line for
    the driver); TensorBoard's writer thread keeps its error for the next call instead of printing it."""

    def __init__(
        self,
        run_dir: Path,
        *,
        tensorboard: bool = True,
        trackers: list | None = None,
        warn=print,
        config: dict | None = None,
    ):
        self.path = run_dir / "metrics.jsonl"
        with _naming(self.path):
            self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._trackers = list(trackers or [])
        self._warn = warn
        self._writer = None
        self._events = run_dir / "tensorboard"
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            _quiet_tensorboard_thread()
            with _naming(self._events):
                self._writer = SummaryWriter(log_dir=str(self._events))
                if config is not None:  # the resolved config, as the TEXT tab shows it (a code block)
                    import yaml

                    text = yaml.safe_dump(config, sort_keys=False)
                    self._writer.add_text("config", "    " + text.replace("\n", "\n    "), 0)
            self._events = Path(self._writer.file_writer.event_writer._file_name)

    def log(self, step: int, row: dict[str, float]) -> None:
        # perf/wall_time: when the row was written (Unix seconds), in metrics.jsonl only: the first row dates the
        # run's start, which `oprl report` weighs against when its findings were declared (experiments/declared.py).
        record = {"step": step, **row, "perf/wall_time": time.time()}
        self._append((json.dumps(record, sort_keys=True) + "\n").encode())
        if self._writer is not None:
            with _naming(self._events):
                for key, value in row.items():
                    if isinstance(value, (int, float)):
                        self._writer.add_scalar(key, value, step)
        numbers = {k: float(v) for k, v in row.items() if isinstance(v, (int, float))}
        for tracker in list(self._trackers):
            try:
                tracker.log(step, numbers)
            except Exception as exc:  # a tracker is optional; metrics.jsonl already has the row
                self._trackers.remove(tracker)
                self._warn(
                    f"warning: tracking.backends: {tracker.name} failed ({type(exc).__name__}: {exc}); "
                    "dropped, metrics still go to metrics.jsonl"
                )

    def _append(self, line: bytes) -> None:
        assert self._fd is not None, "MetricsLogger is closed"
        size = os.fstat(self._fd).st_size
        with _naming(self.path):
            try:
                written = os.write(self._fd, line)
                if written != len(line):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, size)  # never leave half a row
                raise

    def sync(self) -> None:
        """Make the rows written so far durable (before a checkpoint that counts on them is committed)."""
        with _naming(self.path):
            fsync_file(self.path)

    def close(self, *, quiet: bool = False) -> None:
        """Close the file and the tensorboard writer; ``quiet`` (on a failure path) ignores errors in doing so,
        so that they cannot hide the failure being reported."""
        for tracker in self._trackers:
            try:
                tracker.close()
            except Exception as exc:  # the run's files are what matter; say it and go on
                self._warn(f"warning: tracking.backends: {tracker.name} did not close cleanly ({exc})")
        fd, self._fd = self._fd, None
        writer, self._writer = self._writer, None
        try:
            if fd is not None:
                os.close(fd)
            if writer is not None:
                with _naming(self._events):
                    writer.close()
        except Exception:
            if not quiet:
                raise


@contextlib.contextmanager
def _naming(path: Path):
    """An error inside becomes an ``OSError`` naming ``path`` (TensorBoard's own say no file)."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None and str(path) in str(exc.filename):
            raise
        code = exc.errno or errno.EIO
        raise OSError(code, exc.strerror or os.strerror(code), str(path)) from exc
    except Exception as exc:  # TensorBoard wraps some in its own types
        raise OSError(errno.EIO, f"{type(exc).__name__}: {exc}", str(path)) from exc


def _quiet_tensorboard_thread() -> None:
    """TensorBoard's writer thread re-raises a failed write, which prints a traceback from that thread at
    any moment; it also keeps the error, and the writer raises it at its next call (where ``_naming``
    turns it into one line). Keep only the latter."""
    from tensorboard.summary.writer import event_file_writer

    thread = event_file_writer._AsyncWriterThread
    if getattr(thread, "_oprl_quiet", False):
        return
    original = thread.run

    def run(self) -> None:
        with contextlib.suppress(Exception):  # kept in self.exception by the original run
            original(self)

    thread.run = run
    thread._oprl_quiet = True


def read_metrics(path: Path, warn=None) -> list[dict]:
    """The rows of ``metrics.jsonl``. A torn last line (a run killed mid-write by an older oprl) is dropped
    with one ``warn`` line (stderr by default); a bad line elsewhere is an ``OprlError`` naming it."""
    lines = Path(path).read_text().splitlines()
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if number < len(lines):
                raise OprlError(f"{path}: line {number} is not a JSON row") from None
            (warn or _stderr)(f"warning: {path}: dropped a torn last line ({len(line)} characters)")
    return rows


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def deterministic_view(rows: list[dict]) -> list[dict]:
    """The rows without wall-clock fields: what must match between two runs with the same seed."""
    return [{k: v for k, v in row.items() if not k.startswith(NONDETERMINISTIC_PREFIX)} for row in rows]


REVERSE_KL = "distill/reverse_kl"
"""A distillation run's signal (``oprl.algorithms.distill``): drawn on its own axis by ``plot_run``."""


def plot_run(rows: list[dict], out: Path, title: str = "", subtitle: str = "") -> None:
    """``draw_run``'s figure as one PNG."""
    import matplotlib.pyplot as plt

    fig = draw_run(rows, title, subtitle)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def draw_run(rows: list[dict], title: str = "", subtitle: str = ""):
    """Training reward and eval accuracy against step; a distillation run's reverse KL to its teacher
    (``REVERSE_KL``, nats per token: not on the 0-1 scale) on a right-hand axis. ``title`` names the run,
    ``subtitle`` its settings."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in rows if "reward/mean" in r]
    evals = [r for r in rows if "eval/accuracy" in r]
    distill = [r for r in rows if REVERSE_KL in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["step"] for r in train], [r["reward/mean"] for r in train], label="train reward (batch mean)", lw=1)
    ax.plot([r["step"] for r in evals], [r["eval/accuracy"] for r in evals], "o-", label="eval accuracy (pass@1)")
    ax.set_xlabel("trainer step")
    ax.set_ylabel("reward / accuracy (0-1)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if distill:
        kl = ax.twinx()
        kl.plot([r["step"] for r in distill], [r[REVERSE_KL] for r in distill], color="tab:red", lw=1,
                label="reverse KL to the teacher (per token, right axis)")  # fmt: skip
        kl.set_ylabel("reverse KL (nats per token)")
        more = kl.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    ax.legend(handles, labels, loc="lower right", fontsize=8)
    ax.set_title(f"{title}\n{subtitle}" if subtitle else title, fontsize=10)
    fig.tight_layout()
    return fig
