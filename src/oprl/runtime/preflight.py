"""Checks made before any work starts: every length that must fit the model's context, against the task's
prompts, the warm start's demonstrations and RL's reply budget.

A run whose prompts cannot fit would otherwise fail minutes later, in the warm start's first validation or in
the first rollout, and name a length the user never set (the warm start's own). Here each check names the
setting that fixes it (``rollout.max_new_tokens=N: lower it to <= M``), or the model when no setting can
(a prompt longer than the whole context; demonstrations that need more positions than the model has).

Cheap on purpose: the embedded model's tokenizer and context (``oprl.models.tiny.MAX_POSITIONS``) need
neither torch nor the model; a pretrained model's come from its tokenizer and ``config.json``. The warm
start's demonstrations are measured only when its cache misses (``oprl.trainer.warmstart``). Not here: the
checks of single settings against each other without the task (``RunConfig``'s validators, at load), and
the memory check of a batch (``oprl.rollout.base``).

The other checks that need the machine, in the order a run makes them (each one line naming its setting):
- ``check_paths``, before anything is imported or printed: ``model.path``, ``teacher.path`` and ``judge.path``
  exist (a local typo names the nearest run directories, never reaches the hub: ``oprl.models.loading``), a
  local model directory's files hold a chat template, a local teacher's ``tokenizer.json`` has the local
  student's vocabulary, ``run_name`` holds no run (unless ``overwrite``) and mode=offline's ``buffer.path`` is
  a directory (``_check_outputs``), and a task that reads a Hugging Face dataset has the ``data`` extra
  (``_check_extras``);
- in ``check_lengths``, from the tokenizers it reads anyway: the student has a chat template (a hub model, or
  a directory whose files could not tell; the advice says how to give one), a teacher speaks the student's
  tokens (``check_teacher_tokens``);
- ``check_rewards``: a task's user reward functions (``task.reward``) are called on the first train rows with
  the reference as the reply; one that raises on every such row stops the run before any worker starts;
- ``check_machine``, as ``oprl.runtime.run.run`` starts: the packages the config needs (vLLM, Ray), the GPUs of
  the trainer's ranks (``oprl.trainer.ranks.check_trainer_machine``), the store a distillation reads.

Settings that would do nothing are warnings, not errors: ``noop_warnings`` before the run (partial rollouts that
cannot switch), ``outcome_warnings`` from its rows once it is over; both ask the run's synchronizer
(``oprl.runtime.synchronizer``) which mode it runs rather than reading ``config.sync``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from oprl.errors import OprlError
from oprl.models.chat import encode_problem


@dataclass(frozen=True)
class ModelLimits:
    tokenizer: Any
    context: int
    """Positions the model has for prompt plus reply (``max_position_embeddings``)."""
    label: str
    """How a message names the model: ``the embedded tiny model``, ``model.path=...``."""


def check_paths(config, outputs: bool = True) -> None:
    """``model.path``, ``teacher.path`` and ``judge.path`` point at something, checked without loading it (module
    docstring): a path that exists nowhere is one ``OprlError`` line naming the key, the path and the nearest
    existing directories. What a directory holds is checked where it loads."""
    from pathlib import Path

    from oprl.models.loading import lacks_chat_template, no_chat_template, resolve_model_path

    paths = [("model.path", config.model.path), ("teacher.path", config.teacher.path)]
    paths.append(("judge.path", config.judge.path))
    for key, path in paths:
        if path is None or path == "tiny" or (key != "model.path" and Path(path).expanduser().is_dir()):
            continue  # tiny is built here; a teacher's or judge's run or checkpoint directory is resolved later
        try:
            location, extra = resolve_model_path(path)
        except OprlError as exc:  # resolve_model_path speaks of model.path
            raise OprlError(str(exc).replace("model.path", key, 1)) from None
        if key == "model.path" and not extra and lacks_chat_template(location):  # the judge reads plain text
            raise OprlError(no_chat_template(key, path, location))
    _check_teacher_files(config)
    _check_extras(config)
    if outputs:  # a command that opens no new run (oprl teacher-score scores a run's own store) skips them
        _check_outputs(config)


def _check_outputs(config) -> None:
    """The directories a new run writes to and reads from, checked before its headline (issue #71: these two came
    after it, and an offline run's store after the warm start, 170 s on a cold cache): a ``run_name`` that holds
    a run (``rundir.check_new``), and mode=offline's ``buffer.path`` that is no directory. Whether that directory
    holds batches is ``ExperienceStore.locate``'s (its module imports torch), made before the warm start
    (``oprl.runtime.run``)."""
    from pathlib import Path

    from oprl.checkpoint import rundir

    if config.run_name:  # a default name carries the time: it is new
        rundir.check_new(Path(config.output_dir) / config.run_name, overwrite=config.overwrite)
    if config.mode == "offline" and not Path(config.buffer.path).expanduser().is_dir():
        raise OprlError(
            f"buffer.path: {config.buffer.path} is not a directory; mode=offline reads the experience store of an "
            "explore or both run (its run directory, or the store's own directory)"
        )


def _check_extras(config) -> None:
    """A task that will read through Hugging Face ``datasets`` (an extra since #71: the default job never does)
    while it is not installed: the same line ``oprl.tasks.data.files`` would print, before the headline rather
    than after it. Reads the task's settings only: ``task.hf_name`` (task.name=dataset), or source=hub, or
    source=auto with no file set (gsm8k, math)."""
    from importlib.util import find_spec

    task = config.task
    if getattr(task, "hf_name", None):
        key = "task.hf_name"
    elif getattr(task, "source", None) == "hub" or (
        getattr(task, "source", None) == "auto"
        and not any(getattr(task, name, None) for name in ("path", "train_file", "test_file"))
    ):
        key = "task.hub_id"
    else:
        return
    if find_spec("datasets") is None:
        from oprl.tasks.data.files import NEEDS_DATASETS

        raise OprlError(f"{key}: {NEEDS_DATASETS}")


def _check_teacher_files(config) -> None:
    """A teacher and a student that are both local directories with a ``tokenizer.json``: their vocabularies
    compared from those files (the ``tokenizers`` library, milliseconds), before anything heavy is imported.
    Any other pair is ``check_teacher_tokens``'s, from the loaded tokenizers."""
    from pathlib import Path

    from oprl.models.loading import tokenizer_file_vocabulary, vocabulary_mismatch

    teacher_path, student_path = config.teacher.path, config.model.path
    if teacher_path is None or teacher_path == "tiny" or student_path == "tiny":
        return
    teacher = Path(teacher_path).expanduser()
    if teacher.is_dir() and not (teacher / "config.json").is_file():
        teacher = teacher / "final"  # a run directory's final model (a checkpoint holds the student's tokens)
    student = Path(student_path).expanduser()
    if not (teacher.is_dir() and student.is_dir()):
        return
    teacher_vocab, student_vocab = tokenizer_file_vocabulary(teacher), tokenizer_file_vocabulary(student)
    if teacher_vocab is not None and student_vocab is not None:
        problem = vocabulary_mismatch(teacher_vocab, student_vocab, teacher_path, student_path)
        if problem:
            raise OprlError(problem)


def check_machine(config) -> None:
    """What the config cannot say alone, as one-line errors: installed packages, the GPUs of this machine, the
    store a distillation reads. Every rule between fields is a validator of the config (``oprl.config``), so it
    was checked when the config was loaded."""
    from oprl.teacher.loading import check_teacher_store
    from oprl.trainer.ranks import check_trainer_machine

    check_teacher_store(config)
    if config.rollout.engine == "vllm":
        from oprl.rollout.vllm_engine import require_vllm

        require_vllm()
    if config.teacher.path is not None and config.teacher.engine == "vllm":
        from oprl.teacher.vllm_prefill import require_vllm as require_teacher_vllm

        require_teacher_vllm()
    check_trainer_machine(config)
    if config.backend == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise OprlError("backend=ray needs Ray: pip install 'oprl[ray]'")


def check_lengths(config, task, log=print) -> None:
    """Refuse, with one line, a run whose lengths cannot fit the model's context (module docstring); a teacher
    whose tokens are not the student's (``check_teacher_tokens``) is refused here too, from the same tokenizer."""
    limits = model_limits(config.model)
    if limits is None:
        return
    check_teacher_tokens(config, limits.tokenizer)
    splits = ["test"] if config.mode in ("eval", "offline") else ["train", "test"]
    if config.mode == "explore":
        splits = ["train"]
    longest = {split: _longest_prompt(task, split, limits.tokenizer, config) for split in splits}
    for split, prompt in longest.items():
        if prompt + 1 > limits.context:
            raise OprlError(
                f"task {config.task.name}: a {split} prompt of {prompt} tokens does not fit {limits.label}'s "
                f"context of {limits.context} positions (prompt and reply together): no reply length fixes "
                "this; use a model with a longer context (model.path) or a task with shorter prompts"
            )
    budget = config.rollout.max_new_tokens
    for split, prompt in longest.items():
        if prompt + budget > limits.context:
            what = "RL" if split == "train" else "evaluation"
            raise OprlError(
                f"rollout.max_new_tokens={budget}: a {split} prompt of {prompt} tokens + {budget} new tokens "
                f"exceeds {limits.label}'s context of {limits.context} positions ({what} samples up to it); "
                f"lower it to <= {limits.context - prompt}"
            )
    _check_warm_start(config, task, limits, log)


def model_limits(model_cfg) -> ModelLimits | None:
    """The tokenizer and context of ``model.path``; None when its files cannot be read here (loading the model
    reports that, naming ``model.path``) or its config states no context."""
    if model_cfg.path == "tiny":
        from oprl.models.tiny import MAX_POSITIONS, build_tokenizer

        return ModelLimits(build_tokenizer(), MAX_POSITIONS, "the embedded tiny model")
    from transformers import AutoConfig, AutoTokenizer

    from oprl.models.loading import dequantised_gguf, resolve_model_path

    location, extra = resolve_model_path(model_cfg.path)
    if "gguf_file" in extra:  # converted once and cached; loading the model would do it now anyway
        from pathlib import Path

        location, extra = str(dequantised_gguf(Path(location) / extra["gguf_file"])), {}
    try:
        context = getattr(AutoConfig.from_pretrained(location, **extra), "max_position_embeddings", None)
        tokenizer = AutoTokenizer.from_pretrained(location, **extra)
    except (OSError, ValueError):
        return None
    if not tokenizer.chat_template:  # here, not after the workers load the model: seconds, not a minute
        from oprl.models.loading import no_chat_template

        raise OprlError(no_chat_template("model.path", model_cfg.path, location))
    if not isinstance(context, int) or context <= 0:
        return None
    return ModelLimits(tokenizer, context, f"model.path={model_cfg.path}")


def check_teacher_tokens(config, student_tokenizer) -> None:
    """A teacher whose vocabulary is not the student's, refused from its tokenizer alone (the teacher worker
    makes the same check after loading the weights, ``oprl.teacher.loading``). A run or checkpoint directory
    without ``final/`` holds the student's architecture, so its tokens; a .gguf teacher is checked where it
    is converted."""
    from pathlib import Path

    path = config.teacher.path
    if path is None or path == "tiny":
        return
    local = Path(path).expanduser()
    if local.is_dir() and not (local / "config.json").is_file():
        if not (local / "final" / "config.json").is_file():
            return  # a checkpoint: the student's own architecture and tokenizer
        local = local / "final"
    from transformers import AutoTokenizer

    from oprl.models.loading import resolve_model_path
    from oprl.teacher.loading import check_same_tokens

    location, extra = (str(local), {}) if local.is_dir() else resolve_model_path(path)
    if "gguf_file" in extra:
        return
    try:
        teacher = AutoTokenizer.from_pretrained(location, **extra)
    except (OSError, ValueError):
        return  # unreadable: the teacher worker's load says why, naming teacher.path
    check_same_tokens(teacher, student_tokenizer, path, config.model.path)


def check_rewards(task) -> None:
    """A task's user reward functions (``task.reward``, ``oprl.tasks.rewards.user``) called on the first
    ``REWARD_PROBE_ROWS`` train rows, each with its own reference as the reply: a function that raises (or
    times out, or returns no number) on every one is one line naming it and a row, before the run starts
    (else the first evaluation or batch stops the run, after the workers loaded). A function that fails on
    some rows only is the run's business (those rows score 0 and are counted)."""
    rewards = getattr(task, "rewards", None)
    if rewards is None or not callable(getattr(rewards, "probe", None)):
        return
    problems = list(task.problems("train"))[:REWARD_PROBE_ROWS]
    if problems:
        with rewards.probe():
            task.score(problems, [p.answer for p in problems])


REWARD_PROBE_ROWS = 4
"""Train rows ``check_rewards`` scores (in the reward processes the task started, a few milliseconds each)."""


def _longest_prompt(task, split: str, tokenizer, config) -> int:
    """Tokens of the longest prompt of ``split`` that the run samples from (evaluation: the first
    ``eval.num_problems``); a multi-turn task's first prompt (later turns grow it, under
    ``rollout.max_episode_tokens``)."""
    problems = list(task.problems(split))
    if split == "test":
        problems = problems[: config.eval.num_problems]
    return max((len(encode_problem(tokenizer, p)) for p in problems), default=0)


def _check_warm_start(config, task, limits: ModelLimits, log) -> None:
    """The warm start samples up to its longest demonstration (+ a few tokens) after its longest prompt,
    whatever RL allows: when that cannot fit, the model is the cause (demonstrations are the task's)."""
    from oprl.trainer import warmstart

    if config.mode == "eval" and config.eval.checkpoint:
        return  # the checkpoint's weights replace the warm start's; its tokenizer is all that is read
    if not warmstart.wants_warm_start(config.model, config.warmstart):
        return
    if warmstart.cached_warm_start(config.model, config.task, config.warmstart, task) is not None:
        return
    need = warmstart.positions_needed(limits.tokenizer, config.task, task)
    if need["positions"] > limits.context:
        raise OprlError(
            f"task {config.task.name}: the warm start's demonstrations need {need['positions']} positions "
            f"(a prompt of {need['prompt']} tokens + replies of up to {need['max_new_tokens']}), more than "
            f"{limits.label}'s context of {limits.context}: no setting shortens them; use a model with a "
            "longer context (model.path) or a task with shorter prompts and answers"
        )


def noop_warnings(config, task) -> list[str]:
    """Warnings for settings that would do nothing in this run, known before it starts: partial rollouts
    (``sync.partial``) under a schedule that publishes no newer version while a batch is generated, or with
    replies that end before the switch step. What only the run can tell (a free-running mode that never ran
    ahead) is ``outcome_warnings``."""
    from oprl.runtime.synchronizer import Synchronizer

    out = list[str]()
    sync = Synchronizer.of(config, explorers=0)  # the run's own answer: which batches switch, to what, and when
    if not sync.partial or not sync.scheduled or config.mode != "both":
        return out
    if all(sync.switch_target(b) is None for b in range(1, config.steps + 1)):
        out.append(
            f"warning: sync.partial=true does nothing here: with sync.interval={sync.interval} "
            f"sync.offset={sync.offset} the trainer waits for every batch, so no newer version exists while one "
            "is generated (a switch needs sync.offset >= 1, or sync.mode=async)"
        )
    elif not hasattr(task, "environment") and config.rollout.max_new_tokens <= sync.switch_step:
        out.append(
            f"warning: sync.partial=true does nothing here: a batch switches weights at decode step "
            f"sync.switch_step={sync.switch_step}, and rollout.max_new_tokens={config.rollout.max_new_tokens} ends "
            "every reply before it; lower sync.switch_step"
        )
    return out


def outcome_warnings(config, rows: list[dict]) -> list[str]:
    """Warnings, once a run is over, for settings its metrics show did nothing: partial rollouts in which no
    response switched weights, a free-running mode (``sync.mode=async``) that never sampled with weights older
    than the trainer's (lag 0 throughout: the run was on-policy)."""
    from oprl.runtime.synchronizer import Synchronizer

    trained = [r for r in rows if "lag/max" in r]
    if config.mode != "both" or not trained:
        return []
    out = []
    sync = Synchronizer.of(config, explorers=0)
    if sync.partial and not any(r.get("batch/switched_frac", 0.0) > 0 for r in trained):
        lengths = [r["response/length_mean"] for r in trained if "response/length_mean" in r]
        mean = f" (replies of {sum(lengths) / len(lengths):.1f} tokens on average)" if lengths else ""
        out.append(
            f"warning: sync.partial=true made no switch in {len(trained)} steps{mean}: no newer version was "
            f"published while a batch was generated (sync.mode={sync.mode}, sync.switch_step={sync.switch_step})"
        )
    if sync.free_running and all(r["lag/max"] == 0 for r in trained):
        out.append(
            f"warning: sync.mode=async never ran ahead: every batch of {len(trained)} steps was sampled with the "
            "trainer's newest weights (lag 0), so the run was on-policy; the explorers are slower than the trainer"
        )
    return out


__all__ = [
    "ModelLimits",
    "check_lengths",
    "check_machine",
    "check_paths",
    "check_rewards",
    "check_teacher_tokens",
    "model_limits",
    "noop_warnings",
    "outcome_warnings",
]
