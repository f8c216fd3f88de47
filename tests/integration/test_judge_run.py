"""A model as the judge in a run: a 2-step ``oprl train`` on the embedded task whose reward is the rule reward
plus the judge's yes/no verdict (the student's own starting model as the judge) logs both components."""

import pytest

from oprl.cli import main
from oprl.metrics import read_metrics

pytestmark = pytest.mark.integration


def test_a_judge_component_is_logged_beside_the_rule_reward(small_overrides, tmp_path):
    args = [*small_overrides, "tensorboard=false", "runtime.torch_threads=1", "eval.interval=0", "steps=2"]
    judge = ["judge.path=tiny", "judge.yes_text=1", "judge.no_text=0", "judge.weight=0.1", "judge.name=verdict"]
    assert main(["train", *args, *judge, "run_name=judged"]) == 0
    rows = [r for r in read_metrics(tmp_path / "runs" / "judged" / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert {"reward/correct", "reward/verdict", "reward/verdict_unparsed"} <= row.keys()
        assert row["reward/verdict"] != 0.0 and row["reward/verdict_unparsed"] == 0.0  # yes-no always parses
