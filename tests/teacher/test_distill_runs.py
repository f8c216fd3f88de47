"""Distillation end to end on the embedded model, with a teacher that is a checkpoint of a GRPO run of it: the
``distill`` preset trains, the store holds the teacher's log-probs (equal to a fresh prefill), worker processes
give the threads' numbers, resume keeps the teacher log-probs of the batches a checkpoint holds; off-policy:
stale data with REC's clip, and offline from a store scored once by ``oprl teacher-score`` (equal to scoring
on the fly, and to exploring with the teacher)."""

import json
import os
import shutil

import pyarrow.parquet as pq
import pytest

from oprl.checkpoint.store import read_parquet
from oprl.cli import main
from oprl.config import load_config
from oprl.metrics import deterministic_view, read_metrics
from oprl.rollout import Sampling
from oprl.runtime.launch import model_path
from oprl.tasks import build_task
from oprl.teacher import Teacher
from oprl.teacher.loading import load_teacher

pytestmark = pytest.mark.integration

FAST = ["tensorboard=false", "runtime.torch_threads=1", "eval.interval=0"]


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory, cache_dir):
    """A GRPO run of 2 steps with a checkpoint: its step-2 weights are the teacher."""
    os.environ["OPRL_CACHE_DIR"] = str(cache_dir)
    from conftest import SMALL

    root = tmp_path_factory.mktemp("distill")
    args = [*SMALL, *FAST, f"output_dir={root / 'runs'}"]
    assert main(["train", *args, "steps=2", "checkpoint.interval=2", "run_name=teacher"]) == 0
    teacher = root / "runs" / "teacher" / "checkpoints" / "step-000002"
    distill = [*args, "algorithm.preset=distill", f"teacher.path={teacher}"]
    return root, distill


@pytest.fixture(scope="module")
def distill_run(teacher_run):
    """The ``distill`` preset's run of 2 steps (threads), named ``distill``."""
    root, distill = teacher_run
    assert main(["train", *distill, "steps=2", "run_name=distill"]) == 0
    return root


def rows_of(root, name):
    return read_metrics(root / "runs" / name / "metrics.jsonl")


def test_the_distill_preset_trains_and_stores_what_a_fresh_prefill_gives(distill_run):
    root = distill_run
    rows = [r for r in rows_of(root, "distill") if "distill/reverse_kl" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["optim/grad_norm"] > 0 and 0 < r["distill/agreement"] < 1 for r in rows)
    config = load_config(root / "runs" / "distill" / "config.yaml")
    model, tokenizer = load_teacher(config, model_path(config, build_task(config.task)))
    teacher = Teacher(model, tokenizer.pad_token_id, sampling=Sampling(config.rollout.temperature))
    for batch in (1, 2):
        stored = read_parquet(root / "runs" / "distill" / "experiences" / f"batch-{batch:06d}.parquet")
        fresh = teacher.logprobs([e.prompt_ids for e in stored], [e.response_ids for e in stored])
        for row, values in zip(stored, fresh, strict=True):
            assert row.teacher_logprobs == pytest.approx(values, abs=1e-5)
            assert row.teacher_logprobs != pytest.approx(row.behavior_logprobs, abs=1e-3)  # another model


def test_the_teachers_cost_is_logged_only_in_runs_with_a_teacher(teacher_run, distill_run):
    """Each step's row has the teacher's clock and its batch's prefill seconds; the teacher's own run (GRPO, no
    ``teacher.path``) has no ``perf/teacher_*`` column at all."""
    root = distill_run
    steps = [r for r in rows_of(root, "distill") if "perf/step_s" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for row in steps:  # on-policy: between two rows the teacher scored exactly the step's batch
        assert 0 < row["perf/teacher_s"] <= row["perf/teacher_busy_s"] < row["perf/step_s"]
        assert row["perf/teacher_idle_s"] >= 0 and 0 < row["perf/teacher_utilization"] < 1
    without = rows_of(root, "teacher")
    assert [r["step"] for r in without if "perf/step_s" in r] == [1, 2]
    assert not [k for r in without for k in r if k.startswith("perf/teacher")]


@pytest.mark.slow  # ~50 s on 2 cores: two runs, one with spawned worker processes
def test_worker_processes_give_the_threads_numbers(teacher_run):
    root, distill = teacher_run
    common = [*distill, "steps=2", "sync.offset=1"]
    assert main(["train", *common, "run_name=threads"]) == 0
    assert main(["train", *common, "run_name=processes", "runtime.workers=processes"]) == 0
    assert deterministic_view(rows_of(root, "processes")) == deterministic_view(rows_of(root, "threads"))
    assert all(r["perf/teacher_s"] > 0 for r in rows_of(root, "processes") if "perf/step_s" in r)


def test_resume_keeps_the_teacher_logprobs_of_the_checkpointed_batches(teacher_run, capsys):
    """Step 2's checkpoint holds batch 3 (generated ahead, sync.offset=1) with its teacher log-probs, or, where the
    teacher was still scoring it when the buffer's part was written (a loaded machine), counts it outstanding with
    the version it is generated from; resuming from it (the step-3 checkpoint removed) trains step 3 on the same
    teacher log-probs either way and logs the uninterrupted run's numbers."""
    root, distill = teacher_run
    common = [*distill, "sync.offset=1", "checkpoint.interval=2", "steps=3"]
    assert main(["train", *common, "run_name=whole"]) == 0
    shutil.copytree(root / "runs" / "whole", root / "runs" / "cut")
    shutil.rmtree(root / "runs" / "cut" / "checkpoints" / "step-000003")
    checkpoint = root / "runs" / "cut" / "checkpoints" / "step-000002"
    ready = checkpoint / "buffer" / "ready-000003.parquet"
    if ready.is_file():  # the usual order: the put of batch 3 ran before the buffer's checkpoint part
        assert pq.read_table(ready).column("teacher_logprobs").null_count == 0
        expected = [e.teacher_logprobs for e in read_parquet(ready)]
    else:  # batch 3 still with the teacher: outstanding, to be generated again from the weights it was sampled by
        state = json.loads((checkpoint / "state.json").read_text())
        assert state["outstanding"] == [3] and (checkpoint / "weights" / "version-000001.safetensors").is_file()
        whole = root / "runs" / "whole" / "experiences" / "batch-000003.parquet"
        expected = [e.teacher_logprobs for e in read_parquet(whole)]
    capsys.readouterr()
    assert main(["train", *common, "run_name=cut", "resume=true"]) == 0
    assert "step-000002 (step 2 of 3)" in capsys.readouterr().out
    assert deterministic_view(rows_of(root, "cut")) == deterministic_view(rows_of(root, "whole"))
    resumed = read_parquet(root / "runs" / "cut" / "experiences" / "batch-000003.parquet")
    assert [e.teacher_logprobs for e in resumed] == expected


def test_stale_distillation_with_rec_clipping(teacher_run):
    root, distill = teacher_run
    args = [*distill, "steps=3", "sync.offset=2", "algorithm.clip_mode=one-side", "run_name=stale"]
    assert main(["train", *args]) == 0
    rows = [r for r in rows_of(root, "stale") if "distill/reverse_kl" in r]
    assert [r["lag/max"] for r in rows] == [0.0, 1.0, 2.0]
    assert all(r["optim/grad_norm"] > 0 and "loss/clip_frac" in r for r in rows)


def test_replayed_groups_keep_their_teacher_logprobs(teacher_run):
    """Replay hands the trainer groups of earlier batches: they carry the teacher log-probs stored with them
    (a row without them would stop the distilling trainer)."""
    root, distill = teacher_run
    assert main(["train", *distill, "steps=3", "replay.groups_per_step=2", "run_name=replay"]) == 0
    rows = [r for r in rows_of(root, "replay") if "distill/reverse_kl" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["batch/use_count_mean"] > 0 for r in rows] == [False, True, True]


def test_offline_distillation_from_a_store_scored_once(teacher_run, capsys):
    root, distill = teacher_run
    runs = root / "runs"
    student = [a for a in distill if not a.startswith("teacher.path=")]
    teacher = next(a for a in distill if a.startswith("teacher.path="))
    for name in ("explored", "unscored"):
        assert main(["explore", *student, "steps=2", f"run_name={name}"]) == 0
    assert main(["explore", *distill, "steps=2", "run_name=explored-with-teacher"]) == 0
    offline = [*student, "mode=offline", "steps=2"]
    capsys.readouterr()
    assert main(["train", *offline, f"buffer.path={runs / 'explored'}", "run_name=refused"]) == 2
    error = capsys.readouterr().err
    assert "has no teacher log-probs; score the store once with `oprl teacher-score" in error
    assert len(error.strip().splitlines()) == 1
    assert main(["teacher-score", str(runs / "explored"), teacher]) == 0
    assert "2 batch files scored, 0 already scored" in capsys.readouterr().out
    assert main(["teacher-score", str(runs / "explored"), teacher]) == 0
    assert "0 batch files scored, 2 already scored" in capsys.readouterr().out
    for batch in (1, 2):
        name = f"batch-{batch:06d}.parquet"
        scored = read_parquet(runs / "explored" / "experiences" / name)
        online = read_parquet(runs / "explored-with-teacher" / "experiences" / name)
        assert [e.teacher_logprobs for e in scored] == [e.teacher_logprobs for e in online]
    assert main(["train", *offline, f"buffer.path={runs / 'explored'}", "run_name=scored"]) == 0
    assert main(["train", *offline, teacher, f"buffer.path={runs / 'unscored'}", "run_name=on-the-fly"]) == 0
    rows = rows_of(root, "scored")
    assert [r["step"] for r in rows if "distill/reverse_kl" in r] == [1, 2]
    assert deterministic_view(rows) == deterministic_view(rows_of(root, "on-the-fly"))


@pytest.mark.slow  # ~40 s: a local Ray instance and two runs
def test_ray_places_the_teacher_as_an_actor_with_the_local_numbers(teacher_run):
    ray = pytest.importorskip("ray")
    root, distill = teacher_run
    common = [*distill, "steps=2"]
    assert main(["train", *common, "run_name=ray-local"]) == 0
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        assert main(["train", *common, "run_name=ray", "backend=ray"]) == 0
    finally:
        ray.shutdown()
    assert deterministic_view(rows_of(root, "ray")) == deterministic_view(rows_of(root, "ray-local"))
    assert all(r["perf/teacher_s"] > 0 for r in rows_of(root, "ray") if "perf/step_s" in r)  # its report arrives
    stored = read_parquet(root / "runs" / "ray" / "experiences" / "batch-000002.parquet")
    assert all(e.teacher_logprobs is not None for e in stored)
