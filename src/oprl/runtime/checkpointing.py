"""Writing a live run's checkpoints and its final model (the files themselves are ``oprl.checkpoint.files``,
their manifest ``oprl.checkpoint.manifest``; reading them back is ``oprl.runtime.resume``).

The driver owns a ``CheckpointWriter`` and tells it when a step is done (``due``, ``start``); the writer asks the
trainer and the buffer for their parts into a staging directory (each worker serialises its own state in its
own process), and ``commit_ready`` adds the old policy versions still needed (the synchronizer's snapshots),
the RNG and ``state.json`` once those parts are written *and* the step's row is in ``metrics.jsonl``, then
commits the staging directory (verified, synced, renamed). So a resumed run never loses or repeats a row. After
a worker failure the driver asks for one last checkpoint of the last completed step (``after_failure``), unless
the trainer or the buffer failed (``abandon``: the last committed checkpoint stands).

``write_final`` writes ``final/`` the same way, whole or not at all; ``resume_hint`` is what a failure's line
says about the checkpoint a run can continue from.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from oprl.backends.failure import WorkerFailure
from oprl.checkpoint import files as ckpt
from oprl.checkpoint import rundir
from oprl.checkpoint.manifest import CheckpointError
from oprl.config import RunConfig
from oprl.io import commit_dir

if TYPE_CHECKING:
    from oprl.roles import BufferHandle, TrainerHandle
    from oprl.runtime.synchronizer import Synchronizer


@dataclass
class PendingCheckpoint:
    """A checkpoint being assembled: the workers' parts are futures, the rest is written at commit."""

    staging: Path
    trainer_part: object
    """Future of the trainer worker's ``save`` (its version)."""
    buffer_part: object
    """Future of ``ExperienceBuffer.save`` (the fresh batches it holds)."""
    outstanding: list[int]
    """Batches not generated yet when the checkpoint was started."""
    snapshots: dict[int, object]
    """Older policy versions those batches still need: version -> weights future."""


class CheckpointWriter:
    """When and how a live run's checkpoints are written (see the module docstring); ``sync``: the run's
    synchronizer, whose snapshots of older versions a checkpoint keeps for the batches still to generate."""

    def __init__(self, config: RunConfig, run_dir: Path, backend, logger, started: float, sync: Synchronizer):
        self.cfg, self.run_dir, self.backend, self.sync = config, Path(run_dir), backend, sync
        self.logger, self.started = logger, started
        self.pending: dict[int, PendingCheckpoint] = {}
        self.last: Path | None = None
        """The newest committed checkpoint (named in the failure message)."""
        self.final_attempted = False
        self.elapsed_before = 0.0
        """Seconds the earlier segments of a resumed run took up to its checkpoint (``elapsed_before``)."""

    def due(self, step: int) -> bool:
        every = self.cfg.checkpoint.interval
        return bool(every) and (step % every == 0 or step == self.cfg.steps)

    def start(self, step: int, trainer: TrainerHandle, buffer: BufferHandle, outstanding: list[int]):
        """Ask the trainer and the buffer for their parts of checkpoint ``step``, after which ``outstanding``
        batches are still to generate (with the older versions they need: the trainer's ``step`` is its own
        part); returns both futures."""
        versions = [v for v in self.sync.needed_versions(outstanding) if v != step]
        snapshots = {v: self.sync.snapshots[v] for v in versions}
        staging = ckpt.staging_dir(self.run_dir, step)
        trainer_part = trainer.save(str(staging / "trainer"))
        buffer_part = buffer.save(str(staging / "buffer"))
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
        try:
            self._assemble(step, entry)
        except BaseException:  # a full disk, refused weights: no half-written .tmp-step-N is left behind
            shutil.rmtree(entry.staging, ignore_errors=True)
            raise

    def _assemble(self, step: int, entry: PendingCheckpoint) -> None:
        staging = entry.staging
        for version, snapshot in entry.snapshots.items():
            target = staging / "weights" / f"version-{version:06d}.safetensors"
            ckpt.save_weights(self.backend.get(snapshot), target)
        ckpt.save_rng(staging)
        ckpt.write_json(
            staging / "state.json",
            {
                "step": step,
                "steps": self.cfg.steps,
                "mode": self.cfg.mode,
                "sync_mode": self.sync.mode,
                "ready": self.backend.get(entry.buffer_part),
                "outstanding": entry.outstanding,
                "weights_versions": sorted(entry.snapshots),
                "wall_s": time.perf_counter() - self.started,
                "total_s": self.elapsed_before + time.perf_counter() - self.started,
            },
        )
        final = ckpt.step_dir(self.run_dir, step)
        self.logger.sync()  # the rows this checkpoint counts on reach the disk before it does
        try:
            ckpt.commit(staging, final)
        except CheckpointError as exc:  # e.g. weights gone NaN: training diverged, nothing sound to save
            raise WorkerFailure(
                f"checkpoint of step {step} refused: {exc}{resume_hint(ckpt.resolve_checkpoint(self.run_dir))}"
            ) from exc
        ckpt.prune(self.run_dir, self.cfg.checkpoint.keep)  # only now: a newer checkpoint has verified
        self.last = final

    def count_again(self, batch: int) -> None:
        """``batch`` went to the buffer before the pending checkpoints started, and its put failed (the teacher
        died scoring it): their buffer parts lack it, so each counts it outstanding, with the older versions a
        run resumed from it generates the batch with."""
        snapshots = {v: self.sync.snapshots[v] for v in self.sync.needed_versions([batch])}
        for step, entry in self.pending.items():
            if batch > step and batch not in entry.outstanding:
                entry.outstanding = sorted([*entry.outstanding, batch])
                entry.snapshots |= {v: snapshot for v, snapshot in snapshots.items() if v < step}

    def abandon(self) -> None:
        """The trainer or the buffer failed: its state can no longer be trusted; the last committed stands."""
        for entry in self.pending.values():  # their parts may be half written
            shutil.rmtree(entry.staging, ignore_errors=True)
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


def write_final(run_dir: Path, save, describe=str, step: int | None = None) -> None:
    """``final/`` (the trained model, tokenizer included), written atomically: ``save(directory)`` fills a
    staging directory, which is then synced and renamed (``oprl.io.commit_dir``), so a kill leaves the whole
    model or none. With it go the run's config (``rundir.FINAL_CONFIG``) and ``step`` (``rundir.FINAL_INFO``):
    what ``oprl eval`` needs to evaluate it as the run's model. A failure is one line naming the directory;
    the staging directory is removed."""
    final = Path(run_dir) / "final"
    staging = final.with_name(".tmp-final")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        save(str(staging))
        if (Path(run_dir) / "config.yaml").is_file():
            shutil.copyfile(Path(run_dir) / "config.yaml", staging / rundir.FINAL_CONFIG)
        ckpt.write_json(staging / rundir.FINAL_INFO, {"step": step, "run": Path(run_dir).name})
        commit_dir(staging, final)
    except Exception as exc:
        shutil.rmtree(staging, ignore_errors=True)
        reason = " ".join(describe(exc).split())[:300]
        raise WorkerFailure(
            f"trainer failed writing the final model {final}: {reason}{resume_hint(ckpt.resolve_checkpoint(run_dir))}"
        ) from exc


def resume_hint(checkpoint: Path | None) -> str:
    """What a failure message adds about resuming from ``checkpoint`` (nothing without one)."""
    if checkpoint is None:
        return ""
    step = int(checkpoint.name.split("-")[-1])
    return f"; checkpoint of step {step} in {checkpoint} (continue with resume=true)"
