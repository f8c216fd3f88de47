"""Failure paths end with the one-line error naming the real cause and exit status 1, never an abort.

Each case runs 10 times, each time in a fresh child process: the abort this guards against
(``terminate called without an active exception``, exit -6) happened at interpreter exit, in some tries
only, when a worker thread was still inside torch. To keep that affordable the children are forked from one
parent that has imported torch, transformers and oprl once (``ZYGOTE``); each child runs ``oprl.cli.main``
and leaves through ``sys.exit``, i.e. through a normal interpreter shutdown; two children run at a time.
Faults are injected at the library level (safetensors, parquet writers), before oprl imports them: a full
disk while a checkpoint is written, a run directory that stops accepting new files (read-only) while the
store is written, and a model directory whose weights file is garbage.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SMALL

SRC = Path(__file__).resolve().parents[2] / "src"
TRIES = 10

ZYGOTE = r"""
import errno, json, os, sys
import pyarrow.parquet, safetensors.torch

FAULT = {}
PARALLEL = 2

def faulty(real):
    def write(*args, **kwargs):
        target = str(args[1] if len(args) > 1 else kwargs.get("filename", kwargs.get("where", "")))
        if FAULT and FAULT["match"] in target:
            raise OSError(FAULT["errno"], os.strerror(FAULT["errno"]), target)
        return real(*args, **kwargs)
    return write

safetensors.torch.save_file = faulty(safetensors.torch.save_file)
pyarrow.parquet.write_table = faulty(pyarrow.parquet.write_table)
# The expensive imports, once (importing starts no threads, so forking afterwards is safe).
import torch.utils.tensorboard, transformers, oprl.cli, oprl.runtime.run, oprl.backends.local, oprl.models.tiny
from tensorboard.summary.writer import record_writer

def tensorboard_write(real):
    def write(self, data):  # runs in TensorBoard's writer thread; its errors name no file
        if FAULT.get("tensorboard"):
            raise OSError(FAULT["errno"], os.strerror(FAULT["errno"]))
        return real(self, data)
    return write

record_writer.RecordWriter.write = tensorboard_write(record_writer.RecordWriter.write)
# The imported heap so far into the permanent generation: a child's exit then does not walk it (copying it page
# by page from this parent), ~0.5 s a child. What the child's run creates (its threads, models, torch state) is
# collected as in any exit, which is where the abort happened. Before the model classes: they import triton, whose
# objects, frozen, would never be freed and nanobind would print its leak report at every exit.
import gc
gc.freeze()
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM, PreTrainedTokenizerFast

def start(job):
    pid = os.fork()
    if pid == 0:
        log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(log, 1)
        os.dup2(log, 2)
        FAULT.update(job.get("fault") or {})
        sys.exit(oprl.cli.main(job["args"]))  # a normal interpreter shutdown: where the abort happened
    return pid

for line in sys.stdin:  # a list of jobs, run PARALLEL at a time; one list of exit statuses back
    jobs, running, exits = json.loads(line), {}, {}
    for index, job in enumerate(jobs):
        if len(running) == PARALLEL:
            pid, status = os.wait()
            exits[running.pop(pid)] = os.waitstatus_to_exitcode(status)
        running[start(job)] = index
    while running:
        pid, status = os.wait()
        exits[running.pop(pid)] = os.waitstatus_to_exitcode(status)
    print(json.dumps([exits[i] for i in range(len(jobs))]), flush=True)
"""


@pytest.fixture(scope="module")
def zygote(tmp_path_factory, cache_dir):
    env = os.environ | {"PYTHONPATH": str(SRC), "OPRL_CACHE_DIR": str(cache_dir)}
    process = subprocess.Popen(
        [sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    root = tmp_path_factory.mktemp("failures")
    counter = iter(range(10_000))

    def run(
        args: list[str], fault: dict | None = None, tries: int = 1, outputs: list[Path] | None = None
    ) -> list[tuple[int, str, Path]]:
        names = [f"r{next(counter)}" for _ in range(tries)]
        outputs = outputs or [root / "runs"] * tries
        jobs = [
            {
                "args": [*args, f"output_dir={output}", f"run_name={name}"],
                "fault": fault,
                "log": str(root / f"{name}.log"),
            }
            for name, output in zip(names, outputs, strict=True)
        ]
        process.stdin.write(json.dumps(jobs) + "\n")
        process.stdin.flush()
        reply = process.stdout.readline()
        assert reply, "the zygote process died"
        return [
            (code, (root / f"{name}.log").read_text(), output / name)
            for code, name, output in zip(json.loads(reply), names, outputs, strict=True)
        ]

    # Overlapped (sync.offset=1): an explorer is generating while the trainer fails, so shutdown must wait.
    base = [
        "train",
        *SMALL,
        "steps=3",
        "sync.offset=1",
        "checkpoint.interval=1",
        "eval.interval=0",
        "eval.num_problems=4",
        "runtime.torch_threads=1",
        "rollout.prompts_per_step=2",
        "rollout.group_size=2",
    ]
    [(code, output, _)] = run([*base, "tensorboard=false", "steps=1"])  # builds the warm-start cache if needed
    assert code == 0, output
    yield run, base
    process.stdin.close()
    process.wait(timeout=60)


def test_disk_full_during_a_checkpoint_exits_1_with_the_cause_never_an_abort(zygote):
    run, base = zygote
    full = {"match": "step-000002", "errno": 28}  # ENOSPC while the trainer writes checkpoint 2
    for code, output, run_dir in run([*base, "tensorboard=true"], full, tries=TRIES):
        assert code == 1, output
        lines = error_lines(output)
        assert len(lines) == 1 and "terminate called" not in output, output
        assert "failed while checkpointing step 2" in lines[0]  # the trainer's or the buffer's part
        assert "No space left on device" in lines[0] and "step-000002" in lines[0]
        assert "checkpoint of step 1" in lines[0]  # the last good one, to resume from
        assert (run_dir / "checkpoints" / "step-000001" / "state.json").is_file()


def test_a_read_only_run_directory_reports_the_failed_store_write_never_an_abort(zygote):
    run, base = zygote
    read_only = {"match": "batch-000002", "errno": 13}  # EACCES creating the store file of batch 2
    tries = run([*base, "tensorboard=true"], read_only, TRIES // 2) + run(
        [*base, "tensorboard=false"], read_only, TRIES - TRIES // 2
    )
    for code, output, _ in tries:
        assert code == 1, output
        lines = error_lines(output)
        assert len(lines) == 1 and "terminate called" not in output, output
        assert "buffer failed" in lines[0] and "batch 2" in lines[0], lines[0]
        assert "PermissionError" in lines[0] and "batch-000002.parquet" in lines[0], lines[0]
        assert "never put" not in lines[0]
    [(code, output, _)] = run([*base, "tensorboard=false", "--debug"], read_only)
    assert code == 1 and "Traceback" in output and "PermissionError" in output, output
    assert "terminate called" not in output


def test_a_model_directory_with_garbage_weights_fails_in_one_line_never_an_abort(zygote, cache_dir, tmp_path):
    run, base = zygote
    model = tmp_path / "garbage-model"
    shutil.copytree(next((cache_dir / "models").glob("tiny-*")), model)
    (model / "model.safetensors").write_bytes(os.urandom(4096))
    for code, output, _ in run([*base, "tensorboard=true", f"model.path={model}"], tries=TRIES):
        assert code == 2, output  # a bad input, reported as one
        lines = error_lines(output)
        assert len(lines) == 1 and "terminate called" not in output, output
        assert "failed to start: model.path: cannot load" in lines[0] and "SafetensorError" in lines[0], lines[0]


def error_lines(output: str) -> list[str]:
    """What a run printed besides its progress log lines (``INFO oprl:``, written when stderr is not a terminal)
    and its first line (``oprl: train on ...``, what starts)."""
    lines = output.strip().splitlines()
    return [line for line in lines if " INFO oprl: " not in line and not line.startswith("oprl: ")]


def one_line_naming_a_file(code: int, output: str, run_dir: Path) -> str:
    """The run ended in one line naming a file of its run directory, its rows whole, no temporary left."""
    assert code in (1, 2), output
    lines = error_lines(output)
    assert len(lines) == 1 and "Traceback" not in output and "terminate called" not in output, output
    assert str(run_dir) in lines[0], lines[0]
    if (run_dir / "metrics.jsonl").is_file():
        for line in (run_dir / "metrics.jsonl").read_text().splitlines():
            json.loads(line)  # never a torn row
    assert not list(run_dir.glob("checkpoints/.tmp-step-*")) and not (run_dir / ".tmp-final").exists()
    return lines[0]


def test_tensorboard_failing_in_its_writer_thread_ends_in_one_line_naming_its_file(zygote):
    """Issue 25, item 5: a read-only run directory made TensorBoard's thread print a 17-line traceback."""
    run, base = zygote
    for code, output, run_dir in run([*base, "tensorboard=true"], {"tensorboard": True, "errno": 13}, tries=TRIES):
        line = one_line_naming_a_file(code, output, run_dir)
        assert "Permission denied" in line and f"{run_dir}/tensorboard" in line, line


@pytest.fixture
def small_disks(tmp_path):
    """TRIES tmpfs mounts of 16 MB (root only), each filled to leave a different few KB to 4 MB free."""
    mounts = []
    try:
        for index in range(TRIES):
            mount = tmp_path / f"disk{index}"
            mount.mkdir()
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], capture_output=True)
            if done.returncode != 0:
                pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()[:80]})")
            mounts.append(mount)
            free = os.statvfs(mount).f_bavail * os.statvfs(mount).f_frsize
            keep = [20, 50, 100, 200, 400, 800, 1200, 1600, 2400, 4000][index] * 1024
            (mount / "filler").write_bytes(b"\0" * (free - keep))
        yield [m / "runs" for m in mounts]
    finally:
        for mount in mounts:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_nearly_full_disk_ends_in_one_line_naming_the_file(zygote, small_disks):
    """Issue 25, item 5: 50-60 KB free used to print TensorBoard's traceback, name no file, tear metrics.jsonl
    and leave .tmp-step-N behind. Free space from 20 KB to 4 MB: each try fails at another file."""
    run, base = zygote
    tries = run([*base, "tensorboard=true", "checkpoint.keep=1"], None, tries=TRIES, outputs=small_disks)
    failed = 0
    for code, output, run_dir in tries:
        if code == 0:  # enough room for the whole run
            continue
        failed += 1
        line = one_line_naming_a_file(code, output, run_dir)
        assert "No space left on device" in line, line
    assert failed >= TRIES // 2, [output for _, output, _ in tries]
