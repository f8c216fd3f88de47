"""Where metrics go: ``metrics.jsonl`` (one row per trainer step), tensorboard, and the PNG plot.

Keys are ``group/name``. Every key except those under ``perf/`` (wall-clock timings and throughput) is a
deterministic function of the config and seed on CPU, so two runs with the same seed produce identical rows
once ``perf/*`` is set aside.
"""

from __future__ import annotations

import json
from pathlib import Path

from oprl.io import fsync_file

NONDETERMINISTIC_PREFIX = "perf/"


class MetricsLogger:
    """Rows to ``metrics.jsonl`` first, then to tensorboard and the experiment ``trackers``
    (``oprl.trackers``); a tracker that fails is dropped after one ``warn`` line, never the file."""

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
        self._file = self.path.open("a")
        self._trackers = list(trackers or [])
        self._warn = warn
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
            if config is not None:  # the resolved config, as the TEXT tab shows it (a code block)
                import yaml

                text = yaml.safe_dump(config, sort_keys=False)
                self._writer.add_text("config", "    " + text.replace("\n", "\n    "), 0)

    def log(self, step: int, row: dict[str, float]) -> None:
        self._file.write(json.dumps({"step": step, **row}, sort_keys=True) + "\n")
        self._file.flush()
        if self._writer is not None:
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

    def sync(self) -> None:
        """Make the rows written so far durable (before a checkpoint that counts on them is committed)."""
        self._file.flush()
        fsync_file(self.path)

    def close(self, *, quiet: bool = False) -> None:
        """Close the file and the tensorboard writer; ``quiet`` (on a failure path) ignores errors in doing so,
        so that they cannot hide the failure being reported."""
        closers = [self._file.close, self._writer.close if self._writer is not None else None]
        for tracker in self._trackers:
            try:
                tracker.close()
            except Exception as exc:  # the run's files are what matter; say it and go on
                self._warn(f"warning: tracking.backends: {tracker.name} did not close cleanly ({exc})")
        for close in closers:
            try:
                if close is not None:
                    close()
            except Exception:
                if not quiet:
                    raise


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def deterministic_view(rows: list[dict]) -> list[dict]:
    """The rows without wall-clock fields: what must match between two runs with the same seed."""
    return [{k: v for k, v in row.items() if not k.startswith(NONDETERMINISTIC_PREFIX)} for row in rows]


def plot_run(rows: list[dict], out: Path, title: str = "", subtitle: str = "") -> None:
    """Training reward and eval accuracy against step, one PNG; ``title`` names the run, ``subtitle`` its
    settings."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in rows if "reward/mean" in r]
    evals = [r for r in rows if "eval/accuracy" in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["step"] for r in train], [r["reward/mean"] for r in train], label="train reward (batch mean)", lw=1)
    ax.plot([r["step"] for r in evals], [r["eval/accuracy"] for r in evals], "o-", label="eval accuracy (pass@1)")
    ax.set_xlabel("trainer step")
    ax.set_ylabel("reward / accuracy (0-1)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(f"{title}\n{subtitle}" if subtitle else title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
