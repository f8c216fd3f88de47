"""Experiment trackers beside the run's own ``metrics.jsonl``: Weights & Biases, MLflow, trackio.

``tracking.backends`` names them (TensorBoard is ``tensorboard=true``, on by default, and written by
``oprl.metrics``). Each is an optional extra using the library itself (``pip install 'oprl[wandb]'``, ...)
and receives every metrics row at its trainer step, with the resolved config as the run's parameters:

- ``wandb``: ``wandb.init(project, name=run_name, config=..., mode=tracking.wandb_mode)``, offline by default
  (files under ``<run_dir>/wandb``; ``wandb sync`` uploads them); the step is the metric ``step``.
- ``mlflow``: a run named after the run directory in experiment ``tracking.project``, in
  ``tracking.mlflow_uri`` (default: a local file store ``<run_dir>/mlruns``); the config as flattened params.
- ``trackio``: ``trackio.init(project, name=run_name, config=...)``, stored locally (``$TRACKIO_DIR``, default
  the Hugging Face cache); ``trackio show`` opens the dashboard.

A tracker that cannot start (library missing, bad URI, no permission) is one warning line and the run goes
on without it; one that fails while logging is dropped after one warning line. Neither ever touches
``metrics.jsonl``, which is written first.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

EXTRAS = {"wandb": "wandb", "mlflow": "mlflow-skinny", "trackio": "trackio"}


class Tracker(Protocol):
    """One experiment tracker: ``log`` a metrics row at a step, ``close`` at the end."""

    name: str

    def log(self, step: int, row: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out |= flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


class WandbTracker:
    name = "wandb"

    def __init__(self, run_dir: Path, config: dict[str, Any], tracking) -> None:
        import wandb

        self.run = wandb.init(
            project=tracking.project,
            name=run_dir.name,
            id=run_dir.name,
            resume="allow",
            dir=str(run_dir),
            config=config,
            mode=tracking.wandb_mode,
            reinit="create_new",
        )
        # Rows come per trainer step, evaluations in between and sometimes late: key them by our own step
        # rather than wandb's monotonic counter, which would drop a late row.
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def log(self, step: int, row: dict[str, float]) -> None:
        self.run.log({**row, "step": step})

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    name = "mlflow"

    def __init__(self, run_dir: Path, config: dict[str, Any], tracking) -> None:
        from mlflow.tracking import MlflowClient

        uri = tracking.mlflow_uri
        if uri is None:  # the local file store: MLflow 3 wants this opt-in for it (its SQL store needs SQLAlchemy)
            uri = (run_dir / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(tracking.project)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(tracking.project)
        self.run_id = self.client.create_run(experiment_id, run_name=run_dir.name).info.run_id
        from mlflow.entities import Param

        params = [Param(key, str(value)[:6000]) for key, value in flatten(config).items()]
        for start in range(0, len(params), 100):  # log_batch takes at most 100 params per call
            self.client.log_batch(self.run_id, params=params[start : start + 100])

    def log(self, step: int, row: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, float(value), now, step) for key, value in row.items()]
        for start in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[start : start + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class TrackioTracker:
    name = "trackio"

    def __init__(self, run_dir: Path, config: dict[str, Any], tracking) -> None:
        import trackio

        with contextlib.redirect_stdout(io.StringIO()):  # its banner would interleave with oprl's lines
            self.run = trackio.init(
                project=tracking.project,
                name=run_dir.name,
                config=flatten(config),
                resume="allow",
                embed=False,
                auto_log_gpu=False,
                auto_log_cpu=False,
            )

    def log(self, step: int, row: dict[str, float]) -> None:
        self.run.log(row, step=step)

    def close(self) -> None:
        from trackio import context_vars

        with contextlib.redirect_stdout(io.StringIO()):
            self.run.finish()
        # trackio's exit hook finishes the "current" run again, printing to the terminal: it is finished.
        if context_vars.current_run.get() is self.run:
            context_vars.current_run.set(None)


TRACKERS: dict[str, Callable[..., Tracker]] = {
    "wandb": WandbTracker,
    "mlflow": MlflowTracker,
    "trackio": TrackioTracker,
}
"""Every tracker by its ``tracking.backends`` name."""


def start_trackers(tracking, run_dir: Path, config: dict[str, Any], warn: Callable[[str], Any]) -> list[Tracker]:
    """The trackers of ``tracking.backends`` that start; each that does not is one ``warn`` line."""
    started: list[Tracker] = []
    for name in tracking.backends:
        try:
            with _quiet():
                started.append(TRACKERS[name](run_dir, config, tracking))
        except Exception as exc:  # a tracker is optional: say why in one line and go on
            missing = isinstance(exc, ImportError)
            why = f"pip install 'oprl[{name}]'" if missing else f"{type(exc).__name__}: {_first_line(exc)}"
            warn(f"warning: tracking.backends: {name} did not start ({why}); metrics still go to metrics.jsonl")
    return started


class _quiet:
    """Trackers print banners on start; keep the run's console to oprl's own lines."""

    def __enter__(self):
        self.saved = os.environ.get("WANDB_SILENT")
        os.environ["WANDB_SILENT"] = "true"

    def __exit__(self, *exc):
        if self.saved is None:
            os.environ.pop("WANDB_SILENT", None)
        else:
            os.environ["WANDB_SILENT"] = self.saved


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else ""
