"""Self-healing runs (issue 57): an explorer process killed (``OPRL_FAULT``, a SIGKILL of its own) at a seeded
random step is restarted, its batch generated again, and the finished run equals the undisturbed run: every
``metrics.jsonl`` cell but ``perf/*`` and ``final/model.safetensors`` byte for byte. Past the restart budget the
run stops as before: one line, a checkpoint, and ``resume=true`` completes it with the same numbers.
"""

import json
import random
import re

import pytest

from oprl.backends.faults import VARIABLE
from oprl.cli import main
from oprl.metrics import deterministic_view, read_metrics
from oprl.schedule import policy_version

# Stale by two steps, so the lost batch's version is older than the trainer's and the driver must hand the new
# process a retained snapshot; two explorers, so the other one's work goes on meanwhile.
RUN = [
    "tensorboard=false",
    "runtime.torch_threads=1",
    "runtime.explorers=2",
    "steps=6",
    "sync.offset=2",
    "checkpoint.interval=2",
    "eval.interval=3",
]
PROCESSES = "runtime.workers=processes"


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory, cache_dir):
    """The reference run, on threads (threads and processes give the same numbers: test_runtime_modes.py)."""
    from conftest import SMALL

    root = tmp_path_factory.mktemp("healing")
    args = [*SMALL, *RUN, f"output_dir={root}"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPRL_CACHE_DIR", str(cache_dir))
        assert main(["train", *args, "run_name=whole"]) == 0
    return root, args


def assert_same_as_undisturbed(root, name):
    whole, healed = read_metrics(root / "whole" / "metrics.jsonl"), read_metrics(root / name / "metrics.jsonl")
    assert [r["step"] for r in healed] == list(range(7))
    assert deterministic_view(healed) == deterministic_view(whole)
    final = "final/model.safetensors"
    assert (root / name / final).read_bytes() == (root / "whole" / final).read_bytes()


def test_an_explorer_killed_at_a_random_step_is_restarted_and_the_run_equals_the_undisturbed_one(
    undisturbed, monkeypatch, capsys
):
    root, args = undisturbed
    chance = random.Random(57)
    batch, after = chance.randint(1, 6), round(chance.uniform(0.0, 0.5), 2)
    monkeypatch.setenv(VARIABLE, f"explorer@step={batch}+{after}")  # whichever explorer generates it
    assert main(["train", *args, PROCESSES, "run_name=healed"]) == 0
    out = capsys.readouterr()
    lines = [line for line in (out.out + out.err).splitlines() if " died (" in line]
    assert len(lines) == 1, out.out + out.err
    assert re.match(r"explorer [01] died \(ProcessDied: worker process exited \(-9\)\); restarted in ", lines[0])
    restarts = json.loads((root / "healed" / "summary.json").read_text())["restarts"]
    # The batch it was generating, and the one queued behind it (overlapped: two per explorer); with the kill
    # 0.29 s into the call, a batch that finished first is kept and the death is met by the next one.
    assert len(restarts) == 1 and restarts[0]["batches"] and min(restarts[0]["batches"]) >= batch, restarts
    again = ", ".join(f"batch {b} (version {policy_version(b, 1, 2)})" for b in restarts[0]["batches"])
    assert f"generating {again} again" in lines[0], lines[0]
    assert restarts[0]["seconds_lost"] > 0 and restarts[0]["cause"] == "ProcessDied: worker process exited (-9)"
    assert_same_as_undisturbed(root, "healed")
    rows = read_metrics(root / "healed" / "metrics.jsonl")
    assert sum(r.get("perf/restarts", 0) for r in rows) == 1


@pytest.mark.slow
def test_past_the_budget_the_run_stops_in_one_line_and_resume_equals(undisturbed, monkeypatch, capsys):
    """Two kills, one restart allowed: the second ends the run with today's line; resume=true completes it."""
    root, args = undisturbed
    monkeypatch.setenv(VARIABLE, "explorer@step=2,explorer@step=4")
    assert main(["train", *args, PROCESSES, "runtime.max_restarts=1", "run_name=spent"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert re.match(
        r"error: explorer [01] failed while generating batch 4: ProcessDied: worker process exited \(-9\)", err
    )
    assert "runtime.max_restarts=1 restarts" in err and "resume=true" in err, err
    monkeypatch.delenv(VARIABLE)
    assert main(["train", *args, PROCESSES, "runtime.max_restarts=1", "run_name=spent", "resume=true"]) == 0
    assert_same_as_undisturbed(root, "spent")


@pytest.mark.slow
def test_on_ray_the_killed_explorer_actor_is_restarted_by_ray_and_the_run_equals(undisturbed, monkeypatch, capsys):
    """Ray restarts the actor (max_restarts); the driver resubmits the lost batches with their weights."""
    ray = pytest.importorskip("ray")
    root, args = undisturbed
    monkeypatch.setenv(VARIABLE, "explorer@step=3+0.2")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        assert main(["train", *args, "backend=ray", "run_name=ray-healed"]) == 0
    finally:
        ray.shutdown()
    out = capsys.readouterr()
    lines = [line for line in (out.out + out.err).splitlines() if " died (" in line]
    assert len(lines) == 1 and re.match(r"explorer [01] died \(its process died \(RayActorError\)\)", lines[0]), lines
    assert_same_as_undisturbed(root, "ray-healed")


@pytest.mark.slow
def test_a_killed_trainer_goes_on_from_its_newest_checkpoint_in_the_same_process(undisturbed, monkeypatch, capsys):
    """The trainer dies as step 4 reaches it: every worker starts again from step 2's checkpoint, as resume=true
    would, in the same process; one line, and the numbers of the undisturbed run."""
    root, args = undisturbed
    monkeypatch.setenv(VARIABLE, "trainer@step=4")
    assert main(["train", *args, PROCESSES, "run_name=trainer-healed"]) == 0
    out = capsys.readouterr()
    lines = [line for line in (out.out + out.err).splitlines() if " died (" in line or "resuming" in line]
    assert len(lines) == 1, lines
    assert lines[0].startswith("trainer died (ProcessDied: worker process exited (-9)); restarted in "), lines[0]
    assert "every worker started again, training from " in lines[0] and "step-000002" in lines[0], lines[0]
    assert_same_as_undisturbed(root, "trainer-healed")
    restarts = json.loads((root / "trainer-healed" / "summary.json").read_text())["restarts"]
    assert [r["worker"] for r in restarts] == ["trainer"]
