"""The Python entry point: ``oprl.train(...)`` and ``oprl.evaluate(...)`` from a script or a notebook.

The command line is a thin layer over these functions (``oprl train`` = ``oprl.train``), so both resolve
the same configuration and produce the same run directory. Settings come from, in order: a config (a YAML
path, a ``RunConfig`` or a dict), then keyword overrides, written as nested dicts (``rollout={"group_size":
4}``), as dotted keys (``**{"rollout.group_size": 4}``) or, for top-level keys, plainly (``steps=20``).
``task=`` takes a task name, a task section (``DatasetTaskConfig(...)``) or a built task; ``reward=`` takes
a reward spec string, a function defined in a ``.py`` file or module, or a list of them.

    >>> import oprl
    >>> run = oprl.train(steps=20, algorithm={"preset": "rec-oneside-nois"})
    >>> run.final_metrics["eval/accuracy"], run.run_dir

A reward function travels to the worker processes by name (``oprl.import_paths``: ``module:function`` when a
fresh process finds the module, else ``/path/file.py:function``) and is recorded that way in the run's
``config.yaml``, so the run can be resumed and repeated; a function defined in a notebook cell or a lambda has no
such name: put it in a ``.py`` file. An agent function (``task={"name": "agent", "agent": rollout}``) goes the same
way.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oprl.config import RunConfig, load_config
from oprl.errors import OprlError
from oprl.import_paths import reward_spec, task_values
from oprl.noise import keep_noise_out

ConfigSource = str | Path | RunConfig | Mapping[str, Any] | None
"""A YAML path, a ``RunConfig``, a dict of settings, or None (the defaults)."""


@dataclass(frozen=True)
class RunResult:
    """What a run left behind: its directory, resolved config, final metrics and summary."""

    run_dir: Path
    """The run directory (``<output_dir>/<run_name>``)."""
    config: RunConfig
    """The resolved configuration the run used (also in ``config.yaml``)."""
    summary: dict[str, Any]
    """``summary.json``: mode, eval accuracy before and after, steps, seconds."""
    final_metrics: dict[str, float] = field(default_factory=dict)
    """The last trainer step's metrics merged with the last evaluation's (``eval/accuracy``, ...)."""
    accuracy_before: float = float("nan")
    """Eval accuracy (pass@1) before training (mode=eval: the one evaluation)."""
    accuracy_after: float = float("nan")
    """Eval accuracy after the last step (mode=eval: the one evaluation)."""
    seconds: float = float("nan")
    """Wall-clock seconds of the run."""

    def __repr__(self) -> str:
        """One line: where the run is and how it went (the generated repr printed the whole config and summary,
        which stay attributes)."""
        return (
            f"RunResult(run_dir={str(self.run_dir)!r}, mode={self.config.mode}, "
            f"accuracy {self.accuracy_before:.3f} -> {self.accuracy_after:.3f}, {self.seconds:.0f} s)"
        )

    @property
    def metrics_path(self) -> Path:
        """``metrics.jsonl``: one JSON row per trainer step and per evaluation."""
        return self.run_dir / "metrics.jsonl"

    @property
    def config_path(self) -> Path:
        return self.run_dir / "config.yaml"

    @property
    def checkpoints_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def final_model(self) -> Path | None:
        """The trained model as a Hugging Face directory (``from_pretrained`` loads it); None if not written."""
        path = self.run_dir / "final"
        return path if path.is_dir() else None

    def metrics(self) -> list[dict[str, Any]]:
        """Every row of ``metrics.jsonl``."""
        from oprl.metrics import read_metrics

        return read_metrics(self.metrics_path)


def train(
    config_or_path: ConfigSource = None,
    /,
    *,
    task: Any = None,
    reward: Any = None,
    log: Callable[[str], Any] = print,
    **overrides: Any,
) -> RunResult:
    """Train (``mode=both`` unless ``mode=`` says otherwise) and return the run.

    Args:
        config_or_path: a YAML path, a ``RunConfig``, a dict of settings, or None for the defaults.
        task: a task name (``"gsm8k"``), a task section (``DatasetTaskConfig(...)``), or a built task.
        reward: for ``task.name=dataset``: ``"file.py:function"``, ``"module:function"``, a function defined in a
            ``.py`` file or module, or a list of these (weights in ``task={"reward_weights": [...]}``).
        log: where progress lines go (``print``).
        **overrides: settings over the config: ``steps=20``, ``rollout={"group_size": 4}``,
            ``**{"algorithm.preset": "opmd"}``.

    Raises:
        OprlError: a user mistake (bad key, missing file, reward that does not import), one line naming it.
    """
    return run(resolve(config_or_path, task=task, reward=reward, **overrides), log=log)


def evaluate(
    config_or_path: ConfigSource = None,
    /,
    *,
    checkpoint: str | Path | None = None,
    task: Any = None,
    reward: Any = None,
    log: Callable[[str], Any] = print,
    **overrides: Any,
) -> RunResult:
    """Evaluate (pass@1 on the task's test split) and return the result; ``final_metrics["eval/accuracy"]``.

    ``checkpoint`` is a checkpoint directory (``<run>/checkpoints/step-N``) or a run directory (its newest
    checkpoint): the run's own config is used (overrides still apply) and its weights are evaluated; without
    it, ``model.path`` is evaluated under ``config_or_path``.
    """
    forced = ["mode=eval"]
    if checkpoint is not None:
        config_or_path = checkpoint_config(checkpoint)
        forced = checkpoint_overrides(checkpoint, keep_run_name="run_name" in overrides)
    return run(resolve(config_or_path, forced, task=task, reward=reward, **overrides), log=log)


def checkpoint_config(source: str | Path) -> Path:
    """The ``config.yaml`` of the run that holds checkpoint, run or ``final/`` directory ``source``."""
    from oprl.checkpoint.rundir import final_config

    source = Path(source)
    carried = final_config(source)
    if carried is not None:
        return carried
    run_dir = source.parent.parent if (source / "state.json").is_file() else source
    if not (run_dir / "config.yaml").is_file():
        hint = ""
        if (source / "config.json").is_file():  # a model directory without its run's config (an older final/)
            hint = f"; a model directory: evaluate it with `oprl eval model.path={source} task.name=...`"
        raise OprlError(f"{source}: not a checkpoint or run directory (no config.yaml in {run_dir}){hint}")
    return run_dir / "config.yaml"


def checkpoint_overrides(source: str | Path, *, keep_run_name: bool = False) -> list[str]:
    """Settings that evaluate checkpoint, run or ``final/`` directory ``source`` in a new run directory
    (unless ``keep_run_name``) over its run's config. A ``final/`` is evaluated as ``model.path`` (no warm
    start: it is the trained model)."""
    from oprl.checkpoint.rundir import final_config

    if final_config(source) is not None:
        forced = ["mode=eval", f"model.path={source}", "eval.checkpoint=null", "warmstart.pretrained=false"]
    else:
        forced = ["mode=eval", f"eval.checkpoint={source}"]
    forced.append("resume=false")
    return forced if keep_run_name else [*forced, "run_name=null"]


def final_model_settings(config: RunConfig, log: Callable[[str], Any] = print) -> RunConfig:
    """mode=eval of ``model.path=<run>/final``: the run's task and eval settings unless given (then a line
    when the task given is not the run's), so ``model.path=runs/X/final`` scores as ``oprl eval runs/X``."""
    from oprl.checkpoint.rundir import final_config

    carried = final_config(config.model.path) if config.mode == "eval" and not config.eval.checkpoint else None
    if carried is None:
        return config
    trained = load_config(carried)
    given = config.model_fields_set
    if "task" in given:
        if config.task != trained.task:
            log(
                f"warning: model.path={config.model.path} was trained on task {trained.task.name}; evaluating "
                f"task {config.task.name} as given"
            )
        return config
    update: dict[str, Any] = {"task": trained.task}
    if "eval" not in given:
        update["eval"] = trained.eval
    log(f"model.path={config.model.path}: a run's final model; evaluating its run's task {trained.task.name}")
    return config.model_copy(update=update)


def resolve(
    config_or_path: ConfigSource = None,
    cli_overrides: Sequence[str] = (),
    /,
    *,
    task: Any = None,
    reward: Any = None,
    **overrides: Any,
) -> RunConfig:
    """The validated, preset-resolved config these arguments describe (what ``train`` would run).

    ``cli_overrides`` are ``key=value`` strings as the command line takes them, applied before ``overrides``.
    """
    path = None
    items = list(cli_overrides)
    if isinstance(config_or_path, (str, Path)):
        path = config_or_path
    elif isinstance(config_or_path, RunConfig):
        items = _as_overrides(config_or_path.model_dump(mode="json")) + items
    elif isinstance(config_or_path, Mapping):
        items = _as_overrides(dict(config_or_path)) + items
    elif config_or_path is not None:
        raise OprlError(f"config: expected a YAML path, a RunConfig or a dict, got {type(config_or_path).__name__}")
    if task is not None:  # the whole section: a new task's fields replace the old task's
        items.append(f"task={json.dumps(task_values(task), default=str)}")
    if reward is not None:
        items += _as_overrides({"task.reward": reward_spec(reward)})
    items += _as_overrides(overrides)
    return load_config(path, items)


def run(config: RunConfig, log: Callable[[str], Any] = print) -> RunResult:
    """Run a resolved config (``resolve``'s) and collect its result."""
    config = final_model_settings(config, log)
    keep_noise_out()  # third-party notices that say nothing to a user go to workers.log (oprl.noise)
    if not config.resume:  # milliseconds: a path typo is one line before anything is printed or imported
        from oprl.runtime.preflight import check_paths

        check_paths(config)
    # An evaluation's headline counts the problems it will run, so it waits for the task (the test split's size).
    counted = config.mode == "eval" and not config.resume
    if not counted:
        log(_start_line(config))  # within a second: the checks, the imports and the warm start take longer
    task, checked = None, False
    if not config.resume:  # a resumed run's saved config is read by the runtime, which checks it there
        from oprl.runtime.preflight import check_lengths, check_rewards
        from oprl.tasks import build_task

        with _pre_run_worker_log():
            task = build_task(config.task)
            if counted:
                log(_start_line(config, problems=len(list(task.problems("test"))[: config.eval.num_problems])))
            check_rewards(task)  # a reward that fails on every row: its processes are up already
            check_lengths(config, task, log)  # before torch and the runtime are imported: seconds, not minutes
            task, checked = _hand_over(task), True
    from oprl.metrics import read_metrics
    from oprl.runtime.run import run as run_config

    done = run_config(config, log=log, task=task, checked=checked)
    summary_path = done.run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    rows = read_metrics(done.run_dir / "metrics.jsonl") if (done.run_dir / "metrics.jsonl").is_file() else []
    final: dict[str, float] = {}
    for prefix in ("reward/", "eval/"):  # the last trainer row, then the last evaluation on top
        last: dict[str, Any] = next((r for r in reversed(rows) if any(k.startswith(prefix) for k in r)), {})
        final |= {k: v for k, v in last.items() if isinstance(v, (int, float))}
    return RunResult(
        run_dir=done.run_dir,
        config=done.config or config,
        summary=summary,
        final_metrics=final,
        accuracy_before=done.accuracy_before,
        accuracy_after=done.accuracy_after,
        seconds=done.seconds,
    )


@contextlib.contextmanager
def _pre_run_worker_log():
    """What reward processes started for the checks before the run print goes to a scratch file, not the terminal:
    a reward's own prints belong in ``<run_dir>/workers.log``, which does not exist yet (the processes are closed
    by ``_hand_over`` and the runtime starts its own, logging there)."""
    from oprl.tasks.rewards.processes import reward_log

    with tempfile.TemporaryDirectory(prefix="oprl-checks-") as scratch, reward_log(Path(scratch) / "workers.log"):
        yield


def _hand_over(task: Any) -> Any:
    """The checked task for the runtime, unless it started worker processes (a dataset task's user rewards
    start at once, to report a bad import at once): those must start inside the run's worker log
    (``<run_dir>/workers.log``, which does not exist yet), so they stop here and the runtime builds its own."""
    rewards = getattr(task, "rewards", None)
    if rewards is None or not callable(getattr(rewards, "close", None)):
        return task
    rewards.close()
    return None


def _start_line(config: RunConfig, problems: int | None = None) -> str:
    """What is starting, in one line: mode, task, model, the schedule and the length (or the run resumed); an
    evaluation's length is the ``problems`` it runs (the first ``eval.num_problems`` of the test split)."""
    if config.resume:
        return f"oprl: resuming run {config.run_name} (resume={str(config.resume).lower()})"
    model = "the embedded tiny model" if config.model.path == "tiny" else config.model.path
    what = f"task {config.task.name}, {model}"
    if config.mode == "eval" and config.eval.checkpoint:  # its weights are evaluated, not model.path's
        what = f"checkpoint {_newest_checkpoint(config.eval.checkpoint)} (task {config.task.name})"
    if config.mode == "eval":
        count = f"up to {config.eval.num_problems}" if problems is None else str(problems)
        return f"oprl: eval of {what} ({count} test problem{'' if problems == 1 else 's'})"
    # An offline run reads no schedule (its data's versions are the store's): it names the store instead of k and m.
    data = f"stored batches of {config.buffer.path}" if config.mode == "offline" else config.sync.describe()
    schedule = f"{config.algorithm.preset}, {data}, {config.steps} steps"
    return f"oprl: {'train' if config.mode == 'both' else config.mode} on {what} ({schedule})"


def _newest_checkpoint(source: str) -> str:
    """The checkpoint ``eval.checkpoint=source`` evaluates: itself, or a run's newest ``checkpoints/step-N``
    (``oprl.checkpoint.files.resolve_checkpoint``'s answer, found here without importing torch)."""
    path = Path(source)
    steps = [p for p in path.glob("checkpoints/step-*") if p.name.removeprefix("step-").isdigit()]
    if (path / "state.json").is_file() or not steps:
        return source
    return str(max(steps, key=lambda p: int(p.name.removeprefix("step-"))))


def _as_overrides(values: Mapping[str, Any], prefix: str = "") -> list[str]:
    """``key=value`` strings (values as JSON, which the YAML reader takes as is) for nested or dotted keys."""
    items = []
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            items += _as_overrides(value, f"{dotted}.")
        else:
            items.append(f"{dotted}={json.dumps(value, default=str)}")
    return items


__all__ = [
    "ConfigSource",
    "RunResult",
    "checkpoint_config",
    "checkpoint_overrides",
    "evaluate",
    "final_model_settings",
    "resolve",
    "reward_spec",
    "run",
    "train",
]
