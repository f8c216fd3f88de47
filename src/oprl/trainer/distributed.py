"""Data parallelism for the trainer on ``torch.distributed``: FSDP2 (``fully_shard``) or DDP, one process per rank.

The trainer (``oprl.trainer.trainer``) talks to a *parallel* object: ``SingleProcess`` on one process (what
every run used before; the same numbers), ``DataParallel`` on rank ``r`` of ``N``. The contract:

- every rank receives the whole batch, so advantages (per group), the mini-batch permutation and the global
  normaliser (tokens or rows of the mini-batch) are computed identically everywhere, before sharding;
- ``micro_batches`` hands rank ``r`` its share of whole groups (round-robin over the mini-batch's groups),
  split into micro-batches, padded with empty ones so every rank runs as many forward/backward passes
  (FSDP gathers parameters in each forward; gradients are reduced after the last backward);
- each micro-batch loss is weighted by (its count / the mini-batch's global count) * ``grad_scale``, where
  ``grad_scale = N`` undoes the average FSDP's reduce-scatter / DDP's all-reduce take over ranks: the summed
  gradient is exactly the single-process gradient (normalising per rank, or dividing by N again, is not);
- clipping uses the global gradient norm; metrics are summed (weighted by global shares) or min/max-reduced;
- a loss whose mask is a statistic of the whole mini-batch (M2PO, BAPO) sees every rank's rows of it through
  ``gather_objects`` (``losses.batch_keeps``), so the mask is the single-process one too.

Sharding: ``fsdp`` applies ``fully_shard`` to each decoder layer and to the root (``PolicyForward``, which
holds embeddings, final norm and head, tied or not); with ``model.dtype=bfloat16`` the sharded parameters
stay float32 (master weights, AdamW state float32) and FSDP2's ``MixedPrecisionPolicy`` computes in bfloat16
and reduces gradients in float32. ``ddp`` wraps ``PolicyForward`` in ``DistributedDataParallel``.

Initialisation under ``fsdp``: only rank 0 holds the unsharded model (loaded from ``model.path``); the other ranks
build it on the ``meta`` device (``oprl.models.loading.empty_model``), ``fully_shard`` allocates their shards, and
``fill_from_rank0`` broadcasts rank 0's tensors one at a time (``set_model_state_dict(..., full_state_dict=True,
broadcast_from_rank0=True)``). Peak memory at set-up: rank 0 the full model plus its shard, every other rank its
shard plus one tensor in flight.

Weights leave a sharded trainer through ``gather_weights``: parameter by parameter (each a collective),
copied into a preallocated ``FlatWeights`` on rank 0's CPU, so no rank ever holds a second full copy on its
device. Checkpoints use ``torch.distributed.checkpoint`` (each rank writes its shard; loading reshards to the
current world size).

Deliberately not here: starting the rank processes (``oprl.trainer.ranks``) and any loss formula.
"""

from __future__ import annotations

import itertools
import math
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from oprl.algorithms.losses import alone
from oprl.errors import OprlError
from oprl.models.logprobs import grouped_response_logprobs, packed_response_logprobs


class PolicyForward(torch.nn.Module):
    """The trainer's forward, ``(prompts, responses, pad_id, **kw) -> (logprobs, entropy, mask)``, as a module.

    ``grouped_response_logprobs`` calls the decoder and the head directly, never ``model.forward``; FSDP2's root
    hooks (gather the root's parameters, reduce its gradients in backward) and DDP's reducer run on a module
    call only, so the trainer calls this wrapper. On one process it is a plain call (the same numbers).

    ``autocast`` (``trainer.autocast``): the forward runs under ``torch.autocast`` in that dtype (matmuls and
    linear layers in bfloat16, the log-softmax over float32 logits); backward follows the forward's dtypes.
    Parameters, gradients and AdamW state stay in the model's float32 (master weights)."""

    def __init__(
        self, model: torch.nn.Module, activation_checkpointing: bool = False, autocast: torch.dtype | None = None
    ):
        super().__init__()
        self.model = model
        self.activation_checkpointing = activation_checkpointing
        self.autocast = autocast
        if activation_checkpointing:
            enable_activation_checkpointing(model)

    def forward(self, prompt_ids, response_ids, pad_id, **kwargs):
        device = next(self.model.parameters()).device.type
        with torch.autocast(device, dtype=self.autocast or torch.bfloat16, enabled=self.autocast is not None):
            if self.activation_checkpointing:
                # The shared-prompt pass appends to a KV cache inside each layer, which a recomputation in backward
                # would repeat; checkpointed layers run every row's prompt + response without a cache instead.
                return packed_response_logprobs(self.model, prompt_ids, response_ids, pad_id, **kwargs)
            return grouped_response_logprobs(self.model, prompt_ids, response_ids, pad_id, **kwargs)


def enable_activation_checkpointing(model: Any) -> None:
    """Keep only each decoder layer's input for backward and recompute the layer there (transformers'
    gradient checkpointing with non-reentrant ``torch.utils.checkpoint``; active in train mode, which the
    trainer's passes use). State-dict keys are unchanged, so weight sync, checkpoints and ``final/`` are too."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft (LoRA) wrapper
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise OprlError(
            f"trainer.activation_checkpointing: {type(base).__name__} does not support gradient checkpointing"
        )
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


class SingleProcess:
    """One trainer process: the whole mini-batch is this rank's share, nothing to reduce."""

    world_size, rank = 1, 0
    grad_scale = 1.0
    """Factor on each micro-batch loss: the number of ranks whose gradients the reduction averages."""

    def wrap(
        self,
        model: torch.nn.Module,
        trainable: bool = True,
        activation_checkpointing: bool = False,
        autocast: torch.dtype | None = None,
    ) -> torch.nn.Module:
        """``model`` in a ``PolicyForward`` (the one forward every rank runs), then placed by ``distribute``."""
        return self.distribute(PolicyForward(model, activation_checkpointing, autocast), model, trainable)

    def distribute(self, forward: torch.nn.Module, model: torch.nn.Module, trainable: bool) -> torch.nn.Module:
        """``forward`` as this parallelism runs it (one process: as it is)."""
        return forward

    def share(self, rows: list, rank: int | None = None) -> list[int]:
        """Indices of ``rows`` (a mini-batch) that ``rank`` trains on."""
        return list(range(len(rows)))

    def micro_batches(self, rows: list, size: int) -> list[list[int]]:
        """This rank's share of ``rows`` in micro-batches of at most ``size`` rows, padded with empty lists to
        the largest number any rank has."""
        mine = self.share(rows)
        count = max(math.ceil(len(self.share(rows, r)) / size) for r in range(self.world_size))
        chunks = [mine[start : start + size] for start in range(0, len(mine), size)]
        return chunks + [[] for _ in range(count - len(chunks))]

    def gradient_sync(self, sync: bool):
        """Context of one micro-batch's backward: reduce gradients over ranks only when ``sync`` (the last)."""
        return nullcontext()

    def clip_grad_norm(self, params, max_norm: float) -> float:
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))

    def grad_norm(self, params) -> float:
        """The global norm of the gradients of ``params`` (no clipping)."""
        return float(torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None]))

    def gather(self, values: list[float]) -> list[float]:
        """Every rank's ``values``, concatenated in rank order (this rank's own on one process)."""
        return list(values)

    gather_objects = staticmethod(alone)
    """``gather_objects(value)``: every rank's ``value`` in rank order (``[value]`` here). The batch rules' gather
    (``losses.batch_keeps``), which skips the exchange when it is this very function."""

    def reduce_metrics(self, sums: dict, extremes: dict) -> tuple[dict, dict]:
        return sums, extremes


class DataParallel(SingleProcess):
    """Rank ``rank`` of ``world_size`` in the default process group (already initialised)."""

    def __init__(self, sharding: str, *, device: torch.device, compute_dtype: torch.dtype | None = None):
        import torch.distributed as dist

        self.sharding, self.device, self.compute_dtype = sharding, device, compute_dtype
        self.world_size, self.rank = dist.get_world_size(), dist.get_rank()
        self.grad_scale = float(self.world_size)
        self.wrapped: Any = None  # the trainable module after wrap: an FSDPModule or a DistributedDataParallel

    def distribute(self, forward: torch.nn.Module, model: torch.nn.Module, trainable: bool) -> torch.nn.Module:
        """FSDP: ``model``'s decoder layers and ``forward`` sharded; DDP: ``forward`` replicated, its gradients
        reduced when ``trainable``."""
        if self.sharding == "fsdp":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            mesh = init_device_mesh(self.device.type, (self.world_size,))
            policy = MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)
            full = forward.state_dict() if self.rank == 0 else {}  # references to rank 0's weights, no copy
            for layer in decoder_layers(model):
                fully_shard(layer, mesh=mesh, mp_policy=policy)
            fully_shard(forward, mesh=mesh, mp_policy=policy)
            fill_from_rank0(forward, full, self.device)
            del full  # rank 0's unsharded weights are freed here
        elif trainable:  # ddp; a frozen reference model needs no gradient reduction
            from torch.nn.parallel import DistributedDataParallel

            device_ids = [self.device.index or 0] if self.device.type == "cuda" else None
            forward = DistributedDataParallel(forward.to(self.device), device_ids=device_ids)
        else:
            forward = forward.to(self.device)
        if trainable:
            self.wrapped = forward
        return forward

    def share(self, rows: list, rank: int | None = None) -> list[int]:
        rank = self.rank if rank is None else rank
        groups = list(dict.fromkeys(e.group_id for e in rows))  # in order of first appearance
        mine = {group for index, group in enumerate(groups) if index % self.world_size == rank}
        return [i for i, e in enumerate(rows) if e.group_id in mine]

    def gradient_sync(self, sync: bool):
        if self.sharding == "fsdp":
            self.wrapped.set_requires_gradient_sync(sync)
            return nullcontext()
        return nullcontext() if sync else self.wrapped.no_sync()

    def clip_grad_norm(self, params, max_norm: float) -> float:
        from torch.distributed.tensor import DTensor

        params = [p for p in params if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        if isinstance(norm, DTensor):  # the norm of sharded gradients: a partial sum over ranks
            norm = norm.full_tensor()
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
        return float(norm)

    def grad_norm(self, params) -> float:
        from torch.distributed.tensor import DTensor

        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)

    def gather(self, values: list[float]) -> list[float]:
        import torch.distributed as dist

        everyone: list = [None] * self.world_size
        dist.all_gather_object(everyone, list(values))
        return [value for rank_values in everyone for value in rank_values]

    def gather_objects(self, value: Any) -> list[Any]:
        import torch.distributed as dist

        everyone: list = [None] * self.world_size
        dist.all_gather_object(everyone, value)
        return everyone

    def reduce_metrics(self, sums: dict, extremes: dict) -> tuple[dict, dict]:
        """Sum the share-weighted metrics and min/max the extremes over ranks; ``perf/`` seconds stay this
        rank's. A rank without rows has no metrics of its own, hence objects rather than fixed tensors."""
        import torch.distributed as dist

        mine = ({k: v for k, v in sums.items() if not k.startswith("perf/")}, extremes)
        everyone: list = [None] * self.world_size
        dist.all_gather_object(everyone, mine)
        total: dict[str, float] = {}
        low_high: dict[str, float] = {}
        for rank_sums, rank_extremes in everyone:  # rank order: the same float sums on every rank
            for key, value in rank_sums.items():
                total[key] = total.get(key, 0.0) + value
            for key, value in rank_extremes.items():
                pick = min if key.endswith("_min") else max
                low_high[key] = pick(low_high.get(key, value), value)
        return sums | total, low_high


def fill_from_rank0(module: torch.nn.Module, full: dict[str, Any], device: torch.device) -> None:
    """Every rank's shards of a ``fully_shard``-ed ``module`` from rank 0's unsharded ``full`` state dict (``{}``
    on the other ranks, whose module may be on the ``meta`` device: ``empty_model``).

    A rank on ``meta`` first allocates its shards (``to_empty``: uninitialised, 4/N bytes per float32
    parameter). ``set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True)`` then broadcasts rank 0's
    tensors one at a time and each rank keeps its slice, so no rank but 0 ever holds an unsharded copy; buffers
    (RoPE's ``inv_freq``: not in the state dict, garbage after ``to_empty``) are broadcast as they are. A
    collective: every rank calls it, in the same order of modules."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if any(t.is_meta for t in itertools.chain(module.parameters(), module.buffers())):
        module.to_empty(device=device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(module, full, options=options)
    for buffer in module.buffers():
        dist.broadcast(buffer, src=0)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks of a Hugging Face causal LM (through a peft wrapper), FSDP's unit."""
    base: Any = getattr(model, "get_base_model", lambda: model)()  # through a peft wrapper to the HF model
    try:
        layers = base.get_decoder().layers
    except (AttributeError, NotImplementedError):
        layers = None
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) == 0:
        raise OprlError(
            f"trainer.sharding=fsdp: {type(base).__name__} has no decoder layers to shard "
            "(model.get_decoder().layers); use trainer.sharding=ddp"
        )
    return list(layers)


def init_process_group(rank: int, world_size: int, address: str, backend: str, device: torch.device) -> None:
    """Join the default group (``address`` = ``host:port`` of rank 0's rendezvous)."""
    import datetime

    import torch.distributed as dist

    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend,
        init_method=f"tcp://{address}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(minutes=10),
    )


def gather_weights(model: torch.nn.Module, dtype: torch.dtype | None, rank: int):
    """Full trainable weights of a (sharded) model as a ``FlatWeights`` on rank 0's CPU; ``None`` elsewhere.

    Parameter by parameter: ``DTensor.full_tensor`` is a collective every rank joins in the same order, and
    only that one parameter exists unsharded at a time. Cast to ``dtype`` (the explorers' dtype) if given."""
    from torch.distributed.tensor import DTensor

    from oprl.messages import FlatWeights

    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    out = None
    if rank == 0:
        layout: list[tuple[str, torch.dtype, int, tuple[int, ...]]] = []
        sizes: dict[torch.dtype, int] = {}
        for name, param in named:
            kind = dtype or param.dtype
            layout.append((name, kind, sizes.get(kind, 0), tuple(param.shape)))
            sizes[kind] = sizes.get(kind, 0) + param.numel()
        out = FlatWeights.from_buffers({k: torch.empty(n, dtype=k) for k, n in sizes.items()}, layout)
    with torch.no_grad():
        for name, param in named:
            full = param.full_tensor() if isinstance(param, DTensor) else param.detach()
            if out is not None:
                out[name].copy_(full)
            del full
    return out


def save_sharded(model: torch.nn.Module, optimizer, directory: Path) -> None:
    """Model and optimizer state into ``directory`` with ``torch.distributed.checkpoint``: each rank writes its
    shard (``*.distcp``) and rank 0 the ``.metadata``; every rank must call it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.tensor import DTensor

    from oprl.checkpoint.manifest import CheckpointError

    # The manifest checks safetensors weights for NaN/inf; shards are checked here, each rank its own.
    for name, param in model.named_parameters():
        local = param.to_local() if isinstance(param, DTensor) else param
        if local.is_floating_point() and not torch.isfinite(local).all():
            raise CheckpointError(f"{directory}: {name} holds non-finite values (NaN or inf); not checkpointed")
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(directory))


def load_sharded(model: torch.nn.Module, optimizer, directory: Path) -> None:
    """Load ``save_sharded``'s output; DCP reshards when the world size differs from the saving run's."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(directory))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
