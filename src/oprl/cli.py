"""Command line: ``oprl train|explore|eval [CONFIG.yaml] [key=value ...]``, ``oprl bandit``, ``oprl config``.

Thin by design: parse arguments and call the Python API (``oprl.api``: ``oprl train`` is ``oprl.train``).
User mistakes (``OprlError``) print one line and exit 2, also when a worker finds one during the run (a reward
that fails on every row of a batch); a worker that dies during a run prints one line naming it and exits 1;
``--debug`` shows the traceback of anything.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from oprl.backends.failure import Interrupted, WorkerFailure
from oprl.errors import OprlError

USAGE = """usage: oprl COMMAND [ARGUMENTS]

oprl train [CONFIG.yaml] [key=value ...] [--debug]   run RL (no arguments: the embedded CPU default);
                                                    mode=offline buffer.path=DIR trains offline from a store
oprl explore [CONFIG.yaml] [key=value ...]          generate `steps` batches with a fixed policy into a store
oprl eval [CONFIG.yaml | CHECKPOINT | RUN_DIR] [key=value ...]
                                                    evaluate model.path, a checkpoint, or a run's newest one
oprl config [CONFIG.yaml] [key=value ...]           print the resolved config (with --help: every option)
oprl teacher-score [RUN_DIR | CONFIG.yaml] teacher.path=T [key=value ...]
                                                    add a teacher's log-probs to a stored experience directory
oprl bandit [--steps N] [--out DIR] ...             the 3-armed bandit counter-example (docs/paper.md#bandit)
oprl sweep SWEEP.yaml [--parallel N] [--dry-run]    run a grid of runs (resumable) into results.csv
           [--backend ray [--address A]]         ... or spread over a Ray cluster (docs/sweeps.md)
oprl plot RUN_DIR... [--out DIR]                    paper-style figures of any runs
oprl report SWEEP_DIR                               figures + report.md with the sweep's tables
oprl serve tinker [key=value ...] [--port P] ...    a Tinker-compatible server on oprl's models (docs/tinker.md)

`oprl COMMAND --help` shows a command's arguments; `oprl config --help` lists every setting."""

SETTINGS = """Settings: `key=value` over the defaults (or over CONFIG.yaml), e.g. steps=20 rollout.group_size=4
algorithm.preset=opmd. `oprl config --help` lists every setting with its default and meaning; `oprl config
[CONFIG.yaml] [key=value ...]` prints the resolved config."""

HELP = {
    "train": f"""usage: oprl train [CONFIG.yaml] [key=value ...] [--debug]

Run RL: explorers generate, the trainer learns, evaluations at eval.interval; writes runs/<run_name>/
(config.yaml, metrics.jsonl, summary.json, checkpoints/, final/). No arguments: the embedded CPU default job.
mode=offline buffer.path=DIR trains from an experience store; resume=true run_name=NAME continues a run.

arguments:
  CONFIG.yaml   optional YAML config (first argument, without '=')
  key=value     settings over it
  --debug       show the traceback of any error
  -h, --help    this help

{SETTINGS}""",
    "explore": f"""usage: oprl explore [CONFIG.yaml] [key=value ...] [--debug]

Generate `steps` batches with a fixed policy into an experience store (runs/<run_name>/experiences/, or
buffer.path); `oprl train mode=offline buffer.path=...` trains on it later. Same as `oprl train mode=explore`.

arguments:
  CONFIG.yaml   optional YAML config
  key=value     settings over it
  --debug       show the traceback of any error
  -h, --help    this help

{SETTINGS}""",
    "eval": f"""usage: oprl eval [CONFIG.yaml | CHECKPOINT_DIR | RUN_DIR] [key=value ...] [--debug]

Evaluate pass@1 on the task's test split (its first eval.num_problems problems) and write a run directory.
  oprl eval model.path=MODEL               a model (hub name or directory) on the default task
  oprl eval runs/RUN                       a run's newest checkpoint, with the run's own config
  oprl eval runs/RUN/checkpoints/step-N    one checkpoint (a run keeps its last checkpoint.keep of them)
  oprl eval runs/RUN/final                 the run's final model, on the run's task and eval settings
                                           (model.path=runs/RUN/final does the same; both score exactly
                                           as the run's last checkpoint)

arguments:
  CONFIG.yaml | CHECKPOINT_DIR | RUN_DIR   optional first argument
  key=value     settings over it (run_name=NAME keeps a name; default: a new eval-... directory)
  --debug       show the traceback of any error
  -h, --help    this help

{SETTINGS}""",
    "teacher-score": f"""usage: oprl teacher-score [RUN_DIR | CONFIG.yaml] teacher.path=T [key=value ...] [--debug]

Add the teacher's per-token log-probs (teacher_logprobs, store schema 4) to every batch file of an experience
store, once, for off-policy distillation: `oprl train mode=offline buffer.path=... algorithm.preset=distill`
then trains on it without loading the teacher. Rows already scored are kept (a second pass continues the
first). A run directory as first argument brings its config (model.path, warm start) and is the store.

arguments:
  RUN_DIR | CONFIG.yaml   optional first argument (a run directory, or a YAML config with buffer.path=DIR)
  key=value     settings over it (teacher.path is required; teacher.engine, teacher.micro_batch_size, ...)
  --debug       show the traceback of any error
  -h, --help    this help

{SETTINGS}""",
    "bandit": """usage: oprl bandit [--steps N] [--lr LR] [--samples K] [--seed S] [--out DIR]

The 3-armed bandit counter-example (docs/paper.md#bandit): every method's exact and sampled dynamics on
off-policy data; prints a table, writes DIR/bandit.json and DIR/bandit.png.

options:
  --steps N     gradient steps per run (default 300)
  --lr LR       SGD step size on the logits (default 1.0)
  --samples K   group size K: arms drawn from the behaviour policy per step (default 8)
  --seed S      seed of the sampled runs (default 0)
  --out DIR     output directory (default runs/bandit)
  -h, --help    this help""",
}
"""``--help`` of the commands parsed here, and bandit's (its parser lives with torch code that help must not
import). sweep, plot and report print their own parsers' help (those modules import nothing heavy), and
``oprl config --help`` lists every setting (``oprl.config.describe_fields``)."""


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # `oprl config --help | head`: the reader has what it wanted
        _silence_stdout()
        return 0


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command in HELP and ("-h" in rest or "--help" in rest):
        print(HELP[command])
        return 0
    handlers = {
        "train": _train,
        "explore": _explore,
        "eval": _eval,
        "config": _config,
        "bandit": _experiment("bandit"),
        "teacher-score": _teacher_score,
        "sweep": _experiment("sweep"),
        "plot": _experiment("curves"),
        "report": _experiment("report"),
        "serve": _serve,
    }
    if command not in handlers:
        print(f"error: unknown command {command!r}; valid: {', '.join(handlers)}", file=sys.stderr)
        return 2
    try:
        return handlers[command](rest)
    except BrokenPipeError:
        raise  # main's: not a failure
    except SystemExit as exc:  # argparse's --help and usage errors (sweep, plot, report)
        return exc.code if isinstance(exc.code, int) else 2
    except OprlError as exc:
        if debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except WorkerFailure as exc:
        if debug:
            raise
        if _user_mistake(exc.__cause__):  # a worker found a mistake in the input: the user's, not a crash
            print(f"error: {str(exc).replace('OprlError: ', '', 1)}", file=sys.stderr)
            return 2
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Interrupted as exc:  # SIGTERM or SIGINT (oprl.backends.failure): its one line
        print(f"{exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug, not a user mistake: keep it to one line unless asked
        if debug:
            raise
        print(f"error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)", file=sys.stderr)
        return 1


def _user_mistake(cause: BaseException | None) -> bool:
    """Whether a worker failed on an ``OprlError``: raised in a thread, or carried by a worker process's
    ``RemoteError`` (its ``kind``) or a Ray task error (its ``cause``)."""
    for _ in range(3):  # the backends wrap it at most twice
        if cause is None:
            return False
        if isinstance(cause, OprlError) or getattr(cause, "kind", None) == "OprlError":
            return True
        cause = getattr(cause, "cause", None) or cause.__cause__
    return False


def _serve(args: list[str]) -> int:
    from oprl.serve.tinker import main as serve_tinker  # fastapi, uvicorn, tinker: only when serving

    return serve_tinker(args)


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush does not raise again (Python's
    documented recipe for SIGPIPE)."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _split_config_args(args: list[str]) -> tuple[str | None, list[str]]:
    """The optional YAML path (first argument without '=') and the ``key=value`` overrides."""
    path = None
    if args and "=" not in args[0]:
        path, args = args[0], args[1:]
        _refuse_bare_setting(path, args)
    for item in args:
        if "=" not in item:
            raise OprlError(f"argument {item!r}: expected key=value (only the first argument may be a YAML file)")
    return path, args


def _refuse_bare_setting(path: str, rest: list[str]) -> None:
    """``oprl train steps 10``: the first argument names a setting, not a file; the line blames it (``steps``),
    not the value after it."""
    from pathlib import Path

    from oprl.config import RunConfig

    if (
        Path(path).exists()
        or Path(path).suffix in (".yaml", ".yml")
        or path.split(".")[0] not in RunConfig.model_fields
    ):
        return
    value = rest[0] if rest and "=" not in rest[0] else "VALUE"
    raise OprlError(f"argument {path!r}: a setting takes key=value: {path}={value} (no file {path!r} either)")


def _train(args: list[str], forced: Sequence[str] = ()) -> int:
    from oprl import api

    path, overrides = _split_config_args(args)
    result = api.run(api.resolve(path, [*overrides, *forced]))
    mode, before, after = result.config.mode, result.accuracy_before, result.accuracy_after
    if mode == "explore":
        print(f"explored {result.config.steps} batches in {result.seconds:.0f}s; run dir {result.run_dir}")
    elif mode == "eval":
        checkpoint = result.config.eval.checkpoint
        model = result.config.model.path
        what = f" of {'the embedded tiny model' if model == 'tiny' else model}"
        if checkpoint:  # the weights evaluated: the checkpoint's (a run directory: its newest)
            step = int(result.final_metrics.get("eval/checkpoint_step", 0))
            what = f" of checkpoint step {step} ({checkpoint})"
        print(f"eval accuracy{what} {after:.3f} in {result.seconds:.0f}s; run dir {result.run_dir}")
    else:
        print(
            f"eval accuracy before -> after: {before:.3f} -> {after:.3f} ({after - before:+.3f}) in "
            f"{result.seconds:.0f}s; run dir {result.run_dir}"
        )
    return 0


def _explore(args: list[str]) -> int:
    return _train(args, ["mode=explore"])


def _eval(args: list[str]) -> int:
    """A directory as first argument is a checkpoint or a run: its run's config, its weights."""
    from pathlib import Path

    from oprl import api

    if args and "=" not in args[0] and Path(args[0]).is_dir():
        keep = any(a.startswith("run_name=") for a in args[1:])
        forced = api.checkpoint_overrides(args[0], keep_run_name=keep)
        return _train([str(api.checkpoint_config(args[0])), *args[1:]], forced)
    if args and "=" not in args[0] and not Path(args[0]).exists() and Path(args[0]).suffix not in (".yaml", ".yml"):
        raise OprlError(_missing_checkpoint(Path(args[0])))
    return _train(args, ["mode=eval"])


def _missing_checkpoint(path) -> str:
    """One line for ``oprl eval PATH`` where PATH is neither a YAML file nor a directory."""
    folder = path.parent
    kept = sorted(p.name for p in folder.glob("step-*")) if folder.is_dir() else []
    where = f"; {folder} holds {', '.join(kept)}" if kept else ""
    return (
        f"eval: no checkpoint or run directory {path} (a run keeps only its newest checkpoint.keep checkpoints, "
        f"2 by default{where}; `oprl eval RUN_DIR` evaluates a run's newest)"
    )


def _config(args: list[str]) -> int:
    import yaml

    from oprl.config import help_lines, load_config

    if "--help" in args or "-h" in args:
        print("\n".join(help_lines([a for a in args if a not in ("--help", "-h")])))
        return 0
    path, overrides = _split_config_args(args)
    print(yaml.safe_dump(load_config(path, overrides).model_dump(mode="json"), sort_keys=False), end="")
    return 0


def _teacher_score(args: list[str]) -> int:
    """``oprl teacher-score``: ``oprl.teacher.score.score_store`` on the student model of the config."""
    from pathlib import Path

    from oprl.config import load_config
    from oprl.models.loading import missing_path
    from oprl.runtime.preflight import check_paths

    path, overrides = _split_config_args(args)
    if path is not None and Path(path).is_dir():  # a run directory: its own config, its store
        path, overrides = str(Path(path) / "config.yaml"), [f"buffer.path={path}", *overrides]
    elif path is not None and not Path(path).exists() and Path(path).suffix not in (".yaml", ".yml"):
        hint = missing_path(path, "teacher-score").partition("; use ")[0]  # the nearest run directories
        raise OprlError(f"{hint}: give a run directory (its store and config) or a YAML config with buffer.path")
    config = load_config(path, overrides)
    check_paths(config, outputs=False)  # teacher.path=runs/nope: one line now; the store is the run's own

    import torch

    from oprl.runtime.launch import model_path, worker_threads
    from oprl.tasks import build_task
    from oprl.teacher.score import score_store

    torch.set_num_threads(worker_threads(config))  # a run's teacher worker's threads: the same numbers
    score_store(config, model_path(config, build_task(config.task)))
    return 0


def _experiment(module: str):
    """Handler for an ``oprl.experiments`` command; the module's ``main(argv)`` parses its own arguments."""

    def handler(args: list[str]) -> int:
        from importlib import import_module

        return import_module(f"oprl.experiments.{module}").main(args)

    return handler


if __name__ == "__main__":
    sys.exit(main())
