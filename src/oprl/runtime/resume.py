"""Opening a run's directory and resuming from it: the config a run goes on with and the one restore path (the
files are ``oprl.checkpoint.files``, their manifest ``oprl.checkpoint.manifest``, the run directory's lock
``oprl.checkpoint.rundir``; writing checkpoints is ``oprl.runtime.checkpointing``).

``run`` calls two functions of this module: ``open_run`` (lock the run directory, the config the run goes
on with, saved for a new run, and what a resume or an evaluation will load) before any worker starts, and
``restore`` (load that into the started workers) once they are ready.

Resuming (``resume=true``): ``lock_run_dir`` holds the run directory and merges the given keys into the
saved config (only keys that do not change what is computed may differ: ``RESUMABLE_CHANGES``), ``prepare``
lists the checkpoints that verify and whose every file parses (``oprl.checkpoint.contents``), changing
nothing, and ``restore`` is the one path that loads the newest loadable one into the workers and the
synchronizer, refuses to extend a run the checkpoint cannot feed (``check_versions_available``), and only
then cuts ``metrics.jsonl`` and the store back to it. So a refused resume changes no file.
``mode=explore`` resumes from the store itself.
``mode=eval`` reads only a checkpoint's weights (``eval_checkpoint``, then ``Evaluator.load_checkpoint``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import yaml

from oprl.checkpoint import files as ckpt
from oprl.checkpoint import manifest, rundir, storedir
from oprl.checkpoint.store import STORE_DIRNAME, ExperienceStore
from oprl.config import RunConfig, resolve_algorithm, save_config
from oprl.errors import OprlError
from oprl.metrics import read_metrics

if TYPE_CHECKING:
    from oprl.roles import BufferHandle, TrainerHandle


class Versions(Protocol):
    """What ``restore`` needs of the run's synchronizer (``oprl.runtime.synchronizer.Synchronizer``)."""

    snapshots: dict[int, Any]

    @property
    def scheduled(self) -> bool: ...

    def publish(self, version: int, snapshot: Any) -> None: ...

    def scheduled_version(self, batch: int) -> int: ...


# Keys that may change when resuming: they do not alter what is computed (docs/runtime.md, config ``resume``).
RESUMABLE_CHANGES = (
    "steps",
    "progress",
    "logging.",
    "tensorboard",
    "tracking.",
    "backend",
    "checkpoint.",
    "runtime.",
    "eval.",
    "trainer.world_size",
)  # sharded checkpoints reshard to the new world size
_IDENTITY = ("resume", "run_name", "output_dir", "overwrite")


def elapsed_before(resumption: Resumption | None) -> float:
    """Seconds a resumed run had run when the checkpoint it continues from was written, over every earlier
    segment (``total_s``; a checkpoint written before it was recorded has only its own segment's ``wall_s``)."""
    if resumption is None or resumption.path is None:
        return 0.0
    state = ckpt.read_json(resumption.path / "state.json")
    return float(state.get("total_s", state.get("wall_s", 0.0)))


# -- opening the run directory -----------------------------------------------------------------------
@dataclass
class OpenRun:
    """The run directory held for this process, and what the run starts from."""

    lock: rundir.RunLock
    run_dir: Path
    config: RunConfig
    """The config the run goes on with (a resumed run's saved one with the resumable keys given)."""
    store_dir: str | None
    """Where the experience store is (None: the run keeps none)."""
    resumption: Resumption | None = None
    """The checkpoints a resume may load (``restore``); None for a new run and for mode=explore."""
    eval_checkpoint: Path | None = None
    """mode=eval: the checkpoint whose weights are evaluated (None: ``model.path``)."""


def store_dir(config: RunConfig, run_dir: Path) -> str | None:
    """The run's experience store: ``buffer.path``, else ``<run_dir>/experiences`` (none in mode=offline, nor
    in mode=both without ``buffer.persist``)."""
    if config.mode == "offline" or (config.mode == "both" and not config.buffer.persist):
        return None
    return config.buffer.path or str(run_dir / STORE_DIRNAME)


def open_run(config: RunConfig, run_dir: Path, log=print) -> OpenRun:
    """Hold ``run_dir`` (``lock_run_dir``), save a new run's config, and find what it starts from: the
    checkpoint ``eval.checkpoint`` names (mode=eval), the checkpoints a resume may load (``prepare``). On
    an error the lock is released and nothing of a resumed run has changed."""
    checkpoint = eval_checkpoint(config) if config.mode == "eval" else None
    lock, config = lock_run_dir(config, run_dir, log)
    try:
        store = store_dir(config, run_dir)
        if not config.resume:
            save_config(config, run_dir / "config.yaml")
            return OpenRun(lock, run_dir, config, store, eval_checkpoint=checkpoint)
        return OpenRun(lock, run_dir, config, store, resumption=prepare(config, run_dir, store, log))
    except BaseException:
        lock.release()
        raise


# -- resuming ---------------------------------------------------------------------------------------------
def lock_run_dir(config: RunConfig, run_dir: Path, log=print) -> tuple[rundir.RunLock, RunConfig]:
    """Hold ``run_dir`` for this process (see ``rundir``) and the config the run goes on with: the given one
    for a new run; for ``resume=true`` the saved one with the resumable keys given; for ``resume=restart``
    the saved one with any key given, after the run's outputs are deleted."""
    restart = config.resume == "restart"
    if not config.resume or (restart and not rundir.is_run_dir(run_dir)):
        lock = rundir.open_new(run_dir, overwrite=config.overwrite, log=log)
        config = config.model_copy(update={"resume": False})
    else:
        lock = rundir.open_existing(run_dir)
    try:
        if config.resume:
            config = resumed_config(config, run_dir, any_key=restart)
        if restart and config.resume:
            rundir.clear(run_dir)
        # The store at buffer.path is locked too, and checked to be this run's (or appended to on request).
        lock.also(storedir.claim(config, run_dir))
        if restart:
            config = config.model_copy(update={"resume": False})
    except BaseException:
        lock.release()
        raise
    return lock, config


def resumed_config(config: RunConfig, run_dir: Path, *, any_key: bool = False) -> RunConfig:
    """The run's saved config with the keys set in ``config`` (``model_fields_set``: given in the YAML file,
    as overrides or as arguments) applied; unless ``any_key``, only resumable keys may differ."""
    try:
        data = yaml.safe_load((run_dir / "config.yaml").read_text())
        saved = resolve_algorithm(RunConfig.model_validate(data))
    except Exception as exc:
        raise OprlError(
            f"resume: {run_dir / 'config.yaml'} is not a readable run config ({str(exc).splitlines()[0][:160]})"
        ) from None
    flat_saved, flat_given = _flatten(saved.model_dump(mode="json")), _flatten(config.model_dump(mode="json"))
    changed = sorted(
        k for k in _given_keys(config) if not k.startswith(_IDENTITY) and flat_given.get(k) != flat_saved.get(k)
    )
    refused = [k for k in changed if not k.startswith(RESUMABLE_CHANGES)]
    if refused and not any_key:
        raise OprlError(
            f"resume=true: {', '.join(refused[:3])}{' ...' if len(refused) > 3 else ''} differs from "
            f"{run_dir / 'config.yaml'}; only steps, eval.*, checkpoint.*, runtime.*, tracking.*, backend, "
            "progress, tensorboard and trainer.world_size may change (resume=restart starts the run over)"
        )
    for key in changed:
        *sections, leaf = key.split(".")
        node = data
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = flat_given[key]
    # overwrite is the given run's too: a saved overwrite=true (how the run began) is not a resume's choice.
    data.update(
        resume=config.resume, run_name=config.run_name, output_dir=config.output_dir, overwrite=config.overwrite
    )
    return resolve_algorithm(RunConfig.model_validate(data))


def _given_keys(section, prefix: str = "") -> list[str]:
    """Dotted keys of the leaves set explicitly in a config section (not defaults)."""
    keys = []
    for name in section.model_fields_set:
        value = getattr(section, name)
        if hasattr(value, "model_fields_set"):
            keys.extend(_given_keys(value, f"{prefix}{name}."))
        else:
            keys.append(f"{prefix}{name}")
    return keys


def _flatten(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@dataclass
class Resumption:
    """A resume in preparation: the checkpoints it may load, newest first; nothing of the run changed yet."""

    config: RunConfig
    run_dir: Path
    store_dir: str | None
    candidates: list[Path]
    """Checkpoints that verify and parse, newest first."""
    skipped: list[str]
    """What is wrong with the newer checkpoints passed over (``"<checkpoint>/<file> ..."``)."""
    path: Path | None = None
    """The checkpoint ``restore`` loaded."""


def prepare(config: RunConfig, run_dir: Path, store_dir: str | None, log=print) -> Resumption | None:
    """The checkpoints a resume may load (verified against their manifests, every file parsed); nothing is
    changed here. Without one the run stops (one line naming the newest checkpoint's bad file). mode=explore
    resumes from the store itself: batches without a row are made again."""
    metrics = run_dir / "metrics.jsonl"
    if config.mode == "explore":
        # The store is the checkpoint: keep batches that have both a file and a row, make the others again.
        assert store_dir is not None  # mode=explore always writes a store (run._store_dir)
        store = ExperienceStore(store_dir)
        _save_resumed_config(config, run_dir)
        ckpt.truncate_metrics(metrics, lambda step: True)  # drops a half-written last line
        logged = {r["step"] for r in read_metrics(metrics)} if metrics.is_file() else set()
        mine = set(storedir.explore_batches(config, run_dir))  # a shared store also holds other runs' batches
        store.discard([b for b in store.batches() if b in mine and b not in logged])
        present = set(store.batches())
        ckpt.truncate_metrics(metrics, lambda step: step in present)
        return None
    if rundir.never_started(run_dir):
        raise OprlError(
            f"resume: {run_dir} stopped before step 1 (no checkpoint, no trained step): there is nothing to "
            "continue; run it again without resume=true, which replaces it"
        )
    candidates, skipped = ckpt.usable_checkpoints(run_dir)
    newest = candidates[0]
    step = ckpt.read_json(newest / "state.json")["step"]
    if step > config.steps:
        raise OprlError(
            f"resume: {run_dir} has already trained {step} steps (checkpoint {newest.name}); "
            f"steps={config.steps} would not continue it: give steps >= {step} to extend it"
        )
    return Resumption(config, run_dir, store_dir, candidates, skipped)


def _save_resumed_config(config: RunConfig, run_dir: Path) -> None:
    """Once the resume is known to be possible: the settings it goes on with are what a later resume reads."""
    save_config(config.model_copy(update={"resume": False}), run_dir / "config.yaml")


def restore(
    plan: Resumption, backend, trainer: TrainerHandle, buffer: BufferHandle, sync: Versions, log=print
) -> tuple[int, list[int]]:
    """Load the newest loadable checkpoint of ``plan`` into the trainer, the buffer, the synchronizer (the old
    versions still needed) and this process's RNG, and only then cut ``metrics.jsonl`` and the store back
    to it (batches generated after it are made again); returns ``(step, fresh batches the buffer holds)``:
    the one restore path. A checkpoint the workers cannot load (a tensor missing from the model) is passed
    over for the next older one, said in one line; when none loads, ``OprlError`` naming the file, and no
    file of the run has changed."""
    problems = list(plan.skipped)
    for checkpoint in plan.candidates:
        try:
            backend.get(trainer.restore(str(checkpoint / "trainer")))
            ready = backend.get(buffer.restore(str(checkpoint / "buffer")))
        except Exception as exc:  # a file that does not fit this run's model: try the next older one
            reason = backend.describe(exc).removeprefix("OprlError: ")
            problems.append(reason if str(checkpoint) in reason else f"{checkpoint}: {reason}")
            continue
        state = ckpt.read_json(checkpoint / "state.json")
        for version in state["weights_versions"]:
            weights = ckpt.load_weights(checkpoint / "weights" / f"version-{version:06d}.safetensors")
            sync.publish(version, backend.put(weights))
        ckpt.load_rng(checkpoint)
        config = plan.config
        if config.mode == "both" and sync.scheduled:
            pending = [b for b in range(state["step"] + 1, config.steps + 1) if b not in ready]
            check_versions_available(checkpoint, sync, pending, state["step"])
        if problems:
            log(f"resume: the newest checkpoint is unusable ({problems[0]}); resuming from {checkpoint.name} instead")
        _cut_back(plan, state)
        plan.path = checkpoint
        return state["step"], ready
    raise OprlError(f"resume: no checkpoint of {plan.run_dir} loads (newest: {problems[0]}); {ckpt.NOTHING_DELETED}")


def _cut_back(plan: Resumption, state: dict) -> None:
    """The run's files after a checkpoint has loaded: its settings saved, rows and batches after it dropped."""
    _save_resumed_config(plan.config, plan.run_dir)
    ckpt.truncate_metrics(plan.run_dir / "metrics.jsonl", lambda step: step <= state["step"])
    if plan.store_dir:
        store = ExperienceStore(plan.store_dir)
        store.discard([b for b in store.batches() if b > max(state["step"], 0) and b not in state["ready"]])


def check_versions_available(checkpoint: Path, sync: Versions, pending: list[int], step: int) -> None:
    """A checkpoint holds the old versions its own run still needed; a longer run may need more."""
    missing = [b for b in pending if step > sync.scheduled_version(b) not in sync.snapshots]
    if missing:
        b = missing[0]
        raise OprlError(
            f"resume: batch {b} must come from policy version {sync.scheduled_version(b)} (sync.interval/offset), "
            f"which {checkpoint} does not hold: it was written for a run of fewer steps; a run can be extended "
            f"only from a checkpoint of a step t with v(t + 1) = t (e.g. sync.offset=0, t a multiple of sync.interval)"
        )


def eval_checkpoint(config: RunConfig) -> Path | None:
    """mode=eval: the checkpoint ``eval.checkpoint`` names (verified), or None to evaluate ``model.path``."""
    source = config.eval.checkpoint
    checkpoint = ckpt.resolve_checkpoint(source) if source else None
    if source and checkpoint is None:
        raise OprlError(f"eval.checkpoint: no checkpoint at {source}")
    problem = manifest.verify(checkpoint) if checkpoint else None
    if problem is not None:
        raise OprlError(f"eval.checkpoint: {checkpoint}/{problem}")
    return checkpoint
