"""Checkpoints and resume, the logic (the files themselves are ``oprl.runtime.checkpoint``).

Writing: the driver owns a ``CheckpointWriter`` and tells it when a step is done (``due``, ``start``); the
writer asks the trainer and the buffer for their parts into a staging directory (each worker serialises its
own state in its own process), and ``commit_ready`` adds the old policy versions still needed, the RNG and
``state.json`` once those parts are written *and* the step's row is in ``metrics.jsonl``, then renames the
staging directory into place. So a resumed run never loses or repeats a row. After a worker failure the
driver asks for one last checkpoint of the last completed step (``after_failure``), unless the trainer or
the buffer failed (``abandon``: the last committed checkpoint stands).

Resuming (``resume=true``): ``check_resumable`` compares the config with the run's saved one (only keys that
do not change what is computed may differ), ``prepare`` cuts ``metrics.jsonl`` and the store back to the
newest checkpoint, ``restore`` is the one path that loads it into the workers and the synchronizer, and
``check_versions_available`` refuses to extend a run the checkpoint cannot feed. ``mode=explore`` resumes
from the store itself. ``mode=eval`` reads only a checkpoint's weights (``load_checkpoint_weights``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from oprl.config import RunConfig
from oprl.errors import OprlError
from oprl.metrics import read_metrics
from oprl.runtime import checkpoint as ckpt
from oprl.runtime.store import ExperienceStore
from oprl.runtime.synchronizer import Synchronizer

# Keys that may change when resuming: they do not alter what is computed.
RESUMABLE_CHANGES = ("steps", "resume", "progress", "tensorboard", "backend", "checkpoint.", "runtime.", "eval.")


# -- writing ----------------------------------------------------------------------------------------------
@dataclass
class PendingCheckpoint:
    """A checkpoint being assembled: the workers' parts are futures, the rest is written at commit."""

    staging: Path
    trainer_part: object
    """Future of ``TrainerWorker.save`` (the trainer's version)."""
    buffer_part: object
    """Future of ``ExperienceBuffer.save`` (the fresh batches it holds)."""
    outstanding: list[int]
    """Batches not generated yet when the checkpoint was started."""
    snapshots: dict[int, object]
    """Older policy versions those batches still need: version -> weights future."""


class CheckpointWriter:
    """When and how a live run's checkpoints are written (see the module docstring)."""

    def __init__(self, config: RunConfig, run_dir: Path, backend, logger, started: float):
        self.cfg, self.run_dir, self.backend = config, Path(run_dir), backend
        self.logger, self.started = logger, started
        self.pending: dict[int, PendingCheckpoint] = {}
        self.last: Path | None = None
        """The newest committed checkpoint (named in the failure message)."""
        self.final_attempted = False

    def due(self, step: int) -> bool:
        every = self.cfg.checkpoint.interval
        return bool(every) and (step % every == 0 or step == self.cfg.steps)

    def start(self, step: int, trainer, buffer, outstanding: list[int], snapshots: dict[int, object]):
        """Ask the trainer and the buffer for their parts of checkpoint ``step``; returns both futures."""
        staging = ckpt.staging_dir(self.run_dir, step)
        trainer_part = trainer.call("save", str(staging / "trainer"))
        buffer_part = buffer.call("save", str(staging / "buffer"))
        self.pending[step] = PendingCheckpoint(staging, trainer_part, buffer_part, outstanding, snapshots)
        return trainer_part, buffer_part

    def commit_ready(self, in_flight, logged_through) -> None:
        """Commit pending checkpoints in step order while their parts are done (``in_flight(future)`` is
        false) and their step is logged (``logged_through(step)``)."""
        for step in sorted(self.pending):
            entry = self.pending[step]
            if in_flight(entry.trainer_part) or in_flight(entry.buffer_part) or not logged_through(step):
                return
            self._commit(step, entry)
            del self.pending[step]

    def _commit(self, step: int, entry: PendingCheckpoint) -> None:
        staging = entry.staging
        for version, snapshot in entry.snapshots.items():
            target = staging / "weights" / f"version-{version:06d}.safetensors"
            ckpt.save_weights(self.backend.get(snapshot), target)
        ckpt.save_rng(staging)
        ckpt.write_json(staging / "state.json", {
            "step": step,
            "steps": self.cfg.steps,
            "mode": self.cfg.mode,
            "sync_mode": self.cfg.sync.mode,
            "ready": self.backend.get(entry.buffer_part),
            "outstanding": entry.outstanding,
            "weights_versions": sorted(entry.snapshots),
            "wall_s": time.perf_counter() - self.started,
        })
        final = ckpt.step_dir(self.run_dir, step)
        self.logger.sync()  # the rows this checkpoint counts on reach the disk before it does
        ckpt.commit(staging, final)
        ckpt.prune(self.run_dir, self.cfg.checkpoint.keep)
        self.last = final

    def abandon(self) -> None:
        """The trainer or the buffer failed: its state can no longer be trusted; the last committed stands."""
        self.pending.clear()
        self.final_attempted = True
        self.last = ckpt.resolve_checkpoint(self.run_dir)

    def after_failure(self, completed: int) -> bool:
        """Once the trainer is idle after a failure: whether to checkpoint step ``completed`` (no checkpoint
        of it exists, checkpoints are on, a step was trained); ``last`` names the newest one either way."""
        self.final_attempted = True
        self.last = ckpt.resolve_checkpoint(self.run_dir)
        if self.cfg.mode == "explore" or not self.cfg.checkpoint.interval or completed == 0:
            return False
        return self.last is None or self.last.name != ckpt.step_dir(self.run_dir, completed).name



def resume_hint(checkpoint: Path | None) -> str:
    """What a failure message adds about resuming from ``checkpoint`` (nothing without one)."""
    if checkpoint is None:
        return ""
    step = int(checkpoint.name.split("-")[-1])
    return f"; checkpoint of step {step} in {checkpoint} (continue with resume=true)"


# -- resuming ---------------------------------------------------------------------------------------------
def check_resumable(config: RunConfig, run_dir: Path) -> None:
    """One-line error unless ``config`` equals the run's saved config up to ``RESUMABLE_CHANGES``."""
    saved = _flatten(yaml.safe_load((run_dir / "config.yaml").read_text()))
    current = _flatten(config.model_dump(mode="json"))
    changed = sorted(k for k in saved.keys() | current.keys()
                     if saved.get(k) != current.get(k) and not k.startswith(RESUMABLE_CHANGES))
    if changed:
        raise OprlError(f"resume=true: the config differs from {run_dir}/config.yaml in {', '.join(changed[:3])}"
                        f"{' ...' if len(changed) > 3 else ''}; only steps, eval.*, checkpoint.*, runtime.* may change")


def _flatten(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def prepare(config: RunConfig, run_dir: Path, store_dir: str | None) -> Path | None:
    """Newest checkpoint; metrics and store trimmed to it (batches generated after it are made again)."""
    metrics = run_dir / "metrics.jsonl"
    if config.mode == "explore":
        # The store is the checkpoint: keep batches that have both a file and a row, make the others again.
        store = ExperienceStore(store_dir)
        ckpt.truncate_metrics(metrics, lambda step: True)  # drops a half-written last line
        logged = {r["step"] for r in read_metrics(metrics)} if metrics.is_file() else set()
        store.discard([b for b in store.batches() if b not in logged])
        present = set(store.batches())
        ckpt.truncate_metrics(metrics, lambda step: step in present)
        return None
    checkpoint = ckpt.resolve_checkpoint(run_dir)
    state = ckpt.read_json(checkpoint / "state.json") if checkpoint else {"step": -1, "ready": []}
    ckpt.truncate_metrics(metrics, lambda step: step <= state["step"])
    if store_dir:
        store = ExperienceStore(store_dir)
        store.discard([b for b in store.batches() if b > max(state["step"], 0) and b not in state["ready"]])
    ckpt.prune(run_dir, config.checkpoint.keep)
    return checkpoint


def restore(checkpoint: Path, backend, trainer, buffer, sync: Synchronizer) -> tuple[int, list[int]]:
    """Load ``checkpoint`` into the trainer, the buffer, the synchronizer (the old versions still needed)
    and this process's RNG; returns ``(step, fresh batches the buffer holds)``."""
    state = ckpt.read_json(checkpoint / "state.json")
    backend.get(trainer.call("restore", str(checkpoint / "trainer")))
    ready = backend.get(buffer.call("restore", str(checkpoint / "buffer")))
    for version in state["weights_versions"]:
        weights = ckpt.load_weights(checkpoint / "weights" / f"version-{version:06d}.safetensors")
        sync.publish(version, backend.put(weights))
    ckpt.load_rng(checkpoint)
    return state["step"], ready


def check_versions_available(checkpoint: Path, sync: Synchronizer, pending: list[int], step: int) -> None:
    """A checkpoint holds the old versions its own run still needed; a longer run may need more."""
    missing = [b for b in pending if step > sync.scheduled_version(b) not in sync.snapshots]
    if missing:
        b = missing[0]
        raise OprlError(
            f"resume: batch {b} must come from policy version {sync.scheduled_version(b)} (sync.interval/offset), "
            f"which {checkpoint} does not hold: it was written for a run of fewer steps; a run can be extended "
            f"only from a checkpoint of a step t with v(t + 1) = t (e.g. sync.offset=0, t a multiple of sync.interval)"
        )
