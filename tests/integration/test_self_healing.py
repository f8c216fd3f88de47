"""Self-healing runs (issue 57): an explorer process killed (``OPRL_FAULT``, a SIGKILL of its own) at a seeded
random step is restarted, its batch generated again, and the finished run equals the undisturbed run: every
``metrics.jsonl`` cell but ``perf/*`` and ``final/model.safetensors`` byte for byte. Past the restart budget the
run stops as before: one line, a checkpoint, and ``resume=true`` completes it with the same numbers.
"""

import contextlib
import json
import random
import re
from pathlib import Path

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
    batch = random.Random(57).randint(1, 6)
    # As the call reaches it: a delay (``+0.18``) raced the run's end, since a tiny-model batch takes ~0.02 s and
    # the run's last steps can finish before the timer (CI once saw no death at all). A death between calls is
    # tests/backends/test_restart.py's.
    monkeypatch.setenv(VARIABLE, f"explorer@step={batch}")  # whichever explorer generates it
    assert main(["train", *args, PROCESSES, "run_name=healed"]) == 0
    out = capsys.readouterr()
    lines = [line for line in (out.out + out.err).splitlines() if " died (" in line]
    assert len(lines) == 1, out.out + out.err
    assert re.match(r"explorer [01] died \(ProcessDied: worker process exited \(-9\)\); restarted in ", lines[0])
    restarts = json.loads((root / "healed" / "summary.json").read_text())["restarts"]
    # The batch it was generating, and any queued behind it (overlapped: two per explorer).
    assert len(restarts) == 1 and min(restarts[0]["batches"]) == batch, restarts
    again = ", ".join(f"batch {b} (version {policy_version(b, 1, 2)})" for b in restarts[0]["batches"])
    assert f"generating {again} again" in lines[0], lines[0]
    assert restarts[0]["seconds_lost"] > 0 and restarts[0]["cause"] == "ProcessDied: worker process exited (-9)"
    assert_same_as_undisturbed(root, "healed")
    rows = read_metrics(root / "healed" / "metrics.jsonl")
    assert sum(r.get("perf/restarts", 0) for r in rows) == 1


def test_a_trainer_killed_while_a_checkpoint_is_written_goes_on_from_the_one_before(undisturbed, monkeypatch, capsys):
    """The trainer dies as step 4's checkpoint asks it for its part (the buffer's part may be on disk: a torn
    checkpoint). The run goes on from step 2's checkpoint, the torn one is never read and never left behind, and
    the numbers equal the undisturbed run's. Started with overwrite=true, which the healed segment must not
    carry (it would refuse the resume, or replace the run)."""
    root, args = undisturbed
    monkeypatch.setenv(VARIABLE, "trainer@save=4")
    assert main(["train", *args, PROCESSES, "run_name=torn", "overwrite=true"]) == 0
    out = capsys.readouterr()
    lines = [line for line in (out.out + out.err).splitlines() if " died (" in line]
    assert len(lines) == 1 and lines[0].startswith("trainer died (ProcessDied"), lines
    assert "step-000002" in lines[0], lines[0]  # the checkpoint before the torn one
    assert_same_as_undisturbed(root, "torn")
    checkpoints = sorted(p.name for p in (root / "torn" / "checkpoints").iterdir())
    assert not [name for name in checkpoints if name.startswith(".tmp")], checkpoints


@pytest.fixture(scope="module")
def undisturbed_partial(tmp_path_factory, cache_dir):
    """A partial-rollout run (every batch from 3 on switches weights at decode step 1), on threads."""
    from conftest import SMALL

    root = tmp_path_factory.mktemp("healing-partial")
    args = [*SMALL, *RUN, "sync.partial=true", "sync.switch_step=1", f"output_dir={root}"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPRL_CACHE_DIR", str(cache_dir))
        assert main(["train", *args, "run_name=whole"]) == 0
    rows = read_metrics(root / "whole" / "metrics.jsonl")
    assert [r["batch/switched_frac"] for r in rows if "batch/switched_frac" in r][3] == 1.0
    return root, args


def test_an_explorer_killed_in_a_weight_switch_is_restarted_and_the_run_equals(
    undisturbed_partial, monkeypatch, capsys
):
    """Partial rollouts: the explorer of batch 4 dies as it loads the batch's switch target mid-generation. The
    driver sends the batch again with its weights and its SwitchPlan; the new process switches at the same decode
    step, and every token and version equals the undisturbed run's."""
    root, args = undisturbed_partial
    monkeypatch.setenv(VARIABLE, "explorer@switch=4")
    assert main(["train", *args, PROCESSES, "run_name=healed"]) == 0
    out = capsys.readouterr()
    lines = [line for line in (out.out + out.err).splitlines() if " died (" in line]
    # Batch 4, and a batch queued behind it when the machine is slow enough for the driver to queue one
    # (overlapped: two per explorer; seen under a load of 200 on 2 cores: "batch 4 (version 1), batch 6 (version 3)").
    restarts = json.loads((root / "healed" / "summary.json").read_text())["restarts"]
    assert len(lines) == 1 and len(restarts) == 1 and min(restarts[0]["batches"]) == 4, (lines, restarts)
    again = ", ".join(f"batch {b} (version {policy_version(b, 1, 2)})" for b in restarts[0]["batches"])
    assert f"generating {again} again" in lines[0], lines[0]
    assert_same_as_undisturbed(root, "healed")


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
    monkeypatch.setenv(VARIABLE, "explorer@step=3")  # as it arrives: a delay could race the end
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
@pytest.mark.parametrize("backend, step", [("processes", 4), ("processes", 1), ("ray", 4)])
def test_a_killed_trainer_goes_on_from_its_newest_checkpoint_in_the_same_process(
    undisturbed, monkeypatch, capsys, backend, step
):
    """The trainer dies as step 4 reaches it: every worker starts again from step 2's checkpoint, as resume=true
    would, in the same process (at step 1, with no checkpoint yet: from the start); one line, and the numbers
    of the undisturbed run."""
    root, args = undisturbed
    name = f"trainer-healed-{backend}-{step}"
    monkeypatch.setenv(VARIABLE, f"trainer@step={step}")
    with ray_instance() if backend == "ray" else contextlib.nullcontext():
        workers = "backend=ray" if backend == "ray" else PROCESSES
        assert main(["train", *args, workers, f"run_name={name}"]) == 0
    out = capsys.readouterr()
    lines = [line for line in (out.out + out.err).splitlines() if " died (" in line or "resuming" in line]
    assert len(lines) == 1, lines
    cause = "ProcessDied: worker process exited (-9)" if backend == "processes" else "its process died (RayActorError)"
    assert lines[0].startswith(f"trainer died ({cause}); restarted in "), lines[0]
    where = "training from " if step == 4 else "from the start (no checkpoint)"
    assert f"every worker started again, {where}" in lines[0], lines[0]
    assert step == 1 or "step-000002" in lines[0], lines[0]
    assert_same_as_undisturbed(root, name)
    restarts = json.loads((root / name / "summary.json").read_text())["restarts"]
    assert [r["worker"] for r in restarts] == ["trainer"]


@contextlib.contextmanager
def ray_instance():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_a_lost_ray_node_its_actors_come_back_on_the_survivor_and_the_run_equals(undisturbed, monkeypatch):
    """Two worker nodes of 3 CPUs on this machine (``ray.cluster_utils.Cluster``, the head holds no CPU): the
    node the trainer runs on is removed once step 3 is done, with whatever else Ray placed there. Every worker
    starts again on the survivor from step 2's checkpoint, and the run equals the undisturbed one."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    from oprl.runtime.driver import Driver

    root, args = undisturbed
    # Ray notices a lost node by its health checks (about 15 s by default): faster here, so that the restart is
    # not placed on the dead node meanwhile (which heals too, but spends the restart budget).
    checks = {"health_check_period_ms": 500, "health_check_failure_threshold": 2}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "_system_config": checks})
    nodes = {node.node_id: node for node in (cluster.add_node(num_cpus=3) for _ in range(2))}
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    on_train = Driver._on_train
    placed: dict[str, str] = {}

    def losing_the_node(driver, call, result):
        if call.step == 3 and not placed:
            for handle in [driver.trainer, driver.buffer, *driver.explorers]:
                placed[handle.name] = ray.get(handle.actor.handle.node_id.remote())
            cluster.remove_node(nodes[placed["trainer"]], allow_graceful=False)
        on_train(driver, call, result)

    monkeypatch.setattr(Driver, "_on_train", losing_the_node)
    try:
        assert main(["train", *args, "backend=ray", "run_name=lost-node"]) == 0
    finally:
        ray.shutdown()
        cluster.shutdown()
    restarts = json.loads((root / "lost-node" / "summary.json").read_text())["restarts"]
    lost = {name for name, where in placed.items() if where == placed["trainer"]}
    assert [r["worker"] for r in restarts][:1] in (["trainer"], ["buffer"]) and lost >= {"trainer"}, restarts
    assert {r["worker"] for r in restarts} <= lost, (restarts, placed)
    assert_same_as_undisturbed(root, "lost-node")


@contextlib.contextmanager
def workers_of(backend: str, cpus: int = 2):
    """``backend=ray`` on a local Ray instance of ``cpus`` logical CPUs, or worker processes."""
    if backend == "ray":
        ray = pytest.importorskip("ray")
        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
        try:
            yield "backend=ray"
        finally:
            ray.shutdown()
    else:
        yield PROCESSES


def died_lines(capsys) -> list[str]:
    out = capsys.readouterr()
    return [line for line in (out.out + out.err).splitlines() if " died (" in line]


# On Ray the teacher, the judge and a trainer rank are actors Ray does not restart (no ``max_restarts``): the
# driver starts every worker again as new actors from the newest checkpoint, as for the trainer.
RAY_DIED = "its process died (RayActorError)"


@pytest.mark.slow  # ~1-2 min per backend on 2 cores
@pytest.mark.parametrize("backend", ["processes", "ray"])
def test_a_killed_teacher_is_restarted_with_every_worker_and_the_distillation_equals(
    undisturbed, monkeypatch, capsys, backend
):
    """Distillation with the undisturbed run's final checkpoint as the teacher: the teacher dies as batch 4
    reaches it; every worker starts again (from the newest checkpoint, or from the start if there is none yet:
    which, depends on timing), and the run equals the same distillation undisturbed."""
    root, args = undisturbed
    teacher = sorted((root / "whole" / "checkpoints").glob("step-*"))[-1]
    distill = [*args, "algorithm.preset=distill", f"teacher.path={teacher}"]
    if not (root / "distill-whole" / "final").is_dir():  # one reference for both backends
        assert main(["train", *distill, "run_name=distill-whole"]) == 0
    monkeypatch.setenv(VARIABLE, "teacher@step=4")
    name = f"distill-healed-{backend}"
    with workers_of(backend) as workers:
        assert main(["train", *distill, workers, f"run_name={name}"]) == 0
    lines = died_lines(capsys)
    cause = "ProcessDied: worker process exited (-9)" if backend == "processes" else RAY_DIED
    assert len(lines) == 1 and lines[0].startswith(f"teacher died ({cause})"), lines
    whole = read_metrics(root / "distill-whole" / "metrics.jsonl")
    healed = read_metrics(root / name / "metrics.jsonl")
    assert deterministic_view(healed) == deterministic_view(whole) and "distill/reverse_kl" in healed[-1]
    final = "final/model.safetensors"
    assert (root / name / final).read_bytes() == (root / "distill-whole" / final).read_bytes()


@pytest.mark.slow  # two sharded runs of two rank processes each: ~1 min on 2 cores (Ray: ~2 min)
@pytest.mark.parametrize("backend", ["processes", "ray"])
def test_a_killed_trainer_rank_restarts_every_worker_from_the_newest_checkpoint(
    undisturbed, monkeypatch, capsys, backend
):
    """trainer.sharding=ddp with 2 ranks: rank 1's process dies as step 4 reaches it. The front raises RankLost,
    the driver treats it as a lost trainer, every worker (new ranks too) starts again from step 2's checkpoint,
    and the run equals an undisturbed sharded run. On Ray the ranks are actors in a placement group (4 logical
    CPUs: 2 bundles for the ranks, 1 per explorer) and RankLost reaches the driver inside Ray's RayTaskError."""
    root, args = undisturbed
    sharded = [*args, "trainer.sharding=ddp", "trainer.world_size=2"]
    if not (root / "ddp-whole" / "final").is_dir():  # one reference for both backends
        assert main(["train", *sharded, PROCESSES, "run_name=ddp-whole"]) == 0
    monkeypatch.setenv(VARIABLE, "trainer-rank:1@step=4")
    name = f"ddp-healed-{backend}"
    with workers_of(backend, cpus=4) as workers:
        assert main(["train", *sharded, workers, f"run_name={name}"]) == 0
    lines = died_lines(capsys)
    assert len(lines) == 1 and lines[0].startswith("trainer died (RankLost: trainer rank 1 died"), lines
    assert "step-000002" in lines[0], lines[0]
    whole = read_metrics(root / "ddp-whole" / "metrics.jsonl")
    healed = read_metrics(root / name / "metrics.jsonl")
    assert deterministic_view(healed) == deterministic_view(whole)
    final = "final/model.safetensors"
    assert (root / name / final).read_bytes() == (root / "ddp-whole" / final).read_bytes()


@pytest.fixture(scope="module")
def judged(tmp_path_factory, cache_dir):
    """A run with a model as the judge (judge.path), one explorer, undisturbed (on worker processes)."""
    from conftest import SMALL

    root = tmp_path_factory.mktemp("healing-judge")
    judge = ["judge.path=tiny", "judge.yes_text=1", "judge.no_text=0", "judge.weight=0.1", "judge.name=verdict"]
    args = [*SMALL, *RUN, *judge, "runtime.explorers=1", f"output_dir={root}"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPRL_CACHE_DIR", str(cache_dir))
        assert main(["train", *args, PROCESSES, "run_name=whole"]) == 0
    return root, args


@pytest.mark.slow  # a run with a judge process or actor: ~40 s on 2 cores (Ray: ~1-2 min)
@pytest.mark.parametrize("backend", ["processes", "ray"])
def test_a_judge_that_dies_under_an_explorers_call_restarts_every_worker(judged, monkeypatch, capsys, backend):
    """A model as the judge (judge.path), in its own process: it dies as its fourth call (an explorer's batch)
    reaches it. The explorer's call fails with JudgeLost (roles.JudgeClient), the driver counts the judge lost,
    and every worker starts again from the newest checkpoint; the run equals the undisturbed one. On Ray the
    explorer's line to the judge actor (``RayPeer``) carries the fault, and JudgeLost reaches the driver inside
    Ray's RayTaskError."""
    root, args = judged
    monkeypatch.setenv(VARIABLE, "judge@call=4")
    name = f"healed-{backend}"
    with workers_of(backend) as workers:
        assert main(["train", *args, workers, f"run_name={name}"]) == 0
    lines = died_lines(capsys)
    assert len(lines) == 1 and lines[0].startswith("judge died (JudgeLost: the judge died while judging"), lines
    assert "every worker started again" in lines[0], lines[0]
    assert_same_as_undisturbed(root, name)


DOUBLES = Path(__file__).parent / "engine_doubles.py"


@pytest.mark.slow  # a run of worker processes or Ray actors, ~50-70 s on the loaded 2-core machine
# (tests/runtime/test_driver.py checks the driver's side with stand-ins in under a second)
@pytest.mark.parametrize("backend", ["processes", "ray"])
def test_an_explorer_whose_engine_process_dies_is_restarted_and_the_run_equals(
    undisturbed, monkeypatch, capsys, backend
):
    """rollout.engine_process=true: batch 3's explorer finds its engine process dead (vLLM's EngineDeadError,
    from a lean engine that raises it: engine_doubles.py). The explorer is alive, but a new one (with a new
    engine) takes its place: the old process told to stop, or on Ray the actor killed with its restart allowed
    (``ray.kill(no_restart=False)``) so that Ray restarts it; the driver counts the engine lost, one line names
    it, and the run equals the undisturbed one."""
    root, args = undisturbed
    monkeypatch.setenv(VARIABLE, "engine@step=3")
    engine = [f"rollout.engine={DOUBLES}:DyingEngine", "rollout.engine_process=true"]
    name = f"engine-healed-{backend}"
    with workers_of(backend) as workers:
        assert main(["train", *args, *engine, workers, f"run_name={name}"]) == 0
    lines = died_lines(capsys)
    assert len(lines) == 1, lines
    assert re.match(
        r"vLLM engine of explorer [01] died \(EngineDeadError: the engine process died\); restarted in ", lines[0]
    )
    restarts = json.loads((root / name / "summary.json").read_text())["restarts"]
    assert [(r["kind"], min(r["batches"])) for r in restarts] == [("vllm-engine", 3)], restarts
    assert_same_as_undisturbed(root, name)


@pytest.mark.slow  # two runs with vLLM engine processes (an explorer's, the trainer's evaluation's): ~5 min
def test_a_killed_vllm_engine_process_is_replaced_with_its_explorer_and_the_run_equals(
    tmp_path, cache_dir, monkeypatch
):
    """rollout.engine=vllm rollout.engine_process=true on worker processes: the explorer's vLLM engine process is
    SIGKILLed as batch 3 reaches it (OPRL_FAULT=engine@step=3). vLLM's client raises EngineDeadError (oprl's
    watch wakes the call vLLM would leave waiting), the driver starts a new explorer with a new engine, and the
    run equals the same run undisturbed: vLLM on CPU samples the same tokens and log-probs from a fresh engine
    with the same weights and seeds."""
    pytest.importorskip("vllm")
    from conftest import SMALL

    vllm = ["rollout.engine=vllm", "rollout.engine_process=true", "eval.interval=6", "runtime.explorers=1"]
    args = [*SMALL, *RUN, *vllm, PROCESSES, f"output_dir={tmp_path}"]
    monkeypatch.setenv("OPRL_CACHE_DIR", str(cache_dir))
    assert main(["train", *args, "run_name=whole"]) == 0
    monkeypatch.setenv(VARIABLE, "engine@step=3")
    assert main(["train", *args, "run_name=healed"]) == 0
    restarts = json.loads((tmp_path / "healed" / "summary.json").read_text())["restarts"]
    assert [(r["worker"], r["kind"], r["batches"][0]) for r in restarts] == [
        ("vLLM engine of explorer 0", "vllm-engine", 3)
    ], restarts
    assert_same_as_undisturbed(tmp_path, "healed")


def _trials(rounds: int, seed: int = 5757) -> list[tuple[str, str]]:
    """``rounds`` (kind, OPRL_FAULT) pairs per worker kind of the undisturbed run's config, at distinct steps drawn
    from ``seed`` among its 6 (for a torn save, among the checkpoints' steps 2 and 4: at most 2 rounds)."""
    rng = random.Random(seed)
    steps = {kind: rng.sample(range(1, 7), rounds) for kind in ("explorer", "trainer", "engine")}
    saves = rng.sample([2, 4], rounds)
    trials = []
    for i in range(rounds):
        trials += [
            ("explorer", f"explorer@step={steps['explorer'][i]}"),
            ("trainer", f"trainer@step={steps['trainer'][i]}"),
            ("trainer", f"trainer@save={saves[i]}"),
            ("vllm-engine", f"engine@step={steps['engine'][i]}"),
        ]
    return trials


TRIALS = _trials(2)


@pytest.mark.slow  # 8 runs of worker processes: ~6-8 min on the loaded 2-core machine
@pytest.mark.parametrize("kind, fault", TRIALS, ids=[f"{i}-{f}" for i, (_, f) in enumerate(TRIALS)])
def test_seeded_trials_kill_a_worker_kind_at_a_random_step_and_every_run_equals(undisturbed, monkeypatch, kind, fault):
    """Issue 57's "kill -9 of each worker kind at a random step in many trials (seeded)": each trial kills one
    worker (an explorer, the trainer as a step or a checkpoint reaches it, an explorer's engine process: the
    lean stand-in of engine_doubles.py) and the healed run must equal the undisturbed one, with one restart of
    that kind. ``benchmarks/restart_explorer.py`` measures what each kind costs."""
    root, args = undisturbed
    name = f"trial-{TRIALS.index((kind, fault))}"
    engine = [f"rollout.engine={DOUBLES}:DyingEngine", "rollout.engine_process=true"] if kind == "vllm-engine" else []
    monkeypatch.setenv(VARIABLE, fault)
    assert main(["train", *args, *engine, PROCESSES, f"run_name={name}"]) == 0
    restarts = json.loads((root / name / "summary.json").read_text())["restarts"]
    assert [r["kind"] for r in restarts] == [kind], restarts
    assert_same_as_undisturbed(root, name)
