"""The experiment harness: a smoke sweep (2 presets x 2 settings x 1 seed), resumption, the report."""

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import SMALL
from oprl import cli
from oprl.errors import OprlError
from oprl.experiments import report, sweep, sweep_local, sweep_spec
from oprl.metrics import deterministic_view, read_metrics


def write_spec(tmp_path, **extra):
    spec = {
        "output_dir": str(tmp_path / "sweep"),
        "parallel": 2,
        "overrides": [*SMALL, "steps=3", "eval.interval=0", "tensorboard=false"],
        "grid": {
            "algorithm.preset": ["grpo", "rec-oneside-nois"],
            "setting": {
                "on-policy": {"sync.interval": 1, "sync.offset": 0},
                "offline": {"sync.interval": 300, "sync.offset": 199},
            },
            "seed": [0],
        },
    } | extra
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_plan_is_the_cartesian_product(tmp_path):
    runs = sweep_spec.plan(sweep_spec.load_spec(write_spec(tmp_path)))
    assert len(runs) == 4
    assert {r.labels["setting"] for r in runs} == {"on-policy", "offline"}
    offline = next(r for r in runs if r.labels == {"algorithm.preset": "grpo", "setting": "offline", "seed": "0"})
    assert "sync.interval=300" in offline.overrides and "algorithm.preset=grpo" in offline.overrides
    assert len({r.name for r in runs}) == 4


def test_smoke_sweep_resumes_and_reports(tmp_path, capsys):
    kept = tmp_path / "kept"  # what a user commits: the runs' light files (keep:)
    spec = write_spec(
        tmp_path,
        report={
            "groups": {"clipping or not": ["grpo", "rec-oneside-nois"]},
            "threshold_gain": 0.01,
            "panels": ["eval_accuracy", "kl", "clip_fraction", "ess"],
        },
        keep=str(kept),
    )
    base = yaml.safe_load(spec.read_text())
    base["overrides"].append("algorithm.log_ref_kl_every=1")
    spec.write_text(yaml.safe_dump(base))
    assert sweep.main([str(spec)]) == 0
    out = tmp_path / "sweep"
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 4
    assert {(r["preset"], r["setting"]) for r in rows} == {
        ("grpo", "on-policy"),
        ("grpo", "offline"),
        ("rec-oneside-nois", "on-policy"),
        ("rec-oneside-nois", "offline"),
    }
    assert all(0.0 <= float(r["final_accuracy"]) <= 1.0 for r in rows)
    # Runs share long-lived worker processes; each must still equal the same run started fresh.
    first = sweep_spec.plan(sweep_spec.load_spec(spec))[-1]
    assert (
        cli.main(["train", *first.overrides, f"output_dir={tmp_path / 'fresh'}", "run_name=x", "progress=false"]) == 0
    )
    fresh = read_metrics(tmp_path / "fresh" / "x" / "metrics.jsonl")
    assert deterministic_view(fresh) == deterministic_view(read_metrics(out / first.name / "metrics.jsonl"))
    # A second invocation finds everything finished and runs nothing.
    capsys.readouterr()
    assert sweep.main([str(spec)]) == 0
    assert "4 already finished, 0 to run" in capsys.readouterr().out
    # keep: every finished run's light files, and nothing heavy; a machine that lost the run directories resumes
    # from them: nothing runs again and the table is the same.
    assert sorted(p.name for p in (kept / first.name).iterdir()) == sorted(sweep.KEPT_FILES)
    table = (out / "results.csv").read_text()
    shutil.rmtree(out)
    assert sweep.main([str(spec)]) == 0
    assert "4 finished run(s) restored" in capsys.readouterr().out
    assert (out / "results.csv").read_text() == table
    assert report.main([str(out)]) == 0
    text = (out / "report.md").read_text()
    assert "| grpo |" in text and "offline" in text and "on-policy" in text
    assert "(1 seed)" in text and "± 0.000" not in text  # one seed has no spread to report
    assert (out / "figures" / "eval_accuracy.png").stat().st_size > 1000
    assert (out / "figures" / "train_reward.png").is_file()
    assert (out / "figures" / "kl_initial.png").is_file()  # logged because of algorithm.log_ref_kl_every
    assert "initial + 0.01" in text  # report.threshold_gain
    assert "## clipping or not" in text and (out / "figures" / "group-1.png").stat().st_size > 1000
    # The kept directory is a sweep of its own (its sweep.yaml beside the runs): a fresh clone reports from it.
    assert report.main([str(kept)]) == 0
    assert (kept / "results.csv").read_text() == table and "## clipping or not" in (kept / "report.md").read_text()
    # Part of a sweep: a group's preset the sweep plans but has not finished is named, not an error; one it never
    # plans (a typo) is.
    for run in kept.iterdir():
        if "preset=rec-oneside-nois" in run.name:
            shutil.rmtree(run)
    assert report.main([str(kept)]) == 0
    assert "Not finished yet: rec-oneside-nois." in (kept / "report.md").read_text()
    spec_kept = yaml.safe_load((kept / "sweep.yaml").read_text())
    spec_kept["report"]["groups"] = {"typo": ["grpo", "rec-onside-nois"]}
    (kept / "sweep.yaml").write_text(yaml.safe_dump(spec_kept))
    with pytest.raises(OprlError, match="rec-onside-nois"):
        report.build_report(kept)


def test_bad_specs_fail_with_one_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("grid: {}\n")
    with pytest.raises(OprlError, match="grid"):
        sweep_spec.load_spec(path)
    path.write_text("grid: {seed: [0]}\nparalel: 2\n")
    with pytest.raises(OprlError, match="paralel"):
        sweep_spec.load_spec(path)
    path.write_text("grid: {seed: [0]}\nreport: {groups: {a: []}}\n")
    with pytest.raises(OprlError, match=r"report\.groups"):
        sweep_spec.load_spec(path)
    path.write_text("grid: {seed: [0]}\nreport: {panels: [eval_accuracy, kl_behaviour]}\n")
    with pytest.raises(OprlError, match=r"report\.panels.*ess"):
        sweep_spec.load_spec(path)
    with pytest.raises(OprlError, match="no finished runs"):
        report.build_report(tmp_path)


def test_sigterm_to_the_sweep_stops_its_runners(tmp_path):
    """``kill <sweep pid>`` (SIGTERM to the sweep alone, as a job scheduler sends it) stops the runs in flight
    and their runner processes; before, the runners ran on, orphaned, to the end of their runs."""
    spec = write_spec(tmp_path, parallel=1)
    base = yaml.safe_load(spec.read_text())
    base["overrides"] = [o for o in base["overrides"] if not o.startswith("steps=")] + ["steps=100000"]
    spec.write_text(yaml.safe_dump(base))
    proc = subprocess.Popen([sys.executable, "-m", "oprl.cli", "sweep", str(spec)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        metrics = list((tmp_path / "sweep").glob("*/metrics.jsonl"))
        while not any(m.stat().st_size for m in metrics):  # a run is training
            assert proc.poll() is None and time.monotonic() < deadline, "the sweep's first run never trained"
            time.sleep(0.5)
            metrics = list((tmp_path / "sweep").glob("*/metrics.jsonl"))
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert children, "the sweep has no runner process"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 128 + signal.SIGTERM
        assert "sweep interrupted by SIGTERM" in err and "Traceback" not in err
        for pid in children:  # gone, not orphaned
            for _ in range(100):
                if not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]:
                    break
                time.sleep(0.1)
            else:
                os.kill(int(pid), signal.SIGKILL)
                raise AssertionError(f"sweep runner {pid} still running after the sweep was stopped")
    finally:
        if proc.poll() is None:
            proc.kill()


def test_an_unfinished_run_with_a_checkpoint_continues_from_it(tmp_path, capsys):
    """A sweep of hours is interrupted mid-run (a session ends): the next invocation resumes that run from its
    last checkpoint (``resume=true``) instead of clearing it, and the rows equal an uninterrupted run's."""
    spec = write_spec(tmp_path, parallel=1)
    base = yaml.safe_load(spec.read_text())
    base["overrides"] = [o for o in base["overrides"] if not o.startswith("steps=")]
    base["overrides"] += ["steps=4", "checkpoint.interval=2", "checkpoint.keep=2"]
    base["grid"] = {"algorithm.preset": ["grpo"], "seed": [0]}
    spec.write_text(yaml.safe_dump(base))
    assert sweep.main([str(spec)]) == 0
    (run,) = sweep_spec.plan(sweep_spec.load_spec(spec))
    run_dir = tmp_path / "sweep" / run.name
    whole = deterministic_view(read_metrics(run_dir / "metrics.jsonl"))
    # What a kill after step 3 leaves: the checkpoint of step 2, no summary, no final weights.
    (run_dir / "summary.json").unlink()
    shutil.rmtree(run_dir / "checkpoints" / "step-000004")
    shutil.rmtree(run_dir / "final")
    capsys.readouterr()
    assert sweep.main([str(spec)]) == 0
    assert "continues from its last checkpoint" in capsys.readouterr().out
    assert (run_dir / "summary.json").is_file()
    assert deterministic_view(read_metrics(run_dir / "metrics.jsonl")) == whole


def test_a_runner_older_than_the_source_hands_its_run_back(tmp_path):
    """A runner whose oprl source changed since it imported it (a sweep of hours beside development) answers the
    next job with ``{"stale": true}`` and exits instead of running it: its workers would import the new code and
    the run would mix two versions (every run of a sweep once failed so, a config class having moved)."""
    stamps = "iter([1.0, 2.0]).__next__"  # imported at 1.0, the source on disk is newer at the first job
    code = f"import oprl.experiments.sweep_runner as r; r.source_stamp = {stamps}; raise SystemExit(r.main())"
    job = {"argv": ["config"], "log": str(tmp_path / "run.log")}
    done = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(job) + "\n", capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and json.loads(done.stdout) == {"stale": True}
    assert not (tmp_path / "run.log").exists()  # nothing ran


def test_the_sweep_gives_a_stale_runners_run_to_a_fresh_runner(tmp_path, monkeypatch):
    """``oprl sweep``'s side: a stale answer is not a failure; the run goes to a new runner and finishes."""
    answers = iter([None, 0])  # the first runner is stale, the second runs it
    started = []

    class FakeRunner:
        def __init__(self, env):
            started.append(self)
            read, write = os.pipe()
            os.write(write, b"\n")  # readable at once for the sweep's selector
            os.close(write)
            self.stdout = os.fdopen(read)
            self.answer = next(answers)

        def start(self, argv, log_path):
            pass

        def result(self):
            return self.answer

        def alive(self):
            return True

        def close(self, stop=False):
            self.stdout.close()

    monkeypatch.setattr(sweep_local, "_Runner", FakeRunner)
    run = sweep_spec.PlannedRun(name="a", labels={"seed": "0"}, overrides=())
    failures = sweep._execute([run], {}, tmp_path, 1, log=lambda *_: None)
    assert failures == [] and len(started) == 2


def test_the_local_pool_tries_a_failed_run_again(tmp_path, monkeypatch, capsys):
    """``retries`` on the local pool (as on Ray): a run that fails is given again, with a line and a header in its
    log where the retry's output begins; one still failing after its retries is named in the sweep's one-line
    error, and the others finish. Failures injected through ``oprl train`` itself (``OPRL_SWEEP_FAULT``)."""
    spec = write_spec(tmp_path, parallel=1, retries=1)
    base = yaml.safe_load(spec.read_text())
    base["overrides"] = [o for o in base["overrides"] if not o.startswith("steps=")] + ["steps=2"]
    base["grid"] = {"algorithm.preset": ["grpo", "reinforce"], "seed": [0]}
    spec.write_text(yaml.safe_dump(base))
    flaky, broken = (r.name for r in sweep_spec.plan(sweep_spec.load_spec(spec)))
    monkeypatch.setenv("OPRL_SWEEP_FAULT", f"{flaky}@1,{broken}@2")
    with pytest.raises(OprlError, match=f"1 run\\(s\\) failed, see their logs in .*: {broken}$"):
        sweep.main([str(spec)])
    out = capsys.readouterr().out
    logs = tmp_path / "sweep" / "logs"
    assert f"run {flaky} failed (exit 2); trying again (retry 1 of 1); see {logs / flaky}.log" in out
    assert f"run {broken} failed (exit 2) after 2 attempts; see {logs / broken}.log" in out
    assert (tmp_path / "sweep" / flaky / "summary.json").is_file()
    assert not (tmp_path / "sweep" / broken / "summary.json").exists()
    log = (logs / f"{flaky}.log").read_text()
    assert "sweep_fault" in log.split("# oprl sweep: attempt 2 of 2")[0]  # the first attempt's error stays
