"""``oprl report SWEEP_DIR``: figures plus a markdown report with the sweep's tables and what its seeds can tell.

First what the design can detect (each pair's own noise, 2 SE and the minimum detectable difference at 80 % power,
``oprl.experiments.tiers``); then per cell (preset × setting; a row per value of any other sweep axis:
``aspo lr=0.0001``) n, mean, **sample** SD (n − 1) and the 95 % t-interval of final eval accuracy and of the area
under the eval-accuracy curve (a mean accuracy over training), and the first step reaching initial accuracy +
``report.threshold_gain`` (default 0.05); then per setting and pooled over the lag ladder the tier of the best
(Hsu's MCB, each pair with its own noise) and the methods below it, in words, each place checked with one seed left
out (every pairwise difference, Holm-adjusted, in ``stats.csv``); with two or more lags (``lag-N``, ``stale-N``,
``offline``) accuracy against lag with intervals, the tiers by lag (``oprl.experiments.arena``) and the losses
against each method's own lag 0 (one family, Holm); then, for each of the spec's ``report.groups``, one figure
(accuracy, reward, clip fraction, KL to the initial policy, reverse KL to a teacher × settings) and its table;
then the spec's ``report.findings``, one family (Bonferroni), each decided holds / does not hold / undetermined,
robust or fragile (``oprl.experiments.findings``) and declared before its data or not (``oprl.experiments.declared``:
the spec's git history against each run's first commit); all in ``findings.csv``. ``report.noise: pooled``
declares the pooled σ̂ instead of each pair's own noise (printed beside Brown–Forsythe's test). Labels are the
sweep's own (its setting names).

A directory with a ``results.csv`` and no run directories (a committed sweep: docs/reproduction/arena) gets the
same report from the CSV, less what needs the runs' curves (training-curve figures, groups). ``--plan DELTA``
prints the seeds per cell that would resolve a difference DELTA, with this sweep's noise as the pilot's.
``report.collapse`` adds, for the cells it names, the runs whose final accuracy fell below their start with an
exact interval and what the ESS warning said of them (``oprl.experiments.report_collapse``).

``--pool DIR`` adds another sweep's finished runs of the cells this sweep plans as more seeds of them (a sweep whose
spec declares the two one population: the same recipe on other seeds); the report says which runs joined and every
setting in which they differ from this sweep's runs of the same cell, and refuses a seed both sweeps ran. A pooled
directory holding only a ``results.csv`` (a committed sweep whose runs are gone) lends its rows of this sweep's cells
to every table and contrast (not to the curves), dated by that file's commits: how arena v2's comparators join the
methods built after it (configs/sweeps/arena2-methods.yaml). ``--spec``
reads the findings and grid from a spec other than the ``sweep.yaml`` beside the runs (a kept copy older than its
tracked spec), ``--out`` writes the report elsewhere (kept run directories that another process commits to).
"""

from __future__ import annotations

import argparse
import csv
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from oprl.errors import OprlError
from oprl.experiments import declared, findings, lag_losses, report_collapse, sensitivity, stats, tiers
from oprl.experiments.arena import arena_section
from oprl.experiments.curves import PANELS, _setting_rank, flat_settings, plot_all, plot_grid
from oprl.experiments.results import _canonical, collect_results, load_run, summarize, write_table
from oprl.experiments.sweep_spec import load_spec, plan, selected_runs, threshold_gain
from oprl.experiments.tiers import LAYOUT, row_label

__all__ = ["LAYOUT", "build_report", "main", "row_label"]

GROUP_PANELS = ("eval_accuracy", "train_reward", "clip_fraction", "kl_initial", "distill_reverse_kl")
"""The rows of a group figure unless the spec names others (``report.panels``, names of ``curves.PANELS``)."""


def group_rows(names) -> list[tuple[str, str, int]]:
    """Rows of a group figure: (metric key, y label, moving-average window: 1 for evaluations, else 5)."""
    return [(*PANELS[name], 1 if name == "eval_accuracy" else 5) for name in names]


CELL = "{:.3f} ± {:.3f} [{:.3f}, {:.3f}]"
"""A cell of the accuracy tables: mean ± sample SD [95 % t-interval of the mean]."""

CLIPPED = "‡"
CLIPPED_NOTE = (f"{CLIPPED}: the t-interval reached past [0, 1], where an accuracy lies; clipped to it (few seeds "
                "and a wide spread: the interval says little there).")  # fmt: skip
"""The mark of an accuracy cell whose interval ``_table`` clipped to [0, 1], and the line under such a table."""

NUMBERS = ("final_accuracy", "initial_accuracy", "best_accuracy", "accuracy_auc", "steps_to_threshold",
           "late_train_reward", "seconds")  # fmt: skip
"""The summary columns of a results.csv (``results.summarize``) read back as numbers."""


def build_report(
    sweep_dir: Path, out_dir: Path | None = None, spec_path: Path | None = None, pools: Sequence[Path] = ()
) -> Path:
    """The report of ``sweep_dir`` (its runs, or its results.csv), written with its tables and figures to
    ``out_dir`` (default: the sweep directory itself): the stages below, in the order the report reads.
    ``spec_path``: the spec to read instead of ``sweep_dir/sweep.yaml``; ``pools``: other sweeps' run directories
    whose runs of this sweep's cells join them (module docstring)."""
    sweep_dir = Path(sweep_dir)
    out_dir = Path(out_dir) if out_dir is not None else sweep_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    spec = load_spec(Path(spec_path)) if spec_path is not None else _spec(sweep_dir)
    report = spec.get("report") or {}
    where = f"sweep spec {spec_path or sweep_dir / 'sweep.yaml'}"
    wanted = report_collapse.parse(report.get("collapse"), where)
    noise = report.get("noise", "own")
    if noise not in tiers.NOISES:
        raise OprlError(f"{where}: report.noise must be one of {', '.join(tiers.NOISES)}, not {noise!r}")
    gain = threshold_gain(spec)
    read = _read(sweep_dir, out_dir, spec, gain, [Path(p) for p in pools])
    analyses = [tiers.analyse(read.summaries, metric, noise) for metric in tiers.METRICS]
    write_table(tiers.pair_rows(analyses), out_dir / "stats.csv")
    lines = [f"# Sweep report: {sweep_dir.name}", "", read.source, "", *sensitivity.design_lines(analyses)]
    # What the report says depends on the spec and the pooled runs, not on where it is written (--out).
    command = " ".join([f"oprl report {sweep_dir}", *([f"--spec {spec_path}"] if spec_path else []),
                        *(f"--pool {p}" for p in pools)])  # fmt: skip
    lines += [f"Regenerate: `{command}`. Every pairwise difference (two-sided, Holm over the pairs "
              "of a comparison): `stats.csv`.", ""]  # fmt: skip
    lines += _cell_sections(read.summaries, gain)
    if wanted and read.from_csv:  # the warning is replayed on a run's rows: a results.csv has none
        lines += ["Collapses (`report.collapse`): not reported from a results.csv (the ESS warning is replayed on "
                  "each run's `metrics.jsonl`).", ""]  # fmt: skip
    elif wanted:
        found = report_collapse.cells(read.sources, wanted, where)
        write_table(report_collapse.rows(found), out_dir / "collapse.csv")
        lines += report_collapse.lines(found)
        if lent := len(read.summaries) - len(read.records):  # --pool of a results.csv: rows without metrics
            lines += [f"Collapses leave out the {lent} pooled rows of a results.csv (the ESS warning is replayed on "
                      "each run's `metrics.jsonl`; a results.csv has none).", ""]  # fmt: skip
    lines += _separation_sections(analyses, read.summaries, out_dir)
    lines += _findings_section(report, spec, read, sweep_dir, out_dir, noise)
    if not read.from_csv:  # the groups' figures are training curves: they need the runs
        lines += _group_sections(report, spec, read, sweep_dir, out_dir, gain)
    if read.figures:
        lines += ["## Figures (all presets)", ""]
        lines += [f"![{f.stem}](figures/{f.name})" for f in read.figures]
    out = out_dir / "report.md"
    out.write_text("\n".join(lines) + "\n")
    return out


@dataclass
class _Read:
    """What a report reads of a sweep: ``(labels, numbers)`` per run, which run each cell and seed is, and where
    runs exist, the runs (``records``), the grid's plan and the training-curve figures drawn from them."""

    summaries: list
    names: dict
    source: str
    """The report's line on what it read."""
    from_csv: bool
    records: list = field(default_factory=list)
    runs: list | None = None
    """The sweep's planned runs (None: not planned by ``oprl sweep``, or read from a results.csv)."""
    figures: list[Path] = field(default_factory=list)
    pooled: dict[str, list[str]] = field(default_factory=dict)
    """``{pooled sweep directory: its run names that joined}`` (``--pool``); empty for a sweep alone."""

    @property
    def sources(self) -> list[tuple]:
        """``(record, source)``: each run and the pooled directory it came from ("" for the sweep's own)."""
        pooled = {name: where for where, names in self.pooled.items() for name in names}
        return [(r, pooled.get(str(r.run_dir), "")) for r in self.records]


def _finished(sweep_dir: Path) -> list[Path]:
    return [d for d in sorted(sweep_dir.iterdir()) if (d / "summary.json").is_file()] if sweep_dir.is_dir() else []


def _read(sweep_dir: Path, out_dir: Path, spec: dict, gain: float, pools: Sequence[Path] = ()) -> _Read:
    """The sweep's finished runs (writing their results.csv and figures to ``out_dir``), else its results.csv;
    with ``pools``, their runs of this sweep's cells too (``_pooled``)."""
    run_dirs = _finished(sweep_dir)
    if pools and not run_dirs:
        raise OprlError(f"report --pool: {sweep_dir} has no finished runs (directories with summary.json) to pool with")
    if not run_dirs:
        if not (sweep_dir / "results.csv").is_file():
            raise OprlError(f"report: no finished runs (directories with summary.json) and no results.csv in "
                            f"{sweep_dir}")  # fmt: skip
        summaries = summaries_from_csv(sweep_dir / "results.csv", spec)
        names = _run_names(summaries, [row.get("run") for row in _csv_rows(sweep_dir / "results.csv")])
        source = f"{len(summaries)} runs, read from results.csv (no run directories: no training-curve figures)."
        return _Read(summaries, names, source, from_csv=True)
    # The sweep's own axis labels (e.g. setting names) where the run was planned by it, else derived ones.
    runs = plan(spec) if spec.get("grid") else None
    planned = {r.name: r.labels for r in runs or []}
    records = [load_run(d, planned.get(d.name)) for d in run_dirs]
    table = collect_results(sweep_dir, runs, threshold_gain=gain)
    source = f"{len(records)} finished runs."
    pooled: dict[str, list[str]] = {}
    rows: list[tuple[dict, dict, str]] = []  # pooled results.csv rows: (labels, numbers, run name)
    if pools:
        joined, table, source, rows = _pooled(sweep_dir, records, runs, table, pools, gain)
        pooled = {str(where): [str(r.run_dir) for r in found] for where, found in joined.items()}
        for where in pools:  # a pooled results.csv's rows: dated from its own directory too (_declarations)
            pooled.setdefault(str(where), [])
        records = records + [r for found in joined.values() for r in found]
    write_table(table, out_dir / "results.csv")
    figures = plot_all(records, out_dir / "figures")
    summaries = [(r.labels, summarize(r, gain)) for r in records] + [(labels, numbers) for labels, numbers, _ in rows]
    names = _run_names(summaries, [*(r.run_dir.name for r in records), *(name for *_, name in rows)])
    return _Read(summaries, names, source, False, records, runs, figures, pooled)


def _pooled(sweep_dir: Path, records: list, runs, table: list[dict], pools: Sequence[Path], gain: float):
    """``--pool``: each pooled directory's finished runs whose cell (method, setting) this sweep plans (or has,
    when it was not planned by ``oprl sweep``), labelled by that directory's own ``sweep.yaml``; returns them by
    directory, the results table with a ``source`` column, and the report's line on what was pooled and in which
    settings (besides the seed) the pooled runs differ from this sweep's runs of the same cell. A (cell, seed)
    that two directories both ran is refused: the same seed twice is one population's draw counted twice.

    A pooled directory with no run directories but a ``results.csv`` (a committed sweep: docs/reproduction/arena2)
    lends its rows of this sweep's cells instead, returned as ``(labels, numbers, run name)``: they join every
    table and contrast, not the curves, and are dated by that file's commits (``declared.run_dates``)."""

    def cell(labels: dict) -> tuple[str, str]:
        return row_label({_canonical(k): v for k, v in labels.items()}), labels["setting"]

    own = {cell(r.labels): r for r in records}
    ours = {cell(r.labels) for r in runs or []} | set(own)
    seen = {(cell(r.labels), r.labels["seed"]): sweep_dir for r in records}
    table = [{**row, "source": str(sweep_dir)} for row in table]
    joined: dict[Path, list] = {}
    words: list[str] = []
    differing: dict[str, tuple] = {}  # key -> (pooled value, this sweep's), the first pair that differs
    lent_rows: list[tuple[dict, dict, str]] = []
    for where in pools:
        run_dirs = _finished(where)
        their = _spec(where)
        if not run_dirs and (where / "results.csv").is_file():
            csv_rows = _csv_rows(where / "results.csv")
            lent = [(tags, numbers, row.get("run") or "")
                    for (tags, numbers), row in zip(summaries_from_csv(where / "results.csv", their), csv_rows,
                                                    strict=True)
                    if cell(tags) in ours]  # fmt: skip
            for tags, _, _ in lent:
                key = (cell(tags), tags["seed"])
                if key in seen:
                    raise OprlError(f"report --pool {where}: {key[0][0]}@{key[0][1]} seed {key[1]} is also in "
                                    f"{seen[key]}; pooled sweeps must not share a seed of a cell")  # fmt: skip
                seen[key] = where
            lent_names = {name for *_, name in lent}
            table += [{**row, "source": str(where)} for row in csv_rows if row.get("run") in lent_names]
            lent_rows += lent
            cells_lent = sorted({f"{m}@{s}" for (m, s) in (cell(tags) for tags, _, _ in lent)})
            words.append(f"{len(lent)} rows of {where / 'results.csv'} ({', '.join(cells_lent) or 'none'}; no curves)")
            continue
        if not run_dirs:
            raise OprlError(f"report --pool {where}: no finished runs (directories with summary.json) and no "
                            "results.csv")  # fmt: skip
        planned = plan(their) if their.get("grid") else None
        labels = {r.name: r.labels for r in planned or []}
        found = [r for r in (load_run(d, labels.get(d.name)) for d in run_dirs) if cell(r.labels) in ours]
        for r in found:
            key = (cell(r.labels), r.labels["seed"])
            if key in seen:
                raise OprlError(f"report --pool {where}: {key[0][0]}@{key[0][1]} seed {key[1]} is also in "
                                f"{seen[key]}; pooled sweeps must not share a seed of a cell")  # fmt: skip
            seen[key] = where
            if cell(r.labels) in own:  # what differs from this sweep's run of the cell, seed aside
                mine, theirs = flat_settings(own[cell(r.labels)].config), flat_settings(r.config)
                for k in sorted(set(mine) | set(theirs)):
                    if mine.get(k) != theirs.get(k):
                        differing.setdefault(k, (theirs.get(k), mine.get(k)))
        joined[where] = found
        rows = [row for row in collect_results(where, planned, threshold_gain=gain)
                if row["run"] in {r.run_dir.name for r in found}]  # fmt: skip
        table += [{**row, "source": str(where)} for row in rows]
        seeds = sorted({r.labels["seed"] for r in found}, key=report_collapse.seed_rank)
        words.append(f"{len(found)} runs of {where} (seeds {', '.join(seeds) or 'none'})")
    differ = "; ".join(f"{k} ({_show(a)} pooled, {_show(b)} here)" for k, (a, b) in differing.items())
    source = (f"{len(records) + sum(map(len, joined.values())) + len(lent_rows)} finished runs, pooled (`--pool`): "
              f"{len(records)} of "
              f"this sweep and {' and '.join(words)}, of the cells this sweep plans, as more seeds of the same "
              "cells (one population: the same recipe on other seeds, as the sweeps' specs must declare). "
              + (f"Settings in which the pooled runs differ from this sweep's runs of the same cell, seed aside: "
                 f"{differ}." if differ else "The pooled runs' settings equal this sweep's, seed aside."))  # fmt: skip
    return joined, table, source, lent_rows


def _show(value) -> str:
    return "unset" if value is None else str(value)


def _cell_sections(summaries, gain: float) -> list[str]:
    """Per cell: final accuracy and its AUC (mean ± SD [t-interval]), then the first step past the threshold."""
    lines = []
    for metric, title in (
        ("final_accuracy", "Final eval accuracy"),
        ("accuracy_auc", "Area under the eval-accuracy curve (mean accuracy over training)"),
    ):
        lines += [f"## {title}: mean ± sample SD (n − 1) [95 % t-interval of the mean]", ""]
        lines += [*_table(summaries, metric, CELL), ""]
    lines += [
        f"## First eval step with accuracy ≥ initial + {gain:g} (mean over the seeds that reach it, * = not all "
        "do; — = none does)",
        "",
        *_table(summaries, "steps_to_threshold", "{:.0f}"),
        "",
    ]
    return lines


def _separation_sections(analyses, summaries, out_dir: Path) -> list[str]:
    """What the seeds separate: the verdicts, then on a lag ladder the tiers by lag, the losses against lag 0 and
    accuracy against lag (``arena``)."""
    lines = ["## What the seeds separate", ""]
    for analysis in analyses:
        lines += tiers.verdict_lines(analysis)
    tables = []
    for analysis in analyses:
        if analysis.pooled is not None:
            title = tiers.METRICS[analysis.metric]
            if not any(tiers.testable(c) for _, c in analysis.named):  # bold would mark every cell as tied
                head = f"Means by lag, {title} (one run per cell: no tiers with one seed):"
            else:
                head = (f"Tiers by lag, {title} (mean over seeds; **bold**: in the tier of the best at that lag (MCB), "
                        "else (−points below the method that puts it below); †: one seed left out changes the "
                        "place):")  # fmt: skip
            tables += [head, "", *tiers.tier_table(analysis), ""]
    if tables:
        tables += lag_losses.loss_lines(summaries)
    return lines + arena_section(summaries, out_dir / "figures", tables)  # a lag ladder: accuracy against lag


def _findings_section(report: dict, spec: dict, read: _Read, sweep_dir: Path, out_dir: Path, noise: str) -> list[str]:
    """The spec's ``report.findings``, decided (``findings``) and dated (``declared``); ``findings.csv``."""
    claims = findings.parse(report.get("findings"), f"sweep spec {sweep_dir / 'sweep.yaml'}")
    if not claims:
        return []
    _check_cells(claims, read.summaries, plan(spec) if spec.get("grid") else [], sweep_dir)
    decided = findings.decide(claims, read.summaries, noise=noise)
    status = _declarations(sweep_dir, spec, decided, read.names, list(read.pooled))
    write_table(findings.rows(decided, status), out_dir / "findings.csv")
    lines = findings.lines(decided, status, noise=noise)
    forest = findings.plot(decided, out_dir / "figures" / "findings.png")
    return lines + ([f"![Findings](figures/{forest.name})", ""] if forest else [])


def _group_sections(report: dict, spec: dict, read: _Read, sweep_dir: Path, out_dir: Path, gain: float) -> list[str]:
    """Per ``report.groups`` entry, its figure of training curves and its table; a preset still awaited is noted,
    one the sweep never runs is a typo (one line)."""
    rows = group_rows(report.get("panels") or GROUP_PANELS)
    planned_presets = {v for r in read.runs or [] for k, v in r.labels.items() if _canonical(k) == "preset"}
    awaited = {
        v for r in (selected_runs(spec) if read.runs else []) for k, v in r.labels.items() if _canonical(k) == "preset"
    }
    lines: list[str] = []
    for index, (title, presets) in enumerate((report.get("groups") or {}).items(), start=1):
        chosen = [r for r in read.records if r.labels["preset"] in presets]
        missing = sorted(set(presets) - {r.labels["preset"] for r in chosen})
        unknown = [p for p in missing if p not in planned_presets]
        if unknown:  # a typo, or a preset this sweep never runs; one the sweep has not finished is only noted
            raise OprlError(f"report group {title!r}: no run of preset(s) {', '.join(unknown)} in {sweep_dir}")
        waiting = [p for p in missing if p in awaited]  # not one the spec's `only:` (a --only sweep) leaves out
        if not chosen and not waiting:
            continue
        lines += [f"## {title}", ""]
        if waiting:
            lines += [f"Not finished yet: {', '.join(waiting)}.", ""]
        if not chosen:
            continue
        figure = plot_grid(chosen, rows, out_dir / "figures" / f"group-{index}.png", title=title)
        chosen_summaries = [(r.labels, summarize(r, gain)) for r in chosen]
        lines += [
            "Final eval accuracy (mean ± sample SD [95 % t-interval]):",
            "",
            *_table(chosen_summaries, "final_accuracy", CELL),
            "",
            *([f"![{title}](figures/{figure.name})", ""] if figure else []),  # None: the runs log none of its rows
        ]
    return lines


def _run_names(summaries, names: list[str | None]) -> dict[tuple[str, str, str], tuple[str | None, float]]:
    """``{(method, setting, seed): (run name, seconds)}``: which run a finding's cell and seed is."""
    return {(row_label(labels), labels["setting"], labels["seed"]): (name, numbers.get("seconds", math.nan))
            for (labels, numbers), name in zip(summaries, names, strict=True)}  # fmt: skip


def _declarations(
    sweep_dir: Path, spec: dict, decided, names, read_pools: Sequence[str] = ()
) -> dict[str, declared.Status]:
    """Each finding's declaration against its runs (``oprl.experiments.declared``), pooled runs included."""
    source, why = declared.source_spec(sweep_dir, spec)
    contrasts = [d.contrast for rows in decided.values() for d in rows]
    when = declared.declarations(source, contrasts, why)
    dates, started = declared.run_dates(sweep_dir), declared.recorded_starts(sweep_dir)
    for where in read_pools:  # a pooled run is dated from its own directory's commits and rows
        dates = {**declared.run_dates(Path(where)), **dates}
        started = {**declared.recorded_starts(Path(where)), **started}
    out = {}
    for name, rows in decided.items():
        cells = dict.fromkeys((m, s, seed) for d in rows for (m, s), seed in d.seeds)  # a run in two contrasts: once
        runs = [names.get(cell, (None, math.nan)) for cell in cells]
        out[name] = declared.status([when[d.contrast] for d in rows], runs, dates, started)
    return out


def _csv_rows(path: Path) -> list[dict]:
    with Path(path).open(newline="") as handle:
        return list(csv.DictReader(handle))


def _check_cells(claims, summaries, planned, sweep_dir: Path) -> None:
    """A finding's cell that no run has and the grid never plans is a typo: one line, not a silent "pending"."""
    known = {(row_label(labels), labels["setting"]) for labels, _ in summaries}
    known |= {(row_label(labels), labels["setting"]) for labels in
              ({_canonical(k): v for k, v in r.labels.items()} for r in planned) if "setting" in labels}  # fmt: skip
    for name, contrasts in claims.items():
        for contrast in contrasts:
            for method, setting in (contrast.a, contrast.b):
                if (method, setting) not in known:
                    raise OprlError(f"report finding {name!r}: no run of {method} at setting {setting} in {sweep_dir}"
                                    " and the sweep plans none")  # fmt: skip


def summaries_from_csv(path: Path, spec: dict) -> list[tuple[dict[str, str], dict[str, float]]]:
    """``(labels, numbers)`` per row of a results.csv: labels preset, setting, seed and the spec's other grid axes
    (where a sweep.yaml lies beside it), numbers the summary columns (``NUMBERS``)."""
    grids = spec.get("grid") or {}
    axes = {_canonical(axis) for grid in (grids if isinstance(grids, list) else [grids]) for axis in grid}
    rows = _csv_rows(path)
    missing = [c for c in ("preset", "setting", "seed") if rows and c not in rows[0]]
    if missing:
        raise OprlError(f"report: {path} has no column(s) {', '.join(missing)}")
    # Without a sweep.yaml beside it, a column that differs between the seeds' rows of one preset x setting cell
    # (a learning rate swept as its own axis) is an axis too: pooling its values into one cell would mix methods.
    cells: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in rows:
        cells[(row["preset"], row["setting"])].append(row)
    other = [k for k in (rows[0] if rows else {}) if k not in {*LAYOUT, *NUMBERS, "run"}]
    axes |= {k for k in other if any(len({r[k] for r in cell}) > 1 for cell in cells.values())}
    out = []
    for row in rows:
        labels = {k: row[k] for k in row if k in {*LAYOUT, *axes}}
        numbers = {k: float(row[k]) if row.get(k) not in (None, "") else math.nan for k in NUMBERS if k in row}
        out.append((labels, numbers))
    return out


def _spec(sweep_dir: Path) -> dict:
    """The sweep spec saved in the sweep directory (empty if the runs were not made by ``oprl sweep``); a malformed
    one is the user's error naming the file (it is read for the report only: its keys are not checked here)."""
    spec_path = sweep_dir / "sweep.yaml"
    if not spec_path.is_file():
        return {}
    try:
        spec = yaml.safe_load(spec_path.read_text())
    except yaml.YAMLError as exc:
        raise OprlError(f"sweep spec {spec_path}: malformed YAML ({getattr(exc, 'problem', exc)})") from None
    if spec is not None and not isinstance(spec, dict):
        raise OprlError(f"sweep spec {spec_path}: expected a mapping of keys, got {type(spec).__name__}")
    return spec or {}


def _row_rank(label: str) -> list[tuple[int, float | str]]:
    """Rows by preset, then each axis value numerically where it is a number (3e-05 before 0.0001)."""
    rank: list[tuple[int, float | str]] = []
    for part in label.split(" "):
        value = part.partition("=")[2]
        try:
            rank.append((0, float(value)))
        except ValueError:
            rank.append((1, part))
    return rank


def _table(summaries, metric: str, fmt: str) -> list[str]:
    """Markdown: a row per preset, a column per setting, ``fmt`` of the cell's seeds; with a "±" format (an
    accuracy) mean ± SD [t-interval clipped to [0, 1], ``CLIPPED`` where it was, ``CLIPPED_NOTE`` under the table]."""
    cells: dict[tuple[str, str], list[float]] = defaultdict(list)
    for labels, numbers in summaries:
        cells[(row_label(labels), labels["setting"])].append(numbers.get(metric, math.nan))
    settings = sorted({s for _, s in cells}, key=_setting_rank)
    presets = sorted({p for p, _ in cells}, key=_row_rank)
    counts = [len(v) for v in cells.values()]
    usual = max(set(counts), key=counts.count) if counts else 0  # seeds per cell; a cell with another n says so
    rows = ["| preset | " + " | ".join(settings) + " |", "|---|" + "---|" * len(settings)]
    for preset in presets:
        row = []
        for setting in settings:
            values = [v for v in cells.get((preset, setting), []) if not math.isnan(v)]
            if not values:
                row.append("—")
            elif "±" in fmt and len(values) == 1:  # one seed: no spread to show
                row.append(fmt.split(" ±")[0].format(values[0]) + " (1 seed)")
            elif "±" in fmt:  # an accuracy: its interval clipped to [0, 1] (a t-interval ignores the bounds)
                cell = stats.describe(values)
                low, high = max(cell.low, 0.0), min(cell.high, 1.0)
                mark = CLIPPED if (low, high) != (cell.low, cell.high) else ""
                row.append(
                    fmt.format(cell.mean, cell.sd, low, high) + mark + ("" if cell.n == usual else f" n={cell.n}")
                )
            else:
                row.append(
                    fmt.format(sum(values) / len(values))
                    + ("" if len(values) == len(cells[(preset, setting)]) else "*")
                )
        rows.append(f"| {preset} | " + " | ".join(row) + " |")
    return rows + (["", CLIPPED_NOTE] if any(CLIPPED in row for row in rows) else [])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="oprl report",
        description="Figures and a markdown report of a sweep: per cell n, mean, sample SD and 95 % t-interval; "
        "the tiers of methods the seeds cannot separate; the smallest difference the design can detect.",
    )
    parser.add_argument("sweep_dir", type=Path, help="a sweep's output directory (run directories or results.csv)")
    parser.add_argument("--out", type=Path, metavar="DIR", help="write the report, tables and figures to DIR "
                        "(default: SWEEP_DIR itself)")  # fmt: skip
    parser.add_argument("--spec", type=Path, metavar="FILE", help="read the findings and the grid's labels from FILE "
                        "instead of SWEEP_DIR/sweep.yaml (a kept copy older than its tracked spec)")  # fmt: skip
    parser.add_argument(
        "--pool",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="add DIR's finished runs of the cells this sweep plans as more seeds of them (a sweep declared one "
        "population with this one; repeatable); the report names them and every setting in which they differ",
    )
    parser.add_argument(
        "--plan",
        type=float,
        metavar="DELTA",
        help="also print how many seeds per cell find a true difference DELTA (accuracy, e.g. 0.01 = 1 point) at "
        "80 %% power, with this sweep's noise as a pilot's",
    )
    args = parser.parse_args(argv)
    if args.plan is not None and not 0 < args.plan < 1:
        raise OprlError(f"report --plan {args.plan:g}: a difference of accuracy in (0, 1), e.g. 0.01 for 1 point")
    out = args.out if args.out is not None else args.sweep_dir
    spec = load_spec(args.spec) if args.spec is not None else _spec(args.sweep_dir)
    print(build_report(args.sweep_dir, out, args.spec, args.pool))
    if (spec.get("report") or {}).get("findings"):  # the verdicts in words, as the report has them
        verdicts = {row["finding"]: row for row in _csv_rows(Path(out) / "findings.csv")}
        print("\n".join(f"{name}: {row['finding_verdict']} ({row['finding_robustness']}; {row['declaration']})"
                        for name, row in verdicts.items()))  # fmt: skip
    if args.plan is not None:
        summaries = summaries_from_csv(Path(out) / "results.csv", spec)
        noise = (spec.get("report") or {}).get("noise", "own")
        analyses = [tiers.analyse(summaries, m, noise) for m in tiers.METRICS]
        print("\n".join(sensitivity.plan_lines(analyses, args.plan)))
    return 0
