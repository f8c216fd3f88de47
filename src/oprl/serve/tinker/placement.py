"""Placement: every model of the Tinker server in a worker of oprl's backends, the ones ``oprl train`` places its
trainer and explorers with (``oprl.backends``): ``oprl serve tinker --workers processes`` (a spawned process of
this machine per model) or ``--workers ray`` (a Ray actor per model, on a local instance or a cluster, with
``--gpus-per-model`` GPUs each).

The server keeps the HTTP side, the sessions and the order of each model's requests (``app.py``); a worker holds
one model and computes for it. Each training model (a TrainingClient's, with its weight snapshots and the
sampling clients made from them) gets a worker of its own; a sampling client of a saved checkpoint or of a base
model shares a worker with the other sampling clients of the same weights. Inside a worker the computation is
the in-process server's (``ModelHost`` wraps a ``TinkerModels`` holding that one model), so a placed model
computes the numbers an in-process one does (tested); what changes is that models in different workers compute
at once (each has a lane of its own in ``app.py``) and that on Ray they sit where the GPUs are.

What crosses to a worker are ids, the decoded request (``records.py``'s plain data) and the loss spec; what comes
back are plain results too (per-datum arrays and metrics, sampled sequences), which the server encodes for the SDK
(``wire.py``, on the HTTP side): a worker's modules import neither the SDK nor protobuf, fastapi or pydantic, so a GPU
machine that hosts workers needs none of them. A ``UserError`` raised in a worker comes back as one (a 4xx-class
failed future); a worker whose process died fails its model's requests (``internal error``) and the model is gone:
the client starts again from its ``save_state``. Checkpoints (``--state-dir``) must be on a filesystem the workers
see (the same machine, or a shared one on a Ray cluster: the rule of ``oprl train``'s run directory).
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from oprl.errors import OprlError
from oprl.serve.tinker import checkpoints
from oprl.serve.tinker.backend import COMPUTE_LANE, ModelTable, TinkerModels
from oprl.serve.tinker.errors import UserError, WireError
from oprl.serve.tinker.losses import LossError, LossSpec
from oprl.serve.tinker.models import Sampler
from oprl.serve.tinker.records import ForwardBackward, ForwardOutput, Sampled

USER_ERRORS = {"UserError": UserError, "LossError": LossError, "WireError": WireError, "OprlError": OprlError}
"""The exception types a worker raises for a request the client must fix, by name (the processes backend sends
back a type's name and message)."""


class ModelHost:
    """The worker: a ``TinkerModels`` of its own that holds one base model's models, addressed by id (what
    travels between processes). ``directory`` is already resolved by the server, so a worker never builds the
    tiny model or converts a GGUF file itself."""

    def __init__(self, base_model: str, directory: str, state_dir: str, device: str):
        table = ModelTable({base_model: directory}, [], device)
        table.directories[base_model] = directory
        self.models = TinkerModels(table, Path(state_dir), device)

    def create(self, model_id: str, owner: str, base_model: str, lora: dict[str, Any]) -> dict[str, Any]:
        policy = self.models.create_policy(model_id, owner, base_model, lora)
        return {"lora": policy.lora, "info": self.models.info(policy)}

    def create_from_checkpoint(self, model_id: str, owner: str, path: str, optimizer: bool) -> dict[str, Any]:
        policy = self.models.create_from_checkpoint(model_id, owner, path, optimizer, None)
        return {"lora": policy.lora, "info": self.models.info(policy)}

    def forward_backward(self, model_id: str, request: ForwardBackward, spec: LossSpec) -> ForwardOutput:
        return self.models.forward_backward(self.models.policies[model_id], request, spec)

    def optim_step(self, model_id: str, params: dict[str, Any]) -> dict[str, Any]:
        return self.models.optim_step(self.models.policies[model_id], params)

    def save(self, model_id: str, kind: str, name: str, optimizer: bool, overwrite: bool) -> str:
        return self.models.save(self.models.policies[model_id], kind, name, optimizer, overwrite)

    def load(self, model_id: str, path: str, optimizer: bool) -> None:
        self.models.load(self.models.policies[model_id], path, optimizer)

    def version(self, model_id: str) -> int:
        """The model's optimizer-step count (what its snapshots are labelled with)."""
        return self.models.policies[model_id].version

    def snapshot_sampler(self, model_id: str, sampler_id: str) -> None:
        self.models.snapshot_sampler(self.models.policies[model_id], sampler_id)

    def path_sampler(self, sampler_id: str, owner: str, path: str) -> None:
        self.models.path_sampler(sampler_id, owner, path)

    def base_sampler(self, sampler_id: str, owner: str, base_model: str) -> None:
        self.models.base_sampler(sampler_id, owner, base_model)

    def sample(self, sampler_id: str, requests: list[dict[str, Any]]) -> list[Sampled | UserError]:
        return self.models.sample(self.models.samplers[sampler_id], requests)


@dataclass
class PlacedPolicy:
    """The server's record of a training model that lives in a worker: whose it is and how to reach it."""

    model_id: str
    owner: str
    base_model: str
    lora: dict[str, Any]
    info: dict[str, Any]
    home: str
    """The key of its worker in ``PlacedModels.homes`` (and of its lane in ``app.py``)."""
    extra: dict[str, Any] = field(default_factory=dict)


class PlacedModels(TinkerModels):
    """``TinkerModels``' interface (what ``app.py`` calls) over models placed on a backend's workers: the
    computing methods forward to the model's worker and wait for its answer, on the lane of that worker."""

    def __init__(
        self,
        table: ModelTable,
        state_dir: Path,
        device: str,
        placement,
        *,
        gpus: float = 0.0,
        threads: int | None = None,
    ):
        super().__init__(table, state_dir, device)
        self.placement = placement
        """An ``oprl.backends`` backend (``LocalBackend("processes")``, ``RayBackend``)."""
        self.gpus = gpus
        self.threads = threads
        self.homes: dict[str, Any] = {}  # home key -> the backend's actor
        self.count = itertools.count()
        self.sampler_homes: dict[str, str] = {}  # sampler id -> home key
        self.registered: set[str] = set()  # sampler ids their worker knows
        self.pending: dict[str, tuple[str, tuple, str]] = {}  # sampler id -> (worker method, args, base model)
        # Lanes call in from their own threads: the records and the (once) resolution of model directories are
        # guarded; a worker's computation is waited for outside the lock.
        self.lock = threading.RLock()

    # ---- workers -------------------------------------------------------------------------------------------

    def _start(self, home: str, base_model: str) -> None:
        """A worker for ``home`` holding ``base_model`` (built before this returns; its build error raised)."""
        with self.lock:
            directory = self.table.directory(base_model)  # resolved here: the tiny model is built once, here
            device = self._device(next(self.count))
        # Ray: the actors reserve no CPU (the GPUs asked for place them; CPU-only models share the CPUs);
        # local: a process of its own (compute=True).
        actor = self.placement.start(
            f"tinker {home}", ModelHost, base_model, directory, str(self.state_dir), device,
            threads=self.threads, gpus=self.gpus, compute=self.placement.name != "ray",
        )  # fmt: skip
        try:
            self.placement.wait_ready(actor)
        except BaseException as exc:
            self._stop([actor])
            raise _unwrapped(exc) from None
        with self.lock:
            self.homes[home] = actor

    def _device(self, index: int) -> str:
        """The device of the ``index``-th worker: local worker processes see every GPU, so they take them in
        turn; a Ray actor sees the ones Ray gave it (its first); CPUs are shared."""
        if not self.device.startswith("cuda") or self.placement.name == "ray":
            return self.device
        import torch

        count = torch.cuda.device_count()
        return f"cuda:{index % count}" if count > 1 else self.device

    def _call(self, home: str, method: str, *args):
        with self.lock:
            actor = self.homes.get(home)
        if actor is None:
            raise UserError(f"model_id: the model of {home!r} was closed")
        try:
            return self.placement.get(actor.call(method, *args))
        except BaseException as exc:
            raise _unwrapped(exc) from None

    def home_of(self, ident: str) -> str:
        """Training models and their snapshot samplers: the model's worker (the model id); samplers of a file or a
        base model: their worker; anything else (closing sessions): the server's own lane."""
        with self.lock:
            if ident in self.sampler_homes:
                return self.sampler_homes[ident]
        if ident in self.policies or ":train:" in ident:  # a model being created has no record yet
            return ident
        return COMPUTE_LANE

    def shutdown(self) -> None:
        """Stop every worker (and the Ray instance the backend started, if it did)."""
        with self.lock:
            actors = list(self.homes.values())
            self.homes.clear()
        self.placement.shutdown(actors)

    def _stop(self, actors: list) -> None:
        """Stop some workers while the server goes on: ``Backend.shutdown`` would also end the Ray instance the
        backend started, so on Ray each actor is asked to exit alone (``__ray_terminate__``, the method Ray adds to
        every actor class: it exits after the calls queued before it; only ``backends/ray_backend.py`` imports
        ray)."""
        if self.placement.name == "ray":
            for actor in actors:
                actor.handle.__ray_terminate__.remote()
        else:
            self.placement.shutdown(actors)

    def _record(self, policy: PlacedPolicy) -> PlacedPolicy:
        with self.lock:
            self.policies[policy.model_id] = policy  # type: ignore[assignment]  # stands in for a Policy: the attributes the table reads
        return policy

    # ---- training models -----------------------------------------------------------------------------------

    def create_policy(self, model_id: str, owner: str, base_model: str, lora: dict[str, Any]):
        self.table.check(base_model)
        self._start(model_id, base_model)
        made = self._made(model_id, "create", model_id, owner, base_model, lora)
        return self._record(PlacedPolicy(model_id, owner, base_model, made["lora"], made["info"], model_id))

    def _made(self, home: str, method: str, *args) -> dict[str, Any]:
        """The new worker's answer to its creating call; a failed one stops the worker (nothing else uses it)."""
        try:
            return self._call(home, method, *args)
        except BaseException:
            with self.lock:
                actor = self.homes.pop(home)
            self._stop([actor])
            raise

    def create_from_checkpoint(self, model_id: str, owner: str, path: str, optimizer: bool, base: str | None):
        _, meta = self.checkpoint(path)
        if base is not None and base != meta["base_model"]:
            raise UserError(f"base_model: {base!r} differs from the checkpoint's {meta['base_model']!r}")
        self._start(model_id, meta["base_model"])
        made = self._made(model_id, "create_from_checkpoint", model_id, owner, path, optimizer)
        return self._record(PlacedPolicy(model_id, owner, meta["base_model"], made["lora"], made["info"], model_id))

    def info(self, policy) -> dict[str, Any]:
        return policy.info  # known since creation: get_info answers without waiting for the worker

    def forward_backward(self, policy, request: ForwardBackward, spec: LossSpec) -> ForwardOutput:
        return self._call(policy.home, "forward_backward", policy.model_id, request, spec)

    def optim_step(self, policy, params: dict[str, Any]) -> dict[str, Any]:
        return self._call(policy.home, "optim_step", policy.model_id, params)

    def save(self, policy, kind: str, name: str, optimizer: bool, overwrite: bool = True) -> str:
        return self._call(policy.home, "save", policy.model_id, kind, name, optimizer, overwrite)

    def load(self, policy, path: str, optimizer: bool) -> None:
        self.checkpoint(path)  # a bad path is the client's error before the worker is asked
        self._call(policy.home, "load", policy.model_id, path, optimizer)

    def snapshot_sampler(self, policy, sampler_id: str) -> Sampler:
        self._call(policy.home, "snapshot_sampler", policy.model_id, sampler_id)
        sampler = Sampler(sampler_id, policy.owner, policy.base_model, policy.model_id)
        with self.lock:
            self.samplers[sampler_id] = sampler
            self.sampler_homes[sampler_id] = policy.home
            self.registered.add(sampler_id)
        return sampler

    serves_inflight = False
    """An in-flight batch keeps its decoding (KV cache, generators) between lane turns; a worker would have to hold
    it across calls, which ``ModelHost`` does not: ``kind="inflight"`` is refused with ``--workers``."""

    # ---- sampling-only models: one worker per base model, LoRA base and shape, or full checkpoint -----------

    def path_sampler(self, sampler_id: str, owner: str, path: str) -> Sampler:
        _, meta = self.checkpoint(path, "model_path")
        return self._shared(checkpoints.host_key(path, meta), meta["base_model"], Sampler(sampler_id, owner,
                            meta["base_model"], model_path=path), "path_sampler", sampler_id, owner, path)  # fmt: skip

    def base_sampler(self, sampler_id: str, owner: str, base_model: str) -> Sampler:
        self.table.directory(base_model)  # an unknown name fails now, not at the first sample
        sampler = Sampler(sampler_id, owner, base_model)
        return self._shared(f"base:{base_model}", base_model, sampler, "base_sampler", sampler_id, owner, base_model)

    def _shared(self, home: str, base_model: str, sampler: Sampler, method: str, *args) -> Sampler:
        """Record ``sampler`` for the worker of ``home``; the worker starts and learns of it at the first sample,
        on its lane (these run on a route: starting a process there would stall every other request)."""
        with self.lock:
            self.samplers[sampler.sampler_id] = sampler
            self.sampler_homes[sampler.sampler_id] = home
            self.pending[sampler.sampler_id] = (method, args, base_model)
        return sampler

    def sample(self, sampler: Sampler, requests: list[dict[str, Any]]) -> list[Sampled | UserError]:
        home = self.sampler_homes[sampler.sampler_id]
        if sampler.policy_id is not None and sampler.policy_id not in self.policies:
            raise UserError(f"sampling_session_id: the model {sampler.policy_id} of this sampler was closed")
        if sampler.sampler_id not in self.registered:  # a sampler of a file or a base model, first sample
            method, args, base_model = self.pending[sampler.sampler_id]
            if home not in self.homes:
                self._start(home, base_model)
            self._call(home, method, *args)
            with self.lock:
                self.registered.add(sampler.sampler_id)
                self.pending.pop(sampler.sampler_id, None)
        outcomes = self._call(home, "sample", sampler.sampler_id, requests)
        self.sample_batches.append(len(requests))
        return outcomes

    def close_owner(self, owner_session: str) -> list[str]:
        """Stop the workers of the session's training models (their snapshot samplers go with them); workers of
        files and base models stay for other sessions."""
        with self.lock:
            # Every model of this table is a placed one.
            mine = [cast(PlacedPolicy, p) for p in self.policies.values() if p.owner == owner_session]
            super().close_owner(owner_session)
            for sampler_id in [s for s in self.sampler_homes if s not in self.samplers]:
                del self.sampler_homes[sampler_id]
                self.registered.discard(sampler_id)
                self.pending.pop(sampler_id, None)
            homes = [p.home for p in mine if p.home in self.homes]
            actors = [self.homes.pop(home) for home in homes]
        self._stop(actors)
        return homes


def _unwrapped(exc: BaseException) -> BaseException:
    """A worker's failure as the server reports it: the client's errors as their own type (a failed future of
    category user), anything else as it came (category server)."""
    cause = getattr(exc, "cause", None)  # Ray's RayTaskError carries the worker's exception
    if isinstance(cause, tuple(USER_ERRORS.values())):
        return UserError(str(cause))
    kind = getattr(exc, "kind", None)  # the processes backend's RemoteError: the type's name and message
    if kind in USER_ERRORS:
        return UserError(exc.message)  # type: ignore[attr-defined]
    return exc


def make_placement(workers: str, *, ray_address: str | None = None):
    """The backend that places the server's models (``--workers``): local processes or Ray."""
    if workers == "processes":
        from oprl.backends.local import LocalBackend

        return LocalBackend("processes")
    if workers == "ray":
        try:
            from oprl.backends.ray_backend import RayBackend
        except ImportError:
            raise OprlError("--workers ray: needs ray (pip install 'oprl[ray]')") from None
        return RayBackend(address=ray_address, num_cpus=None, workers=1)
    raise OprlError(f"--workers: {workers!r} is not threads, processes or ray")
