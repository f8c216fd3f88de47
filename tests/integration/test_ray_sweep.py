"""``oprl sweep --backend ray`` (#57 item 3) on a real local Ray: a run that always fails is reported after its
retries (default suite: its attempts stop at the config, seconds each); the runs as Ray tasks give the local
pool's results.csv, and a run that fails once is tried again and finishes (``-m slow``: about 50 s on the loaded
2-core development machine, most of it two processes importing torch per pool). The retry loop itself, on a fake
cluster: tests/experiments/test_sweep_ray.py."""

import csv
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml

from conftest import SMALL
from oprl.errors import OprlError
from oprl.experiments import sweep

ray = pytest.importorskip("ray")

GRPO, NOIS, BROKEN = (f"preset={p}__seed=0" for p in ("grpo", "rec-oneside-nois", "reinforce"))


@pytest.fixture
def ray_two_cpus():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def rows(path):
    """results.csv's rows by run, without ``seconds`` (wall time: the one column a rerun changes)."""
    table = {}
    for row in csv.DictReader(path.open()):
        row.pop("seconds")
        table[f"preset={row['preset']}__seed={row['seed']}"] = row
    return table


def write_spec(tmp_path, presets):
    spec = tmp_path / "sweep.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "output_dir": str(tmp_path / "local"),
                "parallel": 2,
                "overrides": [*SMALL, "steps=3", "eval.interval=0", "tensorboard=false"],
                "grid": {"algorithm.preset": presets, "seed": [0]},
            }
        )
    )
    return spec


def test_a_run_that_always_fails_on_ray_is_reported_after_its_retries(tmp_path, monkeypatch, capsys):
    """The sweep starts its own Ray (none is running) and stops it; each attempt is a Ray task running
    ``oprl train`` with the injected typo, so it fails at the config, as a real typo would."""
    spec = write_spec(tmp_path, ["reinforce"])
    monkeypatch.setenv("OPRL_SWEEP_FAULT", f"{BROKEN}@9")
    with pytest.raises(OprlError, match=rf"^sweep: 1 run\(s\) failed, see their logs in .*: {BROKEN}$"):
        sweep.main([str(spec), "--backend", "ray", "--retries", "1"])
    console = capsys.readouterr().out
    assert "ray: 1 node(s)" in console and f"run {BROKEN} failed on node " in console
    assert "(exit 2); trying again (retry 1 of 1)" in console and "(exit 2) after 2 attempts; see " in console
    assert not ray.is_initialized()  # the sweep's own Ray, stopped
    log = (tmp_path / "local" / "logs" / f"{BROKEN}.log").read_text()
    assert log.count("unknown key 'sweep_fault'") == 2
    assert "# oprl sweep: attempt 1 of 2 on node " in log and "# oprl sweep: attempt 2 of 2 on node " in log
    assert (tmp_path / "local" / "results.csv").read_text().count("\n") == 1  # the header: no finished run


@pytest.mark.slow
def test_a_ray_sweep_equals_the_local_pool_and_retries_a_failed_run(tmp_path, monkeypatch, capsys, ray_two_cpus):
    """The sweep on the test's Ray (``num_cpus=2``, two runs at once as the local pool's ``parallel: 2``)."""
    spec = write_spec(tmp_path, ["grpo", "rec-oneside-nois", "reinforce"])
    assert sweep.main([str(spec), "--only", "preset=grpo,rec-oneside-nois"]) == 0
    # On Ray: the second run's first attempt fails (an injected typo), the third run's every attempt.
    monkeypatch.setenv("OPRL_SWEEP_FAULT", f"{NOIS}@1,{BROKEN}@9")
    capsys.readouterr()
    with pytest.raises(OprlError, match=rf"^sweep: 1 run\(s\) failed, see their logs in .*: {BROKEN}$"):
        sweep.main([str(spec), "--backend", "ray", "--out", str(tmp_path / "ray")])
    console = capsys.readouterr().out
    assert "on Ray, 1 CPU(s) each, a failed run tried again up to 1 time(s)" in console
    assert f"run {NOIS} failed on node " in console and "(exit 2); trying again (retry 1 of 1)" in console
    assert f"run {BROKEN} failed on node " in console and "(exit 2) after 2 attempts" in console
    assert ray.is_initialized()  # the test's Ray, left as it was found
    local, on_ray = rows(tmp_path / "local" / "results.csv"), rows(tmp_path / "ray" / "results.csv")
    assert set(on_ray) == {GRPO, NOIS} and on_ray == local
    log = (tmp_path / "ray" / "logs" / f"{NOIS}.log").read_text()
    assert log.index("attempt 1 of 2") < log.index("unknown key 'sweep_fault'") < log.index("attempt 2 of 2")


@pytest.mark.slow
def test_sigterm_to_a_ray_sweep_stops_its_runs(tmp_path):
    """``kill <sweep pid>``: the runs in flight get SIGTERM and stop at a step boundary (their tasks cancelled),
    the sweep exits 143 with its one line, and no ``oprl train`` of the sweep is left running. Ray's own SIGTERM
    handler (exit 1 from inside ``ray.wait``) does not replace the sweep's."""
    spec = write_spec(tmp_path, ["grpo"])
    base = yaml.safe_load(spec.read_text())
    base["overrides"] = [o for o in base["overrides"] if not o.startswith("steps=")] + ["steps=100000"]
    spec.write_text(yaml.safe_dump(base))
    command = [sys.executable, "-m", "oprl.cli", "sweep", str(spec), "--backend", "ray"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        metrics = tmp_path / "local" / GRPO / "metrics.jsonl"
        while not (metrics.is_file() and metrics.stat().st_size):  # the run is training
            assert proc.poll() is None and time.monotonic() < deadline, "the sweep's run never trained"
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 128 + signal.SIGTERM, err
        assert "sweep interrupted by SIGTERM" in err and "Traceback" not in err
        assert "interrupted by SIGTERM at step" in (tmp_path / "local" / "logs" / f"{GRPO}.log").read_text()
        left = subprocess.run(["pgrep", "-f", f"output_dir={tmp_path}"], capture_output=True, text=True).stdout
        assert not left.split(), f"oprl train still running: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_a_run_whose_node_is_lost_is_tried_again_on_the_survivor_from_its_checkpoint(tmp_path):
    """Two worker nodes of 1 CPU (``ray.cluster_utils.Cluster``, the head holds none); the node running the run is
    removed after its first checkpoint: Ray reports the task lost (NodeDiedError), the sweep submits it again,
    and the retry continues from the checkpoint on the other node; every step's row once."""
    from ray.cluster_utils import Cluster

    from oprl.metrics import read_metrics

    spec = write_spec(tmp_path, ["grpo"])
    base = yaml.safe_load(spec.read_text())
    base["overrides"] = [o for o in base["overrides"] if not o.startswith("steps=")]
    base["overrides"] += ["steps=300", "checkpoint.interval=10", "checkpoint.keep=2"]
    spec.write_text(yaml.safe_dump(base))
    checks = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "_system_config": checks})
    nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]
    cluster.wait_for_nodes()
    command = [sys.executable, "-m", "oprl.cli", "sweep", str(spec), "--backend", "ray", "--address", cluster.address]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        run_dir, deadline = tmp_path / "local" / GRPO, time.monotonic() + 240
        while not (run_dir / "checkpoints").is_dir() or not any((run_dir / "checkpoints").glob("step-*")):
            assert proc.poll() is None and time.monotonic() < deadline, "the run never checkpointed"
            time.sleep(0.2)
        log = tmp_path / "local" / "logs" / f"{GRPO}.log"
        (first,) = re.findall(r"attempt 1 of 2 on node (\w+)", log.read_text())
        cluster.remove_node(next(n for n in nodes if n.node_id.startswith(first)))
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out
        assert f"run {GRPO} failed (NodeDiedError: " in out and "trying again (retry 1 of 1)" in out
        assert f"run {GRPO}: continues from its last checkpoint" in out
        (second,) = re.findall(r"attempt 2 of 2 on node (\w+)", log.read_text())
        assert second != first
        assert [row["step"] for row in read_metrics(run_dir / "metrics.jsonl")] == list(range(301))
    finally:
        if proc.poll() is None:
            proc.kill()
        cluster.shutdown()
