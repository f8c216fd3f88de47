"""Launching a run: starting its workers with the model they load (``model_path``: the warm start when it gets
one) and their threads, each role placed on the backend (trainer, judge, explorers, buffer, teacher), the newest
checkpoint restored into them and the first version published: ``start_workers`` returns the ``RunParts`` a
``Driver`` is built from. A worker that fails while starting is one line: a user mistake found while loading
(``OprlError``) keeps its own message, a process that died is a ``WorkerFailure`` the run may heal
(``oprl.runtime.healing``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from oprl.backends.failure import WorkerFailure
from oprl.buffer.buffer import make_buffer
from oprl.checkpoint import files as ckpt_files
from oprl.checkpoint import storedir
from oprl.checkpoint.board import BOARD_DIRNAME
from oprl.checkpoint.store import ExperienceStore
from oprl.config import RunConfig
from oprl.errors import OprlError
from oprl.explorer.explorer import ExplorerWorker
from oprl.judge.judge import JudgeWorker
from oprl.roles import BufferHandle, ExplorerHandle, JudgeClient, TeacherHandle, TrainerHandle
from oprl.runtime import resume
from oprl.runtime.checkpointing import resume_hint
from oprl.runtime.synchronizer import Synchronizer
from oprl.teacher.teacher import TeacherWorker
from oprl.trainer.ranks import ShardedTrainer, rank_threads
from oprl.trainer.role import TrainerWorker
from oprl.trainer.warmstart import length_warning, wants_warm_start, warm_started_model
from oprl.worker_parts import worker_threads  # run.py and cli.py import it from here too


def model_path(config: RunConfig, task, log=print) -> str:
    """``model.path``, or the cached warm-started model when it gets one (``tiny``, or any with
    ``warmstart.pretrained``; built first if needed)."""
    if not wants_warm_start(config.model, config.warmstart):
        return config.model.path
    # Same thread count as the workers: more intra-op threads than free cores makes OpenMP spin-wait (measured:
    # a warm-start step took 2.46 s with 2 threads vs 0.16 s with 1 while another process held one of 2 cores).
    previous = torch.get_num_threads()
    torch.set_num_threads(worker_threads(config))
    try:
        path = warm_started_model(config.model, config.task, config.warmstart, task, log=log, progress=config.progress)
    finally:
        torch.set_num_threads(previous)
    warning = length_warning(path, config.rollout.max_new_tokens) if config.mode != "eval" else None
    if warning:
        log(warning)
    return str(path)


@dataclass
class RunParts:
    """The started workers and where the schedule stands: the Driver's arguments."""

    trainer: TrainerHandle | None
    """None in mode=explore."""
    explorers: list[ExplorerHandle]
    buffer: BufferHandle
    sync: Synchronizer
    start_step: int
    """The last trained step (0, or a checkpoint's step when resuming)."""
    pending: list[int]
    """Batches still to generate."""
    ready: set[int]
    """Batches the buffer holds for later steps (restored from a checkpoint)."""
    teacher: TeacherHandle | None = None
    """Distillation: the teacher that scores every batch (``teacher.path``)."""


def start_workers(
    opened: resume.OpenRun, path: str, backend, actors: list, log=print, restarted: bool = False
) -> RunParts:
    """Start the workers of ``config.mode`` (each one appended to ``actors`` as it starts, for the caller to
    stop), restore a checkpoint when resuming (``restarted``: after the trainer died, which the restart's own
    line reports) and publish the first version the explorers need."""
    config, store_dir, run_dir = opened.config, opened.store_dir, opened.run_dir
    trainer = _start_trainer(config, path, backend, actors) if config.mode in ("both", "offline") else None
    explorers = _start_explorers(config, path, backend, actors) if config.mode in ("both", "explore") else []
    buffer = BufferHandle(backend.start("buffer", make_buffer, config, store_dir, threads=1, compute=False))
    actors.append(buffer.actor)
    teacher: TeacherHandle | None = None
    if config.teacher.path is not None:  # placed like an explorer: a thread, a process or a Ray actor
        gpus, threads = config.teacher.gpus, worker_threads(config)
        teacher_actor = backend.start("teacher", TeacherWorker, config, path, threads=threads, gpus=gpus)
        actors.append(teacher_actor)
        teacher = TeacherHandle(teacher_actor)
    for actor in actors:
        wait_ready(backend, actor, run_dir)
    sync = Synchronizer.of(config, len(explorers))
    start_step, ready = 0, list[int]()
    if opened.resumption is not None:
        assert trainer is not None, "mode=explore resumes from its store, without a checkpoint"
        start_step, ready = resume.restore(opened.resumption, backend, trainer, buffer, sync, log=log)
        if not restarted:
            where = f"{opened.resumption.path} (step {start_step} of {config.steps})"
            log(f"resuming {run_dir.name} from checkpoint {where}")
    if sync.partial and explorers:  # the synchronizer posts every version from now on (and the restored)
        sync.open_board(run_dir / BOARD_DIRNAME, start_step, backend.get)
    if config.mode == "explore":
        done = set(ExperienceStore(store_dir).batches()) if store_dir else set()
        pending = [b for b in storedir.explore_batches(config, run_dir) if b not in done]
    else:
        pending = [b for b in range(start_step + 1, config.steps + 1) if b not in ready] if explorers else []
    if trainer is not None and explorers and sync.wants(start_step, pending):
        sync.publish(start_step, trainer.weights())
    return RunParts(trainer, explorers, buffer, sync, start_step, pending, set(ready), teacher)


def _start_trainer(config: RunConfig, path: str, backend, actors: list) -> TrainerHandle:
    """The trainer: one worker, or a front that only forwards calls to its rank processes (sharded)."""
    gpus = config.runtime.gpus_per_trainer_rank
    if config.trainer.sharding == "none":
        threads = worker_threads(config)
        actor = backend.start("trainer", TrainerWorker, config, path, backend.cpu_snapshots, threads=threads, gpus=gpus)
    else:  # the front only forwards calls; its rank processes compute
        ranks = backend.rank_launcher(rank_threads(config), gpus)
        actor = backend.start(
            "trainer", ShardedTrainer, config, path, ranks, threads=worker_threads(config), compute=False
        )
    actors.append(actor)
    return TrainerHandle(actor)


def _start_explorers(config: RunConfig, path: str, backend, actors: list) -> list[ExplorerHandle]:
    """``runtime.explorers`` explorers, and the one judge they call (placed like the teacher) when there is one."""
    threads = worker_threads(config)
    judge = None
    if config.judge.path is not None:
        judge = backend.start("judge", JudgeWorker, config, path, threads=threads, gpus=config.judge.gpus)
        actors.append(judge)
    explorers: list[ExplorerHandle] = []
    for index in range(config.runtime.explorers):
        client = None if judge is None else JudgeClient(backend.peer(judge))
        actor = backend.start(
            f"explorer {index}",
            ExplorerWorker,
            config,
            path,
            index,
            client,
            threads=threads,
            gpus=config.runtime.gpus_per_explorer,
            restartable=config.runtime.max_restarts > 0,  # Ray restarts its process (docs/runtime.md#self-healing-runs)
        )
        actors.append(actor)
        explorers.append(ExplorerHandle(actor))
    return explorers


def wait_ready(backend, actor, run_dir: Path | None = None) -> None:
    """Wait for ``actor`` to load; a failure is one line (module docstring)."""
    try:
        backend.wait_ready(actor)
    except Exception as exc:  # a user mistake found while loading (OprlError) keeps its own message
        reason = backend.describe(exc).removeprefix("OprlError: ")
        if run_dir is not None and backend.lost(exc, actor):  # its process died (killed, a lost node): no mistake
            last = ckpt_files.resolve_checkpoint(run_dir)
            line = f"{actor.name} failed while starting: {reason}{resume_hint(last)}"
            failure = WorkerFailure(line, component=actor.name, lost=True, cause=reason, checkpoint=last, starting=True)
            raise failure from exc
        raise OprlError(f"{actor.name}: failed to start: {reason}") from exc
