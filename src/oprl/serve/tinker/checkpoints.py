"""Checkpoints on disk: ``save_state`` / ``save_weights_for_sampler(name)`` write a training model's trainable
weights (safetensors) and its AdamW state under ``state_dir/<model_id>/<kind>/<name>`` with a ``meta.json``
(base, LoRA record, version), answered as ``tinker://<model_id>/<kind>/<name>``; ``load_state`` and the
``create_*_from_state`` calls read them back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from oprl.checkpoint.files import load_optimizer, load_weights, read_json, save_optimizer, save_weights, write_json
from oprl.serve.tinker.errors import UserError
from oprl.serve.tinker.models import Policy, copy_into


def save(state_dir: Path, policy: Policy, kind: str, name: str, optimizer: bool, overwrite: bool = True) -> str:
    """Trainable weights (and the optimizer) under ``state_dir/<model_id>/<kind>/<name>``; the tinker path.
    ``overwrite=False`` (``save_state``'s default in the SDK) refuses a name this model saved before."""
    if not name or "/" in name or name.startswith("."):
        raise UserError(f"path: {name!r} is not a checkpoint name (no '/', not empty)")
    directory = state_dir / policy.model_id / kind / name
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


def checkpoint(state_dir: Path, path: str, field_name: str = "path") -> tuple[Path, dict[str, Any]]:
    """The directory and metadata of a tinker path this server wrote."""
    parts = path.removeprefix("tinker://").split("/") if path.startswith("tinker://") else []
    if len(parts) != 3 or parts[1] not in ("weights", "sampler_weights"):
        raise UserError(f"{field_name}: {path!r} is not tinker://<model_id>/weights|sampler_weights/<name>")
    directory = state_dir.joinpath(*parts)
    if not (directory / "meta.json").is_file():
        raise UserError(f"{field_name}: no checkpoint {path!r} on this server")
    return directory, read_json(directory / "meta.json")


def load(state_dir: Path, policy: Policy, path: str, optimizer: bool) -> None:
    """The checkpoint's weights (and AdamW state) into ``policy``: a new version, the gradient cleared."""
    directory, meta = checkpoint(state_dir, path)
    if meta["base_model"] != policy.base_model or meta["lora"]["rank"] != policy.lora["rank"]:
        raise UserError(f"path: {path!r} holds a {meta['base_model']} rank-{meta['lora']['rank']} model")
    copy_into(policy, load_weights(directory / "weights.safetensors"))
    if optimizer:
        if not meta.get("optimizer"):
            raise UserError(f"path: {path!r} was saved without optimizer state (save_state writes it)")
        load_optimizer(policy.optimizer, directory)
    policy.version += 1  # the live weights changed: snapshots of before are other weights
    policy.optimizer.zero_grad(set_to_none=True)
    policy.announced.clear()


def host_key(path: str, meta: dict[str, Any]) -> str:
    """Which module samples for the checkpoint at ``path``: a LoRA checkpoint (rank > 0) shares one host module
    with every checkpoint of the same base and adapter shape (rank, the ``train_*`` modules; not the seed, which
    only initialised it), its adapter tensors switched in per call; a full fine-tuning checkpoint is a whole
    model, hosted by itself."""
    if meta["lora"]["rank"] == 0:
        return f"path:{path}"
    shape = {key: value for key, value in meta["lora"].items() if key != "seed"}
    return f"lora:{json.dumps([meta['base_model'], shape], sort_keys=True)}"
