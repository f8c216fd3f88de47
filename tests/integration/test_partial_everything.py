"""Partial rollouts with the rest of the runtime: ``kill -9`` in a switching batch + resume equals the
uninterrupted run, Ray repeats the threads run, the free-running mode records every token's version exactly,
and multi-turn episodes, replay, LoRA and the sharded trainer switch as the rule says while evaluation never
does (docs/runtime.md#partial-rollouts)."""

import time

import pyarrow.parquet as pq
import pytest

from oprl.checkpoint.store import from_table
from oprl.cli import main
from oprl.metrics import deterministic_view, read_metrics
from oprl.schedule import policy_version, switch_version
from oprl.trainer.staleness import token_lag_metrics
from recipes import kill_9_after

SWITCH = 2
PARTIAL = [
    "tensorboard=false",
    "runtime.torch_threads=1",
    "sync.offset=1",
    "sync.partial=true",
    f"sync.switch_step={SWITCH}",
    "eval.interval=0",
]
EPISODES = [
    "task.name=tool-arithmetic",
    "warmstart.max_steps=60",
    "warmstart.batch_size=64",
    "warmstart.check_interval=30",
    "warmstart.val_problems=32",
    "rollout.max_new_tokens=10",
    "rollout.max_turns=3",
    "rollout.max_episode_tokens=48",
]


def rows_of(runs, name):
    return read_metrics(runs / name / "metrics.jsonl")


def stored(runs, name, batch):
    return pq.read_table(runs / name / "experiences" / f"batch-{batch:06d}.parquet")


def same_stores(runs, a, b):
    names = sorted(p.name for p in (runs / a / "experiences").iterdir())
    assert names == sorted(p.name for p in (runs / b / "experiences").iterdir())
    for name in names:
        left, right = (pq.read_table(runs / n / "experiences" / name).drop_columns(["extra"]) for n in (a, b))
        assert left.equals(right), name


def model_step_versions(row) -> list[int]:
    """The versions of a row's model tokens (loss mask 1): the tokens the switch rule counts decode steps of."""
    mask = row["loss_mask"] or [1] * len(row["response_ids"])
    return [v for v, m in zip(row["behavior_versions"], mask, strict=True) if m]


def assert_scheduled_versions(runs, name, steps, *, single_turn=True):
    """Every stored token's version follows the deterministic rule (k=1, m=1): batch b starts with v(b), and
    v(b)+1 takes over at global decode step SWITCH when the trainer reaches it before step b; single-turn rows
    switch exactly at token SWITCH. Returns the number of rows sampled by two policies."""
    switched = 0
    for batch in range(1, steps + 1):
        start, target = policy_version(batch, 1, 1), switch_version(batch, 1, 1)
        for row in stored(runs, name, batch).to_pylist():
            versions = model_step_versions(row)
            assert row["policy_version"] == start and versions[0] == start
            assert versions == sorted(versions) and set(versions) <= {start, target}
            if single_turn and target is not None:
                assert versions == [start] * min(SWITCH, len(versions)) + [target] * (len(versions) - SWITCH)
            switched += len(set(versions)) > 1
    return switched


def test_kill_9_in_a_switching_batch_then_resume_equals_the_uninterrupted_run(small_overrides, tmp_path):
    """k=1, m=1: every batch from 2 on switches at decode step 2 (its explorer waits there for the trainer's
    version), so when the first checkpoint lands the explorer is inside a switching batch or about to be."""
    runs = tmp_path / "runs"
    run = [*small_overrides, *PARTIAL, "steps=6", "checkpoint.interval=2"]
    assert main(["train", *run, "run_name=whole"]) == 0
    kill_9_after([*run, "run_name=killed"], runs / "killed" / "checkpoints" / "step-000002" / "state.json")
    assert len(rows_of(runs, "killed")) < 7
    board = sorted(p.name for p in (runs / "killed" / "weights-board").iterdir())
    assert main(["train", *run, "run_name=killed", "resume=true"]) == 0
    assert deterministic_view(rows_of(runs, "killed")) == deterministic_view(rows_of(runs, "whole"))
    same_stores(runs, "whole", "killed")
    assert assert_scheduled_versions(runs, "killed", 6) > 0
    assert board, "the killed run had posted no version to its board"
    final = [(runs / n / "final" / "model.safetensors").read_bytes() for n in ("whole", "killed")]
    assert final[0] == final[1]


@pytest.mark.slow  # a local Ray instance and two 4-step runs (~40 s)
def test_ray_repeats_the_threads_run(small_overrides, tmp_path):
    ray = pytest.importorskip("ray")
    runs = tmp_path / "runs"
    run = [*small_overrides, *PARTIAL, "steps=4"]
    assert main(["train", *run, "run_name=threads"]) == 0
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        assert main(["train", *run, "backend=ray", "runtime.explorers=2", "run_name=ray"]) == 0
    finally:
        ray.shutdown()
    assert deterministic_view(rows_of(runs, "ray")) == deterministic_view(rows_of(runs, "threads"))
    same_stores(runs, "threads", "ray")
    assert assert_scheduled_versions(runs, "ray", 4) > 0


def test_free_running_records_every_tokens_version_exactly(small_overrides, tmp_path, monkeypatch):
    """sync.mode=async: the explorer takes each version as soon as it is posted. After a batch's first decode
    step the explorer waits (up to 10 s) for a newer version when one is due, so versions land mid-response
    whatever the machine's timing; every token's version was posted before the step that sampled
    it, never decreases along a response, stays within the staleness bound, and the logged lag metrics are
    the stored column's."""
    import oprl.explorer.switcher as partial
    import oprl.runtime.synchronizer as synchronizer

    posted, loaded = {}, []
    post, before, load = synchronizer.post_weights, partial.Switcher.before, partial.Switcher._load

    def posting(board, version, weights, keep_from=None):
        posted.setdefault(version, time.monotonic())  # before the file appears (atomic: whole or absent)
        post(board, version, weights, keep_from)

    def slow_before(self, step):  # after a row's first token, give a newer version (if one is due) time to land
        deadline = time.monotonic() + 10
        while step == 1 and self.version < (self.newest or 0) and time.monotonic() < deadline:
            if any(v > self.version for v in partial.posted_versions(self.board)):
                break
            time.sleep(0.01)
        return before(self, step)

    def loading(self, version, *, wait, step):
        loaded.append((version, time.monotonic(), posted.get(version)))
        return load(self, version, wait=wait, step=step)

    monkeypatch.setattr(synchronizer, "post_weights", posting)
    monkeypatch.setattr(partial.Switcher, "before", slow_before)
    monkeypatch.setattr(partial.Switcher, "_load", loading)
    runs, steps = tmp_path / "runs", 6
    hot = "rollout.temperature=2.0"  # longer responses: more rows still running at the switch
    free = [o for o in PARTIAL if not o.startswith(("sync.offset=", "sync.switch_step="))]  # scheduled-only keys
    args = [
        *small_overrides,
        *free,
        "sync.mode=async",
        "sync.max_staleness=1",
        hot,
        f"steps={steps}",
        "run_name=free",
    ]
    assert main(["train", *args]) == 0
    assert loaded and all(seen is not None and at >= seen for _, at, seen in loaded)  # posted, then loaded
    metrics = {r["step"]: r for r in rows_of(runs, "free")}
    switched = 0
    for batch in range(1, steps + 1):
        table = stored(runs, "free", batch)
        for row in table.to_pylist():
            versions = row["behavior_versions"]
            assert versions == sorted(versions) and versions[0] == row["policy_version"]
            assert (batch - 1) - versions[0] <= 1 and versions[-1] <= batch - 1  # staleness bound, newest b-1
            assert set(versions) - {row["policy_version"]} <= {v for v, _, _ in loaded}
            switched += len(set(versions)) > 1
        expected = token_lag_metrics(from_table(table), batch - 1)  # the trainer's version before step b
        assert {k: metrics[batch][k] for k in expected} == pytest.approx(expected)
    assert switched > 0


COMBOS = {
    "episodes": EPISODES,  # a switch inside a turn or between two (decode steps add up over the turns)
    "replay": ["replay.groups_per_step=2", "replay.max_uses=2", "steps=3"],
    "lora": ["model.lora.r=4"],
    "sharded": ["trainer.sharding=fsdp", "trainer.world_size=2"],
}
SLOW = {"sharded"}  # two rank processes per run: ~60 s on a busy 2-core machine (the others 3-16 s)


@pytest.mark.parametrize("combo", [pytest.param(c, marks=[pytest.mark.slow] if c in SLOW else []) for c in COMBOS])
def test_partial_rollouts_with(combo, small_overrides, tmp_path):
    """The deterministic switch with ``combo``: every stored token follows the rule, and batch 2 (version 0,
    then version 1 from decode step 2; version 1 is the same in both runs, trained on the same batch 1) equals
    the whole-batch run's before the switch and differs after it (the new weights really sampled)."""
    runs = tmp_path / "runs"
    run = [*small_overrides, *PARTIAL, "steps=2", *COMBOS[combo]]
    assert main(["train", *run, "run_name=partial"]) == 0
    assert main(["train", *run, "sync.partial=false", "run_name=whole"]) == 0
    steps = len(rows_of(runs, "partial")) - 1
    assert assert_scheduled_versions(runs, "partial", steps, single_turn=combo != "episodes") > 0
    changed = 0
    for p, w in zip(*(stored(runs, n, 2).to_pylist() for n in ("partial", "whole")), strict=True):
        assert p["prompt_ids"] == w["prompt_ids"] and p["response_ids"][:SWITCH] == w["response_ids"][:SWITCH]
        assert p["behavior_logprobs"][:SWITCH] == w["behavior_logprobs"][:SWITCH]
        after = [(r["response_ids"][SWITCH:], r["behavior_logprobs"][SWITCH:]) for r in (p, w)]
        changed += after[0] != after[1]
    assert changed > 0
    if combo == "sharded":  # the ranks end with the run (they used to outlive it and block the exit)
        deadline = time.monotonic() + 20
        while ranks_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not ranks_alive()
    if combo == "replay":  # replayed groups keep their tokens' versions: older tokens show in the lag
        row = rows_of(runs, "partial")[3]
        assert row["replay/groups"] == 2.0 and row["lag/token_max"] == 2.0  # batch 1's tokens, version 0


def ranks_alive() -> list:
    import multiprocessing

    return [p for p in multiprocessing.active_children() if p.name.startswith("oprl-trainer-rank")]


def test_evaluation_samples_with_one_version(small_overrides, tmp_path):
    """Evaluation never switches: the in-run evaluation at step 2 equals ``oprl eval`` of the step-2
    checkpoint (one engine, the trainer's weights), while the explorer's batches did switch."""
    runs = tmp_path / "runs"
    run = [*small_overrides, *PARTIAL, "steps=2", "eval.interval=2", "eval.seed=0", "checkpoint.interval=2"]
    assert main(["train", *run, "run_name=partial"]) == 0
    assert rows_of(runs, "partial")[2]["batch/switched_frac"] > 0
    assert all(r["perf/switch_wait_s"] >= 0 for r in rows_of(runs, "partial")[1:])  # part of explorer idle
    assert main(["eval", str(runs / "partial"), *small_overrides[:-1], "eval.seed=0", "run_name=e"]) == 0
    keys = ("eval/accuracy", "eval/reward", "eval/format", "eval/response_length")
    in_run, checkpoint = ({k: rows_of(runs, n)[-1][k] for k in keys} for n in ("partial", "e"))
    assert in_run == checkpoint


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["rollout.engine=hf-generate"], r"^sync.partial=true needs rollout.engine=lean or vllm"),
        (["rollout.engine=vllm"], r"^sync.partial=true with rollout.engine=vllm needs sync.partial_kv=recompute"),
        (["runtime.overlap=false"], r"^sync.partial=true needs runtime.overlap=true"),
    ],
)
def test_what_partial_rollouts_cannot_run_with_is_one_line(overrides, message):
    from oprl.config import load_config
    from oprl.errors import OprlError

    with pytest.raises(OprlError, match=message):  # RunConfig's validators: refused at load
        load_config(None, ["sync.partial=true", "sync.offset=1", *overrides])
