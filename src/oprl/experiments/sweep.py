"""``oprl sweep SWEEP.yaml``: run a grid of training runs, several at a time, resumably, into one table.

The spec's format and its plan (the grid's runs, ``--only``, ``--set``): ``oprl.experiments.sweep_spec`` and
docs/sweeps.md. ``--only axis=value,...`` runs a subset of the grid into the sweep's own directory (they are its
runs; the spec's ``only:`` list, which it replaces, and the spec saved beside the runs records it, so that ``oprl
report`` awaits only the selected runs); ``--set key=value`` changes every run, which then go to
``<output_dir>+key=value`` (``--out`` to choose).

Finished runs (a ``summary.json`` in their directory) are skipped, so an interrupted sweep is resumed by
running the same command again; an unfinished run that committed a checkpoint (``checkpoint.interval > 0``)
continues from it (``resume=true``: no row lost or repeated), any other unfinished run directory is cleared and
that run starts over. Long sweeps (hours, across sessions) should therefore checkpoint every few steps. ``keep: DIR``
(``--keep DIR``) copies each finished run's light files (``KEPT_FILES``: config, summary, metrics; no weights) into
``DIR/<run>/`` as it finishes, and restores them into the output directory before planning, so a sweep whose run
directories were lost with a machine (runs/ is not committed; DIR can be) resumes where it stopped; the spec is
written beside them (``DIR/sweep.yaml``), so ``oprl report DIR`` reports the kept runs anywhere.
``drop_checkpoints: true`` (``--drop-checkpoints``) deletes a run's ``checkpoints/`` the moment it finishes (after
``keep``): they exist to resume an unfinished run, and each holds the weights and the optimizer state (~3x the
model), so a sweep of many checkpointed runs would otherwise fill a disk (27 SmolLM2 runs kept ~1.5 GB each, and
one failed for want of space); the run's ``final/`` model stays, but it can no longer be extended
(``resume=true steps=N``). Runs execute
``oprl train`` on ``parallel`` long-lived runner processes (``oprl.experiments.sweep_runner``: torch and
transformers are imported once per runner, not once per run); each run's output goes to ``logs/<run>.log``.
``backend: ray`` (``--backend ray``) spreads the runs over a Ray cluster's nodes instead, one Ray task per attempt,
with the same commands, resume rule and results (``oprl.experiments.sweep_ray``; docs/sweeps.md).
"""

from __future__ import annotations

import argparse
import shutil
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from oprl.errors import OprlError
from oprl.experiments import sweep_local
from oprl.experiments.results import collect_results, write_table
from oprl.experiments.sweep_local import terminate_raises
from oprl.experiments.sweep_spec import (
    BACKENDS,
    PlannedRun,
    check_backend_options,
    load_spec,
    plan,
    select,
    threshold_gain,
    with_overrides,
)

KEPT_FILES = ("config.yaml", "summary.json", "metrics.jsonl")
"""What ``keep:`` copies of a finished run: all that its results row, report and curves are read from."""


def run_sweep(
    spec_path: Path,
    *,
    parallel: int | None = None,
    dry_run: bool = False,
    only: list[str] | None = None,
    sets: list[str] | None = None,
    out_dir: Path | None = None,
    backend: str | None = None,
    retries: int | None = None,
    cpus_per_run: float | None = None,
    address: str | None = None,
    keep: Path | None = None,
    drop_checkpoints: bool = False,
    log=print,
) -> Path:
    """Run the spec's unfinished runs (module docstring). ``only``: run just the runs matching these
    ``axis=values`` selections (``select``), into the same directory as the whole sweep (they are its runs).
    ``sets``: ``key=value`` overrides on every run (``with_overrides``); such runs differ from the spec's, so they go
    to ``<output_dir>+<key=value,...>`` unless ``out_dir`` says where. ``backend``, ``retries``, ``cpus_per_run``:
    the spec's keys of these names, replaced; ``address``: the Ray cluster to use (``backend="ray"`` only);
    ``keep``: the spec's ``keep:``, replaced (``restore_kept`` and ``keep_run``); ``drop_checkpoints``: true turns
    the spec's ``drop_checkpoints:`` on (``drop_checkpoints``)."""
    check_backend_options(backend, retries, cpus_per_run)
    sweep = _Sweep.of(load_spec(spec_path), spec_path, out_dir, sets, only, backend, address)
    sweep.parallel = max(1, parallel or int(sweep.spec.get("parallel") or 1))
    sweep.retries = next(r for r in (retries, sweep.spec.get("retries"), 1) if r is not None)
    sweep.cpus_per_run = float(cpus_per_run or sweep.spec.get("cpus_per_run") or 1)
    kept_in = keep or sweep.spec.get("keep")
    sweep.keep = Path(kept_in) if kept_in else None
    sweep.drop = drop_checkpoints or bool(sweep.spec.get("drop_checkpoints"))
    todo = _todo(sweep, dry_run, log)
    if dry_run:  # prints, writes nothing
        for r in todo:
            log("  oprl " + " ".join(_arguments(r, sweep.spec, sweep.out)))
        return sweep.out
    _save_spec(sweep)
    on_finish = _on_finish(sweep, log)
    if sweep.backend == "ray":
        failures = _execute_on_ray(
            todo, sweep.spec, sweep.out, sweep.retries, sweep.cpus_per_run, sweep.address, log, on_finish
        )
    else:
        failures = _execute(todo, sweep.spec, sweep.out, sweep.parallel, log, on_finish, sweep.retries)
    _finish(sweep, todo, failures, on_finish, log)
    return sweep.out


@dataclass
class _Sweep:
    """One ``oprl sweep`` call resolved: its spec (with ``--set`` and ``--only`` saved in it), where its runs go,
    the whole plan and the runs chosen, and the options of the command line over the spec's."""

    spec: dict
    out: Path
    runs: list[PlannedRun]
    chosen: list[PlannedRun]
    only: list[str]
    backend: str
    address: str | None
    parallel: int = 1
    retries: int = 1
    cpus_per_run: float = 1.0
    keep: Path | None = None
    drop: bool = False

    @classmethod
    def of(cls, spec: dict, spec_path: Path, out_dir, sets, only, backend, address) -> _Sweep:
        """The spec with the command line's ``--set``, ``--out`` and ``--only`` applied, and its chosen runs."""
        backend = backend or spec.get("backend") or "local"
        if address and backend != "ray":
            raise OprlError(f"sweep --address {address}: only with --backend ray (the spec says backend: {backend})")
        out = Path(out_dir or spec.get("output_dir") or f"runs/sweep-{spec_path.stem}")
        if sets:
            spec = with_overrides(spec, sets)
            if out_dir is None:
                out = out.with_name(out.name + "+" + ",".join(sets).replace("/", "_"))
        if out_dir is not None or sets:
            spec["output_dir"] = str(out)  # the spec saved beside the runs says where they are
        only = list(only or spec.get("only") or [])
        if only:  # saved with the spec: the report then awaits only these runs (``selected_runs``)
            spec["only"] = only
        runs = plan(spec)
        chosen = select(runs, only) if only else runs
        if not chosen:
            raise OprlError(f"sweep --only {' '.join(only or [])}: selects no run (each --only must match)")
        return cls(spec, out, runs, chosen, only, backend, address)


def _todo(sweep: _Sweep, dry_run: bool, log) -> list[PlannedRun]:
    """The chosen runs not finished yet (kept runs restored first, unless a dry run), with one line saying so."""
    out, keep, chosen = sweep.out, sweep.keep, sweep.chosen
    if keep is not None and not dry_run:
        restored = restore_kept(chosen, out, keep)
        if restored:
            log(f"sweep {out}: {restored} finished run(s) restored from {keep}")
    done_in = [out] + ([keep] if keep is not None else [])  # a dry run restores nothing but counts kept runs
    todo = [r for r in chosen if not any((d / r.name / "summary.json").is_file() for d in done_in)]
    selected = f", {len(chosen)} selected by --only" if sweep.only else ""
    where = f"{sweep.parallel} at a time" if sweep.backend == "local" else f"on Ray, {sweep.cpus_per_run:g} CPU(s) each"
    how, finished = f"{where}, a failed run tried again up to {sweep.retries} time(s)", len(chosen) - len(todo)
    log(f"sweep {out}: {len(sweep.runs)} runs{selected}, {finished} already finished, {len(todo)} to run, {how}")
    return todo


def _save_spec(sweep: _Sweep) -> None:
    """The spec beside the runs, and beside the kept runs, so that ``oprl report KEEP`` reads them as this sweep's."""
    sweep.out.mkdir(parents=True, exist_ok=True)
    (sweep.out / "sweep.yaml").write_text(yaml.safe_dump(sweep.spec, sort_keys=False))
    if sweep.keep is not None:
        sweep.keep.mkdir(parents=True, exist_ok=True)
        (sweep.keep / "sweep.yaml").write_text(yaml.safe_dump(sweep.spec, sort_keys=False))


def _on_finish(sweep: _Sweep, log) -> Callable[[PlannedRun], None]:
    """What follows a finished run: its light files kept (``keep``), its checkpoints dropped (``drop``)."""
    out, keep = sweep.out, sweep.keep

    def on_finish(run: PlannedRun) -> None:  # after each run that succeeded, and for every finished run at the end
        if keep is not None and not (keep / run.name / "summary.json").is_file():
            keep_run(out / run.name, keep / run.name)
        if sweep.drop:
            drop_run_checkpoints(out / run.name, log)

    return on_finish


def _finish(sweep: _Sweep, todo: list[PlannedRun], failures: list[str], on_finish, log) -> None:
    """After the runs: ``on_finish`` for runs finished before this call, the results table, and one line (an
    error) naming the runs that failed."""
    out = sweep.out
    for run in sweep.chosen:  # runs finished before this sweep (or under another command); its own were handled
        if run not in todo and (out / run.name / "summary.json").is_file():
            on_finish(run)
    table = collect_results(out, sweep.runs, threshold_gain=threshold_gain(sweep.spec))
    write_table(table, out / "results.csv")
    log(f"results: {out / 'results.csv'} ({len(table)} finished runs)")
    if failures:
        raise OprlError(
            f"sweep: {len(failures)} run(s) failed, see their logs in {out / 'logs'}: {', '.join(failures[:5])}"
        )


def keep_run(run_dir: Path, kept: Path) -> None:
    """Copy a finished run's ``KEPT_FILES`` into ``kept`` (summary last: a kept run is complete once it has one)."""
    kept.mkdir(parents=True, exist_ok=True)
    for name in sorted(KEPT_FILES, key=lambda n: n == "summary.json"):
        if (run_dir / name).is_file():
            shutil.copyfile(run_dir / name, kept / name)


def drop_run_checkpoints(run_dir: Path, log=print) -> None:
    """Delete a finished run's ``checkpoints/`` (resume states, weights and optimizer; ``final/`` stays). A run
    without a ``summary.json`` is unfinished and keeps them: its next attempt resumes from them."""
    root = run_dir / "checkpoints"
    if (run_dir / "summary.json").is_file() and root.is_dir():
        size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
        shutil.rmtree(root)
        log(f"run {run_dir.name}: finished, its checkpoints dropped ({size / 2**30:.2f} GiB)")


def restore_kept(runs: list[PlannedRun], out: Path, keep: Path) -> int:
    """Put back the kept files of every run finished in ``keep`` but not in ``out`` (an unfinished leftover of
    the same run is replaced: the kept run is finished). Returns how many runs were restored."""
    restored = 0
    for run in runs:
        kept, target = keep / run.name, out / run.name
        if (kept / "summary.json").is_file() and not (target / "summary.json").is_file():
            shutil.rmtree(target, ignore_errors=True)
            keep_run(kept, target)
            restored += 1
    return restored


def _execute(todo: list[PlannedRun], spec: dict, out: Path, parallel: int, log, on_success=None, retries=0):
    """Run ``todo`` on ``parallel`` long-lived runner processes (``oprl.experiments.sweep_local``), each attempt
    prepared by ``_prepare``, a failed run tried again up to ``retries`` times; ``on_success(run)`` after each run
    that succeeded. The names of the runs that still failed."""
    prepare, log_path = (lambda run: _prepare(run, spec, out, log)), (lambda name: _log_path(out, name))
    return sweep_local.execute(
        todo, parallel, prepare=prepare, log_path=log_path, log=log, on_success=on_success, retries=retries
    )


def _execute_on_ray(todo, spec, out, retries, cpus_per_run, address, log, on_success=None) -> list[str]:
    """Run ``todo`` as Ray tasks (``oprl.experiments.sweep_ray``), each attempt prepared by ``_prepare``."""
    try:
        from oprl.experiments import sweep_ray
    except ImportError as exc:
        raise OprlError(f"sweep backend ray: {exc} (pip install 'oprl[ray]')") from None
    cluster = sweep_ray.RayCluster(address, cpus_per_run)
    received: list[int] = []
    previous = terminate_raises(received)  # after ray.init, which sets its own SIGTERM handler (exit 1)
    try:
        log(f"ray: {cluster.describe()}")
        prepare, log_path = (lambda run: _prepare(run, spec, out, log)), (lambda name: _log_path(out, name))
        return sweep_ray.execute(
            todo, cluster=cluster, prepare=prepare, log_path=log_path, retries=retries, log=log, on_success=on_success
        )
    except SystemExit:
        if received:  # ray.wait, interrupted by the signal, raises SystemExit(1) in place of the handler's
            raise SystemExit(128 + received[0]) from None
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        cluster.close()


def _prepare(run: PlannedRun, spec: dict, out: Path, log) -> list[str]:
    """The resume rule, applied just before a run (or a retry of it) starts: its ``oprl`` arguments, with
    ``resume=true`` when it committed a checkpoint, else its unfinished leftovers cleared; ``logs/`` made."""
    argv = _arguments(run, spec, out)
    if _has_checkpoint(out / run.name):
        argv.append("resume=true")  # `oprl train` verifies it and cuts the rows back to it
        log(f"run {run.name}: continues from its last checkpoint")
    else:
        shutil.rmtree(out / run.name, ignore_errors=True)  # unfinished leftovers start over
    # The log lives beside the run: a run refuses a directory that holds files not its own.
    (out / "logs").mkdir(exist_ok=True)
    return argv


def _has_checkpoint(run_dir: Path) -> bool:
    """Whether an unfinished run committed a checkpoint (``checkpoints/step-N``; staging ``.tmp-*`` directories
    do not count). Which one loads, and whether any does, is ``oprl train resume=true``'s to decide."""
    root = run_dir / "checkpoints"
    return root.is_dir() and any(p.name.startswith("step-") for p in root.iterdir())


def _log_path(out: Path, name: str) -> Path:
    return out / "logs" / f"{name}.log"


def _arguments(run: PlannedRun, spec: dict, out: Path) -> list[str]:
    """The ``oprl`` command-line arguments of one run (``train [config] key=value ...``)."""
    command = ["train"]
    if spec.get("config"):
        command.append(str(spec["config"]))
    return command + list(run.overrides) + [f"output_dir={out}", f"run_name={run.name}", "progress=false"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="oprl sweep",
        description="Run a grid of training runs (the spec format: docs/sweeps.md).",
        epilog="Example: oprl sweep configs/sweeps/arena.yaml --only algorithm.preset=grpo,reinforce "
        "setting=lag-0,lag-4 seed=0 --set steps=60",
    )
    parser.add_argument("spec", type=Path)
    parser.add_argument("--parallel", type=int, default=None, help="runs at once (default: the spec's, else 1)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands of unfinished runs only")
    parser.add_argument(
        "--only",
        nargs="+",
        action="extend",
        default=[],
        metavar="AXIS=VALUES",
        help="run only the runs with these labels (preset=grpo,reinforce seed=0; an axis by its grid name or its "
        "last part); into the sweep's own directory, since they are its runs",
    )
    parser.add_argument(
        "--set",
        nargs="+",
        action="extend",
        default=[],
        dest="sets",
        metavar="KEY=VALUE",
        help="override a setting of every run (steps=60), after the grid's own values; the runs then go to "
        "<output_dir>+KEY=VALUE,... (or --out)",
    )
    parser.add_argument("--out", type=Path, default=None, help="the output directory (default: the spec's)")
    parser.add_argument("--backend", choices=BACKENDS, help="local runner processes (default) or Ray tasks")
    parser.add_argument("--address", help="Ray: the cluster (default $RAY_ADDRESS, else a local Ray for the sweep)")
    parser.add_argument(
        "--retries", type=int, help="times a failed run is tried again, from its checkpoint if any (default 1)"
    )
    parser.add_argument("--cpus-per-run", type=float, help="Ray: CPUs each run holds (default 1)")
    parser.add_argument(
        "--keep",
        type=Path,
        help="copy each finished run's config, summary and metrics here (and restore them from here before "
        "planning), so the sweep resumes on a machine that lost its run directories (default: the spec's keep:)",
    )
    parser.add_argument(
        "--drop-checkpoints",
        action="store_true",
        help="delete each run's checkpoints/ once it finished (its final/ model stays), so a long sweep of "
        "checkpointed runs does not fill the disk (default: the spec's drop_checkpoints:)",
    )
    args = vars(parser.parse_args(argv))
    run_sweep(args.pop("spec"), out_dir=args.pop("out"), **args)
    return 0
