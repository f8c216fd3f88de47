"""A trainer of ``trainer.world_size`` ranks: one front with the trainer worker's methods, N rank processes.

The backend hosts ``ShardedTrainer`` where it would host the one-process trainer worker; the front starts the
ranks itself and forwards every call (train, weights, evaluate, save, restore, save_final) to all of them, since
each is a collective. Rank 0 answers (metrics, the gathered ``FlatWeights``); a rank that fails or dies stops
the others and the call raises one line naming it (``trainer rank 1 ...``), which the driver reports like any
worker failure.

Placement is the backend's (``Backend.rank_launcher``, handed to the front by ``run``): ``backend=local``
spawns each rank as a process of this machine (``processes.LocalRanks``; no torchrun); ``backend=ray``
creates each rank as a Ray actor in one placement group (``ray_backend.RayRanks``: one bundle per rank,
``runtime.gpus_per_trainer_rank`` GPUs each) and meets at rank 0's node address. A Ray cluster needs the run
directory on a filesystem every node sees: rank 0 writes ``final/``, every rank its checkpoint shard.

Evaluation and ``final/`` use a full unsharded replica on rank 0, built on first use and loaded from the
gathered weights (the same memory an explorer holds).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from oprl.algorithms.step import Carry
from oprl.backends.failure import process_died
from oprl.checkpoint.files import (
    SHARDS,
    load_carry,
    load_rng,
    read_json,
    save_carry,
    save_rng,
    save_schedule,
    write_json,
)
from oprl.config.run import check_trainer_device
from oprl.errors import OprlError
from oprl.trainer.distributed import DataParallel, gather_weights, init_process_group, load_sharded, save_sharded

if TYPE_CHECKING:
    from oprl.backends.base import RankLauncher
    from oprl.messages import TrainResult


def check_trainer_machine(config, gpus: int | None = None) -> None:
    """The trainer's rules that need this machine, as one-line errors (``gpus``: visible CUDA devices): the
    CUDA rules of model.device=auto, and enough GPUs for the ranks. Those the config decides alone are
    validators of ``RunConfig`` (``oprl.config``)."""
    t, device = config.trainer, config.model.device
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if device == "auto":
        check_trainer_device(config, cuda)
    if cuda and t.sharding != "none" and config.backend == "local":
        gpus = torch.cuda.device_count() if gpus is None else gpus
        if gpus < t.world_size:
            raise OprlError(
                f"trainer.world_size={t.world_size} on model.device={device} needs "
                f"{t.world_size} GPUs; this machine has {gpus}"
            )


def process_memory(pid: int | str = "self") -> dict[str, float]:
    """``{"peak_rss_gib", "rss_gib"}`` of process ``pid`` from ``/proc/<pid>/status`` (Linux): ``VmHWM`` is the
    peak since the process started (exec resets it; ``ru_maxrss`` of a spawned child starts at its parent's)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            fields[key] = int(value.split()[0]) / 2**20  # kB
    return {"peak_rss_gib": fields["VmHWM"], "rss_gib": fields["VmRSS"]}


def rank_threads(config) -> int:
    """torch intra-op threads per rank: configured, else the cores shared by the ranks and the explorers."""
    from oprl.worker_parts import available_cores

    size = config.trainer.world_size
    return config.runtime.torch_threads or max(1, available_cores() // (size + config.runtime.explorers))


class TrainerRank:
    """One rank: its own copy (or shard) of the policy and of AdamW, in a process of its own."""

    def __init__(self, config, model_path: str, rank: int, world_size: int):
        self.config, self.model_path, self.rank, self.world_size = config, model_path, rank, world_size
        self.replica: tuple[Any, Any] | None = None  # (model, engine) on rank 0
        self.weights_from = "model.path"

    def setup(self, address: str) -> bool:
        import torch.distributed as dist

        from oprl.models.loading import empty_model, resolve_device
        from oprl.trainer.role import build_trainer
        from oprl.worker_parts import load_model

        config, t = self.config, self.config.trainer
        device = resolve_device(config.model.device)
        if device.type == "cuda":
            device = torch.device("cuda", self.rank % torch.cuda.device_count())
        backend = ("nccl" if device.type == "cuda" else "gloo") if t.dist_backend == "auto" else t.dist_backend
        init_process_group(self.rank, self.world_size, address, backend, device)
        fsdp = t.sharding == "fsdp"
        # FSDP keeps float32 master weights: load float32 on the CPU, fully_shard moves each shard to the device.
        model_config = config.model.model_copy(
            update={"dtype": "float32", "device": "cpu"} if fsdp else {"device": str(device)}
        )
        if fsdp:
            # Only rank 0 reads the checkpoint; the others build the shapes on the meta device and receive their
            # shards from rank 0 in fully_shard's wrapping (distributed.fill_from_rank0): no full copy per rank.
            shape: list[Any] = [None]
            if self.rank == 0:
                self.model, self.tokenizer = load_model(
                    config.model_copy(update={"model": model_config}), self.model_path
                )
                shape = [(self.model.config, self.tokenizer.pad_token_id)]
            dist.broadcast_object_list(shape, src=0)
            hf_config, pad_id = shape[0]
            if self.rank != 0:
                self.model, self.tokenizer = empty_model(hf_config, lora=config.model.lora), None
                self.weights_from = "rank 0"
        else:
            self.model, self.tokenizer = load_model(config.model_copy(update={"model": model_config}), self.model_path)
            pad_id = self.tokenizer.pad_token_id
        compute = torch.bfloat16 if fsdp and config.model.dtype == "bfloat16" else None
        self.parallel = DataParallel(t.sharding, device=device, compute_dtype=compute)
        self.trainer = build_trainer(config, self.model, pad_id, self.parallel)
        return True

    def memory(self) -> dict[str, Any]:
        """This rank's peak and current resident memory (GiB, ``VmHWM``/``VmRSS``) and where its weights came
        from (``model.path``, or ``rank 0`` for fsdp ranks built on the meta device)."""
        return process_memory() | {"rank": self.rank, "weights_from": self.weights_from}

    def train(self, step: int, batch: list) -> dict[str, float]:
        if self.trainer.version != step - 1:
            raise RuntimeError(f"trainer holds version {self.trainer.version}, asked to train step {step}")
        return self.trainer.step(batch)

    def weights(self):
        """The full trainable weights in the explorers' dtype (rank 0), gathered parameter by parameter."""
        return gather_weights(self.model, getattr(torch, self.config.model.dtype), self.rank)

    def _full_replica(self):
        """Rank 0's unsharded copy holding the current weights (every rank joins the gathering)."""
        from oprl.tasks import build_task
        from oprl.worker_parts import load_model, make_engine

        weights = self.weights()
        if self.rank != 0:
            return None
        if self.replica is None:
            model, tokenizer = load_model(self.config, self.model_path)
            self.replica = model.eval(), make_engine(self.config, model, tokenizer)
            self.task = build_task(self.config.task)
        self.replica[1].load_weights(weights)  # the Engine protocol, as an explorer loads a snapshot
        return self.replica

    def evaluate(self, step: int) -> dict[str, float] | None:
        from oprl.episodes.evaluation import evaluation_row

        replica = self._full_replica()
        if replica is None:
            return None
        return evaluation_row(self.config, replica[1], self.task, self.tokenizer, step)

    def save(self, directory: str) -> int:
        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        save_sharded(self.model, self.trainer.optimizer, root / SHARDS)
        if self.rank == 0:
            save_rng(root)
            save_carry(root, self.trainer.carry.tensors())  # every rank computes the same carry
            save_schedule(root, self.trainer.lr_slot, self.trainer.schedule)  # and the same schedule position
            write_json(
                root / "trainer.json",
                {
                    "version": self.trainer.version,
                    "world_size": self.world_size,
                    "sharding": self.config.trainer.sharding,
                },
            )
        return self.trainer.version

    def restore(self, directory: str) -> int:
        from oprl.trainer.role import restore_schedule

        root = Path(directory)
        if not (root / SHARDS).is_dir():
            raise OprlError(
                f"resume=true: {root} holds no sharded trainer state ({SHARDS}/); it was written "
                "with trainer.sharding=none, resume with that"
            )
        load_sharded(self.model, self.trainer.optimizer, root / SHARDS)
        load_rng(root)
        self.trainer.carry = load_carry(root, Carry.of)
        self.trainer.version = read_json(root / "trainer.json")["version"]
        self.trainer.lr_slot = restore_schedule(root, self.trainer)
        return self.trainer.version

    def save_final(self, directory: str) -> None:
        replica = self._full_replica()
        if replica is not None:
            replica[0].save_pretrained(directory)
            self.tokenizer.save_pretrained(directory)


RANK_GRACE_S = 5.0
"""Seconds the front waits, after one rank's call failed, for the others' to settle (see ``_gather``)."""


class RankLost(RuntimeError):
    """A trainer rank's process died (killed, out of memory, a lost node), rather than raising: the driver then
    restarts every worker from the newest checkpoint, as when a single-process trainer dies
    (docs/runtime.md#self-healing-runs)."""


class ShardedTrainer:
    """The trainer worker of a run with ``trainer.sharding`` ddp/fsdp: fans every call out to the ranks."""

    def __init__(self, config, model_path: str, launch: RankLauncher | None = None):
        """``launch``: the backend's rank launcher (``Backend.rank_launcher``); local processes by default."""
        from oprl.backends.processes import LocalRanks
        from oprl.worker_parts import Clock

        self.clock = Clock()
        self.version = 0
        size = config.trainer.world_size
        launcher: RankLauncher = launch or LocalRanks(rank_threads(config))
        self.ranks = list(launcher("trainer-rank", TrainerRank, [(config, model_path, r, size) for r in range(size)]))
        try:
            self._gather([r.ready for r in self.ranks], "while starting")
            address = self._gather([self.ranks[0].rendezvous()], "while starting")[0]
            self._all(TrainerRank.setup, "while starting", address)
        except BaseException:
            self.stop()
            raise

    def _all(self, verb: Callable[..., Any], doing: str, *args: Any) -> list:
        """Every rank's result of ``verb(*args)``: a method of ``TrainerRank``, sent to each rank by its name."""
        if getattr(TrainerRank, verb.__name__, None) is not verb:
            raise TypeError(f"{verb.__qualname__} is not a method of TrainerRank")
        return self._gather([r.call(verb.__name__, *args) for r in self.ranks], doing)

    def _gather(self, futures: list, doing: str) -> list:
        """The results of ``futures`` (one per rank, in rank order); the first failure stops every rank."""
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_EXCEPTION)
            failed = [f for f in done if f.exception() is not None]
            if failed:
                # A rank that dies takes its peers' collectives with it ("Connection reset by peer"), and those
                # errors can arrive first: give the others a moment, and name the death when there is one.
                wait(pending, timeout=RANK_GRACE_S)
                failed = [f for f in futures if f.done() and f.exception() is not None]
                failed.sort(key=lambda f: not process_died(f.exception()))
                rank = futures.index(failed[0])
                self.stop()
                exc = failed[0].exception()
                text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                if type(exc).__name__ == "OprlError" or getattr(exc, "kind", "") == "OprlError":
                    raise OprlError(getattr(exc, "message", text))
                if process_died(exc):
                    raise RankLost(f"trainer rank {rank} died {doing}: {text}")
                raise RuntimeError(f"trainer rank {rank} failed {doing}: {text}")
        return [f.result() for f in futures]

    def release(self) -> None:
        """The run is over (the backend's serving loop ended): end the rank processes."""
        self.stop()

    def stop(self) -> None:
        for rank in self.ranks:
            rank.kill()

    def ping(self) -> int:
        return self.version

    def train(self, step: int, batch: list) -> TrainResult:
        from oprl.trainer.role import train_result

        with self.clock.work():
            metrics = self._all(TrainerRank.train, f"while training step {step}", step, batch)[0]
        self.version = step
        return train_result(metrics, step, batch, self.clock)

    def weights(self):
        with self.clock.work():
            return self._all(TrainerRank.weights, f"while gathering version {self.version}")[0]

    def evaluate(self, step: int) -> dict[str, float]:
        with self.clock.work():
            return self._all(TrainerRank.evaluate, f"while evaluating step {step}", step)[0]

    def save(self, directory: str) -> int:
        with self.clock.work():
            return self._all(TrainerRank.save, "while checkpointing", directory)[0]

    def restore(self, directory: str) -> int:
        self.version = self._all(TrainerRank.restore, "while resuming", directory)[0]
        return self.version

    def save_final(self, directory: str) -> None:
        with self.clock.work():
            self._all(TrainerRank.save_final, "while saving the final model", directory)

    def memory(self) -> list[dict[str, Any]]:
        """``TrainerRank.memory`` of every rank, in rank order."""
        return self._all(TrainerRank.memory, "while reading its memory")
