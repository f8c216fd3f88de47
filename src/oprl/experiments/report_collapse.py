"""``report.collapse``: how many runs of a cell collapsed, and whether the ESS warning told them from the rest.

A descriptive the spec declares, not a verdict (no family, no margin): for each named cell (a method at a setting,
its runs over seeds),

- **collapsed**: the run's final eval accuracy lies below its step-0 eval accuracy (strictly: ending level with the
  start is no collapse). The cell's k of n collapsed, with the exact Clopper–Pearson 95 % interval of the fraction
  (``stats.proportion``): at n = 3-9 a fraction's interval is wide, and the report says how wide;
- **the ESS warning**, replayed on each run's own ``metrics.jsonl`` rows: ``oprl.runtime.health.EssWatch`` fires
  once, at the first step whose row completes ``ESS_STEPS`` consecutive logged ``rho/ess`` values averaging below
  ``ESS_LEVEL``. The warning is a log line only (neither ``metrics.jsonl`` nor ``summary.json`` records it), so the
  report applies the same rule to the rows, as ``benchmarks/ess_warning.py`` does; a resumed run's live watch
  restarted at its resume, the replay runs over all its rows. This module may not import the runtime
  (tests/test_layering.py), so the rule is restated here and a test holds it equal to ``EssWatch``;
- **warned before collapse**: a collapsing run whose warning step is earlier than the first evaluation below its
  start (the evaluation that shows the fall; the same step does not count: the warning is not earlier than the
  accuracy that shows it). A surviving run that warned at all is counted as warned: a false alarm.

Per cell the line "warned before collapse: a of b collapsing runs, c of d surviving runs", and per run its eval
accuracy at every evaluation (a 96-step run's to step 96), the first evaluation below the start, the warning's step
and the lowest ``ESS_STEPS``-step mean of ``rho/ess``; ``collapse.csv`` one row per run.

Spec: ``report.collapse: true`` (every cell) or a list of cells, ``method@setting`` or ``method`` (its every
setting): ``collapse: [reinforce, grpo@lag-4]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from oprl.errors import OprlError
from oprl.experiments import stats
from oprl.experiments.curves import _setting_rank
from oprl.experiments.results import RunRecord
from oprl.experiments.tiers import row_label

ESS_LEVEL = 0.7
"""``oprl.runtime.health.ESS_LEVEL``: the ``ESS_STEPS``-step mean of ``rho/ess`` below which a run warns."""
ESS_STEPS = 5
"""``oprl.runtime.health.ESS_STEPS``: the steps averaged."""


def ess_warning_step(rows: Sequence[dict]) -> int | None:
    """The step at which ``EssWatch`` warns on ``rows`` (module docstring), None if it never does: the first row
    whose ``rho/ess`` completes ``ESS_STEPS`` consecutive logged values with mean < ``ESS_LEVEL``."""
    recent: list[float] = []
    for row in rows:
        if "rho/ess" not in row:
            continue
        recent = [*recent[-(ESS_STEPS - 1) :], row["rho/ess"]]
        if len(recent) == ESS_STEPS and sum(recent) / ESS_STEPS < ESS_LEVEL:
            return int(row.get("step", 0))
    return None


def lowest_ess(rows: Sequence[dict]) -> float:
    """The lowest mean of ``ESS_STEPS`` consecutive logged ``rho/ess`` values; NaN with fewer logged."""
    ess = [row["rho/ess"] for row in rows if "rho/ess" in row]
    means = [sum(ess[i - ESS_STEPS : i]) / ESS_STEPS for i in range(ESS_STEPS, len(ess) + 1)]
    return min(means, default=math.nan)


@dataclass(frozen=True)
class RunCollapse:
    """One run: its seed, (step, eval accuracy) at each evaluation, whether it collapsed, the step of its first
    evaluation below the start (None: none), the ESS warning's step (None: never) and its lowest 5-step ESS."""

    run: str
    seed: str
    evals: tuple[tuple[int, float], ...]
    collapsed: bool
    first_below: int | None
    warned_at: int | None
    lowest_ess: float
    source: str = ""
    """Where the run was read from when the report pools sweeps ("" for the sweep's own)."""

    @property
    def warned_before(self) -> bool:
        """A collapsing run warned before its first evaluation below the start; a surviving one warned at all."""
        if self.warned_at is None:
            return False
        return not self.collapsed or (self.first_below is not None and self.warned_at < self.first_below)


def of_run(record: RunRecord, source: str = "") -> RunCollapse | None:
    """The run's collapse and warning; None for a run with fewer than two evaluations (no start to fall from)."""
    steps, accuracy = record.curve("eval/accuracy")
    if len(steps) < 2:
        return None
    start = accuracy[0]
    below = next((s for s, a in zip(steps, accuracy, strict=True) if a < start), None)
    return RunCollapse(
        run=record.run_dir.name,
        seed=str(record.labels.get("seed", "")),
        evals=tuple(zip(steps, accuracy, strict=True)),
        collapsed=accuracy[-1] < start,
        first_below=below,
        warned_at=ess_warning_step(record.rows),
        lowest_ess=lowest_ess(record.rows),
        source=source,
    )


def parse(raw: object, where: str) -> bool | list[tuple[str, str | None]]:
    """``report.collapse``: False when absent, True for every cell, else the named cells ``(method, setting or
    None for every setting)``; one line naming the culprit otherwise."""
    if raw is None or raw is False:
        return False
    if raw is True:
        return True
    if not isinstance(raw, list) or not raw or not all(isinstance(item, str) and item.strip() for item in raw):
        raise OprlError(f"{where}: 'report.collapse' must be true (every cell) or a list of cells, method@setting "
                        f"or method (every setting), not {raw!r}")  # fmt: skip
    cells = []
    for item in raw:
        method, _, setting = item.partition("@")
        cells.append((method.strip(), setting.strip() or None))
    return cells


def cells(
    records: Sequence[tuple[RunRecord, str]], wanted: bool | list[tuple[str, str | None]], where: str
) -> dict[tuple[str, str], list[RunCollapse]]:
    """``{(method, setting): [RunCollapse by seed]}`` for the cells ``wanted`` names, in the report's order
    (method, then setting by schedule); ``records`` are ``(record, source)``. A named cell no run has is a typo:
    one line."""
    out: dict[tuple[str, str], list[RunCollapse]] = {}
    for record, source in records:
        cell = (row_label(record.labels), record.labels["setting"])
        if wanted is True or any(m == cell[0] and s in (None, cell[1]) for m, s in wanted or []):
            run = of_run(record, source)
            if run is not None:
                out.setdefault(cell, []).append(run)
    for method, setting in wanted if isinstance(wanted, list) else []:
        if not any(m == method and setting in (None, s) for m, s in out):
            named = f"{method}@{setting}" if setting else method
            raise OprlError(f"{where}: report.collapse names {named}, which no finished run with evaluations is")
    ordered = sorted(out, key=lambda c: (c[0], _setting_rank(c[1])))
    return {c: sorted(out[c], key=lambda r: (seed_rank(r.seed), r.source)) for c in ordered}


def seed_rank(seed: str) -> tuple[int, int, str]:
    """Seeds numerically (2 before 10), other labels after them."""
    return (0, int(seed), seed) if seed.isdigit() else (1, 0, seed)


def counts(runs: Sequence[RunCollapse]) -> tuple[stats.Proportion, int, int, int, int]:
    """The cell's collapsed k of n with its exact interval, then a, b, c, d of "warned before collapse: a of b
    collapsing runs, c of d surviving runs"."""
    collapsing = [r for r in runs if r.collapsed]
    surviving = [r for r in runs if not r.collapsed]
    return (
        stats.proportion(len(collapsing), len(runs)),
        sum(r.warned_before for r in collapsing),
        len(collapsing),
        sum(r.warned_before for r in surviving),
        len(surviving),
    )


def _step(step: int | None) -> str:
    return "—" if step is None else str(step)


def lines(found: dict[tuple[str, str], list[RunCollapse]]) -> list[str]:
    """The report's section: a row per cell (k of n, fraction, interval, the warning's two counts), then per cell
    a row per run (eval accuracy at each evaluation, first evaluation below the start, the warning)."""
    if not found:
        return []
    out = [
        "## Collapses (`report.collapse`): final eval accuracy below the step-0 accuracy (descriptive, not a verdict)",
        "",
        f"A run collapsed when its final eval accuracy is below its step-0 accuracy. Interval: exact "
        f"(Clopper–Pearson) 95 % of the fraction. ESS warning: `EssWatch`'s rule (the {ESS_STEPS}-step mean of "
        f"`rho/ess` below {ESS_LEVEL}) replayed on the run's `metrics.jsonl` rows; warned before collapse: the "
        "warning's step is earlier than the run's first evaluation below its start; a surviving run that warned at "
        "all counts as warned (a false alarm). Every run: `collapse.csv`.",
        "",
        "| cell | collapsed | fraction | 95 % exact interval | warned before collapse | surviving runs warned |",
        "|---|---|---|---|---|---|",
    ]
    for (method, setting), runs in found.items():
        share, a, b, c, d = counts(runs)
        out.append(f"| {method} @ {setting} | {share.k} of {share.n} | {share.fraction:.2f} | "
                   f"[{share.low:.3f}, {share.high:.3f}] | {a} of {b} | {c} of {d} |")  # fmt: skip
    out.append("")
    if len(found) > 1:  # the warning's question across methods: a clipped method's runs are survivors too
        _, a, b, c, d = counts([r for runs in found.values() for r in runs])
        out += [f"These {len(found)} cells together: warned before collapse: {a} of {b} collapsing runs, {c} of {d} "
                "surviving runs.", ""]  # fmt: skip
    for (method, setting), runs in found.items():
        share, a, b, c, d = counts(runs)
        steps = sorted({s for r in runs for s, _ in r.evals})
        out += [
            f"### {method} @ {setting}: {share.k} of {share.n} collapsed",
            "",
            f"warned before collapse: {a} of {b} collapsing runs, {c} of {d} surviving runs",
            "",
            f"| seed | eval accuracy at step {' / '.join(map(str, steps))} | collapsed | first eval below start | "
            f"ESS warning | lowest {ESS_STEPS}-step `rho/ess` | warned before collapse |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in runs:
            at = dict(r.evals)
            series = " / ".join(f"{at[s]:.3f}" if s in at else "—" for s in steps)
            seed = r.seed + (" (pooled)" if r.source else "")  # which directory: the report's first line, the CSV
            ess = "—" if math.isnan(r.lowest_ess) else f"{r.lowest_ess:.2f}"
            warned = "step " + str(r.warned_at) if r.warned_at is not None else "none"
            before = {(True, True): "yes", (True, False): "no", (False, True): "false alarm"}.get(
                (r.collapsed, r.warned_before), "—"
            )
            out.append(f"| {seed} | {series} | {'yes' if r.collapsed else 'no'} | {_step(r.first_below)} | {warned} | "
                       f"{ess} | {before} |")  # fmt: skip
        out.append("")
    return out


def rows(found: dict[tuple[str, str], list[RunCollapse]]) -> list[dict]:
    """``collapse.csv``: one row per run of the named cells, with its cell's k, n and interval."""
    out = []
    for (method, setting), runs in found.items():
        share, *_ = counts(runs)
        for r in runs:
            out.append({"preset": method, "setting": setting, "seed": r.seed, "run": r.run, "source": r.source,
                        "initial_accuracy": r.evals[0][1], "final_accuracy": r.evals[-1][1],
                        "final_step": r.evals[-1][0], "collapsed": r.collapsed,
                        "first_eval_below_start": "" if r.first_below is None else r.first_below,
                        "ess_warning_step": "" if r.warned_at is None else r.warned_at,
                        "lowest_ess_5step": r.lowest_ess,
                        "warned_before_collapse": r.warned_before if r.collapsed else "",
                        "cell_collapsed": share.k, "cell_runs": share.n,
                        "cell_low": round(share.low, 6), "cell_high": round(share.high, 6)})  # fmt: skip
    return out
