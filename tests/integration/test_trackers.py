"""Experiment trackers: a run's metrics arrive in wandb (offline), MLflow (local file store) and trackio (local),
with the resolved config as the run's parameters; a tracker that fails never costs metrics.jsonl."""

import json
from pathlib import Path

import pytest

from oprl.cli import main
from oprl.config import load_config
from oprl.metrics import MetricsLogger, read_metrics
from oprl.trackers import start_trackers

pytest.importorskip("wandb")  # the test extra installs all three; a bare checkout skips rather than fails
pytest.importorskip("mlflow")
pytest.importorskip("trackio")


def wandb_records(path: Path):
    """Records of a wandb transaction log (.wandb): a 7-byte header, then LevelDB-style 32 KiB blocks of
    chunks (crc32c, little-endian length, type FULL=1 / FIRST=2 / MIDDLE=3 / LAST=4) holding protobufs."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, records, partial = 7, [], b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a chunk header is padding
            pos += 32768 - pos % 32768
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        partial += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(partial)
            records.append(record)
            partial = b""
    return records


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory, cache_dir):
    from conftest import SMALL

    root = tmp_path_factory.mktemp("tracked")
    patch = pytest.MonkeyPatch()
    patch.setenv("OPRL_CACHE_DIR", str(cache_dir))
    patch.setenv("TRACKIO_DIR", str(root / "trackio"))  # read when trackio is first imported: by this run
    overrides = [
        *SMALL,
        f"output_dir={root}",
        "run_name=tracked",
        "steps=2",
        "tracking.project=oprl-test",
        "tracking.backends=[wandb,mlflow,trackio]",
    ]
    assert main(["train", *overrides]) == 0
    patch.undo()
    run_dir = root / "tracked"
    return run_dir, read_metrics(run_dir / "metrics.jsonl"), load_config(run_dir / "config.yaml")


def expected_rewards(rows):
    return {r["step"]: r["reward/mean"] for r in rows if "reward/mean" in r}


def test_wandb_offline_receives_the_metrics_and_the_config(tracked_run):
    run_dir, rows, config = tracked_run
    (log,) = run_dir.glob("wandb/offline-run-*/run-tracked.wandb")
    history, params = [], {}
    for record in wandb_records(log):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
        elif kind == "run":
            params = {item.key: json.loads(item.value_json) for item in record.run.config.update}
    assert {h["step"]: h["reward/mean"] for h in history if "reward/mean" in h} == expected_rewards(rows)
    assert params["rollout"]["group_size"] == config.rollout.group_size == 4
    assert params["algorithm"]["preset"] == "grpo" and params["task"]["name"] == "arithmetic"


def test_mlflow_file_store_receives_the_metrics_and_the_config(tracked_run, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    run_dir, rows, _ = tracked_run
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("oprl-test").experiment_id])
    assert run.info.run_name == "tracked" and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "reward/mean")
    assert {m.step: m.value for m in history} == pytest.approx(expected_rewards(rows))
    assert run.data.params["rollout.group_size"] == "4" and run.data.params["algorithm.preset"] == "grpo"
    assert "eval/accuracy" in run.data.metrics


def test_trackio_receives_the_metrics_and_the_config(tracked_run):
    from trackio import context_vars
    from trackio.sqlite_storage import SQLiteStorage

    # Finished for trackio too: its exit hook finished the current run again and printed "Run finished.
    # Uploading logs to Trackio" at the end of the test suite (#42).
    assert context_vars.current_run.get() is None

    _, rows, _ = tracked_run
    logs = SQLiteStorage.get_logs("oprl-test", "tracked")
    assert {r["step"]: r["reward/mean"] for r in logs if "reward/mean" in r} == pytest.approx(expected_rewards(rows))
    config = SQLiteStorage.get_run_config("oprl-test", "tracked")
    assert config["rollout.group_size"] == 4 and config["task.name"] == "arithmetic"


def test_a_tracker_that_fails_is_one_line_and_metrics_jsonl_is_whole(tmp_path):
    tracking = load_config(None, ["tracking.backends=[mlflow]", "tracking.mlflow_uri=nosuchscheme://x"]).tracking
    warnings = []
    assert start_trackers(tracking, tmp_path, {"seed": 0}, warnings.append) == []
    assert len(warnings) == 1 and "tracking.backends: mlflow did not start" in warnings[0]
    assert "\n" not in warnings[0] and "metrics.jsonl" in warnings[0]

    class Broken:
        name = "broken"
        calls = 0

        def log(self, step, row):
            Broken.calls += 1
            raise ConnectionError("server went away")

        def close(self):
            raise ConnectionError("still away")

    logger = MetricsLogger(tmp_path, tensorboard=False, trackers=[Broken()], warn=warnings.append)
    for step in range(1, 4):
        logger.log(step, {"reward/mean": step / 10})
    logger.close()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    assert Broken.calls == 1 and "broken failed (ConnectionError: server went away); dropped" in warnings[1]
