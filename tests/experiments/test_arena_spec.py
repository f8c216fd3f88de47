"""The arena's sweep specs (configs/sweeps/arena.yaml and its learning-rate tuning arena-lr.yaml, issue #44):
``oprl sweep --dry-run`` plans every run, and every planned run is a valid config with the method, lag and
learning rate its labels name."""

from pathlib import Path

import pytest
import yaml

from oprl.cli import main
from oprl.config import load_config
from oprl.experiments import sweep_spec

SPECS = Path(__file__).resolve().parents[2] / "configs" / "sweeps"
METHODS = {  # the 18 methods -> oprl's preset names
    "REINFORCE": "reinforce", "GRPO": "grpo", "REC-OneSide-NoIS": "rec-oneside-nois", "REC-Ring": "rec-ring-nois",
    "OPMD": "opmd", "RED-Weight": "red-weight", "TIS": "tis-token", "masked IS": "masked-is-token", "GSPO": "gspo",
    "CISPO": "cispo", "DPPO-TV": "dppo-tv", "DPPO-KL": "dppo-kl", "M2PO": "m2po", "OAPL": "oapl", "TOPR": "topr",
    "BAPO": "bapo", "ASPO": "aspo", "SAPO": "sapo",
}  # fmt: skip
LAGS = {"lag-0": 0, "lag-1": 1, "lag-2": 2, "lag-4": 4, "lag-8": 8, "lag-16": 16, "lag-64": 64}


def dry_run(name, tmp_path, capsys):
    """``oprl sweep --dry-run`` on the spec with its output under ``tmp_path``; the planned runs and the printed
    commands."""
    spec = sweep_spec.load_spec(SPECS / name) | {"output_dir": str(tmp_path / "out")}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    assert main(["sweep", str(path), "--dry-run"]) == 0
    commands = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("oprl train")]
    return sweep_spec.plan(spec), commands


def test_arena_plans_every_method_lag_and_seed_as_valid_configs(tmp_path, capsys):
    runs, commands = dry_run("arena.yaml", tmp_path, capsys)
    assert len(runs) == len(commands) == 18 * 10 * 3
    seen = set()
    for run in runs:
        config = load_config(overrides=list(run.overrides))
        labels = run.labels
        assert config.algorithm.preset == labels["algorithm.preset"] and config.optim.lr > 0
        setting = labels["setting"]
        if setting == "offline":
            assert config.sync.offset + config.sync.interval >= config.steps
        else:
            lag = LAGS[setting.removesuffix("-bf16")]
            assert (config.sync.interval, config.sync.offset) == (1, lag) and lag < config.steps
            assert config.rollout.dtype == ("bfloat16" if setting.endswith("-bf16") else None)  # None: the model's
        seen.add((labels["algorithm.preset"], setting, labels["seed"]))
    assert {preset for preset, _, _ in seen} == set(METHODS.values())
    assert {setting for _, setting, _ in seen} == {*LAGS, "offline", "lag-0-bf16", "lag-4-bf16"}
    assert {seed for _, _, seed in seen} == {"0", "1", "2"} and len(seen) == len(runs)
    spec = sweep_spec.load_spec(SPECS / "arena.yaml")
    grouped = {preset for presets in spec["report"]["groups"].values() for preset in presets}
    assert grouped == set(METHODS.values())


def test_arena_learning_rates_come_from_the_tuning_spec(tmp_path, capsys):
    """The tuning sweep covers the same methods on-policy at 4 learning rates, and every arena rate is one of them."""
    runs, commands = dry_run("arena-lr.yaml", tmp_path, capsys)
    assert len(runs) == len(commands) == 18 * 4 * 3
    rates = set()
    for run in runs:
        config = load_config(overrides=list(run.overrides))
        assert (config.sync.interval, config.sync.offset) == (1, 0) and config.steps == 200
        rates.add(config.optim.lr)
    assert {run.labels["algorithm.preset"] for run in runs} == set(METHODS.values())
    arena = sweep_spec.load_spec(SPECS / "arena.yaml")["grid"]["algorithm.preset"]
    assert {bundle["optim.lr"] for bundle in arena.values()} <= rates


@pytest.mark.parametrize("name", ["arena.yaml", "arena-lr.yaml"])
def test_the_specs_share_the_run_settings(name):
    overrides = set(sweep_spec.load_spec(SPECS / name)["overrides"])
    assert {"steps=200", "rollout.prompts_per_step=16", "eval.num_problems=500", "eval.seed=0"} <= overrides


def test_the_oapl_beta_probe_plans_oapl_at_two_betas_and_the_arena_lr(tmp_path, capsys):
    runs, commands = dry_run("arena-oapl-beta.yaml", tmp_path, capsys)
    assert len(runs) == len(commands) == 2 * 4 * 3
    betas = set()
    for run in runs:
        config = load_config(overrides=list(run.overrides))
        assert config.algorithm.preset == "oapl" and config.optim.lr == 1e-4 and config.steps == 200
        betas.add(config.algorithm.regression_beta)
    assert betas == {1e-2, 1e-1}
