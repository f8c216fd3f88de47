"""``RunConfig``: the root of the tree (mode, backend, resume, seed, steps, the sections), and preset resolution."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from oprl.algorithms import (
    ALGORITHM_DEFAULTS,
    SettingError,
    renamed_message,
    resolve_preset,
)
from oprl.config.algorithm import AlgorithmConfig
from oprl.config.choices import register_choices
from oprl.config.judge import JudgeConfig
from oprl.config.sections import (
    BufferConfig,
    CheckpointConfig,
    EvalConfig,
    LoggingConfig,
    ModelConfig,
    OptimConfig,
    ReplayConfig,
    RolloutConfig,
    RuntimeConfig,
    SyncConfig,
    TrackingConfig,
    TrainerConfig,
    WarmStartConfig,
)
from oprl.config.teacher import TeacherConfig
from oprl.errors import OprlError
from oprl.models import TINY_MAX_POSITIONS
from oprl.tasks import TaskConfig
from oprl.tasks.arithmetic import ArithmeticTaskConfig
from oprl.tasks.config import Section as _Section


def _resume_value(value):
    """``resume`` is true, false or restart (one line for anything else)."""
    if isinstance(value, bool) or value == "restart":
        return value
    raise ValueError("expected true, false or restart")


class RunConfig(_Section):
    """A training run."""

    mode: Literal["both", "explore", "offline", "eval"] = "both"
    """``both`` = explorer(s) and trainer run concurrently; ``explore`` = generate ``steps`` batches with the
    fixed policy at model.path into the experience store; ``offline`` = offline RL from buffer.path;
    ``eval`` = evaluate model.path or eval.checkpoint on the task's test split."""
    backend: Literal["local", "ray"] = "local"
    """``local`` = workers are threads of this process; ``ray`` = Ray actors (``pip install 'oprl[ray]'``).
    In sync.mode=scheduled both give identical metrics for the same seed."""
    resume: Annotated[bool | Literal["restart"], BeforeValidator(_resume_value)] = False
    """``true``: continue run ``run_name`` from its newest checkpoint that verifies (after a crash or kill, or to
    add steps), with the run's saved ``config.yaml``; only the keys given now that are resumable (``steps``,
    ``eval.*``, ``checkpoint.*``, ``runtime.*``, ``tracking.*``, ``backend``, ``progress``, ``tensorboard``,
    ``trainer.world_size``) change, and any other difference is refused. With no usable checkpoint it stops
    and deletes nothing. ``restart``: delete the run's outputs (rows, experiences, checkpoints) and run it
    again from step 0 with its saved config plus the keys given."""
    seed: int = 0
    """Seed of everything in the run (sampling, RED-Drop, data order)."""
    steps: int = Field(300, gt=0)
    """Trainer steps (optimizer batches); in mode=explore, batches to generate."""
    output_dir: str = "runs"
    """Parent directory of run directories."""
    run_name: str | None = None
    """Run directory name under output_dir (default: <preset>-k<interval>-m<offset>[-<what differs from the
    defaults: model, task, engine, backend, sync mode, replay, dtype, sharding>]-s<seed>-<timestamp>)."""
    overwrite: bool = False
    """``true``: a new run may replace the run already in ``output_dir/run_name`` (its outputs are deleted
    first, as TRL's ``overwrite_output_dir``); ``false`` refuses it. Not with ``resume``."""
    progress: bool = True
    """Show a live progress bar on a terminal; elsewhere (or with ``false``) progress goes to plain log lines
    every ``logging.interval`` steps."""
    tensorboard: bool = True
    """Write tensorboard event files into the run directory."""
    tracking: TrackingConfig = TrackingConfig()
    logging: LoggingConfig = LoggingConfig()
    model: ModelConfig = ModelConfig()
    warmstart: WarmStartConfig = WarmStartConfig()
    task: TaskConfig = ArithmeticTaskConfig()
    rollout: RolloutConfig = RolloutConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    optim: OptimConfig = OptimConfig()
    trainer: TrainerConfig = TrainerConfig()
    sync: SyncConfig = SyncConfig()
    eval: EvalConfig = EvalConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    buffer: BufferConfig = BufferConfig()
    replay: ReplayConfig = ReplayConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    teacher: TeacherConfig = TeacherConfig()
    judge: JudgeConfig = JudgeConfig()

    @model_validator(mode="after")
    def _fits_tiny_context(self) -> RunConfig:
        """The embedded model's context is known without loading anything: a reply budget that fills it is
        refused here (``oprl config`` too); prompts are checked before the run starts (oprl.runtime.preflight)."""
        budget = self.rollout.max_new_tokens
        if self.model.path == "tiny" and budget >= TINY_MAX_POSITIONS:
            raise OprlError(
                f"rollout.max_new_tokens={budget}: the embedded tiny model's context is {TINY_MAX_POSITIONS} "
                f"positions, prompt included; lower it (below {TINY_MAX_POSITIONS})"
            )
        return self


def resolve_algorithm(config: RunConfig) -> RunConfig:
    """Fill every unset algorithm field from the named preset through ``oprl.algorithms.resolve_preset`` (the
    one resolver, which also validates every value); a bad preset or value -> one line naming the key."""
    section = config.algorithm
    overrides = {key: getattr(section, key) for key in ALGORITHM_DEFAULTS if getattr(section, key) is not None}
    try:
        settings = resolve_preset(section.preset, **overrides)
    except SettingError as exc:
        raise OprlError(f"config: algorithm.{exc.key}: {exc}") from None
    config.algorithm = section.model_copy(update=settings)
    # The keys the user set, not those the preset filled: a resumed run applies only what was given.
    config.algorithm.__pydantic_fields_set__ = set(section.model_fields_set)
    return config


def algorithm_settings(config: RunConfig) -> dict[str, Any]:
    """The resolved algorithm settings as plain keyword arguments for ``oprl.algorithms``; plug-in functions
    they name are added to the registries of this process first (``choices.register_choices``)."""
    settings = {key: getattr(config.algorithm, key) for key in ALGORITHM_DEFAULTS}
    register_choices(settings)
    return settings


RENAMED_MODES = {"train": "offline"}
"""run.mode values of earlier versions -> the current value (``train`` read as "the trainer alone")."""


def _refuse_renamed(data: dict[str, Any]) -> None:
    """A name of an earlier version is one line naming the new one (no silent alias)."""
    mode = data.get("mode")
    if isinstance(mode, str) and mode in RENAMED_MODES:
        raise OprlError(f"config: mode: {mode!r} was renamed {RENAMED_MODES[mode]!r}")
    section = data.get("algorithm")
    for key, value in section.items() if isinstance(section, dict) else ():
        message = renamed_message(key, value)
        if message:
            raise OprlError(f"config: algorithm.{key}: {message}")
