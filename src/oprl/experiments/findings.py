"""``report.findings``: claims declared before the data, decided by the seeds, in words: holds, does not hold, or
undetermined with the smallest effect the design could have seen.

A finding is a list of **contrasts**, each a claim about a − b, two cells of the sweep (a cell: a method at a
setting, paired over seeds), on one metric (default final eval accuracy; ``accuracy_auc`` for "learns faster"):

    a − b > −margin        (margin 0: "a is better than b"; margin δ > 0: "a is no worse than b by δ or more")

Spec (``report.findings`` in a sweep spec; ``setting`` may be a list, one contrast per setting)::

    findings:
      "F2: clipping stabilises": [{a: rec-oneside-nois, b: reinforce, setting: lag-4}]
      "F1: dropping IS costs little": [{a: rec-oneside-nois, b: grpo, setting: lag-4, margin: 0.1}]
      "Anchor": [{a: grpo@lag-4, b: grpo@lag-0, margin: 0.1}]     # cells of two settings: preset@setting

Statistics (``oprl.experiments.stats``): d̄ the paired mean difference over the seeds both cells have. Within one
setting SE = σ̂ · sqrt(2 / n) with σ̂ the residual SD of that setting's methods (method + seed model, as the report's
tiers); across two settings the seeds are not one block, so σ̂ is the two cells' pooled sample SD (as the loss
against a method's own lag 0). Every interval is a 1 − α/m interval, m = the number of contrasts of all the
findings (Bonferroni), so all the verdicts together are wrong with probability ≤ α = 0.05:

- **holds** when the interval lies above −margin; **does not hold** when it lies below −margin;
- **undetermined** otherwise, with the design's minimum detectable difference (80 % power at α/m, ``stats.mde``):
  an effect at least that large would most likely have been decided;
- **pending** when a cell has no finished run yet (a sweep in progress).

A finding holds when all of its contrasts hold, does not hold when any does not, is pending while any is, and is
undetermined otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from oprl.errors import OprlError
from oprl.experiments import stats
from oprl.experiments.tiers import METRICS, points, values_by_setting

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
    """One contrast decided: d̄ and its 1 − α/m interval (accuracy units), σ̂'s df, the MDE, the verdict."""

    contrast: Contrast
    n: int
    mean: float
    low: float
    high: float
    df: int
    mde: float
    verdict: str
    """``holds``, ``does not hold``, ``undetermined`` or ``pending``."""


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


def decide(findings: Mapping[str, list[Contrast]], summaries, alpha: float = stats.ALPHA) -> dict[str, list[Decided]]:
    """Every contrast of ``findings`` decided on the sweep's ``(labels, numbers)`` summaries (module docstring)."""
    level = alpha / max(1, sum(len(c) for c in findings.values()))
    tables = {metric: values_by_setting(summaries, metric) for metric in METRICS}  # {setting: {method: {seed: v}}}
    out: dict[str, list[Decided]] = {}
    for name, contrasts in findings.items():
        out[name] = []
        for c in contrasts:
            table = tables[c.metric]
            a, b = (table.get(setting, {}).get(method, {}) for method, setting in (c.a, c.b))
            if not a or not b:
                out[name].append(Decided(c, 0, math.nan, math.nan, math.nan, 0, math.nan, "pending"))
                continue
            if c.a[1] == c.b[1]:  # one setting: its methods' residual σ̂ (the pairing takes the seed out)
                sigma = stats.residual_noise(table[c.a[1]])
            else:  # two settings: the two cells' own pooled sample SD
                sigma = stats.Noise(*stats.pooled_sd([list(a.values()), list(b.values())]))
            d = stats.difference(a, b, sigma, alpha=level)
            effect = stats.mde(d.se, d.df, alpha=level) if d.se == d.se else math.inf
            out[name].append(Decided(c, d.n, d.mean, d.low, d.high, d.df, effect, _verdict(d.low, d.high, c.margin)))
    return out


def _verdict(low: float, high: float, margin: float) -> str:
    if low > -margin:
        return "holds"
    if high < -margin:
        return "does not hold"
    return "undetermined"  # also NaN bounds: too few seeds or no σ̂


def overall(decided: list[Decided]) -> str:
    verdicts = {d.verdict for d in decided}
    if "does not hold" in verdicts:
        return "does not hold"
    if "pending" in verdicts:
        return "pending"
    return "holds" if verdicts == {"holds"} else "undetermined"


def confidence(decided: dict[str, list[Decided]], alpha: float = stats.ALPHA) -> tuple[int, str]:
    """m, the number of contrasts, and the confidence of their intervals, 1 − α/m, as a percentage text."""
    m = sum(len(d) for d in decided.values())
    return m, f"{100 * (1 - alpha / max(1, m)):.2f} %"


def lines(decided: dict[str, list[Decided]], alpha: float = stats.ALPHA) -> list[str]:
    """The report's findings section: one table row per contrast, one verdict line per finding."""
    m, level = confidence(decided, alpha)
    out = [
        "## Findings (`report.findings`)",
        "",
        f"Each claim is a − b > −margin, paired over seeds; intervals are {level} "
        f"(Bonferroni over the {m} contrasts, so all verdicts together err with probability ≤ {alpha:g}); holds: "
        "the interval lies above −margin, does not hold: below it, else undetermined (MDE: the difference found "
        "with 80 % power at that level). Points = 0.01 of accuracy.",
        "",
        "| finding | claim | n | a − b (points) | interval | df | MDE | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in decided.items():
        for index, d in enumerate(rows):
            name = name if index == 0 else ""  # the finding once, above its contrasts
            if d.verdict == "pending":
                out.append(f"| {name} | {d.contrast.claim} | 0 | — | — | — | — | pending (no run yet) |")
                continue
            interval = "—" if math.isnan(d.low) else f"[{points(d.low)}, {points(d.high)}]"
            mde = "∞" if math.isinf(d.mde) else ("—" if math.isnan(d.mde) else points(d.mde))
            out.append(f"| {name} | {d.contrast.claim} | {d.n} | {points(d.mean)} | {interval} | {d.df} | {mde} | "
                       f"{d.verdict} |")  # fmt: skip
    out.append("")
    for name, rows in decided.items():
        out.append(f"- **{name}**: {overall(rows)}")
    return [*out, ""]


COLORS = {"holds": "tab:green", "does not hold": "tab:red", "undetermined": "tab:gray"}


def plot(decided: dict[str, list[Decided]], out: Path) -> Path | None:
    """A forest plot: one row per decided contrast, d̄ with its 1 − α/m interval in points, the claim's threshold
    −margin as a tick, coloured by verdict; None when no contrast has an interval yet."""
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
    axis.set_title(f"Findings: a − b with its {level} interval (Bonferroni over {m})")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")  # the long claims on the left stay whole
    plt.close(fig)
    return out


def rows(decided: dict[str, list[Decided]]) -> list[dict]:
    """``findings.csv``: one row per contrast, accuracy units."""
    out = []
    for name, contrasts in decided.items():
        for d in contrasts:
            c = d.contrast
            numbers = {"mean_a_minus_b": d.mean, "low": d.low, "high": d.high, "mde": d.mde}
            out.append({"finding": name, "a": c.a[0], "a_setting": c.a[1], "b": c.b[0], "b_setting": c.b[1],
                        "metric": c.metric, "margin": c.margin, "n": d.n, "df": d.df,
                        **{k: float(f"{v:.6g}") for k, v in numbers.items()}, "verdict": d.verdict,
                        "finding_verdict": overall(contrasts)})  # fmt: skip
    return out
