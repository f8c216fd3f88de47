"""oprl.experiments.declared in a temporary git repository with dated commits: a finding committed before its runs is
"declared before data", one committed after them (or after a run that its commit bound says had started) is
"exploratory (declared after k of n runs)", a changed margin is a new declaration, kept run directories are dated
by the commit that added them, and a spec outside git says so."""

import csv
import json
import os
import subprocess

import pytest
import yaml

from oprl.experiments import declared, findings, report

SEEDS = ("0", "1", "2")
VALUES = {"grpo": [0.60, 0.62, 0.61], "reinforce": [0.10, 0.12, 0.11], "m2po": [0.58, 0.63, 0.60]}


def git(repo, *args, date=None):
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    if date:
        env |= {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env)


def commit(repo, message, date):
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message, date=date)


def spec(findings_: dict) -> dict:
    return {"output_dir": "runs/s", "grid": {"algorithm.preset": list(VALUES), "setting": {"lag-4": {}},
            "seed": [0, 1, 2]}, "report": {"findings": findings_}}  # fmt: skip


def write_results(path, methods, seconds=60.0):
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["run", "preset", "setting", "seed", "final_accuracy", "accuracy_auc", "seconds"])
        for method in methods:
            for seed, value in zip(SEEDS, VALUES[method], strict=True):
                writer.writerow([f"{method}-{seed}", method, "lag-4", seed, value, value, seconds])


F2 = {"a": "grpo", "b": "reinforce", "setting": "lag-4"}
LATE = {"a": "m2po", "b": "reinforce", "setting": "lag-4"}


@pytest.fixture
def repo(tmp_path):
    git(tmp_path, "init", "-q")
    return tmp_path


def test_a_finding_committed_after_its_runs_is_exploratory(repo):
    """F2 is declared at 10:00, its runs committed at 12:00 (each took a minute): declared before data. LATE is
    added at 13:00, after every run it uses: exploratory, 6 of 6. The sweep's copy of the spec (written when the
    report's sweep started) is committed last of all: the source's history dates the claims, not the copy's."""
    source = repo / "configs" / "s.yaml"
    source.parent.mkdir()
    source.write_text(yaml.safe_dump(spec({"F2": [F2]})))
    commit(repo, "declare F2", "2026-12-06T10:00:00+00:00")
    write_results(repo / "out" / "results.csv", VALUES)
    commit(repo, "runs", "2026-12-06T12:00:00+00:00")
    source.write_text(yaml.safe_dump(spec({"F2": [F2], "LATE": [LATE]})))
    commit(repo, "declare LATE", "2026-12-06T13:00:00+00:00")
    (repo / "out" / "sweep.yaml").write_text(source.read_text())
    commit(repo, "the copy", "2026-12-06T14:00:00+00:00")

    text = report.build_report(repo / "out").read_text()
    assert "- **F2**: holds (robust; declared before data, commit" in text and "2026-12-06 10:00 UTC" in text
    assert "- **LATE**: holds (" in text and "exploratory (declared after 6 of 6 runs)" in text
    rows = {r["finding"]: r for r in csv.DictReader((repo / "out" / "findings.csv").open())}
    assert rows["F2"]["declaration"] == "declared before data" and rows["F2"]["runs_before"] == "0"
    assert rows["LATE"]["runs"] == "6" and rows["LATE"]["declared_at"] == "2026-12-06T13:00:00+00:00"


def test_a_run_that_had_started_before_the_declaration_counts_even_if_committed_after(repo):
    """A run committed at 12:00 that took 3 hours had started by 09:00: a claim committed at 10:00 came after it."""
    source = repo / "s.yaml"
    source.write_text(yaml.safe_dump(spec({"F2": [F2]})))
    commit(repo, "declare", "2026-12-06T10:00:00+00:00")
    write_results(repo / "out" / "results.csv", ["grpo", "reinforce"], seconds=3 * 3600.0)
    (repo / "out" / "sweep.yaml").write_text(source.read_text())
    commit(repo, "runs", "2026-12-06T12:00:00+00:00")
    text = report.build_report(repo / "out").read_text()
    assert "exploratory (declared after 6 of 6 runs)" in text


def test_a_changed_margin_is_a_new_declaration_and_an_uncommitted_one_is_undated(repo):
    source = repo / "s.yaml"
    first = {"F1": [{"a": "m2po", "b": "grpo", "setting": "lag-4", "margin": 0.05}]}
    source.write_text(yaml.safe_dump(spec(first)))
    commit(repo, "declare", "2026-12-06T10:00:00+00:00")
    first["F1"][0]["margin"] = 0.1
    source.write_text(yaml.safe_dump(spec(first)))
    commit(repo, "widen the margin", "2026-12-06T15:00:00+00:00")
    (contrast,) = findings.parse(first, "s")["F1"]
    assert declared.declarations(source, [contrast])[contrast].at.hour == 15  # not 10: the claim changed
    first["F1"][0]["margin"] = 0.2  # in the working tree only
    (edited,) = findings.parse(first, "s")["F1"]
    assert declared.declarations(source, [edited])[edited] == declared.Declared(
        None, None, "not in any commit of s.yaml"
    )


def test_kept_run_directories_are_dated_by_the_commit_that_added_them(repo):
    for index, run in enumerate(["a", "b"]):
        (repo / "kept" / run).mkdir(parents=True)
        (repo / "kept" / run / "summary.json").write_text(json.dumps({"seconds": 60.0}))
        commit(repo, f"kept run {run}", f"2026-12-06T1{index}:00:00+00:00")
    (repo / "kept" / "a" / "summary.json").write_text(json.dumps({"seconds": 61.0}))
    commit(repo, "a again", "2026-12-06T18:00:00+00:00")  # a later edit does not move the date
    dates = declared.run_dates(repo / "kept")
    assert {run: date.hour for run, date in dates.items()} == {"a": 10, "b": 11}


def test_a_spec_outside_git_says_so(tmp_path):
    assert declared.source_spec(tmp_path, spec({})) == (None, "the spec is not in git")
    (contrast,) = findings.parse({"F2": [F2]}, "s")["F2"]
    status = declared.status([declared.declarations(None, [contrast], "the spec is not in git")[contrast]], [], {})
    assert status.label == "undated (the spec is not in git)"


def test_a_recorded_start_dates_a_run_before_its_commit_does(tmp_path):
    """A run's metrics.jsonl records when it started (perf/wall_time, metrics.MetricsLogger): a run committed
    after the declaration but started before it makes the finding exploratory, which the commit bound (commit less
    seconds) cannot see when the run's seconds are short of the gap (a resumed run's pauses are not in its seconds)."""
    from datetime import datetime, timezone

    from oprl.metrics import MetricsLogger

    (tmp_path / "grpo-0").mkdir()
    logger = MetricsLogger(tmp_path / "grpo-0", tensorboard=False)
    logger.log(0, {"eval/accuracy": 0.5})
    logger.close(quiet=True)
    (tmp_path / "grpo-0" / "metrics.jsonl").open("a").write("torn")
    started = declared.recorded_starts(tmp_path)
    assert abs(started["grpo-0"].timestamp() - datetime.now(timezone.utc).timestamp()) < 60
    at = datetime(2026, 12, 7, 12, tzinfo=timezone.utc)
    when = declared.Declared("c0ffee", at)
    committed = {"grpo-0": datetime(2026, 12, 7, 13, tzinfo=timezone.utc)}  # committed an hour after the declaration
    run = [("grpo-0", 60.0)]
    assert declared.status([when], run, committed).label == declared.BEFORE  # by the commit bound alone
    early = {"grpo-0": datetime(2026, 12, 7, 11, tzinfo=timezone.utc)}
    assert declared.status([when], run, committed, early).label == "exploratory (declared after 1 of 1 runs)"
    assert declared.status([when], run, {}, early).label == "exploratory (declared after 1 of 1 runs)"
