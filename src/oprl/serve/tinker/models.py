"""What a training model is and how one is made: ``Policy`` (a TrainingClient's module, tokenizer, AdamW and
optimizer-step count), ``Snapshot`` (its trainable tensors at a version), ``Sampler`` (a sampling session: which
weights it draws from), a model built on a base directory (peft LoRA on the modules the ``train_*`` flags select,
or every parameter for rank 0) and weights copied into one. The registry of the server's models is
``backend.TinkerModels``."""

from __future__ import annotations

import secrets
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from oprl.errors import OprlError
from oprl.models.loading import load_pretrained
from oprl.serve.tinker.errors import UserError, base_of

LORA_MODULES = {
    "attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mlp": ("gate_proj", "up_proj", "down_proj"),
    "unembed": ("lm_head",),
}
"""The Llama-family module names that ``train_attn`` / ``train_mlp`` / ``train_unembed`` put adapters on."""
LORA_ALPHA = 32
"""LoRA's α (scale α/r), the value tinker-cookbook's hyperparameter notes assume."""


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

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.weights.values())


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
    """What the gradient accumulated since the last step announces (``LossSpec.announcement``): the next
    ``optim_step``'s metrics repeat it, where recipes log them (tinker-cookbook logs no forward_backward metric)."""
    inflight: Snapshot | None = None
    """The weights this model's in-flight samplers share: each ``kind="inflight"`` save publishes the live weights
    here, for the in-flight samplers made before it too (``backend.TinkerModels.sample_step``)."""

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
    """A snapshot sampler's model (its snapshot is ``Policy.snapshots[sampler_id]`` while kept: a sampler never
    holds one, else a sampler nobody closes keeps its weights alive)."""
    model_path: str | None = None
    inflight: bool = False
    """Samples from its model's published in-flight weights as they are at each decode step (``Policy.inflight``)."""


def build_policy(model_id: str, owner: str, base_model: str, directory: str, lora: dict[str, Any], device: str):
    """A training model on the base in ``directory``: LoRA of ``lora['rank']`` on the chosen modules (rank 0:
    every parameter trains), adapters initialised from ``lora['seed']`` (drawn when absent); AdamW over what
    trains (its hyperparameters are each ``optim_step``'s)."""
    rank = int(lora.get("rank", 32))
    if rank < 0:
        raise UserError(f"lora_config.rank: must be >= 0 (0 = full fine-tuning), got {rank}")
    seed = lora.get("seed")
    seed = secrets.randbelow(2**31) if seed is None else int(seed)
    model, tokenizer = load_pretrained(directory, dtype="float32", device=device)
    if rank > 0:
        with torch.random.fork_rng(devices=[]):  # the adapters' initialisation is the seed's alone
            torch.manual_seed(seed)
            model = _add_adapters(model, rank, lora)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    fused = all(p.device.type in ("cpu", "cuda") for p in params)
    optimizer = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0, fused=fused)
    record = {"rank": rank, "seed": seed, **{k: bool(lora.get(k, True)) for k in _TRAIN_FLAGS}}
    return Policy(model_id, owner, base_model, model, tokenizer, record, optimizer)


def policy_info(policy: Policy, tokenizer_dir: str) -> dict[str, Any]:
    """``GetInfoResponse``: the tokenizer is the local model directory, so ``get_tokenizer`` needs no hub."""
    arch = type(base_of(policy.model)).__name__
    data = {"arch": arch, "model_name": policy.base_model, "tokenizer_id": tokenizer_dir}
    rank = policy.lora["rank"]
    return {
        "type": "get_info",
        "model_id": policy.model_id,
        "model_data": data,
        "is_lora": rank > 0,
        "lora_rank": rank or None,
        "model_name": policy.base_model,
    }


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


def copy_into(policy: Policy, weights: dict[str, torch.Tensor]) -> None:
    copy_params(policy.trainable(), weights)


def copy_params(params: dict[str, torch.Tensor], weights: dict[str, torch.Tensor]) -> None:
    """``weights`` copied into the tensors ``params`` names (the same names, else the client's error)."""
    if set(weights) != set(params):
        raise UserError("path: the checkpoint's tensors do not match this model's trainable parameters")
    with torch.no_grad():
        for name, value in weights.items():
            params[name].copy_(value.to(params[name].device))
