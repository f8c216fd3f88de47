"""The workers a backend hosts: a trainer and explorers, each owning its own copy of the policy.

A worker is a plain object; the backend runs each in its own thread (local) or process (Ray) and calls its
methods in submission order. Workers load the model themselves from a path, so the same code runs in any
process; the explorers then receive the trainer's version-0 weights with their first batch, which also makes
randomly initialised parts (LoRA adapters) identical everywhere.

Every worker keeps a ``Clock``: busy seconds (inside a call) and idle seconds (between calls, waiting for
work or for its inputs), reported with each result so the driver can log them per step.

Sampling uses torch's global generator (the engines seed it per call), which threads share: every
``generate`` in this process therefore holds ``SAMPLING_LOCK``, as does model loading (LoRA initialisation
draws from it too). Training draws only from its own seeded generator, so it runs alongside generation.
"""

from __future__ import annotations

import math
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import load_model as load_module_weights
from safetensors.torch import save_model as save_module_weights

from oprl.config import RunConfig, algorithm_settings
from oprl.models.loading import load_pretrained
from oprl.rollout import ENGINES
from oprl.runtime.checkpoint import load_optimizer, load_rng, read_json, save_optimizer, save_rng, write_json
from oprl.runtime.evaluate import evaluate
from oprl.runtime.experience import Experience
from oprl.runtime.explorer import Explorer
from oprl.runtime.trainer import Trainer
from oprl.tasks import build_task

SAMPLING_LOCK = threading.RLock()
EVAL_SEED_OFFSET = 7_777_777


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
    """An engine whose ``generate`` holds ``SAMPLING_LOCK`` (see the module docstring)."""

    def __init__(self, engine):
        self.engine = engine

    def generate(self, *args, **kwargs):
        with SAMPLING_LOCK:
            return self.engine.generate(*args, **kwargs)


def quiet_transformers() -> None:
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()


def load_model(config: RunConfig, path: str, dtype: str | None = None):
    """``(model, tokenizer)`` from ``path`` in ``dtype`` (None = model.dtype); seeded and locked so every worker
    builds the same weights."""
    quiet_transformers()
    with SAMPLING_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        return load_pretrained(path, dtype=dtype or config.model.dtype, device=config.model.device, lora=config.model.lora)


def make_engine(config: RunConfig, model, tokenizer) -> LockedEngine:
    rollout = config.rollout
    options = {"kv_cache_gb": rollout.kv_cache_gb} if rollout.engine == "vllm" else {}
    return LockedEngine(ENGINES[rollout.engine](
        model, tokenizer, temperature=rollout.temperature, top_p=rollout.top_p, max_new_tokens=rollout.max_new_tokens,
        **options,
    ))


def trainable_weights(model, *, to_cpu: bool) -> "FlatWeights":
    """A copy of the weights that training changes (all of them, or only LoRA adapters)."""
    trainable = {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}
    return FlatWeights.copy_of(trainable, device="cpu" if to_cpu else None)


class FlatWeights(dict):
    """``name -> tensor``, every tensor a view of one flat buffer per dtype; pickles as those buffers plus
    the layout. Through a process pipe that is one shared-memory segment per dtype instead of one per tensor
    (torch hands each segment's file descriptor over with a round trip of its own: ~15 ms per snapshot of the
    20-tensor tiny model, on the critical path of every overlapped step)."""

    @classmethod
    def copy_of(cls, tensors: dict[str, torch.Tensor], device=None) -> "FlatWeights":
        layout, sizes = [], {}
        for name, tensor in tensors.items():
            layout.append((name, tensor.dtype, sizes.get(tensor.dtype, 0), tuple(tensor.shape)))
            sizes[tensor.dtype] = sizes.get(tensor.dtype, 0) + tensor.numel()
        first = next(iter(tensors.values()), None)
        device = device or (first.device if first is not None else "cpu")
        buffers = {dtype: torch.empty(size, dtype=dtype, device=device) for dtype, size in sizes.items()}
        weights = cls.from_buffers(buffers, layout)
        for name, tensor in tensors.items():
            weights[name].copy_(tensor)
        return weights

    @classmethod
    def from_buffers(cls, buffers: dict, layout: list) -> "FlatWeights":
        weights = cls(
            (name, buffers[dtype][offset : offset + math.prod(shape)].view(shape))
            for name, dtype, offset, shape in layout
        )
        weights.buffers, weights.layout = buffers, layout
        return weights

    def __reduce__(self):
        return FlatWeights.from_buffers, (self.buffers, self.layout)


def batch_summary(experiences: list[Experience]) -> dict[str, float]:
    """Explorer-side metrics of one generated batch (mode=explore rows)."""
    n = len(experiences)
    rewards = [e.reward for e in experiences]
    mean = sum(rewards) / n
    out = {
        "reward/mean": mean,
        "reward/std": (sum((r - mean) ** 2 for r in rewards) / n) ** 0.5,
        "response/length_mean": sum(len(e.response_ids) for e in experiences) / n,
        "response/truncated_frac": sum(e.truncated for e in experiences) / n,
        "response/tokens": float(sum(len(e.response_ids) for e in experiences)),
    }
    for name in experiences[0].reward_components:
        out[f"reward/{name}"] = sum(e.reward_components.get(name, 0.0) for e in experiences) / n
    return out


class ExplorerWorker:
    def __init__(self, config: RunConfig, model_path: str, index: int):
        self.clock = Clock()
        self.index = index
        task = build_task(config.task)
        self.model, tokenizer = load_model(config, model_path, dtype=config.rollout.dtype)  # the sampler's precision
        self.explorer = Explorer(
            task, tokenizer, make_engine(config, self.model, tokenizer),
            prompts_per_step=config.rollout.prompts_per_step, group_size=config.rollout.group_size, seed=config.seed,
            max_turns=config.rollout.max_turns, max_episode_tokens=config.rollout.max_episode_tokens,
        )

    def ping(self) -> int:
        return self.index

    def explore(self, batch: int, version: int, weights: dict | None = None):
        """``(experiences, info)`` for batch ``batch``, loading ``weights`` (version ``version``) first if given."""
        with self.clock.work():
            start = time.perf_counter()
            if weights is not None:
                self.model.load_state_dict(weights, strict=False)
            synced = time.perf_counter()
            experiences, timing = self.explorer.explore(batch, version)
            for exp in experiences:
                exp.extra["explorer"] = self.index
        info = timing | {"sync_s": synced - start, "explorer": self.index, "batch": batch, "version": version}
        info["summary"] = batch_summary(experiences)
        return experiences, info | {"clock": self.clock.totals()}


class TrainerWorker:
    def __init__(self, config: RunConfig, model_path: str, cpu_snapshots: bool = False):
        self.clock = Clock()
        self.config = config
        self.cpu_snapshots = cpu_snapshots
        self.task = build_task(config.task)
        self.model, self.tokenizer = load_model(config, model_path)
        self.engine = make_engine(config, self.model, self.tokenizer)
        algo = config.algorithm
        self.trainer = Trainer(
            self.model, pad_id=self.tokenizer.pad_token_id, settings=algorithm_settings(config), optim=config.optim,
            sampling_temperature=config.rollout.temperature, max_response_tokens=config.rollout.max_new_tokens,
            kl_coef=algo.kl_coef, kl_estimator=algo.kl_estimator, entropy_coef=algo.entropy_coef, seed=config.seed,
            log_ref_kl_every=algo.log_ref_kl_every,
        )

    def ping(self) -> int:
        return self.trainer.version

    def train(self, step: int, batch: list[Experience]) -> dict[str, float]:
        if self.trainer.version != step - 1:
            raise RuntimeError(f"trainer holds version {self.trainer.version}, asked to train step {step}")
        with self.clock.work():
            metrics = self.trainer.step(batch)
        clock = self.clock.totals()
        return metrics | {"perf/trainer_busy_total_s": clock["busy_s"], "perf/trainer_idle_total_s": clock["idle_s"]}

    def weights(self) -> dict[str, torch.Tensor]:
        with self.clock.work():
            return trainable_weights(self.model, to_cpu=self.cpu_snapshots)

    def evaluate(self, step: int) -> dict[str, float]:
        cfg = self.config
        with self.clock.work():
            start = time.perf_counter()
            result = evaluate(
                self.engine, self.task, self.tokenizer, num_problems=cfg.eval.num_problems,
                temperature=cfg.eval.temperature, top_p=cfg.eval.top_p, batch_size=cfg.eval.batch_size,
                max_turns=cfg.rollout.max_turns, max_episode_tokens=cfg.rollout.max_episode_tokens,
                seed=cfg.seed * 1_000_003 + EVAL_SEED_OFFSET + step if cfg.eval.seed is None else cfg.eval.seed,
            )
        return {f"eval/{k}": v for k, v in result.items()} | {"perf/eval_s": time.perf_counter() - start}

    def save(self, directory: str) -> int:
        """Model, optimizer, RNG and version into ``directory`` (part of a checkpoint)."""
        with self.clock.work():
            root = Path(directory)
            root.mkdir(parents=True, exist_ok=True)
            save_module_weights(self.model, str(root / "model.safetensors"))
            save_optimizer(self.trainer.optimizer, root)
            save_rng(root)
            write_json(root / "trainer.json", {"version": self.trainer.version})
        return self.trainer.version

    def restore(self, directory: str) -> int:
        root = Path(directory)
        load_module_weights(self.model, str(root / "model.safetensors"))
        load_optimizer(self.trainer.optimizer, root)
        load_rng(root)
        self.trainer.version = read_json(root / "trainer.json")["version"]
        return self.trainer.version

    def load_checkpoint(self, checkpoint: str) -> int:
        """Only the weights of a checkpoint (mode=eval); returns its step."""
        return load_checkpoint_weights(self.model, checkpoint)

    def save_final(self, directory: str) -> None:
        """The trained model as a Hugging Face directory (``from_pretrained`` loads it)."""
        with self.clock.work():
            self.model.save_pretrained(directory)
            self.tokenizer.save_pretrained(directory)


def load_checkpoint_weights(model, checkpoint: str) -> int:
    """Load a checkpoint's trainer weights into ``model`` (mode=eval); returns its step."""
    root = Path(checkpoint)
    load_module_weights(model, str(root / "trainer" / "model.safetensors"))
    return read_json(root / "state.json")["step"]
