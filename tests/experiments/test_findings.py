"""``report.findings`` (oprl.experiments.findings): one-sided claims a − b > −margin decided by paired seeds, checked
against scipy's one-sided paired t bounds at the Bonferroni level of the report's one family; every verdict (holds,
does not hold, undetermined, pending), the cross-setting contrast (paired, or Welch), a fragile verdict and what
flips it, the pooled σ̂ only as a declared choice beside Brown–Forsythe, one-line errors for a bad spec, and
``oprl report`` writing the section and findings.csv."""

import csv
import math

import numpy as np
import pytest
import yaml
from scipy import stats as distributions

from oprl.errors import OprlError
from oprl.experiments import findings, report

SEEDS = ("0", "1", "2")


def cells(table: dict[tuple[str, str], list[float]]):
    """Summaries from ``{(preset, setting): [final accuracy per seed]}`` (AUC = half of it)."""
    return [
        ({"preset": p, "setting": s, "seed": seed}, {"final_accuracy": v, "accuracy_auc": v / 2})
        for (p, s), values in table.items()
        for seed, v in zip(SEEDS, values, strict=True)
    ]


def decide(spec: dict, table) -> dict[str, list[findings.Decided]]:
    return findings.decide(findings.parse(spec, "spec"), cells(table))


def test_two_methods_match_scipys_one_sided_paired_bounds_at_the_bonferroni_level():
    a, b = [0.61, 0.55, 0.70], [0.20, 0.16, 0.27]
    spec = {"F": [{"a": "x", "b": "y", "setting": "s"}], "G": [{"a": "y", "b": "x", "setting": "s", "margin": 0.5}]}
    (d,), (e,) = decide(spec, {("x", "s"): a, ("y", "s"): b}).values()
    level = 1 - 0.05 / 2  # m = 2 contrasts, one family; each bound one-sided at α/m
    low = distributions.ttest_rel(a, b, alternative="greater").confidence_interval(level).low
    high = distributions.ttest_rel(a, b, alternative="less").confidence_interval(level).high
    assert d.mean == pytest.approx(np.mean(np.subtract(a, b)))
    assert (d.low, d.high) == pytest.approx((low, high))
    assert d.df == 2 and d.n == 3 and d.verdict == "holds" and d.procedure == "paired t"
    assert d.p == pytest.approx(distributions.ttest_rel(a, b, alternative="greater").pvalue)
    # y − x is ~-41 points: above −50 it holds (no more than 50 below); its p is the test of y − x + 0.5 > 0.
    assert (e.low, e.high) == pytest.approx((-high, -low))
    shifted = distributions.ttest_rel(np.add(b, 0.5), a, alternative="greater").pvalue
    assert e.low > -0.5 and e.verdict == "holds" and e.p == pytest.approx(shifted)


def test_each_verdict():
    table = {
        ("good", "lag-4"): [0.60, 0.62, 0.61],
        ("bad", "lag-4"): [0.10, 0.12, 0.11],
        ("close", "lag-4"): [0.583, 0.603, 0.594],  # 1.7 points under good in every seed
        ("good", "lag-16"): [0.60, 0.62, 0.61],
        ("noisy", "lag-16"): [0.10, 0.90, 0.40],
    }
    spec = {
        "better": [{"a": "good", "b": "bad", "setting": "lag-4"}],
        "reversed": [{"a": "bad", "b": "good", "setting": "lag-4"}],
        "within margin": [{"a": "close", "b": "good", "setting": "lag-4", "margin": 0.1}],
        "no margin": [{"a": "close", "b": "good", "setting": "lag-4"}],
        "noise": [{"a": "noisy", "b": "good", "setting": "lag-16"}],
        "missing": [{"a": "good", "b": "absent", "setting": "lag-4"}, {"a": "bad", "b": "good", "setting": "lag-4"}],
    }
    decided = decide(spec, table)
    got = {name: findings.overall(rows) for name, rows in decided.items()}
    assert got == {
        "better": "holds",
        "reversed": "does not hold",
        "within margin": "holds",
        "no margin": "does not hold",  # 1.7 points below, exactly measured: the claim "above" fails
        "noise": "undetermined",
        "missing": "does not hold",  # one contrast fails: the finding fails even with another pending
    }
    noise = decided["noise"][0]
    assert math.isfinite(noise.mde) and noise.mde > abs(noise.mean)  # the design could not see an effect this size
    assert decided["missing"][0].verdict == "pending"


def test_a_cross_setting_contrast_pairs_its_seeds_and_falls_back_to_welch():
    a, b = [0.50, 0.55, 0.45], [0.80, 0.70, 0.75]
    (d,) = decide({"A": [{"a": "grpo@lag-4", "b": "grpo@lag-0", "margin": 0.1}]},
                  {("grpo", "lag-4"): a, ("grpo", "lag-0"): b})["A"]  # fmt: skip
    reference = distributions.ttest_rel(a, b, alternative="less").confidence_interval(0.95).high
    assert d.procedure == "paired t" and d.df == 2 and d.high == pytest.approx(reference)
    assert d.verdict == "does not hold"  # 25 points below its lag 0, the upper bound below −10
    # Seeds that the two cells do not share: Welch's unpaired test, its Satterthwaite df.
    summaries = [*cells({("grpo", "lag-4"): a}), *[({"preset": "grpo", "setting": "lag-0", "seed": s}, {
        "final_accuracy": v}) for s, v in zip(("5", "6", "7"), b, strict=True)]]  # fmt: skip
    (w,) = findings.decide(findings.parse({"A": [{"a": "grpo@lag-4", "b": "grpo@lag-0"}]}, "spec"), summaries)["A"]
    welch = distributions.ttest_ind(a, b, equal_var=False, alternative="less")
    assert w.procedure == "Welch t" and w.df == pytest.approx(welch.df) and w.n == 6
    assert w.high == pytest.approx(welch.confidence_interval(0.95).high)


def test_a_verdict_that_one_seed_flips_is_fragile_and_says_which():
    """Four seeds put a 3 points above b, the fifth 10 points under: with all five, "above" is undetermined; without
    seed 4 it holds. The verdict is fragile, and the report names the seed."""
    a = {str(u): 0.5 + d for u, d in enumerate([0.03, 0.031, 0.029, 0.03, -0.10])}
    rows = [({"preset": p, "setting": "s", "seed": u}, {"final_accuracy": v, "accuracy_auc": v})
            for p, values in (("a", a), ("b", dict.fromkeys(a, 0.5))) for u, v in values.items()]  # fmt: skip
    decided = findings.decide(findings.parse({"F": [{"a": "a", "b": "b", "setting": "s"}]}, "spec"), rows)
    (d,) = decided["F"]
    assert d.verdict == "undetermined" and d.flips == (("seed 4", "holds"),)
    assert findings.robustness(decided["F"]) == "fragile: seed 4 → holds"
    assert "- **F**: undetermined (fragile: seed 4 → holds" in "\n".join(findings.lines(decided))
    assert findings.rows(decided)[0]["robustness"] == "seed 4 → holds"


def test_a_setting_list_is_one_contrast_per_setting():
    parsed = findings.parse({"F": [{"a": "x", "b": "y", "setting": ["lag-4", "offline"]}]}, "spec")
    assert [(c.a, c.b) for c in parsed["F"]] == [(("x", "lag-4"), ("y", "lag-4")), (("x", "offline"), ("y", "offline"))]


@pytest.mark.parametrize(
    ("raw", "culprit"),
    [
        ({"F": [{"a": "x", "b": "y", "setting": "s", "margin": 5}]}, "'margin' must be"),
        ({"F": [{"a": "x", "setting": "s"}]}, "needs both 'a' and 'b'"),
        ({"F": [{"a": "x", "b": "y"}]}, "'a: x' names no setting"),
        ({"F": [{"a": "x", "b": "y", "setting": "s", "metric": "reward"}]}, "'metric' must be one of"),
        ({"F": [{"a": "x", "b": "y", "setting": "s", "sign": 1}]}, "unknown key(s) ['sign']"),
        ({"F": []}, "report.findings['F'] must be a non-empty list"),
        ([1, 2], "must map a finding's name"),
    ],
)
def test_bad_findings_fail_in_one_line_naming_the_culprit(raw, culprit):
    with pytest.raises(OprlError, match=None) as error:
        findings.parse(raw, "spec s.yaml")
    assert culprit in str(error.value) and "\n" not in str(error.value) and "spec s.yaml" in str(error.value)


def test_report_writes_the_findings_and_refuses_a_cell_the_sweep_never_plans(tmp_path, capsys):
    table = {("grpo", "lag-4"): [0.60, 0.62, 0.61], ("reinforce", "lag-4"): [0.10, 0.12, 0.11]}
    with (tmp_path / "results.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["run", "preset", "setting", "seed", "final_accuracy", "accuracy_auc"])
        for labels, numbers in cells(table):
            writer.writerow(["r", labels["preset"], labels["setting"], labels["seed"], numbers["final_accuracy"],
                             numbers["accuracy_auc"]])  # fmt: skip
    spec = {"grid": {"algorithm.preset": ["grpo", "reinforce", "m2po"], "setting": {"lag-4": {}}, "seed": [0, 1, 2]},
            "report": {"findings": {"F2": [{"a": "grpo", "b": "reinforce", "setting": "lag-4"}],
                                    "later": [{"a": "m2po", "b": "grpo", "setting": "lag-4"}]}}}  # fmt: skip
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(spec))
    text = report.build_report(tmp_path).read_text()
    assert "- **F2**: holds" in text and "- **later**: pending" in text
    rows = list(csv.DictReader((tmp_path / "findings.csv").open()))
    assert [(r["finding"], r["verdict"]) for r in rows] == [("F2", "holds"), ("later", "pending")]
    assert "![Findings](figures/findings.png)" in text
    assert (tmp_path / "figures" / "findings.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == [
        "F2: holds (robust; undated (the spec is not in git))",
        "later: pending (robust; undated (the spec is not in git))",
    ]
    spec["report"]["findings"]["typo"] = [{"a": "grpoo", "b": "grpo", "setting": "lag-4"}]
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(OprlError, match="finding 'typo': no run of grpoo at setting lag-4"):
        report.build_report(tmp_path)


def test_a_pooled_sigma_is_a_declared_choice_printed_beside_brown_forsythe(tmp_path):
    """``report.noise: pooled``: the findings and tiers use the residual σ̂, and the design section prints
    Brown–Forsythe's test of one noise level beside it; any other value is a one-line error."""
    table = {("grpo", "lag-4"): [0.60, 0.62, 0.61], ("reinforce", "lag-4"): [0.10, 0.12, 0.11],
             ("m2po", "lag-4"): [0.30, 0.90, 0.55]}  # fmt: skip
    with (tmp_path / "results.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["run", "preset", "setting", "seed", "final_accuracy", "accuracy_auc"])
        for labels, numbers in cells(table):
            writer.writerow(["r", labels["preset"], labels["setting"], labels["seed"], numbers["final_accuracy"],
                             numbers["accuracy_auc"]])  # fmt: skip
    spec = {"report": {"noise": "pooled", "findings": {"F2": [{"a": "grpo", "b": "reinforce", "setting": "lag-4"}]}}}
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(spec))
    text = report.build_report(tmp_path).read_text()
    assert "pooled σ̂, declared: `report.noise: pooled`" in text and "Brown–Forsythe W (p)" in text
    assert "| pooled σ̂ (" in text  # the findings' test column names the procedure
    spec["report"]["noise"] = "pooled-ish"
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(OprlError, match=r"report\.noise must be one of own, pooled, not 'pooled-ish'"):
        report.build_report(tmp_path)
