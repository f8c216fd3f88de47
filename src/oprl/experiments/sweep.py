"""``oprl sweep SWEEP.yaml``: run a grid of training runs, several at a time, resumably, into one table.

A sweep spec is YAML::

    output_dir: runs/sweep-demo          # one sub-directory per run, plus results.csv
    parallel: 2                          # runs at once (each gets cores // parallel torch threads)
    config: null                         # optional base YAML for every run
    overrides: [steps=60, eval.interval=20]   # applied to every run
    report:                              # optional, for `oprl report`
      groups: {"IS or not": [grpo, rec-oneside-is, rec-oneside-nois]}   # one figure + table per group
      threshold_gain: 0.05               # "steps to threshold" = first eval at initial accuracy + this
      panels: [eval_accuracy, kl, ess]   # the group figures' rows (curves.PANELS), instead of the default five
      findings: {"clipping helps": [{a: grpo, b: reinforce, setting: stale}]}   # claims decided (findings.py)
    grid:                                # the cartesian product of the axes
      algorithm.preset: [grpo, reinforce]          # a plain axis: one key, a list of values
      setting:                                      # a named axis: name -> overrides bundle
        on-policy: {sync.interval: 1, sync.offset: 0}
        stale: {sync.interval: 1, sync.offset: 10}
      seed: [0, 1, 2]

``final_overrides`` (optional, what ``--set`` adds) are applied to every run after the grid's values. The whole
format, with the command-line options: docs/sweeps.md.

``grid`` may also be a list of such mappings with the same axes: their union, in order (a run planned twice runs
once). A long sweep lists its runs by priority this way, so that a partial sweep is already a result (e.g. a pilot
run first, an on-policy anchor for one method only; configs/sweeps/smollm2-stale-arena.yaml).

``--only axis=value,...`` runs a subset of the grid into the sweep's own directory (they are its runs; the spec's
``only:`` list, which it replaces, and the spec saved beside the runs records it, so that ``oprl report`` awaits
only the selected runs);
``--set key=value`` changes every run, which then go to ``<output_dir>+key=value`` (``--out`` to choose).

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
import itertools
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

import yaml

from oprl.config.loading import read_yaml
from oprl.errors import OprlError
from oprl.experiments import findings, sweep_local
from oprl.experiments.curves import PANELS
from oprl.experiments.results import THRESHOLD_GAIN, collect_results, write_table
from oprl.experiments.sweep_local import terminate_raises
from oprl.experiments.tiers import NOISES

SPEC_KEYS = (
    "output_dir", "parallel", "config", "overrides", "final_overrides", "grid", "report",
    "backend", "retries", "cpus_per_run", "keep", "drop_checkpoints", "only",
)  # fmt: skip
KEPT_FILES = ("config.yaml", "summary.json", "metrics.jsonl")
"""What ``keep:`` copies of a finished run: all that its results row, report and curves are read from."""
BACKENDS = ("local", "ray")
"""Where the runs execute: the local pool of runner processes (default), or the tasks of a Ray cluster."""


@dataclass(frozen=True)
class PlannedRun:
    name: str
    labels: dict[str, str]
    """Axis name -> value label (the columns of the results table)."""
    overrides: tuple[str, ...]


def load_spec(path: Path) -> dict:
    if not path.is_file():
        raise OprlError(f"sweep spec {path}: not found")
    try:
        spec = read_yaml(path.read_text()) or {}  # the config's YAML rules: `yes` is text, not a boolean
    except yaml.YAMLError as exc:
        raise OprlError(f"sweep spec {path}: malformed YAML ({getattr(exc, 'problem', exc)})") from None
    unknown = set(spec) - set(SPEC_KEYS)
    if unknown:
        raise OprlError(f"sweep spec {path}: unknown key(s) {sorted(unknown)}; valid: {', '.join(SPEC_KEYS)}")
    try:
        check_backend_options(spec.get("backend"), spec.get("retries"), spec.get("cpus_per_run"))
    except OprlError as exc:
        raise OprlError(f"sweep spec {path}: {exc}") from None
    report = spec.get("report") or {}
    groups = report.get("groups", {}) if isinstance(report, dict) else None
    if not isinstance(groups, dict) or not all(isinstance(v, list) and v for v in groups.values()):
        raise OprlError(f"sweep spec {path}: 'report.groups' must map a figure title to a non-empty list of presets")
    unknown_report = set(report) - {"groups", "threshold_gain", "panels", "findings", "noise"}
    if unknown_report:
        raise OprlError(
            f"sweep spec {path}: unknown report key(s) {sorted(unknown_report)}; valid: findings, groups, noise, "
            "panels, threshold_gain"
        )
    if report.get("noise", "own") not in NOISES:  # oprl report reads it: each pair's own noise, or a pooled one
        raise OprlError(f"sweep spec {path}: report.noise must be one of {', '.join(NOISES)}, not {report['noise']!r}")
    only = spec.get("only", [])
    if not isinstance(only, list) or not all(isinstance(item, str) for item in only):
        raise OprlError(f"sweep spec {path}: 'only' must list axis=value[,value...] selections, as --only takes")
    drop = spec.get("drop_checkpoints", False)
    if not isinstance(drop, bool):
        raise OprlError(f"sweep spec {path}: 'drop_checkpoints' must be true or false, not {drop!r}")
    findings.parse(report.get("findings"), f"sweep spec {path}")
    panels = report.get("panels", list(PANELS))
    if not isinstance(panels, list) or not panels or not set(map(str, panels)) <= set(PANELS):
        raise OprlError(
            f"sweep spec {path}: 'report.panels' must list rows of the group figures among {', '.join(PANELS)}"
        )
    grids = spec.get("grid")
    if isinstance(grids, list) and grids and all(isinstance(g, dict) and g for g in grids):
        if any(list(g) != list(grids[0]) for g in grids):
            raise OprlError(f"sweep spec {path}: every mapping of the 'grid' list must have the same axes in order")
    elif not isinstance(grids, dict) or not grids:
        raise OprlError(
            f"sweep spec {path}: 'grid' must be a non-empty mapping of axis -> values, or a list of such mappings"
        )
    return spec


def check_backend_options(backend, retries, cpus_per_run) -> None:
    """The spec's (or command line's) ``backend``, ``retries`` and ``cpus_per_run``, each None or valid; a bad
    one fails with one line naming its key."""
    if backend is not None and backend not in BACKENDS:
        raise OprlError(f"'backend' must be one of {', '.join(BACKENDS)}, not {backend!r}")
    if retries is not None and (isinstance(retries, bool) or not isinstance(retries, int) or retries < 0):
        raise OprlError(f"'retries' must be a whole number >= 0 (times a failed run is tried again), not {retries!r}")
    number = isinstance(cpus_per_run, int | float) and not isinstance(cpus_per_run, bool)
    if cpus_per_run is not None and not (number and cpus_per_run > 0):
        raise OprlError(f"'cpus_per_run' must be a number > 0 (Ray CPUs each run holds), not {cpus_per_run!r}")


def plan(spec: dict) -> list[PlannedRun]:
    """Every combination of the grid's axes, each with its run name and full override list (``overrides``, the
    grid's values, ``final_overrides``); for a list of grids, the union in order, each run once."""
    grids = spec["grid"] if isinstance(spec["grid"], list) else [spec["grid"]]
    runs: dict[str, PlannedRun] = {}
    last = tuple(str(o) for o in spec.get("final_overrides") or [])
    for grid in grids:
        for run in _plan_grid(grid, tuple(str(o) for o in spec.get("overrides") or []), last):
            if runs.setdefault(run.name, run).overrides != run.overrides:
                raise OprlError(f"sweep grid: run {run.name} is planned twice with different settings")
    return list(runs.values())


def _plan_grid(grid: dict, base: tuple[str, ...], last: tuple[str, ...] = ()) -> list[PlannedRun]:
    axes = []
    for axis, values in grid.items():
        if isinstance(values, dict):  # named bundles
            options = [
                (str(name), [f"{k}={_yaml_value(v)}" for k, v in bundle.items()]) for name, bundle in values.items()
            ]
        elif isinstance(values, list) and values:
            options = [(str(v), [f"{axis}={_yaml_value(v)}"]) for v in values]
        else:
            raise OprlError(f"sweep grid axis {axis!r}: expected a non-empty list or a mapping of named bundles")
        axes.append((axis, options))
    runs = []
    for combo in itertools.product(*(options for _, options in axes)):
        labels = {axis: label for (axis, _), (label, _) in zip(axes, combo, strict=True)}
        name = "__".join(f"{_short(axis)}={label}" for axis, label in labels.items())
        overrides = base + tuple(o for _, bundle in combo for o in bundle) + last
        runs.append(PlannedRun(name=name, labels=labels, overrides=overrides))
    return runs


def selected_runs(spec: dict) -> list[PlannedRun]:
    """The runs the spec will run: its grid's, less those its ``only:`` leaves out (a sweep run with ``--only``
    saves that selection in the spec beside its runs)."""
    runs = plan(spec)
    return select(runs, spec["only"]) if spec.get("only") else runs


def select(runs: list[PlannedRun], only: list[str]) -> list[PlannedRun]:
    """The runs whose labels match every ``axis=value[,value...]`` of ``only`` (``--only``). An axis is named as in
    the grid (``algorithm.preset``) or by its last part (``preset``); its values are the grid's labels (a named
    bundle's name, a plain value as written). The same axis twice: either list's values. Typos fail with one line
    naming the axis or value and what exists."""
    axes = list(runs[0].labels) if runs else []
    wanted: dict[str, set[str]] = {}
    for item in only:
        name, sep, values = item.partition("=")
        if not sep or not name or not values:
            raise OprlError(
                f"sweep --only {item!r}: expected axis=value[,value...], e.g. algorithm.preset=grpo,reinforce"
            )
        matches = [a for a in axes if name in (a, _short(a))]
        if len(matches) != 1:
            raise OprlError(f"sweep --only {item}: no axis {name!r} in the grid; axes: {', '.join(axes)}")
        axis = matches[0]
        known = list(dict.fromkeys(r.labels[axis] for r in runs))
        unknown = [v for v in values.split(",") if v not in known]
        if unknown:
            raise OprlError(
                f"sweep --only {item}: no {axis} {', '.join(map(repr, unknown))} in the grid; "
                f"values: {', '.join(known)}"
            )
        wanted.setdefault(axis, set()).update(values.split(","))
    return [r for r in runs if all(r.labels[axis] in values for axis, values in wanted.items())]


def with_overrides(spec: dict, sets: list[str], config_loader=None) -> dict:
    """The spec with ``sets`` (``--set key=value``) appended to its overrides, after every planned run's own: the
    last word on every run. Each must be ``key=value``; the first planned run is validated as ``oprl train``
    would (``config_loader``, default ``oprl.config.load_config``), so that a typo fails here in a second with
    one line instead of failing every run."""
    for item in sets:
        key, sep, _ = item.partition("=")
        if not sep or not key:
            raise OprlError(f"sweep --set {item!r}: expected key=value, e.g. steps=60")
    # After the grid's own values (``final_overrides``, see ``plan``), so that --set steps=60 also beats a grid
    # bundle that sets steps.
    changed = dict(spec, final_overrides=[*(spec.get("final_overrides") or []), *sets])
    if config_loader is None:
        from oprl.config import load_config as config_loader
    first = plan(changed)[0]
    try:
        config_loader(changed.get("config"), list(first.overrides))
    except OprlError as exc:
        raise OprlError(f"sweep --set {' '.join(sets)}: {exc}") from None
    return changed


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
    spec = load_spec(spec_path)
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
    parallel = max(1, parallel or int(spec.get("parallel") or 1))
    retries = next(r for r in (retries, spec.get("retries"), 1) if r is not None)
    cpus_per_run = float(cpus_per_run or spec.get("cpus_per_run") or 1)
    kept_in = keep or spec.get("keep")
    keep = Path(kept_in) if kept_in else None
    if keep is not None and not dry_run:
        restored = restore_kept(chosen, out, keep)
        if restored:
            log(f"sweep {out}: {restored} finished run(s) restored from {keep}")
    done_in = [out] + ([keep] if keep is not None else [])  # a dry run restores nothing but counts kept runs
    todo = [r for r in chosen if not any((d / r.name / "summary.json").is_file() for d in done_in)]
    selected = f", {len(chosen)} selected by --only" if only else ""
    where = f"{parallel} at a time" if backend == "local" else f"on Ray, {cpus_per_run:g} CPU(s) each"
    how, finished = f"{where}, a failed run tried again up to {retries} time(s)", len(chosen) - len(todo)
    log(f"sweep {out}: {len(runs)} runs{selected}, {finished} already finished, {len(todo)} to run, {how}")
    if dry_run:  # prints, writes nothing
        for r in todo:
            log("  oprl " + " ".join(_arguments(r, spec, out)))
        return out
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    if keep is not None:  # beside the kept runs, so that `oprl report KEEP` reads them as this sweep's
        keep.mkdir(parents=True, exist_ok=True)
        (keep / "sweep.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    drop = drop_checkpoints or bool(spec.get("drop_checkpoints"))

    def on_finish(run: PlannedRun) -> None:  # after each run that succeeded, and for every finished run at the end
        if keep is not None and not (keep / run.name / "summary.json").is_file():
            keep_run(out / run.name, keep / run.name)
        if drop:
            drop_run_checkpoints(out / run.name, log)

    if backend == "ray":
        failures = _execute_on_ray(todo, spec, out, retries, cpus_per_run, address, log, on_finish)
    else:
        failures = _execute(todo, spec, out, parallel, log, on_finish, retries)
    for run in chosen:  # runs finished before this sweep (or under another command); its own were handled above
        if run not in todo and (out / run.name / "summary.json").is_file():
            on_finish(run)
    table = collect_results(out, runs, threshold_gain=threshold_gain(spec))
    write_table(table, out / "results.csv")
    log(f"results: {out / 'results.csv'} ({len(table)} finished runs)")
    if failures:
        raise OprlError(
            f"sweep: {len(failures)} run(s) failed, see their logs in {out / 'logs'}: {', '.join(failures[:5])}"
        )
    return out


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


def threshold_gain(spec: dict) -> float:
    """The spec's ``report.threshold_gain`` (accuracy gain that counts as "reached"), else the default."""
    return float((spec.get("report") or {}).get("threshold_gain", THRESHOLD_GAIN))


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


def _yaml_value(value) -> str:
    text = yaml.safe_dump(value, default_flow_style=True).strip()
    return text[:-4].strip() if text.endswith("...") else text


def _short(axis: str) -> str:
    return axis.split(".")[-1]


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
