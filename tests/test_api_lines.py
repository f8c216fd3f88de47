"""``oprl.api`` without a run: what a result prints and what a headline says (runs: tests/integration/test_api.py)."""

from pathlib import Path

import pytest

from oprl import api
from oprl.config import load_config


def test_a_run_result_prints_as_one_short_line():
    """#71: ``print(result)`` dumped the whole resolved config and summary."""
    result = api.RunResult(Path("runs/x"), load_config(None), {"mode": "both"}, accuracy_before=0.4,
                           accuracy_after=0.55, seconds=84.2)  # fmt: skip
    assert repr(result) == "RunResult(run_dir='runs/x', mode=both, accuracy 0.400 -> 0.550, 84 s)"
    assert str(result) == repr(result) and result.config.steps == 300


def test_the_offline_headline_names_its_store_not_a_schedule():
    """#71: an offline run's headline said ``k=1 m=0``, a schedule it does not read."""
    line = api._start_line(load_config(None, ["mode=offline", "buffer.path=runs/store", "steps=10"]))
    assert line.endswith("(grpo, stored batches of runs/store, 10 steps)") and "k=1" not in line
    assert api._start_line(load_config(None, [])).endswith("(grpo, k=1 m=0, 300 steps)")


def test_the_eval_headline_counts_the_problems_it_runs(monkeypatch):
    """#71: ``oprl eval`` said "500 problems at most" for a 40-problem test set."""
    import sys
    import types

    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop  # the evaluation itself is not this test's: its headline comes before it starts

    monkeypatch.setitem(sys.modules, "oprl.runtime.run", types.SimpleNamespace(run=stop))
    lines = []
    with pytest.raises(Stop):
        api.run(load_config(None, ["mode=eval", "task.test_size=40"]), log=lines.append)
    assert lines[-1].endswith("(40 test problems)"), lines
    with pytest.raises(Stop):
        api.run(load_config(None, ["mode=eval", "task.test_size=40", "eval.num_problems=8"]), log=lines.append)
    assert lines[-1].endswith("(8 test problems)"), lines
