"""``oprl report``'s arena view (oprl.experiments.arena) on synthetic results: accuracy against lag (final and
AUC), one curve per method, and a table ranked at each lag with the first lag losing more than 5 points."""

import json

import pytest
import yaml

from oprl.config import load_config
from oprl.config.loading import save_config
from oprl.experiments import arena, report

# method -> final accuracy at lag 0, 1, 4, offline (each seed adds ±0.01); eval starts at 0.40 for every run.
FINAL = {
    "grpo": [0.60, 0.58, 0.50, 0.30],  # loses > 5 points first at lag 4
    "m2po": [0.55, 0.56, 0.54, 0.52],  # never loses 5 points
    "reinforce": [0.62, 0.50, 0.40, 0.20],  # best on-policy, loses at lag 1
}
SETTINGS = {"lag-0": (1, 0), "lag-1": (1, 1), "lag-4": (1, 4), "offline": (1000, 0)}


def summaries():
    out = []
    for preset, values in FINAL.items():
        for (setting, _), value in zip(SETTINGS.items(), values, strict=True):
            for seed, shift in ((0, -0.01), (1, 0.01)):
                numbers = {"final_accuracy": value + shift, "accuracy_auc": (0.40 + value + shift) / 2}
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


def test_ranked_table_ranks_each_lag_and_names_the_first_losing_lag():
    rows = arena.ranked_table(summaries())
    assert rows[0] == "| method | lag 0 | lag 1 | lag 4 | lag offline | loses > 0.05 at |"
    body = {row.split(" | ")[0].removeprefix("| "): row for row in rows[2:]}
    # Ranks: lag 0 reinforce, grpo, m2po; lag 1 grpo, m2po, reinforce; lag 4 and offline m2po, grpo, reinforce.
    assert body["reinforce"].endswith("| 0.620 (#1) | 0.500 (#3) | 0.400 (#3) | 0.200 (#3) | 1 |")
    assert body["grpo"].endswith("| 0.600 (#2) | 0.580 (#1) | 0.500 (#2) | 0.300 (#2) | 4 |")
    assert body["m2po"].endswith("| 0.550 (#3) | 0.560 (#2) | 0.540 (#1) | 0.520 (#1) | — |")
    # By mean rank: grpo and m2po 1.75 (ties by name), reinforce 2.5.
    assert [row.split(" | ")[0] for row in rows[2:]] == ["| grpo", "| m2po", "| reinforce"]


def test_equal_means_share_a_rank():
    data = [({"preset": p, "setting": "lag-0", "seed": "0"}, {"final_accuracy": v}) for p, v in
            (("a", 0.5), ("b", 0.5), ("c", 0.4))]  # fmt: skip
    assert [row.split(" | ")[1] for row in arena.ranked_table(data)[2:]] == ["0.500 (#1)", "0.500 (#1)", "0.400 (#3)"]


def test_first_losing_lag_needs_a_lag_zero():
    assert arena.first_losing_lag({1.0: [0.5], 4.0: [0.1]}) is None
    assert arena.first_losing_lag({0.0: [0.5], 1.0: [0.46], 4.0: [0.44]}) == 4.0


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
            "seed": [0, 1],
        },
    }
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    from oprl.experiments.sweep import plan

    for run in plan(spec):
        run_dir = tmp_path / run.name
        run_dir.mkdir()
        save_config(load_config(overrides=list(run.overrides)), run_dir / "config.yaml")
        setting = run.labels["setting"].removesuffix("-bf16")
        final = FINAL[run.labels["algorithm.preset"]][list(SETTINGS).index(setting)] + (
            0.01 if run.labels["seed"] == "1" else -0.01
        )
        rows = [{"step": 0, "eval/accuracy": 0.40}, {"step": 20, "reward/mean": 0.5, "loss/clip_frac": 0.1},
                {"step": 40, "eval/accuracy": final, "reward/mean": 0.6}]  # fmt: skip
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run_dir / "summary.json").write_text(json.dumps({"seconds": 1.0}))
    text = report.build_report(tmp_path).read_text()
    assert "## Accuracy against lag" in text and (tmp_path / "figures" / "arena-lag.png").stat().st_size > 10_000
    assert "| m2po | 0.550 (#3) | 0.560 (#2) | 0.540 (#1) | 0.520 (#1) | — |" in text
    # AUC over the two evaluations = (0.40 + final) / 2: grpo at lag 0 is 0.500.
    assert "| grpo | 0.500 (#2) | 0.490 (#1) | 0.450 (#2) | 0.350 (#2) | 4 |" in text
    assert "Settings not on the lag ladder (in the tables above only): lag-0-bf16." in text
    # The bf16 runs repeat their float32 pair's numbers: the mismatch table shows a change of 0.
    assert (
        "## The bfloat16 sampler at equal staleness" in text and (tmp_path / "figures" / "arena-mismatch.png").is_file()
    )
    assert "| grpo | 0.600 → 0.600 (+0.000) |" in text


def test_mismatch_pairs_match_each_bf16_setting_with_its_float32_twin():
    data = [
        ({"preset": "grpo", "setting": "lag-4", "seed": "0"}, {"final_accuracy": 0.5}),
        ({"preset": "grpo", "setting": "lag-4-bf16", "seed": "0"}, {"final_accuracy": 0.4}),
        ({"preset": "grpo", "setting": "lag-4-bf16", "seed": "1"}, {"final_accuracy": 0.3}),
        ({"preset": "sapo", "setting": "lag-0-bf16", "seed": "0"}, {"final_accuracy": 0.3}),  # no float32 twin
    ]
    assert arena.mismatch_pairs(data) == {"grpo": {"lag-4": (0.5, pytest.approx(0.35))}}


def test_fewer_than_two_lags_add_nothing(tmp_path):
    one_lag = [(labels, numbers) for labels, numbers in summaries() if labels["setting"] == "lag-0"]
    assert arena.arena_section(one_lag, tmp_path) == [] and not any(tmp_path.iterdir())


@pytest.mark.parametrize("metric", list(arena.METRICS))
def test_by_method_and_lag_drops_nan(metric):
    data = [*summaries(), ({"preset": "grpo", "setting": "lag-1", "seed": "2"}, {metric: float("nan")})]
    assert len(arena.by_method_and_lag(data, metric)["grpo"][1.0]) == 2


def test_tables_keep_a_sweep_axis_apart_from_the_mean_over_seeds():
    """A learning-rate sweep (arena-lr.yaml) gets a row per rate: averaging over the rates would hide the choice."""
    data = [
        ({"preset": "grpo", "setting": "lag-0", "seed": s, "lr": lr}, {"final_accuracy": v})
        for lr, values in (("0.0001", (0.50, 0.52)), ("0.001", (0.10, 0.12)))
        for s, v in zip("01", values, strict=True)
    ]
    rows = report._table(data, "final_accuracy", "{:.3f} ± {:.3f}")
    assert rows[2:] == ["| grpo lr=0.0001 | 0.510 ± 0.010 |", "| grpo lr=0.001 | 0.110 ± 0.010 |"]
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
