"""``RunConfig``: the root of the tree (mode, backend, resume, seed, steps, the sections), its rules across
sections (validators: ``oprl config`` refuses what a run would, with the same line), and preset resolution."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from oprl.algorithms import KNOBS, Algorithm, SettingError, renamed_message
from oprl.algorithms.topk_divergence import TOP_K_MASKS
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
    TrackingConfig,
    TrainerConfig,
    WarmStartConfig,
    require_capability,
)
from oprl.config.sync import SyncConfig
from oprl.config.teacher import TeacherConfig
from oprl.errors import OprlError
from oprl.models import TINY_MAX_POSITIONS
from oprl.rollout import Sampling, capabilities, engines_with
from oprl.tasks import TaskConfig
from oprl.tasks.arithmetic import ArithmeticTaskConfig
from oprl.tasks.section import Section as _Section

MAX_NAME_BYTES = 200
"""Longest ``run_name`` in UTF-8 bytes: file systems refuse a path component over 255 bytes, and the margin
leaves room for names built from it (sweep suffixes, temporary names)."""


def check_trainer_device(config: RunConfig, cuda: bool) -> None:
    """The trainer's rules that depend on whether model.device is CUDA (``cuda``): the root config's validator
    applies them to an explicit device, the runtime to ``auto`` once it knows the machine
    (``oprl.trainer.ranks.check_trainer_machine``)."""
    t, device = config.trainer, config.model.device
    if t.dist_backend == "nccl" and not cuda:
        raise OprlError(f"trainer.dist_backend=nccl needs CUDA tensors, model.device={device}; use gloo")
    if cuda and t.sharding != "none" and config.backend == "ray" and config.runtime.gpus_per_trainer_rank <= 0:
        raise OprlError("backend=ray with model.device=cuda: set runtime.gpus_per_trainer_rank (e.g. 1)")


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
    defaults: model, task, engine, backend, sync mode, replay, dtype, sharding>]-s<seed>-<timestamp>). One
    directory name (no ``/``, not ``.`` or ``..``), at most 200 UTF-8 bytes; required with ``resume``."""
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

    @field_validator("run_name")
    @classmethod
    def _one_directory(cls, name: str | None) -> str | None:
        """``run_name`` is one ordinary path component under ``output_dir``, so a run never writes outside it."""
        if name is None:
            return name
        if not name or name in (".", "..") or "/" in name or os.sep in name or "\0" in name or Path(name).is_absolute():
            raise OprlError(
                f"run_name: {name!r} must be a single directory name (no '/', not '.' or '..'); "
                "choose the parent directory with output_dir"
            )
        if len(name.encode()) > MAX_NAME_BYTES:
            raise OprlError(
                f"run_name: {name[:40]!r}... is {len(name.encode())} bytes long; at most {MAX_NAME_BYTES} "
                "(file systems refuse longer directory names)"
            )
        return name

    @model_validator(mode="after")
    def _modes_fit(self) -> RunConfig:
        """mode, resume, overwrite, buffer.path and eval.checkpoint agree."""
        resume = str(self.resume).lower()
        if self.mode == "offline" and not self.buffer.path:
            raise OprlError("mode=offline: set buffer.path to an experience store or a run directory holding one")
        if self.resume and not self.run_name:
            raise OprlError(f"resume={resume}: set run_name to the run to continue")
        if self.resume and self.overwrite:
            raise OprlError(f"overwrite=true and resume={resume}: choose one (overwrite replaces the run)")
        if self.resume and self.mode == "eval":
            raise OprlError(f"resume={resume}: mode=eval has nothing to resume")
        if self.eval.checkpoint and self.mode != "eval":
            raise OprlError("eval.checkpoint is read only with mode=eval")
        return self

    @model_validator(mode="after")
    def _staleness_reachable(self) -> RunConfig:
        """An async run's pacing does not hold its lag below ``sync.max_staleness``
        (``SyncConfig.effective_max_ready``)."""
        if self.mode == "both":
            self.sync.effective_max_ready(self.buffer.max_ready)
        return self

    @model_validator(mode="after")
    def _groups_compare(self) -> RunConfig:
        """Group-relative advantages need two responses per group, unless the baseline is shifted (AsymRE)."""
        if self.mode == "both" and self.rollout.group_size == 1 and not self._setting("baseline_shift"):
            raise OprlError(
                "rollout.group_size=1: every advantage is relative to its group (r - baseline of the "
                "group), so with one response per prompt all advantages are 0 and nothing trains; use >= 2"
            )
        return self

    @model_validator(mode="after")
    def _teacher_given(self) -> RunConfig:
        """Distillation while sampling needs a teacher; mode=offline may read a store scored by one instead
        (whether it is, the runtime sees in the store: ``oprl.teacher.loading.check_teacher_store``)."""
        coef = self._setting("distill_coef") or 0.0
        if coef != 0 and self.teacher.path is None and self.mode == "both":
            raise OprlError(
                f"algorithm.distill_coef={coef:g} needs a teacher: set teacher.path (a run, a checkpoint or a "
                "model with the student's tokenizer)"
            )
        return self

    @model_validator(mode="after")
    def _top_k_recorded(self) -> RunConfig:
        """A loss over the sampler's top-K (``Algorithm.needs.top_k``) needs a sampler that records it; mode=offline
        reads a store that may have (the trainer checks its rows)."""
        if self.mode != "both" or self.rollout.record_top_k:
            return self
        clip_mode = self._setting("clip_mode")
        if self._setting("score_centering"):
            culprit = "algorithm.score_centering=true"
        elif clip_mode in TOP_K_MASKS:
            culprit = f"algorithm.clip_mode={clip_mode}"
        else:
            return self
        raise OprlError(f"{culprit} reads the sampler's top-K per token but rollout.record_top_k=0: set it > 0, e.g. 4")

    @model_validator(mode="after")
    def _ranks_fit(self) -> RunConfig:
        """The trainer's ranks, precision and device agree with the model and the batch; with model.device=auto
        the device rules wait for the machine (``oprl.trainer.ranks.check_trainer_machine``)."""
        t, groups = self.trainer, self.rollout.prompts_per_step
        if t.world_size > groups:
            raise OprlError(
                f"trainer.world_size={t.world_size} exceeds the groups per step "
                f"(rollout.prompts_per_step={groups}): every rank trains on whole groups"
            )
        if t.autocast != "none" and self.model.dtype != "float32":
            raise OprlError(
                f"trainer.autocast={t.autocast} needs model.dtype=float32 (the master weights autocast computes "
                f"from), got model.dtype={self.model.dtype}"
            )
        if self.model.device != "auto":
            check_trainer_device(self, cuda=self.model.device.startswith("cuda"))
        return self

    @model_validator(mode="after")
    def _truncation_rebuilt(self) -> RunConfig:
        """Training with rollout.top_k / rollout.top_p < 1 needs an engine that declares ``exact_truncation``
        (``oprl.rollout.capabilities``): the trainer rebuilds the kept set by that rule; another's is unknown,
        so its rho would be off."""
        rollout = self.rollout
        if self.mode == "eval" or not Sampling.of(rollout).truncates:
            return self
        setting = f"rollout.top_k={rollout.top_k}" if rollout.top_k > 0 else f"rollout.top_p={rollout.top_p}"
        why = "samples by its own truncation rule, which the trainer cannot rebuild (rho != 1 on-policy)"
        require_capability(rollout.engine, lambda c: c.exact_truncation, setting, why)
        return self

    @model_validator(mode="after")
    def _engine_process_fits(self) -> RunConfig:
        """``rollout.engine_process`` needs an engine that declares it (``oprl.rollout.capabilities``)."""
        if self.rollout.engine_process:
            why = "samples in the worker's process (it runs no model in a process of its own)"
            require_capability(self.rollout.engine, lambda c: c.engine_process, "rollout.engine_process=true", why)
        return self

    @model_validator(mode="after")
    def _lora_versions_fit(self) -> RunConfig:
        """An adapter-synced LoRA run keeps no more policy versions live than its engine holds adapters
        (``ModelConfig.check_lora_serving``, ``EngineCapabilities.lora_versions``): adapter as given or as resolved
        for the engine and device (an unset model.lora_sync on vllm on a CPU is merged, which holds one model)."""
        if self.model.lora.r and self.model.lora_sync != "merged":
            held = capabilities(self.rollout.engine).lora_versions
            if held:  # an engine without a bound never needs the device (model.device=auto would import torch)
                self.model.check_lora_serving(self.sync, self.rollout.engine, held)
        return self

    @model_validator(mode="after")
    def _partial_fits(self) -> RunConfig:
        """``sync.partial`` needs an engine that declares the ``sync.partial_kv`` mode (``oprl.rollout.capabilities``,
        read without building it) and overlapped workers (docs/runtime.md#partial-rollouts)."""
        if not self.sync.partial:
            return self
        if self.task.name == "agent":  # before the warm start, not at the first batch (oprl.episodes.agents)
            raise OprlError(
                "sync.partial=true: agent tasks (task.name=agent) sample without switching weights; "
                "set sync.partial=false"
            )
        engine, kv = self.rollout.engine, self.sync.partial_kv
        modes = capabilities(engine).partial_kv
        if not modes:
            raise OprlError(
                f"sync.partial=true needs rollout.engine={' or '.join(engines_with(lambda c: c.partial))} (the "
                "engines that switch weights between decode steps; a plug-in declares capabilities.partial_kv); "
                f"{engine} samples each batch with one policy"
            )
        if kv not in modes:
            raise OprlError(
                f"sync.partial=true with rollout.engine={engine} needs sync.partial_kv={' or '.join(modes)}: it "
                f"supports only that at a switch; {kv} needs rollout.engine="
                + " or ".join(engines_with(lambda c: kv in c.partial_kv))
            )
        if not self.runtime.overlap and self.mode == "both":
            raise OprlError(
                "sync.partial=true needs runtime.overlap=true: a batch waits mid-generation for a trainer step, "
                "which the strictly sequential mode only starts after it"
            )
        return self

    def _setting(self, key: str) -> Any:
        """Algorithm setting ``key`` as the run will use it: the value given, else the preset's
        (``resolve_algorithm`` fills the section only after validation)."""
        value = getattr(self.algorithm, key)
        if value is None:
            try:
                value = Algorithm.of(self.algorithm.preset).settings()[key]
            except SettingError as exc:
                raise OprlError(_setting_line(exc)) from None
        return value


def _setting_line(exc: SettingError) -> str:
    return f"config: algorithm.{exc.key}: {exc}"


def algorithm_of(config: RunConfig) -> Algorithm:
    """The ``Algorithm`` of a resolved run config (``Algorithm.of``: its preset and every knob as the section holds
    it), with the teacher's floor and Dr.GRPO's fixed normaliser (the response budget); plug-in functions its
    choices name are added to the registries of this process first (``choices.register_choices``)."""
    section = config.algorithm
    knobs = {name: value for name in KNOBS if (value := getattr(section, name)) is not None}
    register_choices(knobs)
    return Algorithm.of(
        section.preset,
        knobs,
        max_response_tokens=config.rollout.max_new_tokens,
        teacher_logprob_floor=config.teacher.logprob_floor,
    )


def resolve_algorithm(config: RunConfig) -> RunConfig:
    """Fill every unset algorithm field from the named preset through ``Algorithm.of`` (the one resolver, which
    also validates every value); a bad preset or value -> one line naming the key."""
    section = config.algorithm
    overrides = {key: value for key in KNOBS if (value := getattr(section, key)) is not None}
    try:
        settings = Algorithm.of(section.preset, overrides).settings()
    except SettingError as exc:
        raise OprlError(_setting_line(exc)) from None
    config.algorithm = section.model_copy(update=settings)
    # The keys the user set, not those the preset filled: a resumed run applies only what was given.
    config.algorithm.__pydantic_fields_set__ = set(section.model_fields_set)
    return config


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
