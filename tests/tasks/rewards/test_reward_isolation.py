"""User rewards that print, start subprocesses, fail on some rows, allocate or block at import (issue #25):
every reply lands on its own row, prints reach the reward processes' log, a failed row scores 0 and is counted, and
the rest are one line."""

import json
import time
from pathlib import Path

import pytest

from oprl.cli import main
from oprl.errors import OprlError
from oprl.tasks import DatasetTask
from oprl.tasks.rewards.processes import reward_log

ROOT = Path(__file__).resolve().parents[3]
TRAIN = ROOT / "examples" / "arithmetic_train.jsonl"
EXAMPLE_REWARD = f"{ROOT / 'examples' / 'arithmetic_reward.py'}:reward"

REWARDS = '''
import os
import subprocess
import sys


def quiet(prompt, completion, reference, **row):
    return float(completion.strip() == reference)


def noisy(prompt, completion, reference, **row):
    """The same reward, after a child process, C-level and Python prints to stdout and stderr."""
    subprocess.run(["echo", "checking"])
    os.write(1, b'{"value": 1.0}\\n')
    print("python print", completion)
    print("to stderr", file=sys.stderr)
    return float(completion.strip() == reference)


def huge(prompt, completion, reference, **row):
    if completion == "big":
        return 1e308
    if completion == "inf":
        return float("inf")
    if completion == "nan":
        return float("nan")
    return 1.0


def dies_once(prompt, completion, reference, **row):
    """The first process to score a row that starts with 'kill' is killed (as a preemption or an OOM kill would
    do it); the row scores normally anywhere after that. 'always' kills every process it runs in."""
    import pathlib
    import signal

    marker = pathlib.Path(os.environ["DIES_ONCE_DIR"]) / completion
    if completion == "always" or (completion.startswith("kill") and not marker.exists()):
        marker.touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return float(completion.strip() == reference) + 0.5


def greedy(prompt, completion, reference, **row):
    if completion == "allocate":
        block = bytearray(1024**3)  # 1 GiB, past a 300 MB limit
        return float(len(block) > 0)
    return 1.0
'''


@pytest.fixture(scope="module")
def rewards_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("isolation") / "isolation_rewards.py"
    path.write_text(REWARDS)
    return path


def test_a_reward_that_prints_and_starts_subprocesses_scores_every_row_correctly(rewards_file, tmp_path):
    """The issue's reward: with replies on fd 1, 42 of 96 rows carried another row's reward. Here every row
    gets the same reward as without the prints, and the prints are kept in the log."""
    log = tmp_path / "workers.log"
    with reward_log(log):
        noisy = DatasetTask(train_file=str(TRAIN), train_size=24, reward=f"{rewards_file}:noisy", reward_workers=2)
    quiet = DatasetTask(train_file=str(TRAIN), train_size=24, reward=f"{rewards_file}:quiet", reward_workers=2)
    problems = list(noisy.problems("train"))
    responses = [p.answer if i % 3 else "wrong" for i, p in enumerate(problems)]
    expected = [r.total for r in quiet.score(problems, responses)]
    assert expected.count(1.0) == 16
    for _ in range(3):
        assert [r.total for r in noisy.score(problems, responses)] == expected
    assert noisy.rewards.counts["error"] == 0
    noisy.rewards.close()
    text = log.read_text()
    assert text.count("checking") == 72 and text.count("python print") == 72 and text.count("to stderr") == 72


def test_failed_rows_score_zero_and_are_counted_the_batch_goes_on(tmp_path, caplog):
    """Every 10th reference is 'n/a' (the example reward raises on it): those rows score 0 with
    reward_error = 1, one warning says so once, and nothing stops (the old probe stopped on such a group)."""
    path = tmp_path / "data.jsonl"
    records = [json.loads(line) for line in TRAIN.read_text().splitlines()[:40]]
    for i in range(0, 40, 10):
        records[i]["reference"] = "n/a"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    task = DatasetTask(train_file=str(path), reward=EXAMPLE_REWARD)
    problems = [p for p in task.problems("train") for _ in range(8)]  # groups of 8: the first is all n/a
    with caplog.at_level("WARNING", logger="oprl.tasks"):
        for _ in range(2):
            rewards = task.score(problems, [p.answer if p.answer != "n/a" else "7" for p in problems])
    errors = [r.components["reward_error"] for r in rewards]
    assert errors == [1.0 if p.answer == "n/a" else 0.0 for p in problems] and sum(errors) == 32
    assert all(r.total == 0.0 for r, e in zip(rewards, errors, strict=True) if e)
    assert all(r.total == pytest.approx(1.1) for r, e in zip(rewards, errors, strict=True) if not e)
    warnings = [r.getMessage() for r in caplog.records if "failed on" in r.getMessage()]
    assert len(warnings) == 1 and "32 of 320 rows" in warnings[0] and "ValueError" in warnings[0]
    strict = DatasetTask(train_file=str(path), reward=EXAMPLE_REWARD, reward_max_error_fraction=0.1)
    with pytest.raises(OprlError, match=r"failed on 32 of 320 rows .*fraction=0\.1\); e\.g\. dataset/train/000001:"):
        strict.score(problems, ["7"] * len(problems))


def test_a_reward_process_killed_under_a_row_scores_it_again_in_a_new_one(rewards_file, tmp_path, monkeypatch):
    """Self-healing reward processes (issue #57): a row whose process is killed while scoring it is scored once
    more in a fresh process and gets the reward an undisturbed pool gives it (rewards are deterministic); a row
    that kills every process it runs in is an error (reward 0, counted) after that one retry."""
    monkeypatch.setenv("DIES_ONCE_DIR", str(tmp_path))
    task = DatasetTask(train_file=str(TRAIN), train_size=4, reward=f"{rewards_file}:dies_once", reward_workers=2)
    problems = list(task.problems("train"))
    replies = ["kill-a", problems[1].answer, "kill-b", "fine"]
    rewards = task.score(problems, replies)
    assert [r.total for r in rewards] == [0.5, 1.5, 0.5, 0.5]
    assert task.rewards.counts["error"] == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["kill-a", "kill-b"]
    always = task.score(problems[:2], ["always", problems[1].answer])
    assert [r.total for r in always] == [0.0, 1.5] and always[0].components["reward_error"] == 1.0
    task.rewards.close()


@pytest.mark.parametrize("completion", ["big", "inf", "nan"])
def test_non_finite_or_huge_rewards_are_refused_per_row(rewards_file, completion):
    task = DatasetTask(train_file=str(TRAIN), train_size=2, reward=f"{rewards_file}:huge")
    problems = list(task.problems("train"))
    good, bad = task.score(problems, ["fine", completion])
    assert good.total == 1.0 and bad.total == 0.0 and bad.components["reward_error"] == 1.0
    with pytest.raises(OprlError, match=r"a reward must be finite and within ±1e\+06"):
        task.score(problems, [completion, completion])


def test_a_reward_worker_past_its_memory_limit_is_one_line(rewards_file):
    task = DatasetTask(train_file=str(TRAIN), train_size=2, reward=f"{rewards_file}:greedy", reward_memory_mb=300)
    problems = list(task.problems("train"))
    fine, over = task.score(problems, ["small", "allocate"])
    assert fine.total == 1.0 and over.total == 0.0 and over.components["reward_error"] == 1.0
    with pytest.raises(OprlError) as error:
        task.score(problems, ["allocate", "allocate"])
    message = str(error.value)
    assert "\n" not in message and "MemoryError" in message and "task.reward_memory_mb=300" in message


def test_a_reward_module_that_blocks_at_import_is_one_line(tmp_path):
    blocking = tmp_path / "blocking.py"
    blocking.write_text(
        "import time\ntime.sleep(600)\n\ndef reward(prompt, completion, reference, **row):\n    return 1\n"
    )
    started = time.perf_counter()
    with pytest.raises(OprlError) as error:
        DatasetTask(train_file=str(TRAIN), train_size=2, reward=f"{blocking}:reward", reward_import_timeout=1.0)
    assert time.perf_counter() - started < 15
    message = str(error.value)
    assert "\n" not in message and "did not start within 1s" in message and "task.reward_import_timeout" in message


def test_a_run_with_failing_references_trains_to_the_end_counting_them(small_overrides, tmp_path):
    """A dataset where every 10th reference is 'n/a': the run ends with exit 0, the failed rows counted in
    reward/reward_error, and the reward's output in <run_dir>/workers.log."""
    path = tmp_path / "data.jsonl"
    records = [json.loads(line) for line in TRAIN.read_text().splitlines()[:20]]
    for i in range(0, 20, 10):
        records[i]["reference"] = "n/a"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    overrides = [o for o in small_overrides if not o.startswith("task.")] + [
        "task.name=dataset",
        f"task.train_file={path}",
        f"task.reward={EXAMPLE_REWARD}",
        "warmstart.val_problems=4",
        "steps=6",
        "eval.interval=0",
        "run_name=failing",
    ]
    assert main(["train", *overrides]) == 0
    run_dir = tmp_path / "runs" / "failing"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "reward/reward_error" in r]
    assert len(trained) == 6 and sum(r["reward/reward_error"] for r in trained) > 0
    assert (run_dir / "workers.log").exists()


def test_reward_workers_ignore_sigint_and_exit_with_their_parent(rewards_file):
    """A Ctrl-C to the process group is the run's to handle: a worker neither dies nor prints a traceback,
    and the pool (or the parent's exit) stops it."""
    import os
    import signal

    task = DatasetTask(train_file=str(TRAIN), train_size=2, reward=f"{rewards_file}:quiet")
    (worker,) = task.rewards.pool._processes
    os.kill(worker.process.pid, signal.SIGINT)
    time.sleep(0.3)
    problems = list(task.problems("train"))
    assert [r.total for r in task.score(problems, [p.answer for p in problems])] == [1.0, 1.0]
    assert worker.process.poll() is None
    task.rewards.close()
    assert worker.process.poll() is not None


LYING_WORKER = """
import json
from oprl.tasks.rewards.processes import _send, _streams, start_reward_process

def _process_main():
    start_reward_process()
    requests, _ = _streams()
    _send({"ready": True})
    for line in requests:
        request = json.loads(line)
        _send({"value": 1.0, "id": request["id"] + 1000})  # a reply to some other request
"""


def test_a_reply_carrying_another_requests_id_is_an_error_not_a_reward(tmp_path, monkeypatch):
    from oprl.tasks.rewards.processes import RewardPool

    (tmp_path / "lying_worker.py").write_text(LYING_WORKER)
    monkeypatch.chdir(tmp_path)  # the worker imports it from its working directory
    pool = RewardPool(["lying_worker"], processes=1, timeout=5.0)
    try:
        replies = pool.run([{"n": 1}, {"n": 2}])
    finally:
        pool.close()
    assert replies == [{"verdict": "error", "error": "reward process replied to another request (killed)"}] * 2


SILENT_UNTIL_TOLD_WORKER = """
import os
import time
from oprl.tasks.rewards.processes import fatal, start_reward_process

def _process_main():
    start_reward_process()
    while not os.path.exists("go"):  # the test decides when the diagnosis is written
        time.sleep(0.01)
    fatal("task.reward: cannot import 'x.py': ModuleNotFoundError: No module named 'x'")
"""


def test_a_diagnosis_written_just_before_the_worker_exits_is_read_not_lost(tmp_path, monkeypatch):
    """The race behind a once-seen flaky run: the parent finds the pipe empty, the worker then writes its
    one-line diagnosis and exits, and the parent's exit check must not report "exited" with the line unread."""
    from oprl.tasks.rewards import processes

    (tmp_path / "silent_until_told_worker.py").write_text(SILENT_UNTIL_TOLD_WORKER)
    monkeypatch.chdir(tmp_path)
    real_read = processes._RewardProcess._read_line
    reads = []

    def read_then_let_it_speak_and_exit(self):
        line = real_read(self)
        if not reads:  # the first read finds nothing; the worker speaks and exits before the exit check
            reads.append(line)
            (tmp_path / "go").touch()
            self.process.wait(timeout=60)
        return line

    monkeypatch.setattr(processes._RewardProcess, "_read_line", read_then_let_it_speak_and_exit)
    worker = processes._RewardProcess(["silent_until_told_worker"], 60.0, "reward process", None, None)
    try:
        with pytest.raises(OprlError) as error:
            for _ in range(1000):
                worker.poll()
                time.sleep(0.01)
    finally:
        worker.kill()
    assert reads == [None]
    assert "reward process failed to start: task.reward: cannot import 'x.py': ModuleNotFoundError" in str(error.value)
