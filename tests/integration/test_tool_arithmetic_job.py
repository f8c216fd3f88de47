"""The agent acceptance check: on tool-arithmetic (multi-turn, calculator tool), GRPO raises the tiny model's
eval success by >= 10 points over its warm start, on CPU in minutes.

Slow: ``pytest -m slow tests/integration/test_tool_arithmetic_job.py``. Measured numbers are in docs/tasks.md.
"""

import json
from pathlib import Path

import pytest

from oprl.cli import main

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "examples" / "tool-arithmetic.yaml"


@pytest.mark.slow
def test_rl_on_episodes_gains_ten_points(tmp_path, monkeypatch):
    monkeypatch.setenv("OPRL_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["train", str(CONFIG), "steps=20", f"output_dir={tmp_path}", "run_name=agent", "progress=false"]) == 0
    summary = json.loads((tmp_path / "agent" / "summary.json").read_text())
    assert 0.2 <= summary["eval_accuracy_before"] <= 0.7
    assert summary["eval_accuracy_after"] - summary["eval_accuracy_before"] >= 0.10
