"""One run, end to end: check the machine, prepare the run directory, start the workers, drive, report.

``run(config)`` dispatches on ``config.mode``: ``both`` (explorers + buffer + trainer), ``explore`` (explorers
+ buffer writing the store), ``offline`` (buffer reading a store + trainer), ``eval`` (one evaluation). The
run directory receives the resolved config, ``metrics.jsonl``, tensorboard events, ``metrics.png``,
``summary.json``, ``workers.log`` (what reward processes print), ``experiences/`` (the store), ``checkpoints/``
and the final model (``final/``, loadable with ``from_pretrained``). ``resume=true`` continues run
``run_name`` from its newest checkpoint.

Run it: ``oprl train`` (CPU default), ``oprl train sync.offset=1`` (overlapped), ``oprl train backend=ray``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import torch

from oprl.backends.failure import StopSignals, WorkerFailure
from oprl.backends.local import LocalBackend
from oprl.backends.make import make_backend
from oprl.checkpoint import files as ckpt_files
from oprl.checkpoint import rundir
from oprl.checkpoint.store import ExperienceStore
from oprl.config import RunConfig
from oprl.evaluator.evaluator import Evaluator
from oprl.io import atomic_write_json
from oprl.metrics import MetricsLogger, plot_run, read_metrics
from oprl.models.loading import quiet_transformers, resolve_device
from oprl.models.precision import precision_line
from oprl.progress import RunProgress
from oprl.roles import EvaluatorHandle
from oprl.runtime import resume
from oprl.runtime.checkpointing import write_final
from oprl.runtime.driver import Driver
from oprl.runtime.healing import Supervisor
from oprl.runtime.health import SignalHealth, ess_advice
from oprl.runtime.launch import RunParts, model_path, start_workers, wait_ready, worker_threads
from oprl.runtime.preflight import check_lengths, check_machine, noop_warnings, outcome_warnings
from oprl.tasks import build_task
from oprl.tasks.rewards.processes import LOG_NAME as REWARD_LOG
from oprl.tasks.rewards.processes import reward_log
from oprl.trackers import start_trackers
from oprl.trainer.warmstart import wants_warm_start


@dataclass
class RunSummary:
    run_dir: Path
    accuracy_before: float
    accuracy_after: float
    seconds: float
    config: RunConfig | None = None
    """The config the run went on with (a resumed run's saved settings, not only the keys given)."""


def make_run_dir(config: RunConfig) -> Path:
    """Where the run writes: ``output_dir/run_name`` (default name: ``run_label``, then the time)."""
    return Path(config.output_dir) / (config.run_name or f"{run_label(config)}-{datetime.now():%Y%m%d-%H%M%S}")


def run_label(config: RunConfig) -> str:
    """The settings that set a run apart, for its default name: mode (unless both), preset, k/m, then only
    what differs from the defaults (model, task, engine, backend, replay, dtype, sharding), seed. The default job is
    ``grpo-k1-m0-s0``; ``backend=ray rollout.engine=vllm`` gives ``grpo-k1-m0-vllm-ray-s0``; ``sync.mode=async``
    gives ``grpo-k1-async1-s0`` (lag <= sync.max_staleness = 1). An evaluation of a checkpoint is named after
    it, not after the model its run started from: ``eval-<run>-step-N``."""
    if config.mode == "eval" and config.eval.checkpoint:
        found = ckpt_files.resolve_checkpoint(config.eval.checkpoint)
        if found is not None:
            label = f"eval-{found.parent.parent.name}-{found.name}"
            return "".join(c if c.isalnum() or c in "-_." else "-" for c in label)
    parts: list[str] = [config.mode] if config.mode != "both" else []
    parts += [config.algorithm.preset or "custom", config.sync.label()]  # k and m, or k and the async bound
    if config.model.path != "tiny":
        parts.append(Path(config.model.path.rstrip("/")).name.lower())
    if config.task.name != "arithmetic":
        parts.append(config.task.name)
    optional = {
        config.rollout.engine: config.rollout.engine != "lean",
        config.backend: config.backend != "local",
        f"replay{config.replay.groups_per_step}": config.replay.groups_per_step > 0,
        {"bfloat16": "bf16", "float16": "fp16"}.get(config.model.dtype, config.model.dtype): config.model.dtype
        != "float32",
        config.trainer.sharding: config.trainer.sharding != "none",
    }
    parts += [name for name, differs in optional.items() if differs]
    label = "-".join([*parts, f"s{config.seed}"])
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in label)


def run(config: RunConfig, log=print, task=None, checked: bool = False) -> RunSummary:
    """Run ``config.mode``; see the module docstring. ``task``: ``config.task`` already built; ``checked``: its
    lengths already passed ``check_lengths`` (``oprl.train`` makes the checks before the heavy imports)."""
    check_machine(config)
    started = time.perf_counter()
    quiet_transformers()
    torch.manual_seed(config.seed)
    run_dir = make_run_dir(config)
    opened = resume.open_run(config, run_dir, log=log)
    try:
        with reward_log(run_dir / REWARD_LOG):  # reward processes print there
            offline_store = opened.config.buffer.path if opened.config.mode == "offline" else None
            if offline_store:  # its batches, before the warm start (minutes on a cold cache)
                ExperienceStore.locate(offline_store)
            if task is None or opened.config.task != config.task:
                task = build_task(opened.config.task)
            if not (checked and opened.config == config):  # before the warm start and the workers
                check_lengths(opened.config, task, log)
            for line in noop_warnings(opened.config, task):
                log(line)
            if chosen := opened.config.model.lora_sync_notice(opened.config.rollout.engine):  # an unset default
                log(chosen)
            if opened.config.mode == "eval":
                return _evaluate_only(opened.config, run_dir, opened.eval_checkpoint, started, log, task)
            supervisor = Supervisor(opened.config, log)
            with StopSignals():  # SIGTERM and SIGINT stop the run the same way (oprl.backends.failure)
                while True:
                    try:
                        before = _run_workers(opened, run_dir, log, task, started, supervisor)
                        break
                    except WorkerFailure as failure:
                        if (how := supervisor.heals(failure)) is None:
                            raise
                        opened.lock.release()  # held again at once, by the resume of the same run
                        # The next segment continues this run: overwrite=true (which replaced it at its start)
                        # would now refuse the resume (config/run.py) or wipe what is healed from.
                        healed = opened.config.model_copy(update={"resume": how, "overwrite": False})
                        opened = resume.open_run(healed, run_dir, log)
                        started = time.perf_counter()  # this segment, as a resumed run counts it
            done = [r.record() for r in supervisor.restarts.done]
            return _finish(opened.config, run_dir, started, before, log, done)
    except BaseException as exc:  # a run that stopped before step 1 does not block its name (rundir)
        rundir.mark_incomplete(run_dir, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        raise
    finally:
        opened.lock.release()


def _run_workers(opened: resume.OpenRun, run_dir: Path, log, task, started: float, supervisor: Supervisor) -> float:
    """Start the workers, drive the run, write ``final/``; returns the seconds earlier segments of a resumed
    run took (0 for a new run). ``started``: when this segment began (``time.perf_counter``); ``supervisor``: the
    run's restarts, across the segments of a run that restarted its trainer."""
    config = opened.config
    path = model_path(config, task, log=log)
    chosen = precision_line(config.trainer.autocast, config.rollout.dtype, resolve_device(config.model.device))
    if chosen:
        log(chosen)
    backend = make_backend(config, supervisor.plan)
    actors: list = []
    parts: RunParts | None = None
    try:
        parts = start_workers(opened, path, backend, actors, log, restarted=supervisor.trainer is not None)
        supervisor.serving(opened)
        before = resume.elapsed_before(opened.resumption)
        _drive(config, run_dir, backend, parts, log, supervisor, origin=started - before)
        if parts.trainer is not None:
            trainer = parts.trainer
            save = lambda d: backend.get(trainer.save_final(d))  # noqa: E731
            write_final(run_dir, save, backend.describe, step=config.steps)
    finally:
        if parts is not None:  # partial rollouts: an explorer waiting for a version that will never come stops
            parts.sync.close_board()
        backend.shutdown(actors)
        if parts is not None:
            parts.sync.close()  # after the workers: a board write waiting for the trainer's weights ends now
        ckpt_files.remove_staging(run_dir)  # the workers have stopped: nothing writes a staging directory now
    return before


def _drive(config: RunConfig, run_dir: Path, backend, parts: RunParts, log, supervisor: Supervisor, origin: float):
    """Drive the started ``parts`` to the end of the run: its progress line, its rows (``metrics.jsonl`` and the
    trackers), its health warnings, the ``Driver``. ``origin``: the ``time.perf_counter`` reading the run's
    seconds count from (this segment's start, less the earlier segments' seconds): a checkpoint's ``total_s``
    counts start-up and warm start, as summary.json's seconds do, not only the driver's time."""
    progress = RunProgress(
        config.steps,
        enabled=config.progress,
        description="explore" if config.mode == "explore" else "train",
        interval=config.logging.interval,
        interval_s=config.logging.interval_s,
        start=parts.start_step,  # a resumed run's rate, and so its ETA, counts this segment's steps only
    )
    with progress:
        values = config.model_dump(mode="json")
        trackers = start_trackers(config.tracking, run_dir, values, log)
        logger = MetricsLogger(run_dir, tensorboard=config.tensorboard, trackers=trackers, warn=log, config=values)
        health = SignalHealth(
            config.rollout.max_new_tokens,
            log,
            warm_started=wants_warm_start(config.model, config.warmstart),
            distills=(config.algorithm.distill_coef or 0.0) > 0,
            ess_advice=ess_advice(config),
        )
        try:
            driver = Driver(
                config=config,
                run_dir=run_dir,
                backend=backend,
                logger=logger,
                progress=progress,
                health=health,
                log=log,
                supervisor=supervisor,
                **vars(parts),
            )
            driver.checkpoints.elapsed_before = driver.checkpoints.started - origin
            if parts.start_step == 0 and config.mode != "explore":
                driver.request_eval(0)
            driver.run()
        except BaseException:
            logger.close(quiet=True)
            raise
        logger.close()


def _evaluate_only(config: RunConfig, run_dir: Path, checkpoint: Path | None, started: float, log, task) -> RunSummary:
    """mode=eval: one evaluation of model.path, or of a checkpoint's weights, in its own worker thread."""
    path = model_path(config, task, log=log)
    backend = LocalBackend()
    worker = backend.start("evaluator", Evaluator, config, path, threads=worker_threads(config))
    evaluator = EvaluatorHandle(worker)
    progress = RunProgress(1, enabled=config.progress, description="evaluate", unit="run", eta=False)
    try:
        with progress:
            progress.update(0, status=f"{config.eval.num_problems} problems")
            wait_ready(backend, worker)
            # A run's final/ evaluates with the random numbers of its last step, as its checkpoint would.
            step = backend.get(evaluator.load_checkpoint(str(checkpoint))) if checkpoint else _final_step(path)
            row = backend.get(evaluator.evaluate(step))
            problems = int(row.get("eval/num_problems", config.eval.num_problems))
            progress.update(1, f"eval acc {row['eval/accuracy']:.3f} on {problems} problems")
    finally:
        backend.shutdown([worker])
    row["eval/checkpoint_step"] = float(step)
    logger = MetricsLogger(run_dir, tensorboard=False)
    logger.log(step, row)
    logger.close()
    accuracy = row["eval/accuracy"]
    _write_summary(run_dir, config, accuracy, accuracy, time.perf_counter() - started)
    return RunSummary(run_dir, accuracy, accuracy, time.perf_counter() - started)


def _final_step(path: str) -> int:
    """The step of a run's ``final/`` model (0 for any other model)."""
    return (rundir.final_step(path) or 0) if Path(path).is_dir() else 0


def _finish(
    config: RunConfig, run_dir: Path, started: float, before: float = 0.0, log=print, restarts: list | None = None
) -> RunSummary:
    """Plot the run, say which settings did nothing, write ``summary.json``; ``before``: the seconds of a
    resumed run's earlier segments; ``restarts``: the workers this segment restarted."""
    rows = read_metrics(run_dir / "metrics.jsonl")
    for line in outcome_warnings(config, rows):
        log(line)
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    acc_before, acc_after = (evals[0], evals[-1]) if evals else (math.nan, math.nan)
    if any("reward/mean" in r for r in rows):
        subtitle = (
            f"{config.algorithm.preset}, {config.sync.describe()}, lr {config.optim.lr:g}, "
            f"group {config.rollout.group_size}, {config.task.name}, model {config.model.path}, seed {config.seed}"
        )
        plot_run(rows, run_dir / "metrics.png", title=f"run {run_dir.name}", subtitle=subtitle)
    segment = time.perf_counter() - started
    _write_summary(run_dir, config, acc_before, acc_after, before + segment, segment, restarts or [])
    return RunSummary(run_dir, acc_before, acc_after, before + segment, config)


def _write_summary(
    run_dir: Path,
    config: RunConfig,
    before: float,
    after: float,
    seconds: float,
    segment: float | None = None,
    restarts: list[dict] | None = None,
) -> None:
    """``summary.json``, strict JSON (an accuracy that does not exist, as in mode=explore, is null, not NaN).
    ``seconds``: the whole run, every segment of a resumed one; ``segment_seconds``: this process's part;
    ``restarts``: the workers this process restarted (docs/runtime.md#self-healing-runs)."""

    def number(value: float) -> float | None:
        return None if math.isnan(value) else value

    atomic_write_json(
        run_dir / "summary.json",
        {
            "mode": config.mode,
            "eval_accuracy_before": number(before),
            "eval_accuracy_after": number(after),
            "steps": config.steps,
            "seconds": seconds,
            "segment_seconds": seconds if segment is None else segment,
            "restarts": restarts or [],
        },
        indent=2,
        allow_nan=False,
    )


__all__ = ["RunSummary", "make_run_dir", "run", "run_label"]
