"""``report.findings``: claims declared before the data, decided by the seeds, in words: holds, does not hold, or
undetermined with the smallest effect the design could have seen; each verdict checked for robustness and dated
against its runs.

A finding is a list of **contrasts**, each a one-sided claim about a − b, two cells of the sweep (a cell: a method
at a setting, paired over seeds), on one metric (default final eval accuracy; ``accuracy_auc`` for "learns
faster"):

    a − b > −margin        (margin 0: "a is better than b"; margin δ > 0: "a is no worse than b by δ or more")

Spec (``report.findings`` in a sweep spec; ``setting`` may be a list, one contrast per setting)::

    findings:
      "F2: clipping stabilises": [{a: rec-oneside-nois, b: reinforce, setting: lag-4}]
      "F1: dropping IS costs little": [{a: rec-oneside-nois, b: grpo, setting: lag-4, margin: 0.1}]
      "Anchor": [{a: grpo@lag-4, b: grpo@lag-0, margin: 0.1}]     # cells of two settings: preset@setting

Statistics (``oprl.experiments.stats``): each contrast with its own noise, ``stats.contrast``: paired over the
seeds both cells have (SE = s_d / √n of its paired differences, n − 1 df), or Welch's test where they share fewer
than two; ``report.noise: pooled`` declares the pooled σ̂ instead (the setting's residual σ̂ within one setting,
the two cells' pooled sample SD across two), printed beside Brown–Forsythe's test. **One family per report**: the
m contrasts of all the findings, Bonferroni: each claim's two one-sided bounds d̄ ∓ t_{1−α/m, df} · SE, so all
the verdicts together are wrong with probability ≤ α = 0.05 (a contrast can err only in the direction its truth
allows):

- **holds** when the lower bound lies above −margin; **does not hold** when the upper bound lies below −margin;
- **undetermined** otherwise, with the design's minimum detectable difference (the a − b + margin that the
  one-sided test at α/m finds with 80 % power, ``stats.mde``): an effect that large would most likely have been
  decided;
- **pending** when a cell has no finished run yet (a sweep in progress).

A finding holds when all of its contrasts hold, does not hold when any does not, is pending while any is, and is
undetermined otherwise. **Robust** or **fragile**: each verdict is decided again with each seed left out (and,
with a pooled σ̂, each other method of the setting left out of σ̂); one that changes is fragile, and what changes
it is named. The declaration (``oprl.experiments.declared``) is added by the report.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol

from oprl.errors import OprlError
from oprl.experiments import stats
from oprl.experiments.tiers import METRICS, points, values_by_setting


class _Declaration(Protocol):
    """What a finding's rows read of a contrast's declaration (``declared.Declared``)."""

    @property
    def commit(self) -> str | None: ...
    @property
    def at(self) -> datetime | None: ...


class StatusView(Protocol):
    """What a finding's rows read of its declaration against its runs (``declared.Status``, which this module
    does not import: ``declared`` imports this one)."""

    @property
    def label(self) -> str: ...
    @property
    def declared(self) -> _Declaration: ...
    @property
    def runs(self) -> int: ...
    @property
    def before(self) -> int: ...


CONTRAST_KEYS = ("a", "b", "setting", "margin", "metric")


@dataclass(frozen=True)
class Contrast:
    """The claim a − b > −margin on ``metric``; a and b are (method, setting) cells."""

    a: tuple[str, str]
    b: tuple[str, str]
    margin: float = 0.0
    metric: str = "final_accuracy"

    @property
    def claim(self) -> str:
        a, b = (f"{m} @ {s}" for m, s in (self.a, self.b))
        if self.a[1] == self.b[1]:
            a, b = self.a[0], f"{self.b[0]} @ {self.b[1]}"
        what = "above" if self.margin == 0 else f"no more than {points(self.margin)} points below"
        return f"{a} {what} {b}" + ("" if self.metric == "final_accuracy" else f" ({METRICS[self.metric]})")


@dataclass(frozen=True)
class Decided:
    """One contrast decided: d̄, its two one-sided bounds at α/m (accuracy units), the one-sided p of the claim,
    df and procedure, the MDE, the verdict, the seeds each cell used, the leave-one-out flips
    ``((left out, verdict), ...)``."""

    contrast: Contrast
    n: int
    mean: float
    low: float
    high: float
    df: float
    mde: float
    verdict: str
    """``holds``, ``does not hold``, ``undetermined`` or ``pending``."""
    procedure: str = stats.PAIRED
    p: float = math.nan
    seeds: tuple = ()
    """``((cell, seed), ...)``: the runs the contrast used."""
    flips: tuple = ()


def parse(raw: object, where: str) -> dict[str, list[Contrast]]:
    """``{finding: [Contrast]}`` from a spec's ``report.findings``; one line naming the culprit otherwise."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not raw:
        raise OprlError(f"{where}: 'report.findings' must map a finding's name to a list of contrasts {{a, b, ...}}")
    out: dict[str, list[Contrast]] = {}
    for name, contrasts in raw.items():
        if not isinstance(contrasts, list) or not contrasts:
            raise OprlError(f"{where}: report.findings[{name!r}] must be a non-empty list of contrasts {{a, b, ...}}")
        out[str(name)] = []
        for index, item in enumerate(contrasts):
            out[str(name)] += _contrasts(item, f"{where}: report.findings[{name!r}][{index}]")
    return out


def _contrasts(item: object, where: str) -> list[Contrast]:
    if not isinstance(item, dict):
        raise OprlError(f"{where}: a contrast is a mapping with keys {', '.join(CONTRAST_KEYS)}")
    unknown = set(item) - set(CONTRAST_KEYS)
    if unknown:
        raise OprlError(f"{where}: unknown key(s) {sorted(unknown)}; valid: {', '.join(CONTRAST_KEYS)}")
    if "a" not in item or "b" not in item:
        raise OprlError(f"{where}: needs both 'a' and 'b' (a method, or method@setting)")
    margin, metric = item.get("margin", 0.0), item.get("metric", "final_accuracy")
    if isinstance(margin, bool) or not isinstance(margin, int | float) or not 0 <= margin < 1:
        raise OprlError(f"{where}: 'margin' must be an accuracy difference in [0, 1), e.g. 0.1 for 10 points")
    if metric not in METRICS:
        raise OprlError(f"{where}: 'metric' must be one of {', '.join(METRICS)}, not {metric!r}")
    settings = item.get("setting")
    settings = settings if isinstance(settings, list) else [settings]
    out = []
    for setting in settings:
        a, b = (_cell(item[k], setting, where, k) for k in ("a", "b"))
        out.append(Contrast(a, b, float(margin), metric))
    return out


def _cell(text: object, setting: object, where: str, key: str) -> tuple[str, str]:
    method, _, own = str(text).partition("@")
    chosen = own or setting
    if not method or chosen in (None, ""):
        raise OprlError(f"{where}: '{key}: {text}' names no setting (write method@setting, or give 'setting')")
    return method.strip(), str(chosen).strip()


def decide(
    findings: Mapping[str, list[Contrast]], summaries, alpha: float = stats.ALPHA, noise: str = "own"
) -> dict[str, list[Decided]]:
    """Every contrast of ``findings`` decided on the sweep's ``(labels, numbers)`` summaries (module docstring)."""
    level = alpha / max(1, sum(len(c) for c in findings.values()))
    tables = {metric: values_by_setting(summaries, metric) for metric in METRICS}  # {setting: {method: {seed: v}}}
    out: dict[str, list[Decided]] = {}
    for name, contrasts in findings.items():
        out[name] = [_decided(c, tables[c.metric], level, noise) for c in contrasts]
    return out


def _decided(c: Contrast, table, level: float, noise: str) -> Decided:
    """One contrast: its verdict, then the same with each seed (and, pooled, each other method) left out."""
    a, b = (table.get(setting, {}).get(method, {}) for method, setting in (c.a, c.b))
    if not a or not b:
        return Decided(c, 0, math.nan, math.nan, math.nan, 0, math.nan, "pending")
    d = _test(c, a, b, table, level, noise)
    effect = stats.mde(d.se, d.df, alpha=level, tails=1) if d.se == d.se else math.inf
    verdict = _verdict(d.low, d.high, c.margin)
    used = sorted(set(a) & set(b), key=str) if d.procedure != stats.WELCH else sorted({*a, *b}, key=str)
    seeds = tuple((cell, seed) for seed in used for cell, values in ((c.a, a), (c.b, b)) if seed in values)

    def without(left) -> str:
        kind, unit = left
        if kind == "seed":
            drop = {k: v for k, v in a.items() if k != unit}, {k: v for k, v in b.items() if k != unit}
            rest = {m: {k: v for k, v in per.items() if k != unit} for m, per in table.get(c.a[1], {}).items()}
            return _verdict_of(_test(c, *drop, {**table, c.a[1]: rest}, level, noise), c.margin)
        rest = {m: per for m, per in table.get(c.a[1], {}).items() if m != unit}
        return _verdict_of(_test(c, a, b, {**table, c.a[1]: rest}, level, noise), c.margin)

    leave = [("seed", u) for u in used]
    if noise == "pooled" and c.a[1] == c.b[1]:  # the pool's other methods: would one of them decide it?
        leave += [("method", m) for m in sorted(table.get(c.a[1], {})) if m not in (c.a[0], c.b[0])]
    flips = tuple((f"{'seed ' if kind == 'seed' else 'σ̂ without '}{unit}", v)
                  for (kind, unit), v in stats.flips(verdict, without, leave))  # fmt: skip
    return Decided(c, d.n, d.mean, d.low, d.high, d.df, effect, verdict, d.procedure, d.p, seeds, flips)


def _test(c: Contrast, a, b, table, level: float, noise: str) -> stats.Difference:
    """a − b > −margin, one-sided at α/m: its own noise, or the declared pooled σ̂."""
    if noise != "pooled":
        return stats.contrast(a, b, alpha=level, tails=1, threshold=-c.margin)
    if c.a[1] == c.b[1]:  # one setting: its methods' residual σ̂ (the pairing takes the seed out)
        sigma = stats.residual_noise(table[c.a[1]])
    else:  # two settings: the two cells' own pooled sample SD
        sigma = stats.PooledSigma(*stats.pooled_sd([list(a.values()), list(b.values())]))
    return stats.difference(a, b, sigma, alpha=level, tails=1, threshold=-c.margin)


def _verdict_of(d: stats.Difference, margin: float) -> str:
    return _verdict(d.low, d.high, margin) if d.n else "pending"


def _verdict(low: float, high: float, margin: float) -> str:
    if low > -margin:
        return "holds"
    if high < -margin:
        return "does not hold"
    return "undetermined"  # also NaN bounds: too few seeds or no σ̂


def overall(decided: list[Decided]) -> str:
    return _overall([d.verdict for d in decided])


def _overall(verdicts: list[str]) -> str:
    if "does not hold" in verdicts:
        return "does not hold"
    if "pending" in verdicts:
        return "pending"
    return "holds" if set(verdicts) == {"holds"} else "undetermined"


def robustness(decided: list[Decided]) -> str:
    """``robust``, or ``fragile: <what> → <verdict>`` for each left-out unit that changes the finding's verdict
    (the contrasts' own flips, taken together)."""
    verdict = overall(decided)
    units = sorted({unit for d in decided for unit, _ in d.flips}, key=_unit_rank)
    changes = []
    for unit in units:
        again = _overall([dict(d.flips).get(unit, d.verdict) for d in decided])
        if again != verdict:
            changes.append(f"{unit} → {again}")
    return "fragile: " + "; ".join(changes) if changes else "robust"


def _unit_rank(unit: str) -> tuple:
    """Left-out units in order: seeds numerically, then the methods left out of a pooled σ̂."""
    last = unit.rsplit(" ", 1)[-1]
    return (0, int(last), unit) if unit.startswith("seed ") and last.isdigit() else (1, 0, unit)


def confidence(decided: dict[str, list[Decided]], alpha: float = stats.ALPHA) -> tuple[int, str]:
    """m, the number of contrasts, and the confidence of each one-sided bound, 1 − α/m, as a percentage text."""
    m = sum(len(d) for d in decided.values())
    return m, f"{100 * (1 - alpha / max(1, m)):.2f} %"


def _df(df: float) -> str:
    return f"{df:.0f}" if float(df).is_integer() else f"{df:.1f}"


def lines(
    decided: dict[str, list[Decided]], status: Mapping[str, StatusView] | None = None, alpha: float = stats.ALPHA,
    noise: str = "own",
) -> list[str]:  # fmt: skip
    """The report's findings section: one table row per contrast, one line per finding with its verdict, its
    robustness and (``status``, from ``declared``) whether it was declared before its data."""
    m, level = confidence(decided, alpha)
    how = "the pooled σ̂ (declared: `report.noise: pooled`)" if noise == "pooled" else "each contrast's own noise"
    out = [
        "## Findings (`report.findings`)",
        "",
        f"Each claim is a − b > −margin, one-sided, with {how}: paired over the seeds both cells have (paired t, "
        f"n − 1 df), or Welch's t where they share fewer than two. One family: the {m} contrasts of this report, "
        f"Bonferroni; the bounds are the two one-sided {level} bounds (α/{m} each side), so all verdicts together "
        f"err with probability ≤ {alpha:g}. Holds: the lower bound lies above −margin; does not hold: the upper "
        "bound lies below it; else undetermined (MDE: the a − b + margin that the one-sided test finds with 80 % "
        "power). Robust: no verdict changes when any one seed is left out; fragile: what changes it. Declared: "
        "`oprl.experiments.declared` (the spec's git history against each run's first commit). Points = 0.01 of "
        "accuracy.",
        "",
        "| finding | claim | n | a − b (points) | bounds | p | test (df) | MDE | verdict | robustness |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in decided.items():
        for index, d in enumerate(rows):
            name = name if index == 0 else ""  # the finding once, above its contrasts
            if d.verdict == "pending":
                out.append(f"| {name} | {d.contrast.claim} | 0 | — | — | — | — | — | pending (no run yet) | — |")
                continue
            bounds = "—" if math.isnan(d.low) else f"[{points(d.low)}, {points(d.high)}]"
            mde = "∞" if math.isinf(d.mde) else ("—" if math.isnan(d.mde) else points(d.mde))
            p = "—" if math.isnan(d.p) else f"{d.p:.2g}"
            flips = "; ".join(f"{unit} → {v}" for unit, v in d.flips) if d.flips else "robust"
            out.append(f"| {name} | {d.contrast.claim} | {d.n} | {points(d.mean)} | {bounds} | {p} | {d.procedure} "
                       f"({_df(d.df)}) | {mde} | {d.verdict} | {flips} |")  # fmt: skip
    out.append("")
    for name, rows in decided.items():
        declared = f"; {status[name].label}{_when(status[name])}" if status and name in status else ""
        out.append(f"- **{name}**: {overall(rows)} ({robustness(rows)}{declared})")
    return [*out, ""]


def _when(status: StatusView) -> str:
    d = status.declared
    return f", commit {d.commit[:7]} {d.at:%Y-%m-%d %H:%M} UTC" if d.commit and d.at else ""


COLORS = {"holds": "tab:green", "does not hold": "tab:red", "undetermined": "tab:gray"}


def plot(decided: dict[str, list[Decided]], out: Path) -> Path | None:
    """A forest plot: one row per decided contrast, d̄ between its one-sided 1 − α/m bounds in points, the claim's
    threshold −margin as a tick, coloured by verdict; None when no contrast has an interval yet."""
    drawn = [(name, d) for name, rows in decided.items() for d in rows if not math.isnan(d.low)]
    if not drawn:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(9, 0.45 * len(drawn) + 1.4))
    for row, (_, d) in enumerate(reversed(drawn)):
        color = COLORS[d.verdict]
        axis.errorbar(100 * d.mean, row, xerr=[[100 * (d.mean - d.low)], [100 * (d.high - d.mean)]], color=color,
                      marker="o", capsize=3, linewidth=1.5)  # fmt: skip
        axis.plot([-100 * d.contrast.margin] * 2, [row - 0.35, row + 0.35], color="black", linewidth=1.2)
    axis.axvline(0, color="black", linewidth=0.6, alpha=0.5)
    labels = [f"{name.split(':')[0]}: {d.contrast.claim}" for name, d in reversed(drawn)]
    axis.set_yticks(range(len(drawn)), labels, fontsize=7)
    axis.set_xlabel("a − b (points); black tick: −margin, the claim a − b > −margin")
    axis.grid(axis="x", alpha=0.3)
    handles = [plt.Line2D([], [], color=c, marker="o", label=v) for v, c in COLORS.items()]
    # Beside the axes, not inside: inside it covered the lowest claim's interval on a short plot.
    axis.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    m, level = confidence(decided)
    axis.set_title(f"Findings: a − b between its one-sided {level} bounds (Bonferroni over {m})")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")  # the long claims on the left stay whole
    plt.close(fig)
    return out


def _declared_columns(found: StatusView | None) -> dict:
    if found is None:
        return {"declaration": "", "declared_commit": "", "declared_at": "", "runs": "", "runs_before": ""}
    at = found.declared.at.isoformat() if found.declared.at else ""
    return {"declaration": found.label, "declared_commit": found.declared.commit or "", "declared_at": at,
            "runs": found.runs, "runs_before": found.before}  # fmt: skip


def rows(decided: dict[str, list[Decided]], status: Mapping[str, StatusView] | None = None) -> list[dict]:
    """``findings.csv``: one row per contrast, accuracy units; the finding's verdict, robustness and declaration
    on each of its rows."""
    out = []
    for name, contrasts in decided.items():
        found = (status or {}).get(name)
        declared = _declared_columns(found)
        for d in contrasts:
            c = d.contrast
            numbers = {"mean_a_minus_b": d.mean, "low": d.low, "high": d.high, "p": d.p, "mde": d.mde}
            out.append({"finding": name, "a": c.a[0], "a_setting": c.a[1], "b": c.b[0], "b_setting": c.b[1],
                        "metric": c.metric, "margin": c.margin, "n": d.n, "procedure": d.procedure,
                        "df": float(f"{d.df:.4g}"), **{k: float(f"{v:.6g}") for k, v in numbers.items()},
                        "verdict": d.verdict, "robustness": "; ".join(f"{u} → {v}" for u, v in d.flips) or "robust",
                        "finding_verdict": overall(contrasts), "finding_robustness": robustness(contrasts),
                        **declared})  # fmt: skip
    return out
