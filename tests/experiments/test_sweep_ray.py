"""``oprl sweep --backend ray`` (#57 item 3) without a cluster: the retry loop on a fake cluster (bounded retries,
the resume rule made again before each attempt, at most the cluster's capacity in flight, cancel on interrupt),
fault injection, and the backend options' one-line errors. The runs on a real Ray:
tests/integration/test_ray_sweep.py."""

import pytest
import yaml

from oprl import cli
from oprl.errors import OprlError
from oprl.experiments import sweep, sweep_spec

sweep_ray = pytest.importorskip("oprl.experiments.sweep_ray")


class FakeCluster:
    """``RayCluster``'s methods: each submitted attempt ends with the next exit code of its run's list (None: the
    task was lost), all at the next ``ready``, or one at a time with ``one_at_a_time``."""

    cpus_per_run = 1.0

    def __init__(self, answers, slots=2, one_at_a_time=False, on_submit=None):
        self.answers, self.slots, self.one_at_a_time = answers, slots, one_at_a_time
        self.on_submit = on_submit
        self.submitted, self.flying, self.most_flying, self.cancelled = [], set(), 0, None

    def capacity(self):
        return self.slots

    def describe(self):
        return f"1 node(s), {self.slots} CPUs, up to {self.slots} runs at once"

    def submit(self, argv, log, env, header):
        name = next(a for a in argv if a.startswith("run_name=")).partition("=")[2]
        self.submitted.append((name, argv, header))
        if self.on_submit:
            self.on_submit(name, argv)
        ref = len(self.submitted)
        self.flying.add(ref)
        self.most_flying = max(self.most_flying, len(self.flying))
        return ref

    def ready(self, refs, timeout):
        done = sorted(refs)[:1] if self.one_at_a_time else list(refs)
        self.flying -= set(done)
        return done

    def result(self, ref):
        name, argv, _ = self.submitted[ref - 1]
        rc = 2 if sweep_ray.FAULT_OVERRIDE in argv else self.answers[name].pop(0)
        if rc is None:
            return sweep_ray.Attempt(rc=None, cause="WorkerCrashedError: the worker died")
        return sweep_ray.Attempt(rc=rc, node="ab12cd34 at 10.0.0.2", cause=f"exit {rc}")

    def cancel(self, refs):
        self.cancelled = list(refs)

    def close(self):
        pass


def runs(*names):
    return [sweep_spec.PlannedRun(name=n, labels={"seed": "0"}, overrides=()) for n in names]


def execute(cluster, todo, tmp_path, retries=1, lines=None):
    return sweep_ray.execute(
        todo,
        cluster=cluster,
        prepare=lambda run: sweep._prepare(run, {}, tmp_path, lambda line: None),
        log_path=lambda name: tmp_path / "logs" / f"{name}.log",
        retries=retries,
        log=(lines if lines is not None else []).append,
    )


def test_a_failed_run_is_tried_again_and_a_run_that_keeps_failing_is_reported(tmp_path):
    cluster, lines = FakeCluster({"a": [1, 0], "b": [0], "c": [1, None, 3]}), []
    assert execute(cluster, runs("a", "b", "c"), tmp_path, retries=2, lines=lines) == ["c"]
    headers = {n: [h for name, _, h in cluster.submitted if name == n] for n in "abc"}
    assert headers == {
        "a": ["attempt 1 of 3", "attempt 2 of 3"],
        "b": ["attempt 1 of 3"],
        "c": ["attempt 1 of 3", "attempt 2 of 3", "attempt 3 of 3"],
    }
    first = "run a failed on node ab12cd34 at 10.0.0.2 (exit 1); trying again (retry 1 of 2); see "
    assert lines[0] == first + str(tmp_path / "logs" / "a.log")
    # A lost task (its worker or node died) counts against the same budget; the last failure names the attempts.
    assert any("run c failed (WorkerCrashedError: the worker died); trying again (retry 2 of 2)" in x for x in lines)
    assert lines[-1].startswith("run c failed on node ab12cd34 at 10.0.0.2 (exit 3) after 3 attempts; see ")


def test_no_retries_means_one_attempt(tmp_path):
    cluster = FakeCluster({"a": [1]})
    assert execute(cluster, runs("a"), tmp_path, retries=0) == ["a"] and len(cluster.submitted) == 1


def test_a_retry_continues_from_the_checkpoint_its_failed_attempt_committed(tmp_path):
    """The resume rule is the local sweep's (``sweep._prepare``), made again before every attempt: the first
    attempt clears the run's leftovers, the retry of an attempt that died after a checkpoint resumes from it."""
    (tmp_path / "a" / "junk").mkdir(parents=True)  # an unfinished run without a checkpoint: cleared

    def train(name, argv):
        assert not (tmp_path / "a" / "junk").exists()
        (tmp_path / "a" / "checkpoints" / "step-000002").mkdir(parents=True, exist_ok=True)

    cluster = FakeCluster({"a": [1, 0]}, on_submit=train)
    assert execute(cluster, runs("a"), tmp_path) == []
    first, second = (argv for _, argv, _ in cluster.submitted)
    assert "resume=true" not in first and second[-1] == "resume=true"


def test_no_more_runs_in_flight_than_the_cluster_holds(tmp_path):
    cluster = FakeCluster({n: [0] for n in "abcde"}, slots=2, one_at_a_time=True)
    assert execute(cluster, runs(*"abcde"), tmp_path) == [] and cluster.most_flying == 2


def test_an_interrupted_sweep_cancels_the_attempts_in_flight(tmp_path):
    class Interrupted(FakeCluster):
        def ready(self, refs, timeout):
            raise KeyboardInterrupt

    cluster = Interrupted({"a": [0], "b": [0], "c": [0]})
    with pytest.raises(KeyboardInterrupt):
        execute(cluster, runs("a", "b", "c"), tmp_path)
    assert cluster.cancelled == [1, 2]


def test_injected_faults_fail_the_first_attempts_through_oprl_train(tmp_path, monkeypatch):
    monkeypatch.setenv(sweep_ray.FAULT_VARIABLE, "preset=grpo__seed=0@1,b@2")
    assert sweep_ray.faults() == {"preset=grpo__seed=0": 1, "b": 2}
    cluster = FakeCluster({"a": [0], "b": [0]})
    assert execute(cluster, runs("a", "b"), tmp_path, retries=2) == []
    injected = [(name, sweep_ray.FAULT_OVERRIDE in argv) for name, argv, _ in cluster.submitted]
    assert injected == [("a", False), ("b", True), ("b", True), ("b", False)]
    with pytest.raises(OprlError, match="OPRL_SWEEP_FAULT='b': expected RUN@ATTEMPTS"):
        sweep_ray.faults("b")


def test_every_attempt_gets_the_drivers_oprl_settings_and_threads_for_its_cpus(monkeypatch):
    monkeypatch.setenv("OPRL_CACHE_DIR", "/shared/cache")
    monkeypatch.setenv(sweep_ray.FAULT_VARIABLE, "a@1")  # the driver's, not the runs'
    env = sweep_ray.forwarded_env(4.0)
    assert env["OPRL_CACHE_DIR"] == "/shared/cache" and sweep_ray.FAULT_VARIABLE not in env
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "4"
    assert sweep_ray.forwarded_env(0.5)["OMP_NUM_THREADS"] == "1"


def write(tmp_path, **extra):
    spec = {"output_dir": str(tmp_path / "out"), "grid": {"algorithm.preset": ["grpo", "reinforce"], "seed": [0]}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec | extra))
    return path


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("backend", "slurm", "'backend' must be one of local, ray, not 'slurm'"),
        ("retries", -1, "'retries' must be a whole number >= 0"),
        ("retries", True, "'retries' must be a whole number >= 0"),
        ("cpus_per_run", 0, "'cpus_per_run' must be a number > 0"),
    ],
)
def test_bad_backend_options_fail_with_one_line_naming_the_key(tmp_path, capsys, key, value, message):
    path = write(tmp_path, **{key: value})
    with pytest.raises(OprlError, match=f"^sweep spec {path}: {message}"):
        sweep_spec.load_spec(path)
    assert cli.main(["sweep", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and message in err


def test_address_needs_the_ray_backend(tmp_path):
    with pytest.raises(OprlError, match="--address ray://head:10001: only with --backend ray"):
        sweep.main([str(write(tmp_path)), "--address", "ray://head:10001", "--dry-run"])


def test_a_ray_dry_run_starts_no_ray(tmp_path, capsys):
    import ray

    assert sweep.main([str(write(tmp_path, retries=3)), "--backend", "ray", "--cpus-per-run", "2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "2 to run, on Ray, 2 CPU(s) each, a failed run tried again up to 3 time(s)" in out
    assert not ray.is_initialized() and not (tmp_path / "out").exists()


def test_the_sweep_exits_non_zero_with_one_line_naming_the_failed_run(tmp_path, monkeypatch, capsys):
    """The whole command on a fake cluster: ``backend: ray`` in the spec, a run failing every attempt."""
    cluster = FakeCluster({"preset=grpo__seed=0": [0], "preset=reinforce__seed=0": [1, 1]})
    monkeypatch.setattr(sweep_ray, "RayCluster", lambda address, cpus: cluster)
    path = write(tmp_path, backend="ray")
    assert cli.main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"error: sweep: 1 run(s) failed, see their logs in {tmp_path / 'out' / 'logs'}: preset=reinforce__seed=0"
    )
    assert len(cluster.submitted) == 3 and (tmp_path / "out" / "results.csv").is_file()
    assert yaml.safe_load((tmp_path / "out" / "sweep.yaml").read_text())["backend"] == "ray"
