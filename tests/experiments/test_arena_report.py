"""``oprl report``'s arena view (oprl.experiments.arena, .tiers) on synthetic results: accuracy against lag (final
and AUC) with intervals, one curve per method, identical runs named, the tiers by lag (never a rank inside a tier)
and each method's first lag with a significant loss; the report from a committed results.csv and ``--plan``."""

import json

import pytest
import yaml

from oprl.config import load_config
from oprl.config.loading import save_config
from oprl.errors import OprlError
from oprl.experiments import arena, lag_losses, report, sensitivity, tiers

# method -> final accuracy at lag 0, 1, 4, offline (each seed adds ±0.01); eval starts at 0.40 for every run.
FINAL = {
    "grpo": [0.60, 0.58, 0.50, 0.30],  # loses > 5 points first at lag 4
    "m2po": [0.55, 0.56, 0.54, 0.52],  # never loses 5 points
    "reinforce": [0.62, 0.50, 0.40, 0.20],  # best on-policy, loses at lag 1
}
SETTINGS = {"lag-0": (1, 0), "lag-1": (1, 1), "lag-4": (1, 4), "offline": (1000, 0)}


SHIFTS = {
    "grpo": (-0.01, 0.01, 0.005, -0.005),
    "m2po": (0.01, -0.01, -0.005, 0.005),
    "reinforce": (0.0, 0.002, -0.002, 0.0),
}
"""Each method's four seeds around its mean: noise of each run's own, no seed effect (grpo − m2po's paired
differences have SD 0.018, reinforce's pairs about half that); ``shift`` turns them by the lag, so that a method's
own lags differ by noise too."""


def shift(preset: str, setting: str, seed: int) -> float:
    turn = (0, 1, 1, 3)[list(SETTINGS).index(setting.removesuffix("-bf16"))]
    return SHIFTS[preset][(seed + turn) % 4]


def summaries():
    out = []
    for preset, values in FINAL.items():
        for (setting, _), value in zip(SETTINGS.items(), values, strict=True):
            for seed in range(4):
                final = value + shift(preset, setting, seed)
                numbers = {"final_accuracy": final, "accuracy_auc": (0.40 + final) / 2}
                out.append(({"preset": preset, "setting": setting, "seed": str(seed)}, numbers))
    return out


def test_lag_names():
    assert [arena.lag_of(s) for s in ("lag-0", "on-policy", "stale-10", "lag-64", "offline")] == [
        0,
        0,
        10,
        64,
        arena.OFFLINE,
    ]
    assert arena.lag_of("lag-4-bf16") is None and arena.lag_of("sync-20") is None


def test_tier_table_bolds_the_tier_and_says_how_far_below_the_rest_are():
    analysis = tiers.analyse(summaries(), "final_accuracy")
    rows = tiers.tier_table(analysis)
    assert rows[0] == "| method | lag 0 | lag 1 | lag 4 | offline | pooled |"
    body = {row.split(" | ")[0].removeprefix("| "): row for row in rows[2:]}
    assert list(body) == ["grpo", "m2po", "reinforce"]  # by name: a tier is not ranked
    # Lag 1: grpo and m2po 2 points apart within their pair's noise: both bold, not ranked; reinforce 8 below.
    assert [row.split(" | ")[2] for row in rows[2:]] == ["**0.580**", "**0.560**", "0.500 (−8.0)"]
    # Lag 4: grpo 4 points under m2po, separable with all four seeds but not without seed 1, 2 or 3: fragile (†).
    assert body["grpo"].endswith("| **0.580** | 0.500 (−4.0)† | 0.300 (−22.0) | 0.495 (−4.8) |")
    assert body["reinforce"].endswith("| 0.400 (−14.0) | 0.200 (−32.0) | 0.430 (−11.3) |")


def test_verdicts_name_the_tier_without_ranking_it_and_the_rest_by_how_much():
    analysis = tiers.analyse(summaries(), "final_accuracy")
    text = "\n".join(tiers.verdict_lines(analysis))
    assert (
        "- **lag-1**: grpo, m2po in the tier of the best (means 0.560-0.580); below: reinforce 8.0 under grpo "
        "(≥ 6.6, p̃ < 0.001)." in text
    )
    assert "below: grpo† 4.0 under m2po (≥ 1.1, p̃ = 0.022)" in text and "† grpo without seed 1, 2, 3" in text
    assert "pooled over lag-0, lag-1, lag-4, offline" in text
    assert "Pooled: per seed the mean over the lags" in text  # its legend, where a pooled line follows


def test_significant_losses_are_one_family_with_each_pairs_own_noise():
    losses = lag_losses.significant_losses(summaries())
    assert losses["reinforce"].lag == 1.0 and losses["reinforce"].difference.mean == pytest.approx(0.12)
    assert losses["grpo"].lag == 4.0  # its 2 points at lag 1 are within the noise
    # m2po's 3 points offline: significant after Holm over all 9 method × lag tests, but seeds 0, 2 or 3 left out
    # undo it: fragile, and the seeds named.
    assert losses["m2po"].lag == arena.OFFLINE and losses["m2po"].fragile == ("0", "2", "3")
    assert losses["m2po"].difference.p_adjusted == pytest.approx(min(1, 4 * losses["m2po"].difference.p))
    assert "Holm over all 9 method × lag tests" in "\n".join(lag_losses.loss_lines(summaries()))
    no_zero = [(labels, numbers) for labels, numbers in summaries() if labels["setting"] != "lag-0"]
    assert all(found.lag is None for found in lag_losses.significant_losses(no_zero).values())


def test_identical_runs_are_named_at_their_lag():
    data = summaries()
    data += [({**labels, "preset": "rec-oneside-nois"}, numbers) for labels, numbers in data
             if labels["preset"] == "reinforce" and labels["setting"] == "lag-0"]  # fmt: skip
    assert arena.identical_at_lags(data) == {0.0: [["rec-oneside-nois", "reinforce"]]}


def test_report_of_a_synthetic_arena_has_the_lag_figure_and_tables(tmp_path):
    """Run directories written by hand (config, metrics, summary), planned by a sweep spec like arena.yaml's."""
    spec = {
        "output_dir": str(tmp_path),
        "overrides": ["steps=40"],
        "grid": {
            "algorithm.preset": {p: {"algorithm.preset": p, "optim.lr": 3e-4} for p in FINAL},
            "setting": {
                **{name: {"sync.interval": k, "sync.offset": m} for name, (k, m) in SETTINGS.items()},
                "lag-0-bf16": {"sync.interval": 1, "sync.offset": 0, "rollout.dtype": "bfloat16"},
            },
            "seed": [0, 1, 2, 3],
        },
    }
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    from oprl.experiments.sweep import plan

    for run in plan(spec):
        run_dir = tmp_path / run.name
        run_dir.mkdir()
        save_config(load_config(overrides=list(run.overrides)), run_dir / "config.yaml")
        setting = run.labels["setting"].removesuffix("-bf16")
        final = FINAL[run.labels["algorithm.preset"]][list(SETTINGS).index(setting)] + shift(
            run.labels["algorithm.preset"], run.labels["setting"], int(run.labels["seed"])
        )
        rows = [{"step": 0, "eval/accuracy": 0.40}, {"step": 20, "reward/mean": 0.5, "loss/clip_frac": 0.1},
                {"step": 40, "eval/accuracy": final, "reward/mean": 0.6}]  # fmt: skip
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run_dir / "summary.json").write_text(json.dumps({"seconds": 1.0}))
    text = report.build_report(tmp_path).read_text()
    assert "## Accuracy against lag" in text and (tmp_path / "figures" / "arena-lag.png").stat().st_size > 10_000
    assert text.index("## What these seeds can tell apart") < text.index("## Final eval accuracy")
    assert "| final eval accuracy | lag-4 | 4 | " in text and "(3 methods) |" in text  # the MDE against the best
    assert "Tiers by lag, final eval accuracy" in text and "First lag with a significant loss" in text
    assert "| m2po | 0.550 (−7.0) | **0.560** | **0.540** | **0.520** | **0.542** |" in text
    assert "Settings not on the lag ladder (not in the tiers by lag): lag-0-bf16." in text
    assert (tmp_path / "stats.csv").is_file()
    # The bf16 runs repeat their float32 pair's numbers: the mismatch table shows a change of 0.
    assert (
        "## The bfloat16 sampler at equal staleness" in text and (tmp_path / "figures" / "arena-mismatch.png").is_file()
    )
    assert "| grpo | 0.600 → 0.600 (+0.000 ± 0.016) |" in text  # ± the spread of a new seed, not of these copies


def test_mismatch_pairs_match_each_bf16_setting_with_its_float32_twin():
    data = [
        ({"preset": "grpo", "setting": "lag-4", "seed": "0"}, {"final_accuracy": 0.5}),
        ({"preset": "grpo", "setting": "lag-4-bf16", "seed": "0"}, {"final_accuracy": 0.4}),
        ({"preset": "grpo", "setting": "lag-4-bf16", "seed": "1"}, {"final_accuracy": 0.3}),
        ({"preset": "sapo", "setting": "lag-0-bf16", "seed": "0"}, {"final_accuracy": 0.3}),  # no float32 twin
    ]
    pairs = arena.mismatch_pairs(data)
    assert list(pairs) == ["grpo"] and list(pairs["grpo"]) == ["lag-4"]
    float32, bf16, change = pairs["grpo"]["lag-4"]
    assert (float32, bf16) == (0.5, pytest.approx(0.35)) and change.mean == pytest.approx(-0.1)  # paired: seed 0


def test_fewer_than_two_lags_add_nothing(tmp_path):
    one_lag = [(labels, numbers) for labels, numbers in summaries() if labels["setting"] == "lag-0"]
    assert arena.arena_section(one_lag, tmp_path) == [] and not any(tmp_path.iterdir())


@pytest.mark.parametrize("metric", list(arena.METRICS))
def test_by_method_and_lag_drops_nan(metric):
    data = [*summaries(), ({"preset": "grpo", "setting": "lag-1", "seed": "4"}, {metric: float("nan")})]
    assert len(arena.by_method_and_lag(data, metric)["grpo"][1.0]) == 4


def test_tables_keep_a_sweep_axis_apart_from_the_mean_over_seeds():
    """A learning-rate sweep (arena-lr.yaml) gets a row per rate: averaging over the rates would hide the choice."""
    data = [
        ({"preset": "grpo", "setting": "lag-0", "seed": s, "lr": lr}, {"final_accuracy": v})
        for lr, values in (("0.0001", (0.50, 0.52)), ("0.001", (0.10, 0.12)))
        for s, v in zip("01", values, strict=True)
    ]
    rows = report._table(data, "final_accuracy", report.CELL)
    # The sample SD (n − 1): 0.014 for 0.50 and 0.52 (the population SD would say 0.010), and the t-interval.
    assert rows[2:] == [
        "| grpo lr=0.0001 | 0.510 ± 0.014 [0.383, 0.637] |",
        "| grpo lr=0.001 | 0.110 ± 0.014 [0.000, 0.237]‡ |",  # the t-interval's −0.017, clipped
        "",
        report.CLIPPED_NOTE,
    ]
    data += [({"preset": "grpo", "setting": "lag-0", "seed": "0", "lr": "3e-05"}, {"final_accuracy": 0.4})]
    assert [row.split(" | ")[0] for row in report._table(data, "final_accuracy", "{:.3f}")[2:]] == [
        "| grpo lr=3e-05",
        "| grpo lr=0.0001",
        "| grpo lr=0.001",
    ]


def test_no_lag_curves_when_no_method_ran_at_two_lags(tmp_path):
    """The tiny distillation sweep has on-policy, stale and offline rows, but each method at one lag only."""
    data = [
        ({"preset": p, "setting": s, "seed": "0"}, {"final_accuracy": 0.5, "accuracy_auc": 0.5})
        for p, s in (("distill", "on-policy"), ("distill-stale4", "stale-4"), ("distill-offline", "offline"))
    ]
    assert arena.arena_section(data, tmp_path) == [] and not any(tmp_path.iterdir())


def test_an_offline_run_is_named_offline_whatever_its_schedule():
    from oprl.experiments.results import setting_of

    config = {"sync": {"interval": 1, "offset": 0}, "steps": 300}
    assert setting_of(config) == "on-policy"
    assert setting_of({**config, "mode": "offline"}) == "offline"


def test_table_columns_follow_the_lag_ladder():
    from oprl.experiments.curves import _setting_rank

    names = ["offline", "lag-64", "lag-4-bf16", "lag-16", "lag-2", "lag-0-bf16", "lag-0", "lag-1", "lag-4", "lag-8"]
    assert sorted(names, key=_setting_rank) == [
        "lag-0", "lag-0-bf16", "lag-1", "lag-2", "lag-4", "lag-4-bf16", "lag-8", "lag-16", "lag-64", "offline",
    ]  # fmt: skip
    assert sorted(["offline", "stale-10", "on-policy", "stale-4"], key=_setting_rank) == [
        "on-policy", "stale-4", "stale-10", "offline",
    ]  # fmt: skip


def test_the_report_of_a_committed_results_csv_and_its_plan(tmp_path, capsys):
    """docs/reproduction/arena keeps results.csv, not the runs: the report reads it (no curves), and ``--plan``
    turns its noise into seeds."""
    from oprl.experiments.results import write_table

    rows = [{"run": f"{labels['preset']}-{labels['setting']}-{labels['seed']}", **labels, "lr": 1e-4, **numbers}
            for labels, numbers in summaries()]  # fmt: skip
    write_table(rows, tmp_path / "results.csv")
    assert report.main([str(tmp_path), "--plan", "0.01"]) == 0
    out = capsys.readouterr().out
    assert "Seeds to find a true difference of 1.0 points" in out and "final eval accuracy, pooled: median pair" in out
    text = (tmp_path / "report.md").read_text()
    assert "48 runs, read from results.csv" in text and "## Figures (all presets)" not in text
    assert "Tiers by lag" in text and (tmp_path / "figures" / "arena-lag.png").is_file()
    assert not (tmp_path / "figures" / "eval_accuracy.png").exists()
    with pytest.raises(OprlError, match="--plan 2"):
        report.main([str(tmp_path), "--plan", "2"])
    with pytest.raises(OprlError, match=r"no results\.csv"):
        report.build_report(tmp_path / "nothing")


def test_one_seed_per_cell_says_nothing_can_be_told_apart():
    one_seed = [(labels, numbers) for labels, numbers in summaries() if labels["seed"] == "0"]
    analyses = [tiers.analyse(one_seed, metric) for metric in tiers.METRICS]
    assert "(No noise: no two methods share two seeds" in "\n".join(sensitivity.design_lines(analyses))
    assert "nothing can be told apart" in "\n".join(tiers.verdict_lines(analyses[0]))
    assert "cannot be tested with one seed per cell" in lag_losses.loss_lines(one_seed)[0]


def test_one_seed_bolds_no_cell_of_the_tier_table(tmp_path):
    """#71: with one seed every method is "in the tier" only because nothing can be told apart; the table shows plain
    means and the report says there are no tiers (before: 0.082 bold beside 0.472)."""
    one_seed = [(labels, numbers) for labels, numbers in summaries() if labels["seed"] == "0"]
    rows = tiers.tier_table(tiers.analyse(one_seed, "final_accuracy"))
    assert not any("**" in row for row in rows[2:]) and rows[2].startswith("| grpo | 0.")
    from oprl.experiments.results import write_table

    rows = [{"run": f"{labels['preset']}-{labels['setting']}-0", **labels, "lr": 1e-4, **numbers}
            for labels, numbers in one_seed]  # fmt: skip
    write_table(rows, tmp_path / "results.csv")
    text = report.build_report(tmp_path).read_text()
    assert "(one run per cell: no tiers with one seed)" in text and "Tiers by lag" not in text


def test_the_pooled_comparison_takes_only_the_methods_run_at_every_lag():
    """A method run at one lag of the ladder only (an on-policy anchor) stays out of the pooled comparison: its one
    lag's mean is not set beside the others' means over every lag; with one method left there is nothing to pool."""
    anchor = [(lab, num) for lab, num in summaries() if lab["preset"] != "grpo" or lab["setting"] == "lag-0"]
    analysis = tiers.analyse(anchor, "final_accuracy")
    assert set(analysis.pooled.means) == {"m2po", "reinforce"} and "grpo" in analysis.per_setting["lag-0"].means
    alone = [(lab, num) for lab, num in anchor if lab["preset"] != "m2po"]
    assert tiers.analyse(alone, "final_accuracy").pooled is None
    lines = tiers.verdict_lines(tiers.analyse(alone, "final_accuracy"))
    assert not any(line.startswith("- **pooled") or "Pooled:" in line for line in lines)  # nor its legend


def test_a_sweep_in_progress_names_the_cells_still_missing_seeds():
    """A partial sweep's design table describes the finished design; the cells short of seeds are named under it."""
    partial = [(lab, num) for lab, num in summaries() if not (lab["preset"] == "m2po" and lab["seed"] == "1")]
    text = "\n".join(sensitivity.design_lines([tiers.analyse(partial, metric) for metric in tiers.METRICS]))
    assert (
        "Seeds still missing: m2po (lag-0) 3 of 4, m2po (lag-1) 3 of 4, m2po (lag-4) 3 of 4, m2po (offline) 3 of 4."
        in text
    )
    complete = "\n".join(sensitivity.design_lines([tiers.analyse(summaries(), m) for m in tiers.METRICS]))
    assert "Seeds still missing" not in complete


def test_a_results_csv_alone_keeps_a_column_that_varies_within_a_cell_apart(tmp_path):
    """Without its sweep.yaml (a committed results.csv), a learning rate swept as its own axis still makes its own
    rows: its values differ between the rows of one preset x setting cell. sync_offset does not (the setting fixes
    it), so it stays out of the row labels."""
    from oprl.experiments.results import write_table

    rows = [
        {"run": f"r{lr}{seed}", "preset": "grpo", "setting": "lag-0", "seed": seed, "lr": lr, "sync_offset": 0,
         "final_accuracy": 0.5 + (0.1 if lr == 3e-4 else 0.0) + 0.001 * seed}
        for lr in (1e-4, 3e-4) for seed in (0, 1, 2)
    ]  # fmt: skip
    write_table(rows, tmp_path / "results.csv")
    labels = {tiers.row_label(lab) for lab, _ in report.summaries_from_csv(tmp_path / "results.csv", {})}
    assert labels == {"grpo lr=0.0001", "grpo lr=0.0003"}
    report.build_report(tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "| grpo lr=0.0003 | 0.601 ± 0.001" in text and "| grpo lr=0.0001 | 0.501 ± 0.001" in text


def test_an_accuracy_interval_is_clipped_to_zero_one_and_says_so():
    """#71: three seeds of an accuracy near 0 gave [-0.049, 0.439]; an accuracy lies in [0, 1]."""
    seeds = [({"preset": "grpo", "setting": "lag-0", "seed": str(s)}, {"final_accuracy": v})
             for s, v in enumerate((0.0, 0.0, 0.3))]  # fmt: skip
    rows = report._table(seeds, "final_accuracy", report.CELL)
    assert rows[2] == "| grpo | 0.100 ± 0.173 [0.000, 0.530]‡ |"  # t(2) interval: 0.1 ± 0.430
    assert rows[-1] == report.CLIPPED_NOTE
    near_one = [(labels, {"final_accuracy": 1.0 - n["final_accuracy"]}) for labels, n in seeds]
    assert report._table(near_one, "final_accuracy", report.CELL)[2] == "| grpo | 0.900 ± 0.173 [0.470, 1.000]‡ |"
    inside = [(labels, {"final_accuracy": 0.5 + 0.1 * n["final_accuracy"]}) for labels, n in seeds]
    assert report.CLIPPED_NOTE not in report._table(inside, "final_accuracy", report.CELL)
