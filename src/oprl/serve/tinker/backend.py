"""The server's models and samplers by id, the one object the lanes call (``TinkerModels``; ``placement.PlacedModels``
is the same interface over workers), and which weights a sampling session draws from. Everything here runs on the
server's one compute thread (``futures.py``), in the order the requests of a model were numbered, so no lock is
needed and no two computations share the CPU (with ``overlap``, the samplers of saved weights on a second thread,
below). What it delegates, one meaning per module: what a training model
is and how one is built (``models.py``), ``forward_backward`` / ``optim_step`` (``training.py``), checkpoints
on disk (``checkpoints.py``), decoding (``sampling.py``), names -> model directories (``names.py``, whose
``DEFAULT_MODELS``, ``ModelTable`` and ``tiny_directory`` this module re-exports).

Plain data in and out (``records.py``); ``wire.py`` encodes the results for the SDK on the HTTP side, so none of
these modules, nor a placed model's worker, imports the SDK, protobuf, fastapi or pydantic (tested;
``benchmarks/gpu_check.py --tinker`` drives them on a bare GPU image).

Off-policy exactness: ``save_weights_for_sampler`` snapshots the trainable tensors (the LoRA adapters, or every
parameter for full fine-tuning) with the optimizer-step count they belong to; a sampling session samples from
*its* snapshot: when the live weights moved on, the snapshot is copied in for the call and the live weights
back after. Sampling and ``forward_backward`` compute log-probs in float32 from the same modules (prefill +
cached decoding vs. one packed forward), so on-policy ρ = 1 up to float rounding at the default sampling
parameters (with a temperature or truncation, ρ = π / μ: ``sampling.py``).

Overlap (``overlap=True``, ``oprl serve tinker --overlap``): samplers of saved weights (a snapshot, a checkpoint, the
base) run on a second lane (``SAMPLE_LANE``), so one model's sampling computes while its training does, as ``oprl
train``'s explorer and trainer do on two cores (an async recipe, sampling one step ahead, then costs about
max(sample, train) a step instead of their sum). A snapshot's sampler then draws from the model's *replica*, a
copy of the module made on the compute lane at the model's first snapshot, into which each snapshot's tensors are
copied when its sampler's batch comes after another's: the live module is never touched from the sampling lane.
The replica holds the same tensors the swap would, so what a request gets is the same either way (tested).
In-flight samplers stay on the compute lane: they read the live weights between training steps by design.

In-flight samplers (``kind="inflight"``) read the model's published in-flight weights (``Policy.inflight``, which
each in-flight save replaces) at every decode step: ``begin_sample`` / ``sample_step`` decode a batch a few steps
per call, the lane running the model's other requests in between (``futures.py``), so a running sequence goes on
under newly published weights with its cache kept; each token records its weights' version.
"""

from __future__ import annotations

import copy
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any, cast

from oprl.checkpoint.files import load_weights
from oprl.models.loading import load_pretrained, quiet_transformers
from oprl.serve.tinker import checkpoints, training
from oprl.serve.tinker.errors import UserError
from oprl.serve.tinker.losses import LossSpec
from oprl.serve.tinker.models import Policy, Sampler, Snapshot, build_policy, copy_into, copy_params, policy_info
from oprl.serve.tinker.names import DEFAULT_MODELS, ModelTable, tiny_directory  # noqa: F401  (this module's API too)
from oprl.serve.tinker.records import ForwardBackward, ForwardOutput, Sampled
from oprl.serve.tinker.sampling import SampleBatch, sample_batch

COMPUTE_LANE = "compute"
"""The lane every request runs in when the models live in the server's process (``TinkerModels.home_of``)."""
SAMPLE_LANE = "sample"
"""With ``overlap``, the lane of the samplers of saved weights (snapshots, checkpoints, the base)."""
HOSTED_ADAPTERS = 64
"""Checkpoint weights kept in memory for the hosts (``TinkerModels._path_host``), least recently sampled dropped
first (read again from disk when its sampler comes back)."""
SNAPSHOTS_PER_MODEL = 16
"""Weight snapshots kept per training model at most (oldest dropped first); a sampler of a dropped one gets an error
naming its session."""
SNAPSHOT_GB = 2.0
"""...and within this many GB of snapshot tensors per model (``--snapshot-gb``), the newest ``MIN_SNAPSHOTS`` always:
a full fine-tuning snapshot is the whole model (SmolLM2-135M: 0.54 GB), and tinker-cookbook takes a new sampling
client every step and closes none (16 of them took 8.6 GB of a 24 GB machine, and the run into memory thrash)."""
MIN_SNAPSHOTS = 2
"""Snapshots kept whatever their size: the newest and the one before, which an async recipe one step off-policy
still samples from."""


class TinkerModels:
    """The server's models and samplers; every method runs on the compute thread (with ``overlap``, ``sample`` of
    saved weights on the sampling lane)."""

    def __init__(
        self,
        table: ModelTable,
        state_dir: Path,
        device: str = "cpu",
        overlap: bool = False,
        snapshot_gb: float = SNAPSHOT_GB,
        micro_batch_tokens: int = training.MICRO_BATCH_TOKENS,
    ):
        quiet_transformers()
        self.overlap = overlap
        self.micro_batch_tokens = micro_batch_tokens
        self.snapshot_bytes = int(snapshot_gb * 1e9)
        self.table = table
        self.state_dir = Path(state_dir)
        self.device = device
        self.policies: dict[str, Policy] = {}
        self.samplers: dict[str, Sampler] = {}
        self.frozen: dict[str, tuple[Any, Any]] = {}  # base name -> (model, tokenizer), for base-model sampling
        self.hosts: dict[str, Policy] = {}  # checkpoints.host_key -> a policy built to sample from files
        self.path_keys: dict[str, str] = {}  # model_path -> its host's key
        self.hosted: dict[str, str] = {}  # host key -> the model_path whose weights the host holds now
        self.adapters: OrderedDict[str, dict[str, Any]] = OrderedDict()  # model_path -> its weights, read once
        self.sample_batches: deque[int] = deque(maxlen=1024)  # requests per engine call, newest last (tests, logs)
        self.replicas: dict[str, Replica] = {}  # policy id -> the copy its snapshots sample on (``overlap``)

    # ---- training models ----------------------------------------------------------------------------------

    def create_policy(self, model_id: str, owner: str, base_model: str, lora: dict[str, Any]) -> Policy:
        """A training model on ``base_model`` (``models.build_policy``), registered under ``model_id``."""
        directory = self.table.directory(base_model)
        policy = build_policy(model_id, owner, base_model, directory, lora, self.device)
        self.policies[model_id] = policy
        return policy

    def info(self, policy: Policy) -> dict[str, Any]:
        return policy_info(policy, self.table.directory(policy.base_model))

    group_prefixes = True
    """Run the loss-free prefix that several datums share once (``prefix_shared_logprobs``); off, every datum
    runs whole (the tests compare both)."""

    skip_zero_gradient = True
    """Leave out autograd work whose gradient is 0 (loss-free datums, the shared prompts' own positions); off,
    every position runs under autograd (the benchmark compares both)."""

    def forward_backward(self, policy: Policy, request: ForwardBackward, spec: LossSpec) -> ForwardOutput:
        """``training.forward_backward`` on this server's device."""
        return training.forward_backward(
            policy, request, spec, self.device, self.group_prefixes, self.skip_zero_gradient, self.micro_batch_tokens
        )

    def optim_step(self, policy: Policy, params: dict[str, Any]) -> dict[str, Any]:
        return training.optim_step(policy, params)

    # ---- weights on disk and in memory ---------------------------------------------------------------------

    def save(self, policy: Policy, kind: str, name: str, optimizer: bool, overwrite: bool = True) -> str:
        """``checkpoints.save`` under the server's ``state_dir``; the tinker path."""
        return checkpoints.save(self.state_dir, policy, kind, name, optimizer, overwrite)

    def checkpoint(self, path: str, field_name: str = "path") -> tuple[Path, dict[str, Any]]:
        """The directory and metadata of a tinker path this server wrote."""
        return checkpoints.checkpoint(self.state_dir, path, field_name)

    def load(self, policy: Policy, path: str, optimizer: bool) -> None:
        checkpoints.load(self.state_dir, policy, path, optimizer)

    def create_from_checkpoint(self, model_id: str, owner: str, path: str, optimizer: bool, base: str | None) -> Policy:
        _, meta = self.checkpoint(path)
        if base is not None and base != meta["base_model"]:
            raise UserError(f"base_model: {base!r} differs from the checkpoint's {meta['base_model']!r}")
        policy = self.create_policy(model_id, owner, meta["base_model"], meta["lora"])
        self.load(policy, path, optimizer)
        return policy

    def snapshot_sampler(self, policy: Policy, sampler_id: str) -> Sampler:
        """A sampling session on the live weights as they are now (save_weights_and_get_sampling_client)."""
        policy.snapshots[sampler_id] = policy.snapshot()
        sizes = [snapshot.nbytes() for snapshot in policy.snapshots.values()]
        while len(sizes) > MIN_SNAPSHOTS and (len(sizes) > SNAPSHOTS_PER_MODEL or sum(sizes) > self.snapshot_bytes):
            policy.snapshots.popitem(last=False)
            sizes.pop(0)
        if self.overlap and policy.model_id not in self.replicas:  # here, on the compute lane: no step runs now
            self.replicas[policy.model_id] = Replica.of(policy)
        sampler = Sampler(sampler_id, policy.owner, policy.base_model, policy.model_id)
        self.samplers[sampler_id] = sampler
        return sampler

    serves_inflight = True
    """In-flight samplers (``inflight_sampler``) are served: their decoding lives on between lane turns here."""

    def inflight_sampler(self, policy: Policy, sampler_id: str) -> Sampler:
        """``save_weights_and_get_sampling_client(kind="inflight")``: publish the live weights as the model's
        in-flight weights (for every in-flight sampler of the model, this one and the earlier ones) and return a
        sampler that reads them at each decode step."""
        policy.inflight = policy.snapshot()
        sampler = Sampler(sampler_id, policy.owner, policy.base_model, policy.model_id, inflight=True)
        self.samplers[sampler_id] = sampler
        return sampler

    def path_sampler(self, sampler_id: str, owner: str, path: str) -> Sampler:
        _, meta = self.checkpoint(path, "model_path")
        sampler = Sampler(sampler_id, owner, meta["base_model"], model_path=path)
        self.samplers[sampler_id] = sampler
        return sampler

    def base_sampler(self, sampler_id: str, owner: str, base_model: str) -> Sampler:
        self.table.directory(base_model)  # an unknown name fails now, not at the first sample
        sampler = Sampler(sampler_id, owner, base_model)
        self.samplers[sampler_id] = sampler
        return sampler

    # ---- sampling ------------------------------------------------------------------------------------------

    def sample(self, sampler: Sampler, requests: list[dict[str, Any]]) -> list[Sampled | UserError]:
        """For each request, ``num_samples`` continuations of its prompt from the sampler's weights (and the
        prompt's log-probs when asked), or the ``UserError`` refusing it; the
        requests run as one engine call (``sampling.sample_batch``), on weights swapped in once."""
        model, tokenizer, restore, version = self._weights_for(sampler)
        try:
            outcomes = sample_batch(model, tokenizer, requests, self.device, version)
        finally:
            restore()
        self.sample_batches.append(len(requests))
        return outcomes

    def begin_sample(self, sampler: Sampler, requests: list[dict[str, Any]]) -> SampleBatch:
        """An in-flight sampler's requests, checked, to decode a few steps at a time (``sample_step``)."""
        policy = self._inflight_policy(sampler)
        self.sample_batches.append(len(requests))
        return SampleBatch(policy.model, policy.tokenizer, requests, self.device)

    def sample_step(self, sampler: Sampler, batch: SampleBatch, steps: int) -> list[Sampled | UserError] | None:
        """Up to ``steps`` decode steps of an in-flight batch under the model's in-flight weights as published
        now (each token records their version), the cache of earlier steps kept; the outcomes once done, else
        None. Between two calls the model's other requests run (the lane's turn passes: ``futures.py``), so a
        ``kind="inflight"`` save there moves the running sequences onto the new weights."""
        policy = self._inflight_policy(sampler)
        target = cast(Snapshot, policy.inflight)
        model, _, restore = self._swapped(policy, target)
        try:
            done = batch.advance(model, steps, target.version)
            return batch.outcomes(model) if done else None
        finally:
            restore()

    def _inflight_policy(self, sampler: Sampler) -> Policy:
        policy = self.policies.get(cast(str, sampler.policy_id))
        if policy is None or policy.inflight is None:
            raise UserError(f"sampling_session_id: the model {sampler.policy_id} of this sampler was closed")
        return policy

    def _weights_for(self, sampler: Sampler):
        """``(module, tokenizer, restore, version)``: a module holding the sampler's weights for one call. A
        snapshot is looked up in its model's kept ones, never held by its sampler: the cookbook opens a sampler a
        step and closes none, so samplers holding their snapshots kept every version alive (0.54 GB a step for
        SmolLM2's full fine-tuning, the recipe OOM-killed past 15 GB)."""
        if sampler.policy_id is not None:
            policy = self.policies.get(sampler.policy_id)
            if policy is None:
                raise UserError(f"sampling_session_id: the model {sampler.policy_id} of this sampler was closed")
            snapshot = policy.snapshots.get(sampler.sampler_id)  # one read: the compute lane may drop it (overlap)
            if snapshot is None:
                raise UserError(
                    f"sampling_session_id: snapshot {sampler.sampler_id} was dropped (a model keeps its newest "
                    f"{SNAPSHOTS_PER_MODEL} within the server's --snapshot-gb, at least {MIN_SNAPSHOTS}); create a "
                    "new sampling client"
                )
            replica = self.replicas.get(policy.model_id) if self.overlap else None
            if replica is not None:
                return replica.holding(snapshot), policy.tokenizer, lambda: None, snapshot.version
            return (*self._swapped(policy, snapshot), snapshot.version)
        if sampler.model_path is not None:
            host = self._path_host(sampler)
            return host.model, host.tokenizer, lambda: None, 0
        if sampler.base_model not in self.frozen:
            base = self.table.directory(sampler.base_model)
            model, tokenizer = load_pretrained(base, dtype="float32", device=self.device)
            self.frozen[sampler.base_model] = (model.eval().requires_grad_(False), tokenizer)
        model, tokenizer = self.frozen[sampler.base_model]
        return model, tokenizer, lambda: None, 0

    def _path_host(self, sampler: Sampler) -> Policy:
        """The module that samples for a checkpoint sampler, holding that checkpoint's weights now. LoRA
        checkpoints of one base and adapter shape share one host (``checkpoints.host_key``): the base is loaded
        once, and each checkpoint's adapter tensors (read once, ``HOSTED_ADAPTERS`` kept) are copied in when
        its sampler's call comes after another's, so a new LoRA sampler costs its adapter, not a model."""
        path = cast(str, sampler.model_path)
        if path not in self.path_keys:
            _, meta = self.checkpoint(path, "model_path")
            self.path_keys[path] = checkpoints.host_key(path, meta)
        key = self.path_keys[path]
        host = self.hosts.get(key)
        if host is None:
            _, meta = self.checkpoint(path, "model_path")
            base = self.table.directory(meta["base_model"])  # a host is no training model: not registered
            host = build_policy(f"sampler:{sampler.sampler_id}", sampler.owner, meta["base_model"], base,
                                meta["lora"], self.device)  # fmt: skip
            self.hosts[key] = host
        if self.hosted.get(key) != path:
            weights = self.adapters.pop(path, None)
            if weights is None:
                directory, _ = self.checkpoint(path, "model_path")
                weights = load_weights(directory / "weights.safetensors")
            self.adapters[path] = weights  # most recently used last
            while len(self.adapters) > HOSTED_ADAPTERS:
                self.adapters.popitem(last=False)
            copy_into(host, weights)
            self.hosted[key] = path
        return host

    def _swapped(self, policy: Policy, snapshot: Snapshot):
        """The policy's module with ``snapshot``'s weights in it, and how to put the live weights back (nothing to
        do when no optimizer step or load happened since the snapshot)."""
        if snapshot.version == policy.version:
            return policy.model, policy.tokenizer, lambda: None
        live = {n: p.detach().clone() for n, p in policy.trainable().items()}
        copy_into(policy, snapshot.weights)
        return policy.model, policy.tokenizer, lambda: copy_into(policy, live)

    def close_owner(self, owner_session: str) -> list[str]:
        """Free every model and sampler of a finished or expired session; the homes (``home_of``) that freed
        with them (none here: the one lane serves the other sessions too)."""
        for key in [k for k, p in self.policies.items() if p.owner == owner_session]:
            del self.policies[key]
            self.replicas.pop(key, None)
        for key in [k for k, s in self.samplers.items() if s.owner == owner_session]:
            del self.samplers[key]
        return []

    # ---- where the work runs (``placement.PlacedModels`` spreads it over workers) ---------------------------

    def home_of(self, ident: str) -> str:
        """Which lane of the server runs the requests of a model or sampler id: here, every model lives in this
        process, so one lane (one compute thread: on a CPU no two jobs share the cores), or with ``overlap`` a
        second one for the samplers of saved weights, which touch no training model's module (module docstring)."""
        sampler = self.samplers.get(ident) if self.overlap else None
        if sampler is not None and not sampler.inflight:
            return SAMPLE_LANE
        return COMPUTE_LANE

    def shutdown(self) -> None:
        """Nothing to stop: the models are this process's memory."""


class Replica:
    """A training model's second module for its snapshots' samplers (``overlap``): made on the compute lane at
    the model's first snapshot, then used on the sampling lane only; ``holding`` copies a snapshot's tensors in
    when it holds another's."""

    def __init__(self, model: Any, params: dict[str, Any]):
        self.model = model
        self.params = params  # the names of the policy's trainable tensors -> the replica's
        self.held: Snapshot | None = None

    @classmethod
    def of(cls, policy: Policy) -> Replica:
        names = set(policy.trainable())
        model = copy.deepcopy(policy.model)
        params = {}
        for name, param in model.named_parameters():
            param.grad = None  # the live module's accumulated gradient, copied with it
            param.requires_grad_(False)
            if name in names:
                params[name] = param
        return cls(model, params)

    def holding(self, snapshot: Snapshot) -> Any:
        """The replica's module with ``snapshot``'s tensors in it."""
        if self.held is not snapshot:
            copy_params(self.params, snapshot.weights)
            self.held = snapshot
        return self.model
