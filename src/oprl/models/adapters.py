"""A LoRA policy's adapters as data: what an adapter-synced sampler receives (``model.lora_sync=adapter``).

A LoRA policy (``oprl.models.loading.add_lora``, peft) trains only its adapters, so the trainer's snapshot
(``oprl.worker_parts.trainable_weights``: the parameters with ``requires_grad``) is already the adapters alone:
``lora_A`` (r, in) and ``lora_B`` (out, r) of each adapted layer, under peft's parameter names. This module
turns a model's adapters into what a sampler outside torch loads: ``write_adapter`` writes them as a peft
adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``, the format vLLM's LoRA loader reads),
``base_weights`` gives the frozen base under Hugging Face checkpoint names, unmerged, and ``merged_weights`` the
base with each adapter folded in, ``W + (alpha/r) B A`` (what a merged sync serves).

Deliberately not here: loading adapters into a torch model (``load_state_dict`` of the snapshot does it: the
names are the model's own), several adapters on one model, quantised bases.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def lora_rank(model) -> int:
    """The rank ``r`` of ``model``'s active LoRA adapter; 0 for a model without one (full fine-tuning)."""
    config = getattr(model, "peft_config", {}).get(getattr(model, "active_adapter", "default"))
    return int(getattr(config, "r", 0) or 0)


def base_of(model):
    """The Hugging Face model inside a peft wrapper (``model`` itself when it has none)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def merged_weights(model, merge: bool = True) -> dict[str, torch.Tensor]:
    """``model``'s weights under their Hugging Face checkpoint names (peft's ``base_model.model.`` and
    ``.base_layer`` dropped, adapter tensors left out), tied tensors under each of their names. ``merge``: each
    adapted layer's weight is ``W + sum_a get_delta_weight(a)`` = ``W + (alpha/r) B A``, which the un-merged
    forward equals up to float rounding; ``merge=False``: the frozen base ``W`` alone (``base_weights``)."""
    base = base_of(model)
    adapted = {
        name: module
        for name, module in base.named_modules()
        if hasattr(module, "base_layer") and hasattr(module, "get_delta_weight")
    }
    weights = {}
    for name, param in base.named_parameters(remove_duplicate=False):
        if any(part.startswith("lora_") for part in name.split(".")):
            continue
        tensor = param.detach()
        layer = adapted.get(name.rpartition(".base_layer.")[0])
        if merge and layer is not None and name.endswith(".base_layer.weight") and not getattr(layer, "merged", False):
            for adapter in layer.active_adapters:
                if adapter in getattr(layer, "lora_A", {}):
                    tensor = tensor + layer.get_delta_weight(adapter).to(tensor.dtype)
        weights[name.replace(".base_layer.", ".")] = tensor
    return weights


def base_weights(model) -> dict[str, torch.Tensor]:
    """The frozen base of a LoRA ``model`` under checkpoint names, adapters not applied (what an adapter-synced
    sampler loads once, at start-up)."""
    return merged_weights(model, merge=False)


def adapter_tensors(model) -> dict[str, torch.Tensor]:
    """The active adapter's tensors under peft's saved names (``base_model.model.<layer>.lora_A.weight``: the
    adapter's name dropped), as ``save_pretrained`` writes them: ``lora_A`` (r, in), ``lora_B`` (out, r)."""
    from peft import get_peft_model_state_dict

    return {name: tensor.detach() for name, tensor in get_peft_model_state_dict(model).items()}


def write_adapter(model, directory: str | Path) -> int:
    """Write ``model``'s active adapter into ``directory`` as a peft adapter (``adapter_config.json``,
    ``adapter_model.safetensors``); returns the bytes of its tensors (what crosses to the sampler)."""
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    # Placement: the adapter leaves the model's device here (a GPU policy's lora_A / lora_B copied to the CPU);
    # vLLM's LoRA manager reads the file into its CPU cache and copies it into one of its GPU slots on add_lora.
    tensors = {name: tensor.to("cpu").contiguous() for name, tensor in adapter_tensors(model).items()}
    save_file(tensors, os.path.join(directory, "adapter_model.safetensors"))
    config = model.peft_config[model.active_adapter].to_dict()
    config["target_modules"] = sorted(config["target_modules"]) if config.get("target_modules") else None
    with open(os.path.join(directory, "adapter_config.json"), "w") as f:
        json.dump(config, f, default=str)
    return sum(t.numel() * t.element_size() for t in tensors.values())


def adapted_shapes(model) -> list[tuple[int, int]]:
    """``(in_features, out_features)`` of every linear layer ``model``'s active adapter adapts (peft's LoRA layers):
    an adapter of rank r holds ``r (in + out)`` numbers per layer."""
    shapes = []
    for module in base_of(model).modules():
        if hasattr(module, "base_layer") and getattr(module, "lora_A", None):
            layer = module.get_base_layer()
            shapes.append((int(layer.in_features), int(layer.out_features)))
    return shapes
