"""A model as the judge in a run: a 2-step ``oprl train`` on the embedded task whose reward is the rule reward
plus the judge's yes/no verdict (the student's own starting model as the judge) logs both components and the
judge's seconds; the judge is one worker of the run, placed like the teacher: worker processes give the threads'
numbers, and Ray starts it as an actor of its own with ``judge.gpus`` GPUs and gives the local numbers."""

from pathlib import Path

import pytest

from oprl.cli import main
from oprl.metrics import deterministic_view, read_metrics

pytestmark = pytest.mark.integration

FAST = ["tensorboard=false", "runtime.torch_threads=1", "eval.interval=0", "steps=2"]
JUDGE = ["judge.path=tiny", "judge.yes_text=1", "judge.no_text=0", "judge.weight=0.1", "judge.name=verdict"]


def rows_of(overrides, name):
    root = next(a.removeprefix("output_dir=") for a in overrides if a.startswith("output_dir="))
    return read_metrics(Path(root) / name / "metrics.jsonl")


def test_a_judge_component_is_logged_beside_the_rule_reward(small_overrides):
    assert main(["train", *small_overrides, *FAST, *JUDGE, "run_name=judged"]) == 0
    rows = [r for r in rows_of(small_overrides, "judged") if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert {"reward/correct", "reward/verdict", "reward/verdict_unparsed"} <= row.keys()
        assert row["reward/verdict"] != 0.0 and row["reward/verdict_unparsed"] == 0.0  # yes-no always parses
        assert 0 < row["perf/judge_s"] < row["perf/reward_s"]  # the explorer waited for the judge's verdicts


@pytest.mark.slow  # ~30 s on 2 cores: two runs, one with spawned worker processes
def test_worker_processes_give_the_threads_numbers(small_overrides):
    """Two explorers ask the one judge (its own process under runtime.workers=processes)."""
    common = [*small_overrides, *FAST, *JUDGE, "runtime.explorers=2", "sync.offset=1"]
    assert main(["train", *common, "run_name=threads"]) == 0
    assert main(["train", *common, "run_name=processes", "runtime.workers=processes"]) == 0
    processes = rows_of(small_overrides, "processes")
    assert deterministic_view(processes) == deterministic_view(rows_of(small_overrides, "threads"))
    assert all(r["perf/judge_s"] > 0 and r["reward/verdict"] != 0 for r in processes if "perf/step_s" in r)


@pytest.mark.slow  # ~40 s: a local Ray instance and two runs
def test_ray_places_the_judge_as_an_actor_of_its_own(small_overrides, monkeypatch):
    ray = pytest.importorskip("ray")
    from oprl.backends import ray_backend
    from oprl.roles import JudgeClient

    common = [*small_overrides, *FAST, *JUDGE, "judge.gpus=0.5"]
    assert main(["train", *common, "run_name=ray-local"]) == 0
    started = []
    start = ray_backend.RayBackend.start

    def recorded(self, name, factory, *args, **options):
        started.append((name, factory.__name__, args, options))
        return start(self, name, factory, *args, **options)

    monkeypatch.setattr(ray_backend.RayBackend, "start", recorded)
    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)  # a logical GPU for judge.gpus
    try:
        assert main(["train", *common, "run_name=ray", "backend=ray"]) == 0
    finally:
        ray.shutdown()
    assert deterministic_view(rows_of(small_overrides, "ray")) == deterministic_view(
        rows_of(small_overrides, "ray-local")
    )
    judges = [(factory, options["gpus"]) for name, factory, _, options in started if name == "judge"]
    assert judges == [("JudgeWorker", 0.5)]  # one actor, its own GPU request
    explorers = [args for name, _, args, _ in started if name.startswith("explorer")]
    assert len(explorers) == 1 and isinstance(explorers[0][-1], JudgeClient)
    assert isinstance(explorers[0][-1].peer, ray_backend.RayPeer)  # the explorer actor asks the judge actor
    assert all(r["perf/judge_s"] > 0 for r in rows_of(small_overrides, "ray") if "perf/step_s" in r)
