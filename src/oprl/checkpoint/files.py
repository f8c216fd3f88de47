"""Checkpoint files: atomic directories of safetensors and JSON, and the bookkeeping of a run directory.

A checkpoint is ``<run_dir>/checkpoints/step-NNNNNN/``, assembled under a temporary name and renamed when
complete, so a ``kill -9`` leaves either a whole checkpoint or none. Inside:

- ``trainer/model.safetensors`` (every weight, ``safetensors.torch.save_model``), ``trainer/optimizer.*``
  (tensors in safetensors, the rest in JSON), ``trainer/rng.safetensors``, ``trainer/trainer.json``,
  ``trainer/carry.safetensors`` (what a method carries between steps, e.g. the Kondo gate's window; absent when
  it carries nothing), ``trainer/schedule.json`` (the learning-rate schedule's position); with
  ``trainer.sharding`` ddp/fsdp the ranks' ``torch.distributed.checkpoint`` shards in ``trainer/dcp/`` in place
  of model and optimizer (``load_full_weights`` assembles them into one unsharded model for mode=eval);
- ``buffer/`` (``ExperienceBuffer.save``: unconsumed batches and the replay pool, parquet + JSON);
- ``weights/version-N.safetensors``: older policy versions still needed by batches not generated yet;
- ``state.json``: the step, the explorer position, the versions above;
- ``manifest.json``: every file's size and SHA-256, written last (``oprl.checkpoint.manifest``; weights holding
  NaN or infinity are refused before it is written).

Resume takes the newest checkpoint that verifies against its manifest and parses (``usable_checkpoints``); old
checkpoints are pruned only after a newer one has been committed and verified.

Deliberately not here: pickle (``torch.save``) for anything, and deciding *when* to checkpoint or what to
restore (``oprl.runtime.resume``).
"""

from __future__ import annotations

import json
import random
import re
import shutil
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from oprl.checkpoint import contents, manifest
from oprl.errors import OprlError
from oprl.io import atomic_write_text, commit_dir, named

CHECKPOINTS = "checkpoints"
SHARDS = "dcp"
"""Directory (inside a checkpoint's ``trainer/``) of the ``torch.distributed.checkpoint`` shards."""
NOTHING_DELETED = "nothing was deleted; resume=restart runs it again from step 0 (deleting its rows and experiences)"
_STEP_DIR = re.compile(r"step-(\d+)")
T = TypeVar("T")


def step_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"step-{step:06d}"


def staging_dir(run_dir: Path, step: int) -> Path:
    """Where checkpoint ``step`` is assembled (emptied first)."""
    path = Path(run_dir) / CHECKPOINTS / f".tmp-step-{step:06d}"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def commit(staging: Path, final: Path) -> None:
    """Seal a fully written staging directory (finite weights, then the manifest), make it the checkpoint
    (synced, then renamed: ``oprl.io.commit_dir``) and verify what landed; ``CheckpointError`` otherwise."""
    manifest.seal(staging)
    commit_dir(staging, final)
    problem = manifest.verify(final)
    if problem is not None:
        raise manifest.CheckpointError(f"{final}/{problem}")


def checkpoints(run_dir: Path) -> list[Path]:
    """Committed checkpoints of a run, oldest first (staging directories are never listed; whether each one
    is sound is ``manifest.verify``'s question)."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.fullmatch(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def usable_checkpoints(run_dir: Path) -> tuple[list[Path], list[str]]:
    """The checkpoints of ``run_dir`` that verify (``manifest.verify``) and parse (``contents.problem``),
    newest first, and what is wrong with each newer one (``"<checkpoint>/<file> ..."``). Without any:
    ``OprlError`` naming the newest checkpoint's bad file (nothing is deleted)."""
    found = checkpoints(run_dir)
    if not found:
        raise OprlError(
            f"resume: {run_dir} has no checkpoint (checkpoint.interval=0, or the run stopped before "
            f"its first); {NOTHING_DELETED}"
        )
    usable: list[Path] = []
    problems: list[str] = []
    for path in reversed(found):
        problem = manifest.verify(path) or contents.problem(path)
        if problem is None:
            usable.append(path)
        elif not usable:
            problems.append(f"{path}/{problem}")
    if not usable:
        raise OprlError(f"resume: no checkpoint of {run_dir} verifies (newest: {problems[0]}); {NOTHING_DELETED}")
    return usable, problems


def resolve_checkpoint(path: str | Path) -> Path | None:
    """A checkpoint directory, or the newest checkpoint of a run directory; None when there is none."""
    path = Path(path)
    if (path / "state.json").is_file() or (path / manifest.MANIFEST).is_file():
        return path
    found = checkpoints(path)
    return found[-1] if found else None


def prune(run_dir: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints and any staging leftovers (call it only right after a
    checkpoint was committed and verified, so the newest one is sound)."""
    for old in checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    remove_staging(run_dir)


def remove_staging(run_dir: Path) -> None:
    """Delete every ``.tmp-step-N`` (never a committed checkpoint). Also called once the workers have stopped:
    a trainer still writing its part when a failure abandoned the checkpoint can recreate the directory after
    the abandon removed it."""
    for leftover in (Path(run_dir) / CHECKPOINTS).glob(".tmp-step-*"):
        shutil.rmtree(leftover, ignore_errors=True)


def write_json(path: Path, data) -> None:
    with named(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1, sort_keys=True))


def read_json(path: Path):
    return json.loads(Path(path).read_text())


def save_weights(weights: dict[str, torch.Tensor], path: Path) -> None:
    with named(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().contiguous().cpu() for k, v in weights.items()}, str(path))


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))


def save_optimizer(optimizer: torch.optim.Optimizer, directory: Path) -> None:
    """Optimizer state: tensors to ``optimizer.safetensors``, everything else to ``optimizer.json``."""
    state = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, entry in state["state"].items():
        for key, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"{index}/{key}"] = value.detach().contiguous().cpu()
            else:
                scalars[f"{index}/{key}"] = value
    with named(directory / "optimizer.safetensors"):
        save_file(tensors, str(directory / "optimizer.safetensors"))
    write_json(directory / "optimizer.json", {"param_groups": state["param_groups"], "scalars": scalars})


def load_optimizer(optimizer: torch.optim.Optimizer, directory: Path) -> None:
    meta = read_json(directory / "optimizer.json")
    entries: dict[int, dict] = {}
    for name, value in load_file(str(directory / "optimizer.safetensors")).items():
        index, key = name.split("/", 1)
        entries.setdefault(int(index), {})[key] = value
    for name, value in meta["scalars"].items():
        index, key = name.split("/", 1)
        entries.setdefault(int(index), {})[key] = value
    optimizer.load_state_dict({"state": entries, "param_groups": meta["param_groups"]})


def save_rng(directory: Path) -> None:
    """The process's torch (CPU and CUDA) and Python ``random`` generator states."""
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = state
    with named(directory / "rng.safetensors"):
        save_file(tensors, str(directory / "rng.safetensors"))
    version, internal, gauss = random.getstate()
    write_json(directory / "rng.json", {"python": [version, list(internal), gauss]})


def save_carry(directory: str | Path, tensors: dict[str, torch.Tensor]) -> None:
    """What the method carries from step to step (``oprl.algorithms.step.Carry.tensors``) as
    ``carry.safetensors``; no file when it carries nothing."""
    if tensors:
        path = Path(directory) / "carry.safetensors"
        with named(path):
            save_file({name: value.detach().cpu().contiguous() for name, value in tensors.items()}, str(path))


def load_carry(directory: str | Path, of: Callable[[dict[str, torch.Tensor]], T]) -> T:
    """Inverse of ``save_carry``: ``of(tensors)`` (``Carry.of``), ``of({})`` where a checkpoint holds no carry; a
    file ``of`` refuses is one line naming it."""
    path = Path(directory) / "carry.safetensors"
    if not path.is_file():
        return of({})
    with loading(path):
        return of(load_file(str(path)))


def save_schedule(directory: str | Path, slot: int, schedule) -> None:
    """The learning-rate schedule's position as ``schedule.json``: the update slot reached and the schedule
    (``oprl.algorithms.lr_schedule.LrSchedule``: kind, warmup and total slots) it followed."""
    write_json(Path(directory) / "schedule.json",
               {"slot": slot, "kind": schedule.kind, "warmup": schedule.warmup, "total": schedule.total})  # fmt: skip


def load_schedule(directory: str | Path) -> dict | None:
    """Inverse of ``save_schedule``; None for a checkpoint written before schedules were saved (a constant rate)."""
    path = Path(directory) / "schedule.json"
    if not path.is_file():
        return None
    with loading(path):
        data = read_json(path)
        if not all(isinstance(data.get(key), int) for key in ("slot", "warmup", "total")):
            raise ValueError("expected integer slot, warmup and total")
        return data


def load_rng(directory: Path) -> None:
    tensors = load_file(str(directory / "rng.safetensors"))
    torch.set_rng_state(tensors["torch_cpu"])
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("torch_cuda_")]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    version, internal, gauss = read_json(directory / "rng.json")["python"]
    random.setstate((version, tuple(internal), gauss))


def truncate_metrics(path: Path, keep) -> None:
    """Keep the rows whose step satisfies ``keep(step)`` (and drop a half-written last line) before resuming."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if keep(row.get("step", 0)):
            kept.append(line)
    atomic_write_text(path, "".join(line + "\n" for line in kept))


def save_trainer_state(directory: str | Path, model, optimizer: torch.optim.Optimizer, version: int) -> None:
    """The trainer's part of a checkpoint: every weight, the optimizer, this process's RNG, the version."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    with named(root / "model.safetensors"):
        save_model(model, str(root / "model.safetensors"))
    save_optimizer(optimizer, root)
    save_rng(root)
    write_json(root / "trainer.json", {"version": version})


def load_trainer_state(directory: str | Path, model, optimizer: torch.optim.Optimizer) -> int:
    """Inverse of ``save_trainer_state``; returns the version. A file that does not fit this model and
    optimizer (a tensor missing, another shape) is an ``OprlError`` naming it."""
    root = Path(directory)
    with loading(root / "model.safetensors"):
        load_model(model, str(root / "model.safetensors"))
    with loading(root / "optimizer.json"):
        load_optimizer(optimizer, root)
    with loading(root / "rng.safetensors"):
        load_rng(root)
    with loading(root / "trainer.json"):
        return read_json(root / "trainer.json")["version"]


@contextmanager
def loading(path: Path):
    """Any error inside becomes one line naming ``path`` (what a resume reports, and falls back from)."""
    try:
        yield
    except OprlError:
        raise
    except Exception as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        reason = " ".join(lines)[:240]
        raise OprlError(f"{path}: {type(exc).__name__}: {reason}") from None


def load_checkpoint_weights(model, checkpoint: str | Path) -> int:
    """Load a checkpoint's trainer weights into ``model`` (mode=eval); returns its step."""
    root = Path(checkpoint)
    if (root / "trainer" / SHARDS).is_dir():  # written by trainer.sharding=ddp|fsdp ranks
        load_full_weights(model, root / "trainer" / SHARDS)
    else:
        load_model(model, str(root / "trainer" / "model.safetensors"))
    return read_json(root / "state.json")["step"]


def load_full_weights(model: torch.nn.Module, directory: Path) -> None:
    """The weights of a ``save_sharded`` checkpoint into an ordinary (unsharded) ``model``, in this one process
    (mode=eval): DCP assembles every tensor from the ranks' shards, whatever their number."""
    import torch.distributed.checkpoint as dcp

    saved = dcp.FileSystemReader(str(directory)).read_metadata().state_dict_metadata
    # Tied weights (lm_head = embed_tokens) may be saved under one name only; each storage is loaded once.
    state = {k: v for k, v in model.state_dict().items() if f"model.{k}" in saved}
    dcp.load({"model": state}, checkpoint_id=str(directory), no_dist=True)
