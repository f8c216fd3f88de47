"""The parts every role's worker is built from: its clock, the sampling lock, loading a model and an engine, and a
frozen second model (the teacher's, the judge's: ``load_frozen``).

A worker is a plain object (``TrainerWorker``, ``ExplorerWorker``, ``Evaluator``); the backend runs each in
its own thread (local) or process (local processes, Ray) and calls its methods in submission order. Workers
load the model themselves from a path, so the same code runs in any process; the explorers then receive the
trainer's version-0 weights with their first batch, which also makes randomly initialised parts (LoRA
adapters) identical everywhere.

Every worker keeps a ``Clock``: busy seconds (inside a call) and idle seconds (between calls, waiting for
work or for its inputs), reported with each result so the driver can log them per step.

Sampling uses torch's global generator (the engines seed it per call), which threads share: every
``generate`` in this process therefore holds ``SAMPLING_LOCK``, as does model loading (LoRA initialisation
draws from it too). Training draws only from its own seeded generator, so it runs alongside generation.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from oprl import plugins
from oprl.errors import OprlError
from oprl.messages import FlatWeights
from oprl.models.loading import load_pretrained, quiet_transformers
from oprl.models.truncation import Sampling
from oprl.noise import stderr_kept
from oprl.rollout import ENGINES, Engine, Rollout
from oprl.rollout.base import capabilities_of, check_top_k

if TYPE_CHECKING:
    from oprl.config import RunConfig  # annotations only: FlatWeights travels where pydantic is absent

SAMPLING_LOCK = threading.RLock()


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a container or ``taskset`` narrows; all
    cores where the platform has no affinity)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def worker_threads(config: RunConfig) -> int:
    """torch intra-op threads per worker: configured, else the cores shared by trainer + explorers. The same
    in every mode, so that explore + train and eval reproduce a ``both`` run's numbers bit for bit (and the
    committed warm start, ``oprl.trainer.warmstart.ship``, is built with what ``oprl train`` gives it)."""
    if config.runtime.torch_threads:
        return config.runtime.torch_threads
    return max(1, available_cores() // (config.runtime.explorers + 1))


class Clock:
    """Busy and idle seconds of one worker since it started."""

    def __init__(self):
        self.busy = self.idle = 0.0
        self._last = time.perf_counter()

    @contextmanager
    def work(self):
        start = time.perf_counter()
        self.idle += start - self._last
        try:
            yield
        finally:
            self._last = time.perf_counter()
            self.busy += self._last - start

    def totals(self) -> dict[str, float]:
        return {"busy_s": self.busy, "idle_s": self.idle}


class LockedEngine:
    """An ``Engine`` whose ``generate`` holds ``SAMPLING_LOCK`` (see the module docstring)."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def generate(self, *args, **kwargs) -> Rollout:
        with SAMPLING_LOCK:
            return self.engine.generate(*args, **kwargs)

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self.engine.load_weights(weights)  # draws no random numbers: no lock

    def weights_changed(self) -> None:
        self.engine.weights_changed()

    def __getattr__(self, name: str):
        """The wrapped engine's settings and ``capabilities`` (``max_new_tokens``, ``sampling``: the agent
        endpoint reads them)."""
        return getattr(self.engine, name)


def load_model(config: RunConfig, path: str, dtype: str | None = None):
    """``(model, tokenizer)`` from ``path`` in ``dtype`` (None = model.dtype); seeded and locked so every worker
    builds the same weights."""
    quiet_transformers()
    with SAMPLING_LOCK:
        return load_pretrained(
            path,
            dtype=dtype or config.model.dtype,
            device=config.model.device,
            lora=config.model.lora,
            seed=config.seed,
        )


def make_engine(config: RunConfig, model, tokenizer, *, record_top_k: int = 0) -> LockedEngine:
    """The ``rollout.engine`` sampler over ``model``, behind the sampling lock, built with the rollouts'
    ``Sampling`` (``rollout.temperature``, ``rollout.top_k``, ``rollout.top_p``). ``prefix_reuse=`` and
    ``kv_cache_gb=`` go to engines that declare ``capabilities.prefix_reuse`` (``oprl.rollout.EngineCapabilities``),
    ``engine_process=`` to those that declare ``capabilities.engine_process``, ``lora_sync=`` and ``lora_slots=``
    (``lora_serving``) to those that declare more than one ``capabilities.lora_sync`` mode. ``record_top_k`` = K
    > 0 (the explorers': ``rollout.record_top_k``; evaluation and the trainer's engines record none): the engine
    records each sampled position's top K, refused in one line for one that declares no
    ``capabilities.top_logprobs``."""
    rollout = config.rollout
    engine = plugins.resolve("engine", rollout.engine, ENGINES, key="rollout.engine")
    options: dict[str, object] = {}
    if capabilities_of(engine).prefix_reuse:
        options |= {"kv_cache_gb": rollout.kv_cache_gb, "prefix_reuse": rollout.prefix_reuse}
    if capabilities_of(engine).engine_process:
        options |= {"engine_process": rollout.engine_process}
    serving = lora_serving(config, cuda=next(model.parameters()).device.type == "cuda")  # where the engine samples
    if serving is not None:
        modes = capabilities_of(engine).lora_sync
        if serving[0] not in modes:
            raise OprlError(
                f"model.lora_sync={serving[0]}: rollout.engine={rollout.engine} serves a LoRA policy as "
                f"{' or '.join(modes)} only; set model.lora_sync={modes[0]}"
            )
        if len(modes) > 1:
            options |= {"lora_sync": serving[0], "lora_slots": serving[1]}
    if record_top_k:  # the explorers' rollout.record_top_k; a plug-in engine without top log-probs never sees it
        check_top_k(engine, record_top_k)
        options |= {"record_top_k": record_top_k}
    sampling = Sampling.of(rollout)
    with stderr_kept():  # an engine's start prints third-party notices (oprl.noise): into workers.log
        return LockedEngine(engine(model, tokenizer, sampling=sampling, max_new_tokens=rollout.max_new_tokens,
                                   **options))  # fmt: skip


def lora_serving(config: RunConfig, cuda: bool | None = None) -> tuple[str, int] | None:
    """``(model.lora_sync, live policy versions)`` of a LoRA run on ``rollout.engine``, its unset mode resolved for a
    CUDA (``cuda``; None: model.device's) or CPU sampler; None for a full fine-tune
    (``oprl.config.sections.ModelConfig.lora_serving``: the rule the config check refuses by)."""
    return config.model.lora_serving(config.sync, config.rollout.engine, cuda)


def trainable_weights(model, *, to_cpu: bool) -> FlatWeights:
    """A copy of the weights that training changes: all of them, or only a LoRA policy's adapters (``lora_A``,
    ``lora_B`` of each adapted layer under peft's names; the frozen base never travels: ``oprl.models.adapters``)."""
    trainable = {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}
    return FlatWeights.copy_of(trainable, device="cpu" if to_cpu else None)


def frozen_source(path: str, student_path: str, key: str = "teacher.path") -> tuple[str, Path | None]:
    """``(the model to load, a checkpoint whose weights replace its weights, or None)`` for ``path``, the
    setting ``key`` (``teacher.path``, ``judge.path``: the name its errors give)."""
    from oprl.checkpoint.files import resolve_checkpoint  # pyarrow and friends: only where a second model loads

    if path == "tiny":
        return student_path, None
    local = Path(path).expanduser()
    if local.is_dir() and not (local / "config.json").is_file():
        if (local / "final" / "config.json").is_file():
            return str(local / "final"), None
        checkpoint = resolve_checkpoint(local)
        if checkpoint is None:
            raise OprlError(
                f"{key}: {path!r} is neither a model directory nor a run directory with final/ or "
                "checkpoints/ (give a run, a checkpoint step-N, a model directory, 'tiny' or a hub id)"
            )
        return student_path, checkpoint
    return path, None


def load_frozen(path: str, key: str, dtype: str, config: RunConfig, student_path: str):
    """``(model, tokenizer, source)``: the second model of setting ``key`` (the teacher, the judge) resolved by
    ``frozen_source`` (a run, a checkpoint, ``tiny`` or anything ``model.path`` takes), on ``model.device``
    in ``dtype``, frozen; every error is one line naming ``key``."""
    from oprl.checkpoint.files import load_checkpoint_weights

    quiet_transformers()
    source, checkpoint = frozen_source(path, student_path, key)
    try:
        with SAMPLING_LOCK:  # loading draws from the global generator, which sampling threads share
            model, tokenizer = load_pretrained(source, dtype=dtype, device=config.model.device, seed=config.seed)
    except OprlError as exc:  # load_pretrained names model.path; here the culprit is ``key``
        raise OprlError(str(exc).replace("model.path", key, 1)) from None
    if checkpoint is not None:
        try:
            load_checkpoint_weights(model, checkpoint)
        except Exception as exc:  # another architecture's tensors: missing keys, other shapes
            reason = " ".join(str(exc).split())[:200]
            raise OprlError(
                f"{key}: checkpoint {checkpoint} does not fit model.path's architecture "
                f"({type(exc).__name__}: {reason}); give its run's final/ directory instead"
            ) from None
    return model.eval().requires_grad_(False), tokenizer, source
