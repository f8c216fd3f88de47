"""The one typed configuration tree of a run, loaded from YAML plus dotted ``key=value`` overrides.

Every field carries its default and meaning in the docstring under it (``oprl train --help-config`` prints
them). Validation errors come out as one line naming the key and, for unknown keys, the closest valid ones.
The fully resolved tree (preset expanded) is written to ``<run_dir>/config.yaml``.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from oprl.errors import OprlError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)


class ModelConfig(_Section):
    path: str = "tiny"
    """Model to train. ``tiny`` = the embedded character-level Llama, built and warm-started on the task
    (cached in the user cache dir); otherwise a local Hugging Face model directory."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype. float32 keeps CPU runs bit-for-bit repeatable."""
    hidden_size: int = Field(128, gt=0)
    """Embedded tiny model only: width of the residual stream."""
    num_layers: int = Field(2, gt=0)
    """Embedded tiny model only: number of transformer blocks."""
    num_heads: int = Field(4, gt=0)
    """Embedded tiny model only: attention heads (must divide hidden_size)."""


class WarmStartConfig(_Section):
    """Supervised warm start of the embedded model: train until pass@1 at temperature 1 reaches the target,
    so RL starts from a policy that solves some problems but leaves room to improve."""

    target_accuracy: float = Field(0.3, gt=0.0, lt=1.0)
    """Stop supervised training once validation pass@1 (temperature 1.0) reaches this."""
    max_steps: int = Field(3000, gt=0)
    """Upper bound on supervised steps if the target is never reached."""
    batch_size: int = Field(128, gt=0)
    """Problems per supervised step."""
    lr: float = Field(3e-3, gt=0.0)
    """AdamW learning rate of the warm start."""
    check_interval: int = Field(25, gt=0)
    """Supervised steps between validation checks."""
    val_problems: int = Field(256, gt=0)
    """Train-split problems held out of the warm start to measure its pass@1."""
    seed: int = 0
    """Seed of the warm start (weights init, data order, sampling); part of the cache key."""


class TaskConfig(_Section):
    name: Literal["arithmetic"] = "arithmetic"
    """Task plug-in (see ``oprl.tasks.TASKS``)."""
    train_size: int = Field(2500, gt=0)
    """Number of training problems."""
    test_size: int = Field(500, gt=0)
    """Number of held-out test problems (evaluation)."""
    max_value: int = Field(9, gt=0)
    """Arithmetic: operands are drawn uniformly from 0..max_value."""
    num_operands: int = Field(3, ge=2)
    """Arithmetic: operands per expression."""
    operators: str = "+-"
    """Arithmetic: operators to draw from, a subset of '+-*'."""
    seed: int = 1234
    """Seed of problem generation; fixes both splits."""


class RolloutConfig(_Section):
    group_size: int = Field(8, gt=0)
    """K: responses sampled per prompt; advantages are relative within each group."""
    prompts_per_step: int = Field(32, gt=0)
    """Prompts per trainer step; the batch is prompts_per_step x group_size responses."""
    temperature: float = Field(1.0, gt=0.0)
    """Sampling temperature; the trainer divides logits by the same value."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling; 1.0 samples from the full distribution."""
    max_new_tokens: int = Field(8, gt=0)
    """Response length limit; longer responses are truncated and flagged."""


class AlgorithmConfig(_Section):
    """A named preset (SPEC section 3) plus optional per-field overrides; ``None`` = the preset's value."""

    preset: str = "grpo"
    """Algorithm preset: reinforce, grpo, rec-oneside-is, rec-oneside-nois, rec-twoside-*, rec-ring-*, the
    ``-wide`` variants, opmd, asymre, red-drop, red-weight (see docs/algorithms.md)."""
    std_normalize: Optional[bool] = None
    """Divide advantages by the group's population std + 1e-6 (GRPO)."""
    drop: Optional[Literal["none", "balance"]] = None
    """``balance`` = RED-Drop: drop surplus negatives so each group has as many negatives as positives;
    ``none`` keeps every response."""
    baseline_shift: Optional[float] = None
    """AsymRE: baseline = group mean - baseline_shift."""
    baseline: Optional[Literal["mean", "logavgexp"]] = None
    """Group baseline: mean, or the OPMD soft baseline tau*log(mean(exp(r/tau)))."""
    tau: Optional[float] = Field(None, gt=0.0)
    """Temperature of the logavgexp baseline."""
    clip_mode: Optional[Literal["none", "one-side", "two-side", "ring"]] = None
    """Token mask M: none, one-side (where PPO-clip has gradient), two-side, ring."""
    weight: Optional[Literal["none", "importance_sampling", "advantage"]] = None
    """Per-token weight: none (NoIS), importance_sampling (rho, detached), advantage (exp(A/T), RED-Weight)."""
    eps_low: Optional[float] = Field(None, ge=0.0)
    """Clip band lower edge: rho >= 1 - eps_low."""
    eps_high: Optional[float] = Field(None, ge=0.0)
    """Clip band upper edge: rho <= 1 + eps_high."""
    eps_low_prime: Optional[float] = Field(None, ge=0.0)
    """Ring clipping: positive-advantage tokens are also kept where rho <= 1 - eps_low_prime."""
    eps_high_prime: Optional[float] = Field(None, ge=0.0)
    """Ring clipping: negative-advantage tokens are also kept where rho >= 1 + eps_high_prime."""
    regularizer: Optional[Literal["none", "k2", "forward-kl"]] = None
    """Regulariser on every valid token: k2 (OPMD) or forward-kl (AsymRE)."""
    regularizer_coef: Optional[float] = Field(None, ge=0.0)
    """Coefficient c of the regulariser."""
    temperature: Optional[float] = Field(None, gt=0.0)
    """RED-Weight temperature T in w = exp(A/T) (not the sampling temperature)."""
    loss_agg: Optional[
        Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
    ] = None
    """How token losses are averaged over the optimizer batch (token-mean = over all valid tokens)."""
    kl_coef: float = Field(0.0, ge=0.0)
    """Coefficient of a KL penalty to the frozen initial policy (0 = off, no reference model kept)."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """Per-token KL estimator of the reference penalty (Schulman's k1/k2/k3)."""
    entropy_coef: float = Field(0.0, ge=0.0)
    """Entropy bonus coefficient (0 = off)."""


class OptimConfig(_Section):
    lr: float = Field(1e-3, gt=0.0)
    """AdamW learning rate (constant)."""
    weight_decay: float = Field(0.0, ge=0.0)
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    grad_clip: float = Field(1.0, gt=0.0)
    """Clip the global gradient norm to this value before each optimizer step."""
    mini_batches: int = Field(1, gt=0)
    """Optimizer steps per batch per epoch: the batch is split into this many mini-batches (paper: 1)."""
    epochs: int = Field(1, gt=0)
    """Passes over each batch (paper: 1)."""
    micro_batch_size: int = Field(256, gt=0)
    """Rows per forward/backward pass; gradients are accumulated exactly, so this only trades memory."""


class SyncConfig(_Section):
    """The off-policy schedule (SPEC section 4): step t trains on data from policy version
    v(t) = k*floor((t-1-m)/k) when t-1 >= m+k, else 0."""

    interval: int = Field(1, gt=0)
    """k: the rollout weights are refreshed every k trainer steps (1 = every step)."""
    offset: int = Field(0, ge=0)
    """m: the rollout side runs m steps ahead before its first refresh (0 = none)."""


class EvalConfig(_Section):
    interval: int = Field(25, ge=0)
    """Trainer steps between evaluations (0 = only before and after training)."""
    num_problems: int = Field(500, gt=0)
    """Test problems per evaluation (capped by task.test_size)."""
    temperature: float = Field(1.0, gt=0.0)
    """Sampling temperature of evaluation (pass@1 with one sample per problem)."""
    batch_size: int = Field(512, gt=0)
    """Prompts per generate call during evaluation."""


class RunConfig(_Section):
    """A training run."""

    seed: int = 0
    """Seed of everything in the run (sampling, RED-Drop, data order)."""
    steps: int = Field(100, gt=0)
    """Trainer steps (optimizer batches)."""
    output_dir: str = "runs"
    """Parent directory of run directories."""
    run_name: Optional[str] = None
    """Run directory name under output_dir (default: <preset>-k<interval>-m<offset>-s<seed>-<timestamp>)."""
    progress: bool = True
    """Show a live progress bar."""
    tensorboard: bool = True
    """Write tensorboard event files into the run directory."""
    model: ModelConfig = ModelConfig()
    warmstart: WarmStartConfig = WarmStartConfig()
    task: TaskConfig = TaskConfig()
    rollout: RolloutConfig = RolloutConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    optim: OptimConfig = OptimConfig()
    sync: SyncConfig = SyncConfig()
    eval: EvalConfig = EvalConfig()


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> RunConfig:
    """YAML file (optional) + ``a.b=value`` overrides -> validated ``RunConfig`` with the preset resolved."""
    data: dict[str, Any] = {}
    if path is not None:
        data = _read_yaml(Path(path))
    for item in overrides:
        _apply_override(data, item)
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as exc:
        raise OprlError(_describe(exc)) from None
    return resolve_algorithm(config)


def resolve_algorithm(config: RunConfig) -> RunConfig:
    """Fill every unset algorithm field from the named preset (unknown preset -> one-line error)."""
    from oprl.algorithms import PRESETS

    section = config.algorithm
    if section.preset not in PRESETS:
        raise OprlError(f"algorithm.preset: unknown preset {section.preset!r}{_closest(section.preset, PRESETS)}")
    filled = {k: v for k, v in PRESETS[section.preset].items() if getattr(section, k) is None}
    config.algorithm = section.model_copy(update=filled)
    return config


def algorithm_settings(config: RunConfig) -> dict[str, Any]:
    """The resolved algorithm settings as plain keyword arguments for ``oprl.algorithms``."""
    from oprl.algorithms import ALGORITHM_DEFAULTS

    return {key: getattr(config.algorithm, key) for key in ALGORITHM_DEFAULTS}


def save_config(config: RunConfig, path: Path) -> None:
    path.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise OprlError(f"config file {path}: not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise OprlError(f"config file {path}:{where}: malformed YAML ({getattr(exc, 'problem', exc)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise OprlError(f"config file {path}: expected a mapping of keys at the top level, got {type(data).__name__}")
    return data


def _apply_override(data: dict[str, Any], item: str) -> None:
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise OprlError(f"override {item!r}: expected key=value (for example algorithm.preset=grpo)")
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        value = raw
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise OprlError(f"override {item!r}: {part} is not a section")
        node = child
    node[parts[-1]] = value


def _describe(exc: ValidationError) -> str:
    """First validation error as one line: the dotted key, what is wrong, and suggestions."""
    error = exc.errors()[0]
    key = ".".join(str(p) for p in error["loc"])
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    if error["type"] == "extra_forbidden":
        section = _section_at(error["loc"][:-1])
        valid = list(section.model_fields) if section else []
        return f"config: unknown key {key!r}{_closest(str(error['loc'][-1]), valid)}{more}"
    return f"config: {key}: {error['msg']} (got {error.get('input')!r}){more}"


def _section_at(loc) -> type[BaseModel] | None:
    model: type[BaseModel] = RunConfig
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return None
        model = field.annotation
    return model


def _closest(name: str, valid) -> str:
    valid = list(valid)
    near = difflib.get_close_matches(name, valid, n=3, cutoff=0.5)
    if near:
        return f"; did you mean {', '.join(near)}?"
    return f"; valid: {', '.join(valid)}"


def describe_fields(model: type[BaseModel] = RunConfig, prefix: str = "") -> list[str]:
    """``key (default): meaning`` lines for every leaf option, for ``--help-config``."""
    lines = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            lines.extend(describe_fields(annotation, f"{prefix}{name}."))
        else:
            doc = " ".join((field.description or "").split())
            lines.append(f"{prefix}{name} = {field.default!r}: {doc}")
    return lines
