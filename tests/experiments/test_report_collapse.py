"""``report.collapse`` (oprl.experiments.report_collapse) and ``oprl report --pool/--spec/--out`` on run directories
written by hand: the collapse fraction with its exact interval against hand-computed values, the ESS warning
replayed as the runtime's ``EssWatch`` fires it, "warned before collapse" counted as defined, a pooled sweep's runs
joining this sweep's cells (and a shared seed refused), a longer setting's curve shown to its last step."""

import json
import math
import random
import re
import shutil

import pytest
import yaml

from oprl.config import load_config
from oprl.config.loading import save_config
from oprl.errors import OprlError
from oprl.experiments import report, report_collapse, stats, sweep_spec
from oprl.experiments.results import RunRecord
from oprl.runtime import health


@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [
        # Clopper–Pearson by hand: low = B⁻¹(0.025; k, n − k + 1), high = B⁻¹(0.975; k + 1, n − k). With k = n the
        # low end is (α/2)^(1/n), with k = 0 the high end 1 − (α/2)^(1/n): 0.025^(1/4) = 0.3976, 1 − 0.3976 = 0.6024.
        (3, 4, 0.194, 0.994),
        (4, 4, 0.398, 1.0),
        (0, 4, 0.0, 0.602),
        (3, 3, 0.292, 1.0),  # 0.025^(1/3)
        (1, 2, 0.013, 0.987),  # B⁻¹(0.025; 1, 2) = 1 − sqrt(0.975) = 0.0126
    ],
)
def test_the_collapse_fraction_has_the_exact_clopper_pearson_interval(k, n, low, high):
    share = stats.proportion(k, n)
    assert (share.k, share.n, share.fraction) == (k, n, k / n)
    assert (round(share.low, 3), round(share.high, 3)) == (low, high)


def test_a_proportion_of_no_runs_is_nan_and_an_impossible_one_is_refused():
    assert math.isnan(stats.proportion(0, 0).low)
    with pytest.raises(ValueError, match="0 <= k <= n"):
        stats.proportion(3, 2)


def test_the_replayed_ess_warning_is_the_runtimes_rule():
    """The report may not import the runtime: its restated rule must fire where ``EssWatch`` does, on rows with
    gaps (steps without ``rho/ess``), at the level exactly (no warning) and on random walks."""
    assert (report_collapse.ESS_LEVEL, report_collapse.ESS_STEPS) == (health.ESS_LEVEL, health.ESS_STEPS)
    draw = random.Random(0)
    cases = [
        [{"step": s, "rho/ess": 0.7} for s in range(1, 12)],  # a mean of exactly 0.7 is not below it
        [{"step": s, **({"rho/ess": 0.5} if s % 2 else {})} for s in range(1, 12)],  # every other row logs it
        [{"step": 1, "rho/ess": 0.1}] * 4,  # four steps are not five
    ]
    for _ in range(200):
        level = 1.0
        rows = []
        for step in range(1, 60):
            level = min(1.0, max(0.0, level + draw.uniform(-0.08, 0.06)))
            rows.append({"step": step, "rho/ess": level} if draw.random() > 0.1 else {"step": step})
        cases.append(rows)
    for rows in cases:
        watch = health.EssWatch(lambda _: None)
        for row in rows:
            watch.observe(row)
        assert report_collapse.ess_warning_step(rows) == watch.first_step
    assert report_collapse.ess_warning_step(cases[1]) == 9  # the fifth logged value: steps 1, 3, 5, 7, 9


def record(evals, ess, name="run", seed="0"):
    """A run record of ``evals`` {step: accuracy} and ``ess`` {step: rho/ess}."""
    steps = sorted(set(evals) | set(ess))
    rows = [{"step": s, **({"eval/accuracy": evals[s]} if s in evals else {}),
             **({"rho/ess": ess[s]} if s in ess else {})} for s in steps]  # fmt: skip
    from pathlib import Path

    return RunRecord(Path(name), {"preset": "reinforce", "setting": "lag-4", "seed": seed}, {}, rows)


def test_warned_before_collapse_counts_as_defined():
    """Collapse: final below the step-0 accuracy. Warned before it: the warning's step earlier than the first
    evaluation below the start (the same step is not earlier). A surviving run that warned is a false alarm."""
    low = dict.fromkeys(range(1, 21), 0.3)  # the 5-step mean falls below 0.7 at step 5
    late = {s: (1.0 if s < 19 else 0.2) for s in range(1, 21)}  # ... at step 20 (0.68; step 19: 0.84)
    runs = [
        report_collapse.of_run(record({0: 0.5, 10: 0.4, 20: 0.3}, low, "early")),  # warns at 5, below at 10: yes
        report_collapse.of_run(record({0: 0.5, 10: 0.6, 20: 0.3}, late, "same-step")),  # warns at 20, below at 20
        report_collapse.of_run(record({0: 0.5, 10: 0.6, 20: 0.5}, low, "level")),  # ends level: survives, warned
        report_collapse.of_run(record({0: 0.5, 10: 0.4, 20: 0.7}, {}, "quiet")),  # dips, recovers, no ESS logged
    ]
    assert [(r.collapsed, r.first_below, r.warned_at) for r in runs] == [
        (True, 10, 5), (True, 20, 20), (False, None, 5), (False, 10, None)
    ]  # fmt: skip
    assert [r.warned_before for r in runs] == [True, False, True, False]
    assert math.isnan(runs[3].lowest_ess) and runs[0].lowest_ess == pytest.approx(0.3)
    share, a, b, c, d = report_collapse.counts(runs)
    assert (share.k, share.n, a, b, c, d) == (2, 4, 1, 2, 1, 2)
    text = "\n".join(report_collapse.lines({("reinforce", "lag-4"): runs}))
    assert "warned before collapse: 1 of 2 collapsing runs, 1 of 2 surviving runs" in text
    assert "| reinforce @ lag-4 | 2 of 4 | 0.50 | [0.068, 0.932] | 1 of 2 | 1 of 2 |" in text
    assert report_collapse.of_run(record({0: 0.5}, {}, "one-eval")) is None  # no start to fall from


def test_the_spec_key_parses_or_names_the_culprit():
    assert report_collapse.parse(None, "spec") is False and report_collapse.parse(True, "spec") is True
    assert report_collapse.parse(["reinforce", "grpo@lag-4"], "spec") == [("reinforce", None), ("grpo", "lag-4")]
    for bad in ("reinforce", [], [3], {"reinforce": 1}):
        with pytest.raises(OprlError, match=r"'report\.collapse' must be true"):
            report_collapse.parse(bad, "spec")


PRESETS = ("grpo", "reinforce")
COLLAPSES = {("reinforce", 0), ("reinforce", 3)}
"""Which (preset, seed) runs end below their start; reinforce seed 4 survives and warns (a false alarm)."""


def write_sweep(root, seeds, extra_setting=False, presets=PRESETS, collapse=("reinforce", "grpo@lag-4")):
    """A sweep directory of hand-written runs (config, metrics, summary) planned by its spec: ``presets`` at lag 4,
    20 steps, evaluations at 0/10/20; with ``extra_setting`` also reinforce at ``lag-4-long`` (40 steps)."""
    grid = [{"setting": {"lag-4": {"sync.interval": 1, "sync.offset": 4}}, "algorithm.preset": list(presets),
             "seed": list(seeds)}]  # fmt: skip
    if extra_setting:
        grid.append({"setting": {"lag-4-long": {"sync.interval": 1, "sync.offset": 4, "steps": 40}},
                     "algorithm.preset": ["reinforce"], "seed": [seeds[0]]})  # fmt: skip
    spec = {
        "output_dir": "runs/synthetic",
        "overrides": ["steps=20", "eval.interval=10"],
        "grid": grid,
        "report": {
            "findings": {"F2": [{"a": "grpo", "b": "reinforce", "setting": "lag-4"}]},
            **({"collapse": list(collapse)} if collapse else {}),
        },
    }
    root.mkdir(parents=True)
    (root / "sweep.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    for run in sweep_spec.plan(spec):
        preset, seed = run.labels["algorithm.preset"], int(run.labels["seed"])
        steps = 40 if run.labels["setting"] == "lag-4-long" else 20
        run_dir = root / run.name
        run_dir.mkdir()
        save_config(load_config(overrides=list(run.overrides)), run_dir / "config.yaml")
        falls = (preset, seed) in COLLAPSES or run.labels["setting"] == "lag-4-long"
        drifts = preset == "reinforce"  # reinforce's ESS falls (steps 1-5: mean 0.68 < 0.7), grpo's never
        rows = []
        for step in range(steps + 1):
            row = {
                "step": step,
                "reward/mean": 0.1,
                **({"rho/ess": 0.5 if drifts and step > 2 else 0.95} if step else {}),
            }
            if step % 10 == 0:
                row["eval/accuracy"] = (
                    0.4 if step == 0 else (0.2 if falls and step >= 10 else 0.4 + step / 100 + seed / 100)
                )
            rows.append(row)
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run_dir / "summary.json").write_text(json.dumps({"seconds": 1.0}))
    return root


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    """This sweep (seeds 3-4, and reinforce's longer setting on seed 3) and an earlier one of the same recipe
    (seeds 0-1, plus a method this sweep does not plan)."""
    root = tmp_path_factory.mktemp("pool")
    here = write_sweep(root / "follow-up", [3, 4], extra_setting=True)
    earlier = write_sweep(root / "earlier", [0, 1], presets=(*PRESETS, "rec-oneside-nois"), collapse=())
    return here, earlier


def test_a_pooled_report_adds_the_other_sweeps_seeds_to_this_sweeps_cells(sweeps, tmp_path, capsys):
    here, earlier = sweeps
    out = tmp_path / "out"
    assert report.main([str(here), "--pool", str(earlier), "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    assert not (here / "report.md").exists() and not (here / "results.csv").exists()  # --out: nothing written here
    assert f"pooled (`--pool`): 5 of this sweep and 4 runs of {earlier} (seeds 0, 1)" in text
    assert "The pooled runs' settings equal this sweep's, seed aside." in text
    assert "rec-oneside-nois" not in text.split("## Findings")[0]  # a cell this sweep does not plan stays out
    assert f"Regenerate: `oprl report {here} --pool {earlier}`." in text
    # reinforce at lag 4: seeds 0 and 3 collapse, 1 and 4 survive; its ESS warns at step 5 in every seed, before
    # the first evaluation below the start (step 10).
    assert "| reinforce @ lag-4 | 2 of 4 | 0.50 | [0.068, 0.932] | 2 of 2 | 2 of 2 |" in text
    assert "| grpo @ lag-4 | 0 of 4 | 0.00 | [0.000, 0.602] | 0 of 0 | 0 of 4 |" in text
    assert "warned before collapse: 2 of 2 collapsing runs, 2 of 2 surviving runs" in text
    assert "These 3 cells together: warned before collapse: 3 of 3 collapsing runs, 2 of 6 surviving runs." in text
    assert "| 0 (pooled) | 0.400 / 0.200 / 0.200 | yes | 10 | step 5 | 0.50 | yes |" in text
    # The longer setting's runs are shown to their last evaluation.
    assert "| reinforce @ lag-4-long | 1 of 1 | 1.00 | [0.025, 1.000] |" in text
    assert "eval accuracy at step 0 / 10 / 20 / 30 / 40 |" in text
    runs = (out / "collapse.csv").read_text().splitlines()
    assert len(runs) == 1 + 4 + 4 + 1 and "source" in runs[0] and str(earlier) in "".join(runs)
    # The finding pairs over all four seeds; the printed verdict is read from --out's findings.csv.
    assert "| F2 | grpo above reinforce @ lag-4 | 4 |" in text
    assert "F2: " in capsys.readouterr().out
    assert (out / "results.csv").read_text().count(str(earlier)) == 4


def test_a_seed_both_sweeps_ran_is_refused_and_a_differing_setting_is_named(sweeps, tmp_path):
    here, _ = sweeps
    twin = write_sweep(tmp_path / "twin", [4], presets=("reinforce",), collapse=())
    with pytest.raises(OprlError, match=r"reinforce@lag-4 seed 4 is also in .*must not share a seed"):
        report.build_report(here, tmp_path / "out", pools=[twin])
    other = write_sweep(tmp_path / "other", [7], presets=("reinforce",), collapse=())
    config = other / "setting=lag-4__preset=reinforce__seed=7" / "config.yaml"
    saved = yaml.safe_load(config.read_text())
    saved["optim"]["lr"] = 1e-3  # this sweep's: the default 3e-4
    config.write_text(yaml.safe_dump(saved))
    text = report.build_report(here, tmp_path / "out2", pools=[other]).read_text()
    assert "differ from this sweep's runs of the same cell, seed aside: optim.lr (0.001 pooled, 0.0003 here)" in text


def test_spec_replaces_a_stale_copy_and_a_named_cell_no_run_has_is_a_typo(sweeps, tmp_path):
    here, _ = sweeps
    spec = yaml.safe_load((here / "sweep.yaml").read_text())
    spec["report"]["collapse"] = ["grpo@lag-4-long"]  # the grid plans no grpo there
    newer = tmp_path / "newer.yaml"
    newer.write_text(yaml.safe_dump(spec, sort_keys=False))
    with pytest.raises(OprlError, match=r"report\.collapse names grpo@lag-4-long, which no finished run"):
        report.build_report(here, tmp_path / "out", spec_path=newer)
    spec["report"]["collapse"] = True
    newer.write_text(yaml.safe_dump(spec, sort_keys=False))
    text = report.build_report(here, tmp_path / "out", spec_path=newer).read_text()
    assert "| grpo @ lag-4 | 0 of 2 |" in text and "| reinforce @ lag-4-long | 1 of 1 |" in text
    committed = tmp_path / "committed"  # a results.csv alone (a committed sweep): no rows to replay the warning on
    committed.mkdir()
    (committed / "results.csv").write_text((tmp_path / "out" / "results.csv").read_text())
    (committed / "sweep.yaml").write_text(newer.read_text())
    text = report.build_report(committed).read_text()
    assert "Collapses (`report.collapse`): not reported from a results.csv" in text
    assert not (committed / "collapse.csv").exists()
    spec["report"]["collapse"] = "yes"
    newer.write_text(yaml.safe_dump(spec, sort_keys=False))
    with pytest.raises(OprlError, match=r"'report\.collapse' must be true"):
        sweep_spec.load_spec(newer)
    with pytest.raises(OprlError, match="no finished runs"):
        report.build_report(here, tmp_path / "out", pools=[tmp_path / "missing"])


def test_a_committed_results_csv_pools_its_rows_as_the_run_directories_would(sweeps, tmp_path):
    """A pooled directory holding only a results.csv (a committed sweep, e.g. arena v2's comparators) lends its rows
    of this sweep's cells: every contrast and table equals the pooled run directories', less the curves; a seed
    both hold is refused as for run directories."""
    here, earlier = sweeps
    full = report.build_report(here, tmp_path / "dirs", pools=[earlier]).read_text()
    report.build_report(earlier, tmp_path / "earlier-report")
    committed = tmp_path / "committed"
    committed.mkdir()
    (committed / "results.csv").write_text((tmp_path / "earlier-report" / "results.csv").read_text())
    (committed / "sweep.yaml").write_text((earlier / "sweep.yaml").read_text())
    text = report.build_report(here, tmp_path / "rows", pools=[committed]).read_text()
    assert f"5 of this sweep and 4 rows of {committed / 'results.csv'} (grpo@lag-4, reinforce@lag-4; no curves)" in text
    assert "| F2 | grpo above reinforce @ lag-4 | 4 |" in text
    assert "rec-oneside-nois" not in text.split("## Findings")[0]  # a cell this sweep does not plan stays out
    # The collapse counts replay each run's metrics: the lent rows have none, and the report says they are left out.
    assert "| reinforce @ lag-4 | 1 of 2 |" in text and "Collapses leave out the 4 pooled rows of a results.csv" in text
    assert "Collapses leave out" not in full
    findings_of = [(p / "findings.csv").read_text() for p in (tmp_path / "dirs", tmp_path / "rows")]
    assert findings_of[0] == findings_of[1]  # the same verdicts, intervals and seeds from rows as from the runs
    assert (tmp_path / "rows" / "results.csv").read_text().count(str(committed)) == 4
    assert "| F2 |" in full
    with pytest.raises(OprlError, match=r"seed 3 is also in .*must not share a seed"):
        report.build_report(here, tmp_path / "twice", pools=[_rows_of(here, tmp_path)])


def _rows_of(sweep, tmp_path):
    """``sweep``'s results.csv and spec alone in a directory of their own."""
    report.build_report(sweep, tmp_path / "sweep-report")
    rows = tmp_path / "sweep-rows"
    rows.mkdir()
    (rows / "results.csv").write_text((tmp_path / "sweep-report" / "results.csv").read_text())
    (rows / "sweep.yaml").write_text((sweep / "sweep.yaml").read_text())
    return rows


@pytest.mark.parametrize("text", ["grid: [unclosed", "- just\n- a list\n"])
def test_a_pooled_sweeps_malformed_spec_is_one_line_naming_its_file(sweeps, tmp_path, text):
    here, earlier = sweeps
    broken = tmp_path / "broken"
    shutil.copytree(earlier, broken)
    (broken / "sweep.yaml").write_text(text)
    with pytest.raises(OprlError, match=rf"^sweep spec {re.escape(str(broken / 'sweep.yaml'))}: (malformed|expected)"):
        report.main([str(here), "--pool", str(broken), "--out", str(tmp_path / "out")])
