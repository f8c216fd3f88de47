"""The acceptance check of the default job: RL raises eval accuracy by >= 10 points over the warm start.

Slow (minutes): run with ``pytest -m slow tests/integration/test_default_job.py``. Wall time is measured by
``benchmarks/default_job.py``, not asserted here.
"""

import json

import pytest

from oprl.cli import main


@pytest.mark.slow
def test_default_job_gains_ten_points(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OPRL_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["train", f"output_dir={tmp_path}", "run_name=default", "progress=false"]) == 0
    out = capsys.readouterr().out
    assert "no learning signal" not in out and "warning: rollout.max_new_tokens" not in out  # it learns
    summary = json.loads((tmp_path / "default" / "summary.json").read_text())
    assert 0.2 <= summary["eval_accuracy_before"] <= 0.6
    assert summary["eval_accuracy_after"] - summary["eval_accuracy_before"] >= 0.10
