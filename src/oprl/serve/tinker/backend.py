"""What the Tinker server computes with: base models by name, training models (a peft LoRA or a full model and
its AdamW), weight snapshots, sampling. Everything here runs on the server's one compute thread (``app.py``), in
the order the requests of a model were numbered, so no lock is needed and no two computations share the CPU.

Names -> models: ``names.py`` (``ModelTable``, ``DEFAULT_MODELS``, ``tiny_directory``, imported here too).

Plain data in and out (``records.py``); ``wire.py`` encodes the results for the SDK on the HTTP side, so neither
this module nor ``sampling.py``, ``losses.py`` or a placed model's worker imports the SDK, protobuf, fastapi or
pydantic (tested; ``benchmarks/gpu_check.py --tinker`` drives them on a bare GPU image).

Off-policy exactness: ``save_weights_for_sampler`` snapshots the trainable tensors (the LoRA adapters, or every
parameter for full fine-tuning) with the optimizer-step count they belong to; a sampling session samples from
*its* snapshot: when the live weights moved on, the snapshot is copied in for the call and the live weights
back after. Sampling and ``forward_backward`` compute log-probs in float32 from the same modules (prefill +
cached decoding vs. one packed forward), so on-policy ρ = 1 up to float rounding at the default sampling
parameters (with a temperature or truncation, ρ = π / μ: ``sampling.py``).

In-flight samplers (``kind="inflight"``) read the model's published in-flight weights (``Policy.inflight``, which
each in-flight save replaces) at every decode step: ``begin_sample`` / ``sample_step`` decode a batch a few steps
per call, the lane running the model's other requests in between (``futures.py``), so a running sequence goes on
under newly published weights with its cache kept; each token records its weights' version.
"""

from __future__ import annotations

import math
import secrets
import warnings
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from oprl.checkpoint.files import load_optimizer, load_weights, read_json, save_optimizer, save_weights, write_json
from oprl.errors import OprlError
from oprl.models.batching import right_pad
from oprl.models.loading import load_pretrained, quiet_transformers
from oprl.models.logprobs import pack, prefix_shared_logprobs, response_logprobs
from oprl.serve.tinker.errors import UserError, base_of, check_tokens, context_of
from oprl.serve.tinker.finite import CallGradient, checked_adam_params, refusal, suspect_rows
from oprl.serve.tinker.losses import OPTIONAL_INPUTS, LossSpec, compute_loss
from oprl.serve.tinker.names import DEFAULT_MODELS, ModelTable, tiny_directory  # noqa: F401  (this module's API too)
from oprl.serve.tinker.records import Datum, ForwardBackward, ForwardOutput, Sampled
from oprl.serve.tinker.sampling import SERVED, SampleBatch, sample_batch

LORA_MODULES = {
    "attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mlp": ("gate_proj", "up_proj", "down_proj"),
    "unembed": ("lm_head",),
}
"""The Llama-family module names that ``train_attn`` / ``train_mlp`` / ``train_unembed`` put adapters on."""
LORA_ALPHA = 32
"""LoRA's α (scale α/r), the value tinker-cookbook's hyperparameter notes assume."""
MICRO_BATCH_TOKENS = 8192
"""Tokens per forward/backward micro-batch of a built-in loss (the losses are sums: micro-batches add up)."""
COMPUTE_LANE = "compute"
"""The lane every request runs in when the models live in the server's process (``TinkerModels.home_of``)."""
SNAPSHOTS_PER_MODEL = 16
"""Weight snapshots kept per training model (oldest dropped first): bounds memory, and a sampler of a dropped one
gets an error naming its session."""


@dataclass
class LoraSpec:
    """What ``oprl.models.loading.add_lora`` reads (the fields of the ``model.lora`` config section)."""

    r: int
    alpha: int
    dropout: float
    target_modules: list[str]


@dataclass
class Snapshot:
    weights: dict[str, torch.Tensor]
    version: int


@dataclass
class Policy:
    """One training model (a TrainingClient's): its module, tokenizer, AdamW and optimizer-step count."""

    model_id: str
    owner: str
    base_model: str
    model: Any
    tokenizer: Any
    lora: dict[str, Any]
    optimizer: torch.optim.Optimizer
    version: int = 0
    snapshots: OrderedDict[str, Snapshot] = field(default_factory=OrderedDict)
    announced: dict[str, float] = field(default_factory=dict)
    inflight: Snapshot | None = None
    """The weights this model's in-flight samplers share: each ``kind="inflight"`` save publishes the live weights
    here, for the in-flight samplers made before it too (``sample_step``)."""
    """What the gradient accumulated since the last step announces (``LossSpec.announcement``): the next
    ``optim_step``'s metrics repeat it, where recipes log them (tinker-cookbook logs no forward_backward metric)."""

    def trainable(self) -> dict[str, torch.Tensor]:
        return {name: p for name, p in self.model.named_parameters() if p.requires_grad}

    def snapshot(self) -> Snapshot:
        return Snapshot({n: p.detach().clone() for n, p in self.trainable().items()}, self.version)


@dataclass
class Sampler:
    """A sampling session: which weights it samples from (a policy's snapshot, a saved file, or the base)."""

    sampler_id: str
    owner: str
    base_model: str
    policy_id: str | None = None
    snapshot: Snapshot | None = None
    model_path: str | None = None
    inflight: bool = False
    """Samples from its model's published in-flight weights as they are at each decode step (``Policy.inflight``)."""


class TinkerModels:
    """The server's models and samplers; every method runs on the compute thread."""

    def __init__(self, table: ModelTable, state_dir: Path, device: str = "cpu"):
        quiet_transformers()
        self.table = table
        self.state_dir = Path(state_dir)
        self.device = device
        self.policies: dict[str, Policy] = {}
        self.samplers: dict[str, Sampler] = {}
        self.frozen: dict[str, tuple[Any, Any]] = {}  # base name -> (model, tokenizer), for base-model sampling
        self.hosts: dict[str, Policy] = {}  # model_path -> a policy built to sample from a file
        self.sample_batches: deque[int] = deque(maxlen=1024)  # requests per engine call, newest last (tests, logs)

    # ---- training models ----------------------------------------------------------------------------------

    def create_policy(self, model_id: str, owner: str, base_model: str, lora: dict[str, Any]) -> Policy:
        """A training model on ``base_model``: LoRA of ``lora['rank']`` on the chosen modules (rank 0: every
        parameter trains), adapters initialised from ``lora['seed']``."""
        directory = self.table.directory(base_model)
        rank = int(lora.get("rank", 32))
        if rank < 0:
            raise UserError(f"lora_config.rank: must be >= 0 (0 = full fine-tuning), got {rank}")
        seed = lora.get("seed")
        seed = secrets.randbelow(2**31) if seed is None else int(seed)
        model, tokenizer = load_pretrained(directory, dtype="float32", device=self.device)
        if rank > 0:
            with torch.random.fork_rng(devices=[]):  # the adapters' initialisation is the seed's alone
                torch.manual_seed(seed)
                model = _add_adapters(model, rank, lora)
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        fused = all(p.device.type in ("cpu", "cuda") for p in params)
        optimizer = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0, fused=fused)
        record = {"rank": rank, "seed": seed, **{k: bool(lora.get(k, True)) for k in _TRAIN_FLAGS}}
        policy = Policy(model_id, owner, base_model, model, tokenizer, record, optimizer)
        self.policies[model_id] = policy
        return policy

    def info(self, policy: Policy) -> dict[str, Any]:
        """``GetInfoResponse``: the tokenizer is the local model directory, so ``get_tokenizer`` needs no hub."""
        arch = type(base_of(policy.model)).__name__
        data = {"arch": arch, "model_name": policy.base_model, "tokenizer_id": self.table.directory(policy.base_model)}
        rank = policy.lora["rank"]
        return {
            "type": "get_info",
            "model_id": policy.model_id,
            "model_data": data,
            "is_lora": rank > 0,
            "lora_rank": rank or None,
            "model_name": policy.base_model,
        }

    def forward_backward(self, policy: Policy, request: ForwardBackward, spec: LossSpec) -> ForwardOutput:
        """Per-datum target log-probs (and elementwise loss) and the metrics, the loss's gradient added to
        ``.grad`` unless ``forward_only`` (``wire.encode_forward_backward_output`` makes the SDK's
        ``ForwardBackwardOutput`` of it). A call whose loss or gradient is not finite adds nothing and fails
        naming its datums (``finite.py``)."""
        rows = [self._checked_datum(policy, datum, spec, f"data[{i}]") for i, datum in enumerate(request.data)]
        outputs: list[dict[str, np.ndarray]] = []
        total, weights, suspects = 0.0, 0, []
        metrics: dict[str, float] = {}
        gradient = None if request.forward_only else CallGradient(list(policy.trainable().values()))
        # A preset's rules may look at the whole call's tokens (M2PO, BAPO): one micro-batch then.
        budget = math.inf if spec.preset is not None else MICRO_BATCH_TOKENS
        try:
            for micro in _micro_batches(rows, budget):
                with torch.set_grad_enabled(gradient is not None):
                    logprobs, inputs, mask = self._target_logprobs(policy, micro)
                    loss, elementwise, values = compute_loss(spec, logprobs, inputs, mask)
                    loss_value = float(loss.detach())
                    if gradient is not None and not math.isfinite(loss_value):
                        rows_here = suspect_rows(logprobs, inputs, mask, elementwise, ratio=False)
                        raise refusal("loss", [len(outputs) + i for i in rows_here], loss_value)
                    if gradient is not None:
                        loss.backward()
                suspects += [len(outputs) + i for i in suspect_rows(logprobs, inputs, mask, elementwise, ratio=True)]
                total += loss_value
                for key, value in values.items():  # token-weighted over micro-batches
                    metrics[key] = metrics.get(key, 0.0) + value * int(mask.sum())
                weights += int(mask.sum())
                outputs += _datum_outputs(logprobs, elementwise, mask)
            if gradient is not None and not gradient.finite():
                raise refusal("gradient", suspects)
        except BaseException:
            if gradient is not None:
                gradient.close(keep=False)
            raise
        if gradient is not None:
            gradient.close(keep=True)
            policy.announced |= spec.announcement()
        reported = {"loss:sum": total} | {
            f"{key}:{_reduction(key)}": value / max(weights, 1) for key, value in metrics.items()
        }
        return ForwardOutput(outputs, reported | spec.announcement())

    def _checked_datum(self, policy: Policy, datum: Datum, spec: LossSpec, where: str) -> dict[str, Any]:
        """The datum's tokens, targets and float inputs, each (N,), after checking lengths and token ranges."""
        n, vocab = len(datum.tokens), len(policy.tokenizer)
        if n == 0:
            raise UserError(f"{where}.model_input: empty")
        limit = context_of(policy.model)
        if limit is not None and n > limit:
            raise UserError(f"{where}.model_input: {n} tokens exceed the model's context of {limit}")
        for name in spec.inputs:
            if name not in datum.inputs:
                raise UserError(f"{where}.loss_fn_inputs.{name}: required by {spec.name}")
        for name in datum.inputs:
            if name not in spec.inputs and name not in OPTIONAL_INPUTS:
                raise UserError(f"{where}.loss_fn_inputs.{name}: not an input of {spec.name}")
        for name, values in datum.inputs.items():
            if values.reshape(-1).shape[0] != n:
                raise UserError(f"{where}.loss_fn_inputs.{name}: {values.size} values for {n} model_input tokens")
        check_tokens(datum.tokens, vocab, f"{where}.model_input")
        targets = datum.inputs["target_tokens"].reshape(-1).astype(np.int64).tolist()
        check_tokens(targets, vocab, f"{where}.loss_fn_inputs.target_tokens")
        floats = {k: v.reshape(-1).astype(np.float32) for k, v in datum.inputs.items() if k != "target_tokens"}
        for name, values in floats.items():
            if not np.isfinite(values).all():
                raise UserError(f"{where}.loss_fn_inputs.{name}: holds NaN or infinite values")
        return {"tokens": datum.tokens, "targets": targets, "inputs": floats}

    group_prefixes = True
    """Run the loss-free prefix that several datums share once (``prefix_shared_logprobs``); off, every datum
    runs whole (the tests compare both)."""

    def _target_logprobs(self, policy: Policy, rows: list[dict[str, Any]]):
        """``(log π(y_t | x_≤t) (B, T), inputs (B, T) each, mask (B, T))`` for rows of tokens x and targets y.

        When datums share a prefix that carries no loss (an RL batch: every reply of a prompt starts with that
        prompt, advantage 0 there), ``oprl.models.logprobs.prefix_shared_logprobs`` runs each such prefix once
        and only the rest per datum, as ``oprl train``'s trainer runs each prompt once for its group. Otherwise
        ``response_logprobs`` scores the last T columns' targets from the positions before them; laying a datum
        out as prompt ``[x_0]`` and response ``[x_1 .. x_{N-1}, pad]`` puts position t's hidden state in front of
        target t, whatever the targets are. Both use the memory-bounded chunked log-softmax, under ``SERVED``,
        the distribution the sampler draws from."""
        pad = policy.tokenizer.pad_token_id
        shared = _shared_prefixes(rows) if self.group_prefixes else None
        scored = None
        if shared is not None:
            tokens, targets = [r["tokens"] for r in rows], [r["targets"] for r in rows]
            scored = prefix_shared_logprobs(policy.model, tokens, targets, shared, pad, sampling=SERVED)
        if scored is not None:
            logprobs, mask = scored
        else:
            prompts = [r["tokens"][:1] for r in rows]
            responses = [[*r["tokens"][1:], pad] for r in rows]
            input_ids, attention, _, mask = (t.to(self.device) for t in pack(prompts, responses, pad))
            targets_t, _ = right_pad([r["targets"] for r in rows], 0)
            logprobs, _ = response_logprobs(
                policy.model, input_ids, attention, targets_t.to(self.device), sampling=SERVED
            )  # (B, T)
        width = mask.shape[1]
        names = set().union(*(r["inputs"] for r in rows))
        inputs = {
            name: torch.tensor(
                np.stack([np.pad(r["inputs"][name], (0, width - len(r["tokens"]))) for r in rows]),
                device=self.device,
            )
            for name in names
        }  # (B, T) each; a name missing from some rows is refused by _checked_datum's required list
        return logprobs, inputs, mask

    def optim_step(self, policy: Policy, params: dict[str, Any]) -> dict[str, Any]:
        """One AdamW step with this call's ``AdamParams`` (learning_rate, beta1, beta2, eps, weight_decay:
        decoupled, as torch.optim.AdamW; grad_clip_norm: global norm, 0 = off), then the gradients are cleared."""
        fields = {"learning_rate": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12, "weight_decay": 0.0}
        values = checked_adam_params(params, {**fields, "grad_clip_norm": 0.0})
        clip = values.pop("grad_clip_norm")
        if values["learning_rate"] < 0 or not 0 <= values["beta1"] < 1 or not 0 <= values["beta2"] < 1:
            raise UserError("adam_params: learning_rate must be >= 0 and beta1, beta2 in [0, 1)")
        trainable = list(policy.trainable().values())
        grads = [p.grad for p in trainable if p.grad is not None]
        norms = [torch.linalg.vector_norm(g) for g in grads]
        norm = float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0  # before clipping
        if not math.isfinite(norm):  # each call's gradient was finite (forward_backward): their sum overflowed
            policy.optimizer.zero_grad(set_to_none=True)
            policy.announced.clear()
            raise UserError(
                f"optim_step: the accumulated gradient's norm is {norm}; the step was not taken and the gradient "
                "was cleared (the weights and optimizer state are untouched)"
            )
        if clip > 0 and grads:
            torch.nn.utils.clip_grad_norm_(trainable, clip)
        for group in policy.optimizer.param_groups:
            group.update(
                lr=values["learning_rate"],
                betas=(values["beta1"], values["beta2"]),
                eps=values["eps"],
                weight_decay=values["weight_decay"],
            )
        policy.optimizer.step()
        policy.optimizer.zero_grad(set_to_none=True)
        policy.version += 1
        announced, policy.announced = policy.announced, {}
        return {"metrics": {"grad_norm:mean": norm, "learning_rate:mean": values["learning_rate"], **announced}}

    # ---- weights on disk and in memory ---------------------------------------------------------------------

    def save(self, policy: Policy, kind: str, name: str, optimizer: bool, overwrite: bool = True) -> str:
        """Trainable weights (and the optimizer) under ``state_dir/<model_id>/<kind>/<name>``; the tinker path.
        ``overwrite=False`` (``save_state``'s default in the SDK) refuses a name this model saved before."""
        if not name or "/" in name or name.startswith("."):
            raise UserError(f"path: {name!r} is not a checkpoint name (no '/', not empty)")
        directory = self.state_dir / policy.model_id / kind / name
        if not overwrite and (directory / "meta.json").is_file():
            raise UserError(
                f"path: checkpoint {name!r} of this model exists (tinker://{policy.model_id}/{kind}/{name}); "
                "save_state(name, overwrite=True) replaces it"
            )
        save_weights(policy.trainable(), directory / "weights.safetensors")
        if optimizer:
            save_optimizer(policy.optimizer, directory)
        meta = {"base_model": policy.base_model, "lora": policy.lora, "version": policy.version, "optimizer": optimizer}
        write_json(directory / "meta.json", meta)
        return f"tinker://{policy.model_id}/{kind}/{name}"

    def checkpoint(self, path: str, field_name: str = "path") -> tuple[Path, dict[str, Any]]:
        """The directory and metadata of a tinker path this server wrote."""
        parts = path.removeprefix("tinker://").split("/") if path.startswith("tinker://") else []
        if len(parts) != 3 or parts[1] not in ("weights", "sampler_weights"):
            raise UserError(f"{field_name}: {path!r} is not tinker://<model_id>/weights|sampler_weights/<name>")
        directory = self.state_dir.joinpath(*parts)
        if not (directory / "meta.json").is_file():
            raise UserError(f"{field_name}: no checkpoint {path!r} on this server")
        return directory, read_json(directory / "meta.json")

    def load(self, policy: Policy, path: str, optimizer: bool) -> None:
        directory, meta = self.checkpoint(path)
        if meta["base_model"] != policy.base_model or meta["lora"]["rank"] != policy.lora["rank"]:
            raise UserError(f"path: {path!r} holds a {meta['base_model']} rank-{meta['lora']['rank']} model")
        _copy_into(policy, load_weights(directory / "weights.safetensors"))
        if optimizer:
            if not meta.get("optimizer"):
                raise UserError(f"path: {path!r} was saved without optimizer state (save_state writes it)")
            load_optimizer(policy.optimizer, directory)
        policy.version += 1  # the live weights changed: snapshots of before are other weights
        policy.optimizer.zero_grad(set_to_none=True)
        policy.announced.clear()

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
        while len(policy.snapshots) > SNAPSHOTS_PER_MODEL:
            policy.snapshots.popitem(last=False)
        sampler = Sampler(sampler_id, policy.owner, policy.base_model, policy.model_id, policy.snapshots[sampler_id])
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
        model, tokenizer, restore = self._weights_for(sampler)
        version = sampler.snapshot.version if sampler.snapshot is not None else 0
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
        """``(module, tokenizer, restore)``: a module holding the sampler's weights for one call."""
        if sampler.policy_id is not None:
            policy = self.policies.get(sampler.policy_id)
            if policy is None:
                raise UserError(f"sampling_session_id: the model {sampler.policy_id} of this sampler was closed")
            if sampler.snapshot is None or sampler.sampler_id not in policy.snapshots:
                raise UserError(
                    f"sampling_session_id: snapshot {sampler.sampler_id} was dropped (a model keeps its newest "
                    f"{SNAPSHOTS_PER_MODEL}); create a new sampling client"
                )
            return self._swapped(policy, sampler.snapshot)
        if sampler.model_path is not None:
            host = self.hosts.get(sampler.model_path)
            if host is None:
                directory, meta = self.checkpoint(sampler.model_path, "model_path")
                name = f"sampler:{sampler.sampler_id}"
                host = self.create_policy(name, sampler.owner, meta["base_model"], meta["lora"])
                del self.policies[host.model_id]  # a host is no training model
                _copy_into(host, load_weights(directory / "weights.safetensors"))
                self.hosts[sampler.model_path] = host
            return host.model, host.tokenizer, lambda: None
        if sampler.base_model not in self.frozen:
            base = self.table.directory(sampler.base_model)
            model, tokenizer = load_pretrained(base, dtype="float32", device=self.device)
            self.frozen[sampler.base_model] = (model.eval().requires_grad_(False), tokenizer)
        model, tokenizer = self.frozen[sampler.base_model]
        return model, tokenizer, lambda: None

    def _swapped(self, policy: Policy, snapshot: Snapshot):
        """The policy's module with ``snapshot``'s weights in it, and how to put the live weights back (nothing to
        do when no optimizer step or load happened since the snapshot)."""
        if snapshot.version == policy.version:
            return policy.model, policy.tokenizer, lambda: None
        live = {n: p.detach().clone() for n, p in policy.trainable().items()}
        _copy_into(policy, snapshot.weights)
        return policy.model, policy.tokenizer, lambda: _copy_into(policy, live)

    def close_owner(self, owner_session: str) -> list[str]:
        """Free every model and sampler of a finished or expired session; the homes (``home_of``) that freed
        with them (none here: the one lane serves the other sessions too)."""
        for key in [k for k, p in self.policies.items() if p.owner == owner_session]:
            del self.policies[key]
        for key in [k for k, s in self.samplers.items() if s.owner == owner_session]:
            del self.samplers[key]
        return []

    # ---- where the work runs (``placement.PlacedModels`` spreads it over workers) ---------------------------

    def home_of(self, ident: str) -> str:
        """Which lane of the server runs the requests of a model or sampler id: here, every model lives in this
        process, so one lane (one compute thread: on a CPU no two jobs share the cores, and nothing here is
        thread-safe)."""
        return COMPUTE_LANE

    def shutdown(self) -> None:
        """Nothing to stop: the models are this process's memory."""


_TRAIN_FLAGS = ("train_mlp", "train_attn", "train_unembed")


def _add_adapters(model, rank: int, lora: dict[str, Any]):
    """peft LoRA (oprl.models.loading.add_lora) on the modules the flags select that the model has."""
    from oprl.models.loading import add_lora

    wanted = [name for flag, names in zip(_TRAIN_FLAGS, ("mlp", "attn", "unembed"), strict=True)
              if lora.get(flag, True) for name in LORA_MODULES[names]]  # fmt: skip
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    targets = [name for name in wanted if name in present]
    if not targets:
        raise UserError("lora_config: none of train_mlp / train_attn / train_unembed selects a module of this model")
    try:
        with warnings.catch_warnings():  # an adapter on a tied unembedding: trained as its own delta, as asked
            warnings.filterwarnings("ignore", message=".*tie_word_embeddings.*")
            return add_lora(model, LoraSpec(r=rank, alpha=LORA_ALPHA, dropout=0.0, target_modules=targets))
    except OprlError as exc:
        raise UserError(f"lora_config: {exc}") from None


def _copy_into(policy: Policy, weights: dict[str, torch.Tensor]) -> None:
    params = policy.trainable()
    if set(weights) != set(params):
        raise UserError("path: the checkpoint's tensors do not match this model's trainable parameters")
    with torch.no_grad():
        for name, value in weights.items():
            params[name].copy_(value.to(params[name].device))


LOSS_INPUTS = ("advantages", "weights", "mask")
"""The loss inputs that say whether a position carries loss (every built-in loss and preset is 0 where they are)."""


def _shared_prefixes(rows: list[dict[str, Any]]) -> list[int] | None:
    """Per datum, how many of its first input tokens to run as a shared prefix: its start before the first
    position whose advantage, weight or mask is non-zero (the prompt of an RL datum; at least 1), or None when
    no two datums start with the same such prefix (nothing to share: the datums run whole). Only where to cut;
    the log-probs and gradients are those of the whole datum either way (a prefix position's loss, e.g. dro's
    penalty, reaches the shared pass through each datum's gathered copy of its hidden state)."""
    lengths = []
    for row in rows:
        carrying = [np.flatnonzero(row["inputs"][name]) for name in LOSS_INPUTS if name in row["inputs"]]
        first = min((int(c[0]) for c in carrying if c.size), default=len(row["tokens"]))
        lengths.append(max(1, first))
    starts = Counter(tuple(row["tokens"][:n]) for row, n in zip(rows, lengths, strict=True))
    return lengths if any(count > 1 and len(start) > 1 for start, count in starts.items()) else None


def _datum_outputs(logprobs: torch.Tensor, elementwise: torch.Tensor | None, mask: torch.Tensor):
    """Per row of a micro-batch, its valid positions' ``logprobs`` (and ``elementwise_loss``) as float32 (N,)."""
    outputs = []
    for i in range(mask.shape[0]):
        valid = mask[i]
        out = {"logprobs": logprobs[i][valid].detach().float().cpu().numpy()}
        if elementwise is not None:
            out["elementwise_loss"] = elementwise[i][valid].float().cpu().numpy()
        outputs.append(out)
    return outputs


def _micro_batches(rows: list[dict[str, Any]], budget: float) -> list[list[dict[str, Any]]]:
    """Consecutive rows grouped so that rows × the longest row stays within ``budget`` tokens."""
    batches: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    for row in rows:
        width = max([len(r["tokens"]) for r in current] + [len(row["tokens"])])
        if current and (len(current) + 1) * width > budget:
            batches.append(current)
            current = []
        current.append(row)
    return [*batches, current] if current else batches


def _reduction(key: str) -> str:
    return "min" if key.endswith("_min") else "max" if key.endswith("_max") else "mean"
