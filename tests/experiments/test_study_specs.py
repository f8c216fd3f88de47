"""The studies' sweep specs (configs/sweeps/mismatch.yaml, red-drop.yaml, the smollm2-*.yaml): every planned
run is a valid config with >= 3 seeds (2 for SmolLM2), and (slow) a 2-step version of each whole grid runs and
reports."""

from pathlib import Path

import pytest
import yaml

from conftest import SMALL
from oprl.config import load_config
from oprl.errors import OprlError
from oprl.experiments import report, sweep, sweep_spec

SPECS = Path(__file__).resolve().parents[2] / "configs" / "sweeps"
STUDIES = ["mismatch.yaml", "red-drop.yaml"]


@pytest.mark.parametrize("name", STUDIES)
def test_every_planned_run_is_a_valid_config(name):
    spec = sweep_spec.load_spec(SPECS / name)
    runs = sweep_spec.plan(spec)
    assert len(spec["grid"]["seed"]) >= 3
    for run in runs:
        config = load_config(overrides=list(run.overrides))
        assert config.algorithm.preset == run.labels["algorithm.preset"]
    grouped = {preset for presets in spec["report"]["groups"].values() for preset in presets}
    assert grouped <= set(spec["grid"]["algorithm.preset"])


def test_mismatch_settings_separate_mismatch_from_staleness():
    spec = sweep_spec.load_spec(SPECS / "mismatch.yaml")
    settings = spec["grid"]["setting"]
    assert settings["on-policy-bf16"] == {**settings["on-policy"], "rollout.dtype": "bfloat16"}
    assert settings["stale-bf16"] == {**settings["stale"], "rollout.dtype": "bfloat16"}


def test_red_drop_covers_the_variants_settings_and_two_learning_rates():
    spec = sweep_spec.load_spec(SPECS / "red-drop.yaml")
    presets = set(spec["grid"]["algorithm.preset"])
    assert {"red-drop", "red-drop-keep", "red-drop-probabilistic", "red-weight", "reinforce"} <= presets
    settings = spec["grid"]["setting"]
    schedules = {(s["sync.interval"], s["sync.offset"]) for s in settings.values()}
    assert schedules == {(1, 10), (20, 0), (300, 199)}  # stale, infrequent, offline (m + k >= steps)
    for schedule in schedules:  # each schedule at the reproduction's lr and at a lower one
        rates = sorted(s["optim.lr"] for s in settings.values() if (s["sync.interval"], s["sync.offset"]) == schedule)
        assert len(rates) == 2 and rates[1] == load_config().optim.lr and rates[0] < rates[1]


@pytest.mark.slow
@pytest.mark.parametrize("name", STUDIES)
def test_two_step_version_runs_and_reports(name, tmp_path):
    spec = sweep_spec.load_spec(SPECS / name)
    small = [o for o in SMALL if not o.startswith("rollout.prompts_per_step")]
    spec |= {
        "output_dir": str(tmp_path / "study"),
        "overrides": [*spec["overrides"], *small, "steps=2", "eval.interval=0", "rollout.prompts_per_step=2"],
        "grid": spec["grid"] | {"seed": [0]},
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = sweep.run_sweep(path)
    planned = sweep_spec.plan(spec)
    assert all((out / run.name / "summary.json").is_file() for run in planned)
    assert (report.build_report(out)).is_file()


@pytest.mark.parametrize("name", ["smollm2-findings.yaml", "smollm2-mismatch.yaml", "smollm2-finding2-long.yaml"])
def test_smollm2_studies_plan_valid_configs(name):
    """The real-model studies (issue #28): every run is a valid config of its example on SmolLM2, with the
    preset it is labelled with, the schedule its setting is named for, and explicit float32/bfloat16 choices
    (not ``auto``)."""
    spec = sweep_spec.load_spec(SPECS / name)
    runs = sweep_spec.plan(spec)
    assert len(spec["grid"]["seed"]) >= 2  # 2, not 3: what fits 90 minutes of a 2-core CPU (docs/reproduction.md)
    base = SPECS.parents[1] / spec["config"]
    for run in runs:
        config = load_config(base, list(run.overrides))
        assert config.model.path == "smollm2-135m-instruct" and config.eval.seed == 0
        assert config.algorithm.preset == run.labels["algorithm.preset"]
        assert config.trainer.autocast == "none" and config.rollout.dtype in ("float32", "bfloat16")
        if run.labels["setting"] != "offline":
            assert config.sync.offset == {"on-policy": 0, "stale": 4}[run.labels["setting"]]
        if run.labels["setting"] == "offline":
            assert config.sync.offset + config.sync.interval > config.steps  # every batch from version 0
        if config.steps > 16:  # a sweep of hours must survive the end of a session: resumable from checkpoints
            assert config.checkpoint.interval > 0


def _flat(config) -> dict:
    return {
        f"{section}.{key}": value
        for section, values in config.model_dump().items()
        if isinstance(values, dict)
        for key, value in values.items()
    }


def test_bfcl_recipes_change_one_thing_of_the_first_example_each():
    """Study 3's recipes (configs/sweeps/smollm2-bfcl-recipes.yaml): each setting is the first BFCL example (the
    grid's overrides pin its RL settings: 2 prompts x 8, lr 2e-6, no KL term, 20 steps, one sample a problem) with
    its own overrides and nothing else (a preset brings its own algorithm keys), on the same 80 test problems
    with the same eval seed."""
    spec = sweep_spec.load_spec(SPECS / "smollm2-bfcl-recipes.yaml")
    base = SPECS.parents[1] / spec["config"]
    first = load_config(base, list(spec["overrides"]))
    assert (first.steps, first.rollout.prompts_per_step, first.optim.lr) == (20, 2, 2e-6)
    assert first.algorithm.kl_coef == 0.0 and first.eval.samples == 1 and first.algorithm.preset == "grpo"
    example = _flat(first)
    settings = spec["grid"]["setting"]
    assert settings["example"] == {} and len(settings) >= 5
    for run in sweep_spec.plan(spec):
        config = load_config(base, list(run.overrides))
        assert config.eval.seed == 0 and config.eval.num_problems == 80 and config.task.subsets == ["simple_python"]
        flat, setting = _flat(config), set(settings[run.labels["setting"]])
        changed = {key for key, value in flat.items() if example[key] != value}
        allowed = setting | (
            {k for k in flat if k.startswith("algorithm.")} if "algorithm.preset" in setting else set()
        )
        assert setting <= changed <= allowed, run.labels["setting"]


def test_the_bfcl_example_is_the_stronger_phase_and_its_spec_runs_it_on_three_seeds():
    """configs/examples/smollm2-bfcl.yaml is the stronger RL phase: the first example with 4 prompts a step,
    lr 4e-6, the KL term and 40 steps, evaluated with 8 samples a problem on the same 80 test problems and eval
    seed. configs/sweeps/smollm2-bfcl-stronger.yaml pins those settings and runs exactly the example on 3 seeds."""
    recipes = sweep_spec.load_spec(SPECS / "smollm2-bfcl-recipes.yaml")
    base = SPECS.parents[1] / recipes["config"]
    first = _flat(load_config(base, list(recipes["overrides"])))
    example = _flat(load_config(base, ["checkpoint.interval=0"]))
    changed = {key for key, value in example.items() if first[key] != value}
    assert changed == {"rollout.prompts_per_step", "optim.lr", "algorithm.kl_coef", "eval.samples", "eval.interval"}
    assert load_config(base).steps == 40 and example["eval.samples"] == 8 and example["eval.seed"] == 0
    spec = sweep_spec.load_spec(SPECS / "smollm2-bfcl-stronger.yaml")
    runs = sweep_spec.plan(spec)
    assert sorted(run.labels["seed"] for run in runs) == ["0", "1", "2"]
    for run in runs:
        config = load_config(base, list(run.overrides))
        assert config.model_dump() == load_config(base, ["checkpoint.interval=0", f"seed={config.seed}"]).model_dump()


def test_the_tiny_distillation_table_plans_valid_runs_on_three_seeds():
    """configs/sweeps/tiny-distill.yaml: 9 methods x 3 seeds; RL has no teacher, every other method distils
    from the teacher run, the offline ones from the stored samples; the report groups name grid methods."""
    spec = sweep_spec.load_spec(SPECS / "tiny-distill.yaml")
    runs = sweep_spec.plan(spec)
    assert len(runs) == 27 and spec["grid"]["seed"] == [0, 1, 2]
    for run in runs:
        config = load_config(overrides=list(run.overrides))
        method = run.labels["algorithm.preset"]
        assert (config.teacher.path is None) == (method == "rl")
        assert (config.mode == "offline") == method.endswith("offline")
        assert method == "rl" or config.algorithm.distill_coef > 0
    grouped = {method for methods in spec["report"]["groups"].values() for method in methods}
    assert grouped <= set(spec["grid"]["algorithm.preset"])


def test_the_smollm2_stale_arena_runs_its_priority_order_on_three_paired_seeds():
    """configs/sweeps/smollm2-stale-arena.yaml (issue #51): the pilot (GRPO seed 0) first, then REINFORCE, GRPO,
    the on-policy GRPO anchor, then the other methods; every method on seeds 0-2 at lag 4, exact float32, 48 steps
    evaluated every 10 on 128 problems with a fixed evaluation seed, checkpointed for resumption."""
    spec = sweep_spec.load_spec(SPECS / "smollm2-stale-arena.yaml")
    runs = sweep_spec.plan(spec)
    base = SPECS.parents[1] / spec["config"]
    order = [(r.labels["setting"], r.labels["algorithm.preset"], r.labels["seed"]) for r in runs]
    assert order[0] == ("lag-4", "grpo", "0") and order[1] == ("lag-4", "reinforce", "0")
    assert len(order) == len(set(order)) == 27
    presets = list(dict.fromkeys(p for s, p, _ in order if s == "lag-4"))
    assert presets == [
        "grpo",
        "reinforce",
        "rec-oneside-nois",
        "rec-oneside-nois-wide",
        "red-weight",
        "m2po",
        "dppo-tv",
        "gspo",
    ]
    for preset in presets:
        assert sorted(seed for s, p, seed in order if (s, p) == ("lag-4", preset)) == ["0", "1", "2"]
    assert sorted(seed for s, p, seed in order if s == "lag-0") == ["0", "1", "2"]
    for run in runs:
        config = load_config(base, list(run.overrides))
        assert config.algorithm.preset == run.labels["algorithm.preset"] and config.steps == 48  # the pilot's rule
        assert config.trainer.autocast == "none" and config.rollout.dtype == "float32"
        assert (config.sync.mode, config.sync.interval) == ("scheduled", 1)
        assert config.sync.offset == {"lag-4": 4, "lag-0": 0}[run.labels["setting"]]
        assert (config.eval.interval, config.eval.num_problems, config.eval.seed) == (10, 128, 0)
        assert config.checkpoint.interval > 0


def test_the_smollm2_follow_up_is_the_stale_arena_on_new_seeds_paired_seed_by_seed():
    """configs/sweeps/smollm2-f1-auc.yaml: the stale arena's recipe on seeds 3-14 (none of its seeds 0-2, whose
    noise chose the metric), every method of a seed before the next seed, every run the stale arena's config but
    for its seed (and the two 96-step REINFORCE runs' steps); its declared findings: F1 on the AUC, F5 on both
    metrics, the anchor on the AUC, F2 (issues #66, #73), adaptive RED-Weight on the AUC (#70)."""
    from oprl.experiments import findings

    spec = sweep_spec.load_spec(SPECS / "smollm2-f1-auc.yaml")
    arena = sweep_spec.load_spec(SPECS / "smollm2-stale-arena.yaml")
    assert (spec["config"], spec["overrides"]) == (arena["config"], arena["overrides"])
    runs = sweep_spec.plan(spec)
    order = [(r.labels["setting"], r.labels["algorithm.preset"], r.labels["seed"]) for r in runs]
    expected = []
    for seed in range(3, 15):
        lag4 = ("rec-oneside-nois", "grpo", "red-weight") + (("reinforce", "red-weight-adaptive") if seed <= 8 else ())
        expected += [("lag-4", p, str(seed)) for p in lag4] + ([("lag-0", "grpo", str(seed))] if seed <= 9 else [])
        expected += [("lag-4-96", "reinforce", "3"), ("lag-4-96", "reinforce", "4")] if seed == 8 else []
    assert order == expected
    twin = {
        (r.labels["algorithm.preset"], r.labels["setting"]): r
        for r in sweep_spec.plan(arena)
        if r.labels["seed"] == "0"
    }
    base = SPECS.parents[1] / spec["config"]
    for run in runs:
        if run.labels["seed"] != "3":
            continue
        config = load_config(base, list(run.overrides)).model_dump()
        preset, setting = run.labels["algorithm.preset"], run.labels["setting"]
        arena_preset = "rec-oneside-nois" if preset == "red-weight-adaptive" else preset  # not run by the arena
        other = load_config(base, list(twin[(arena_preset, setting.removesuffix("-96"))].overrides)).model_dump()
        other["algorithm"] = config["algorithm"] if preset == "red-weight-adaptive" else other["algorithm"]
        steps = 96 if setting == "lag-4-96" else 48
        assert config == {**other, "seed": 3, "steps": steps}
    declared = findings.parse(spec["report"]["findings"], "spec")
    C = findings.Contrast
    assert list(declared.values()) == [
        [C(("rec-oneside-nois", "lag-4"), ("grpo", "lag-4"), 0.1, "accuracy_auc")],
        [
            C(("red-weight", "lag-4"), ("rec-oneside-nois", "lag-4"), 0.1, "final_accuracy"),
            C(("red-weight", "lag-4"), ("rec-oneside-nois", "lag-4"), 0.1, "accuracy_auc"),
        ],
        [C(("grpo", "lag-4"), ("grpo", "lag-0"), 0.1, "accuracy_auc")],
        [
            C(("grpo", "lag-4"), ("reinforce", "lag-4"), 0.0, "final_accuracy"),
            C(("rec-oneside-nois", "lag-4"), ("reinforce", "lag-4"), 0.0, "final_accuracy"),
        ],
        [C(("red-weight-adaptive", "lag-4"), ("rec-oneside-nois", "lag-4"), 0.1, "accuracy_auc")],
    ]


def test_a_grid_list_is_the_union_of_its_grids_in_order(tmp_path):
    spec = {
        "grid": [
            {"algorithm.preset": ["grpo"], "seed": [0]},
            {"algorithm.preset": ["reinforce", "grpo"], "seed": [0, 1]},
        ]
    }
    names = [r.name for r in sweep_spec.plan(spec)]
    assert names == [
        "preset=grpo__seed=0",
        "preset=reinforce__seed=0",
        "preset=reinforce__seed=1",
        "preset=grpo__seed=1",
    ]
    for grid, message in [
        ([{"seed": [0]}, {"algorithm.preset": ["grpo"]}], "same axes"),
    ]:
        path = tmp_path / "s.yaml"
        path.write_text(yaml.safe_dump({"grid": grid}))
        with pytest.raises(OprlError, match=message):
            sweep_spec.load_spec(path)
    clash = {"grid": [{"setting": {"a": {"steps": 1}}}, {"setting": {"a": {"steps": 2}}}]}
    with pytest.raises(OprlError, match="setting=a is planned twice"):
        sweep_spec.plan(clash)
