"""The sweep spec and its plan: the YAML format of ``oprl sweep SWEEP.yaml`` checked, its grid expanded into named runs.

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
      collapse: [reinforce]              # runs ending below their start, k of n (report_collapse.py)
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

``select`` (``--only axis=value,...``) picks a subset of the plan by its labels; ``with_overrides`` (``--set
key=value``) changes every run, checked on the first as ``oprl train`` would. A bad key or value is one line naming
it. Not here: running the plan (``sweep``), reporting it (``report``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import yaml

from oprl.config.loading import read_yaml
from oprl.errors import OprlError
from oprl.experiments import findings, report_collapse
from oprl.experiments.curves import PANELS
from oprl.experiments.results import THRESHOLD_GAIN
from oprl.experiments.tiers import NOISES

SPEC_KEYS = (
    "output_dir", "parallel", "config", "overrides", "final_overrides", "grid", "report",
    "backend", "retries", "cpus_per_run", "keep", "drop_checkpoints", "only",
)  # fmt: skip
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
    unknown_report = set(report) - {"groups", "threshold_gain", "panels", "findings", "noise", "collapse"}
    if unknown_report:
        raise OprlError(
            f"sweep spec {path}: unknown report key(s) {sorted(unknown_report)}; valid: collapse, findings, groups, "
            "noise, panels, threshold_gain"
        )
    report_collapse.parse(report.get("collapse"), f"sweep spec {path}")
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


def threshold_gain(spec: dict) -> float:
    """The spec's ``report.threshold_gain`` (accuracy gain that counts as "reached"), else the default."""
    return float((spec.get("report") or {}).get("threshold_gain", THRESHOLD_GAIN))


def _yaml_value(value) -> str:
    text = yaml.safe_dump(value, default_flow_style=True).strip()
    return text[:-4].strip() if text.endswith("...") else text


def _short(axis: str) -> str:
    return axis.split(".")[-1]
