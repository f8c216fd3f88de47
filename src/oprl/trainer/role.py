"""The trainer role: how a run's config builds the ``Trainer`` (``build_trainer``), and ``TrainerWorker``, the
worker the driver calls (train a step, hand out weights, evaluate, save and restore its checkpoint state: model,
optimizer, version, the algorithm's carry and the learning-rate schedule's position). The step itself is
``trainer.py``'s; the sharded trainer (``ranks.py``) uses the same builders."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from oprl.algorithms.lr_schedule import LrSchedule
from oprl.algorithms.step import Carry
from oprl.checkpoint.files import (
    load_carry,
    load_schedule,
    load_trainer_state,
    save_carry,
    save_schedule,
    save_trainer_state,
)
from oprl.messages import Experience, TrainResult
from oprl.models.truncation import Sampling
from oprl.trainer.distributed import SingleProcess
from oprl.trainer.trainer import Trainer
from oprl.worker_parts import Clock, load_model, make_engine, trainable_weights

if TYPE_CHECKING:
    from oprl.config import RunConfig

log = logging.getLogger("oprl.trainer")


def train_result(metrics: dict[str, float], version: int, batch: list[Experience], clock: Clock) -> TrainResult:
    """The worker's report of a step: ``metrics`` (columns only), the version reached, the newest version a
    response started with, the worker's clock totals."""
    totals = clock.totals()
    start_version = max(e.policy_version for e in batch)
    return TrainResult(metrics, version, start_version, busy_s=totals["busy_s"], idle_s=totals["idle_s"])


def restore_schedule(directory: str | Path, trainer: Trainer) -> int:
    """The schedule's slot saved in checkpoint ``directory`` (``version * epochs * mini_batches`` for a checkpoint
    from before schedules were saved: every such run had the constant rate). A resume that changed the run's
    length (``steps``) goes on from that slot on the schedule over the new length, and says so in one line."""
    saved = load_schedule(directory)
    if saved is None:
        return trainer.version * trainer.optim.epochs * trainer.optim.mini_batches
    was = LrSchedule(saved["kind"], saved["warmup"], saved["total"])
    slot = saved["slot"]
    if was != trainer.schedule:
        log.warning("optim.lr_schedule: the run now has %d updates (was %d): from update %d the rate follows %s "
                    "(%.3g, was %.3g on the old schedule)", trainer.schedule.total, was.total, slot,
                    trainer.schedule.describe(), trainer.optim.lr * trainer.schedule.factor(slot),
                    trainer.optim.lr * was.factor(slot))  # fmt: skip
    return slot


def build_trainer(config: RunConfig, model, pad_id: int, parallel: SingleProcess | None = None) -> Trainer:
    """The ``Trainer`` of ``config`` around ``model`` (one process, or one rank of ``parallel``)."""
    from oprl.config import algorithm_of
    from oprl.models.loading import resolve_device
    from oprl.models.precision import autocast_dtype

    return Trainer(
        model,
        pad_id=pad_id,
        method=algorithm_of(config),
        optim=config.optim,
        sampling=Sampling.of(config.rollout),
        seed=config.seed,
        parallel=parallel,
        activation_checkpointing=config.trainer.activation_checkpointing,
        autocast=autocast_dtype(config.trainer.autocast, resolve_device(config.model.device)),
        max_token_lag=config.sync.max_token_lag,
        schedule=LrSchedule.of(config.optim, config.steps),
    )


class TrainerWorker:
    """The trainer role: owns the policy being trained, its optimizer and version; evaluates that policy."""

    def __init__(self, config: RunConfig, model_path: str, cpu_snapshots: bool = False):
        from oprl.tasks import build_task

        self.clock = Clock()
        self.config = config
        self.cpu_snapshots = cpu_snapshots
        self.task = build_task(config.task)
        self.model, self.tokenizer = load_model(config, model_path)
        self.engine = make_engine(config, self.model, self.tokenizer)
        self.trainer = build_trainer(config, self.model, self.tokenizer.pad_token_id)

    def ping(self) -> int:
        return self.trainer.version

    def train(self, step: int, batch: list[Experience]) -> TrainResult:
        if self.trainer.version != step - 1:
            raise RuntimeError(f"trainer holds version {self.trainer.version}, asked to train step {step}")
        with self.clock.work():
            metrics = self.trainer.step(batch)
        return train_result(metrics, self.trainer.version, batch, self.clock)

    def weights(self) -> dict[str, torch.Tensor]:
        with self.clock.work():
            return trainable_weights(self.model, to_cpu=self.cpu_snapshots)

    def evaluate(self, step: int) -> dict[str, float]:
        with self.clock.work():
            from oprl.episodes.evaluation import evaluation_row

            return evaluation_row(self.config, self.engine, self.task, self.tokenizer, step)

    def save(self, directory: str) -> int:
        """Model, optimizer, RNG and version into ``directory`` (part of a checkpoint)."""
        with self.clock.work():
            save_trainer_state(directory, self.model, self.trainer.optimizer, self.trainer.version)
            save_carry(directory, self.trainer.carry.tensors())
            save_schedule(directory, self.trainer.lr_slot, self.trainer.schedule)
        return self.trainer.version

    def restore(self, directory: str) -> int:
        self.trainer.version = load_trainer_state(directory, self.model, self.trainer.optimizer)
        self.trainer.carry = load_carry(directory, Carry.of)
        self.trainer.lr_slot = restore_schedule(directory, self.trainer)
        return self.trainer.version

    def save_final(self, directory: str) -> None:
        """The trained model as a Hugging Face directory (``from_pretrained`` loads it)."""
        with self.clock.work():
            self.model.save_pretrained(directory)
            self.tokenizer.save_pretrained(directory)
