"""A tinker-cookbook recipe, unchanged, against the server: ``python -m tinker_cookbook.recipes.math_rl.train`` (its
chz CLI only; ``env=arithmetic`` makes its problems, no hub dataset) for two steps on the random tiny model.

Needs ``tinker-cookbook`` (``make setup`` installs it with ``--no-deps``, see the Makefile and docs/tinker.md);
skipped without it. The model is named by its directory (the fixture serves it under that name
too): the recipe loads its tokenizer with ``AutoTokenizer.from_pretrained(model_name)``."""

import json
import os
import subprocess
import sys

import pytest
from tinker_server import serve

pytest.importorskip("tinker_cookbook.recipes.math_rl.train")


def _recipe(running, log_path, **overrides):
    config = {
        "base_url": running.url,
        "model_name": running.model_dir,
        "renderer_name": "role_colon",  # the cookbook's plain "User: ...\n\nAssistant: ..." text (any tokenizer)
        "env": "arithmetic",
        "group_size": 2,
        "groups_per_batch": 2,
        "max_tokens": 4,
        "learning_rate": 1e-3,
        "lora_rank": 4,
        # The recipe's default, stable_reinforce, has no published objective: refused unless the server was started
        # with --stable-reinforce PRESET (both tested below; docs/tinker.md says what is missing).
        "loss_fn": "importance_sampling",
        "max_steps": 2,
        "eval_every": 0,
        "save_every": 0,
        "log_path": str(log_path),
        "behavior_if_log_dir_exists": "delete",
        **overrides,
    }
    env = {**os.environ, "TINKER_API_KEY": "tml-test-key", "TINKER_TELEMETRY": "0", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "tinker_cookbook.recipes.math_rl.train", *(f"{k}={v}" for k, v in config.items())],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_math_rl_recipe_trains_two_steps_through_the_server(running, tmp_path):
    done = _recipe(running, tmp_path / "run")
    assert done.returncode == 0, done.stderr[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if "env/all/reward/total" in row]
    assert [row["step"] for row in steps] == [0, 1]
    for row in steps:
        # Every step sampled its groups, scored them and trained on them through the server.
        assert row["env/all/total_episodes"] == 4 and row["tokens/trained"] > 0
        assert -0.1 <= row["env/all/reward/total"] <= 1.0
    checkpoints = [json.loads(line) for line in (tmp_path / "run" / "checkpoints.jsonl").read_text().splitlines()]
    assert checkpoints[-1]["name"] == "final" and checkpoints[-1]["state_path"].startswith("tinker://")


@pytest.mark.slow  # 11 s; the refusal itself is in test_tinker_losses.py, this is what the recipe's default meets
def test_stable_reinforce_is_refused_with_a_400_naming_the_alternatives(running, tmp_path):
    done = _recipe(running, tmp_path / "run", loss_fn="stable_reinforce", max_steps=1)
    assert done.returncode != 0
    assert "loss_fn: 'stable_reinforce' is refused" in done.stderr and "importance_sampling" in done.stderr
    assert "--stable-reinforce PRESET" in done.stderr


@pytest.mark.slow  # 15-30 s: the recipe as it ships, its default loss, on a server whose operator chose its preset
def test_math_rl_with_its_default_loss_against_a_server_started_with_stable_reinforce(tmp_path):
    chosen = serve(tmp_path / "server", stable_reinforce="rec-oneside-nois")
    try:
        config = {"loss_fn": "stable_reinforce", "max_steps": 2}
        done = _recipe(chosen, tmp_path / "run", **config)
    finally:
        chosen.stop()
    assert done.returncode == 0, done.stderr[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if "env/all/reward/total" in row]
    assert [row["step"] for row in steps] == [0, 1] and all(row["tokens/trained"] > 0 for row in steps)
    # The recipe logs optim_step's metrics, which repeat the announcement of the loss its gradient came from.
    assert all(row["stable_reinforce=rec-oneside-nois:max"] == 1.0 for row in steps)
