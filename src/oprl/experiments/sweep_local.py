"""How ``oprl sweep`` runs its runs on this machine (``backend: local``): ``parallel`` long-lived runner processes
(``python -m oprl.experiments.sweep_runner``: torch and transformers imported once per runner, not once per run), fed
one planned run at a time over a pipe, each run's output in its log; SIGTERM stops them all at a step boundary.

A run whose ``oprl train`` exits non-zero, or whose runner process dies under it (killed for memory, a crash in
native code), is given again, up to ``retries`` times, to a runner (a fresh one when its own died), with a line on
the console; the resume decision (``prepare``) is made again, so the retry of a run that died after a checkpoint
continues from it. A run still failing after its retries is reported, and the sweep goes on with the others.

Split from ``oprl.experiments.sweep`` (the spec, the plan, the resume rule, the table), which prepares each run and
calls ``execute``, to keep each module under ~500 lines (#23); ``oprl.experiments.sweep_ray`` is the Ray backend's
counterpart, with the same retries and the same fault injection (``OPRL_SWEEP_FAULT``, ``faults``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from oprl.errors import OprlError

FAULT_VARIABLE = "OPRL_SWEEP_FAULT"
FAULT_OVERRIDE = "sweep_fault=injected"
"""What an injected failure adds to a run's arguments: a key ``oprl train`` refuses. ``OPRL_SWEEP_FAULT="RUN@N,..."``
makes the first ``N`` attempts of run ``RUN`` fail so, through ``oprl train`` itself (a test tool, as ``OPRL_FAULT``
is for workers); read by the sweep's driver only, local or Ray."""
STOP_GRACE_S = 120.0
"""How long an interrupted sweep waits for a run to stop at a step boundary before it kills the runner."""


def execute(todo: list, parallel: int, *, prepare, log_path, log, on_success=None, retries: int = 0) -> list[str]:
    """Run ``todo`` (planned runs) on ``parallel`` long-lived runner processes (``oprl.experiments.sweep_runner``):
    ``prepare(run)`` gives a run's ``oprl`` arguments just before each attempt, ``log_path(name)`` its log (each
    attempt's output appended); a failed run is tried again up to ``retries`` times; ``on_success(run)`` after each
    run that succeeded. The names of the runs that still failed."""
    import selectors

    from oprl.progress import RunProgress

    injected = faults()
    threads = max(1, (os.cpu_count() or 1) // parallel)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    idle = [_Runner(env) for _ in range(min(parallel, len(todo)))]
    busy: dict[_Runner, Any] = {}
    failures: list[str] = []
    queue = [(run, 1) for run in todo]  # (run, attempt)
    retried = 0
    selector = selectors.DefaultSelector()
    # SIGTERM (``kill``, a job scheduler) reaches this process alone, not its runners: turn it into an exception
    # so that the ``finally`` below stops them. Without it they ran on, orphaned, to the end of their runs.
    previous = terminate_raises()
    finished = False
    try:
        # Runs done of the total (a bar on a terminal, a line per finished run elsewhere), the last one named.
        with RunProgress(len(todo), description="sweep", unit="run", interval=1) as progress:
            done = 0
            while queue or busy:
                while queue and idle:
                    (run, attempt), runner = queue.pop(0), idle.pop()
                    argv = prepare(run)
                    if attempt <= injected.get(run.name, 0):
                        argv.append(FAULT_OVERRIDE)
                    if attempt > 1:  # the log keeps every attempt's output; say where the retry's begins
                        with open(log_path(run.name), "a") as header:
                            when = time.strftime("%F %T")
                            header.write(f"# oprl sweep: attempt {attempt} of {retries + 1}, {when}\n")
                    runner.start(argv, log_path(run.name))
                    busy[runner] = (run, attempt)
                    selector.register(runner.stdout, selectors.EVENT_READ, runner)
                for key, _ in selector.select(timeout=1.0):
                    runner = key.data
                    selector.unregister(runner.stdout)
                    run, attempt = busy.pop(runner)
                    rc = runner.result()
                    if rc is None:  # the runner's oprl is older than the source on disk: a fresh one runs it
                        runner.close()
                        queue.insert(0, (run, attempt))
                        idle.append(_Runner(env))
                        continue
                    idle.append(runner if runner.alive() else _Runner(env))  # a runner that died is replaced
                    if rc != 0 and try_again(queue, run, attempt, retries, f"(exit {rc})", log_path, log):
                        retried += 1
                        continue
                    done += 1
                    if rc != 0:
                        failures.append(run.name)
                        tries = f" after {attempt} attempts" if attempt > 1 else ""
                        log(f"run {run.name} failed (exit {rc}){tries}; see {log_path(run.name)}")
                    elif on_success is not None:
                        on_success(run)
                    counts = [f", {len(failures)} failed"] if failures else []
                    counts += [f", {retried} retried"] if retried else []
                    status = "ok" if rc == 0 else "failed"
                    progress.update(done, f"last: {run.name} ({status}){''.join(counts)}")
        finished = True
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        for runner in busy:  # interrupted: each run stops as `oprl train` does on SIGTERM, then its runner exits
            runner.close(stop=not finished)
        for runner in idle:
            runner.close()
    return failures


def try_again(queue: list, run, attempt: int, retries: int, cause: str, log_path, log) -> bool:
    """The retry rule of both pools: a failed ``attempt`` (1-based) of ``run`` is tried again while
    ``attempt <= retries``, first in ``queue`` (as ``(run, attempt + 1)``), with a line naming ``cause``. Whether it
    was."""
    if attempt > retries:
        return False
    log(f"run {run.name} failed {cause}; trying again (retry {attempt} of {retries}); see {log_path(run.name)}")
    queue.insert(0, (run, attempt + 1))
    return True


def faults(variable: str | None = None) -> dict[str, int]:
    """``OPRL_SWEEP_FAULT``'s run name -> how many of its first attempts fail (``FAULT_OVERRIDE``)."""
    text = os.environ.get(FAULT_VARIABLE, "") if variable is None else variable
    plan: dict[str, int] = {}
    for item in filter(None, text.split(",")):
        name, _, count = item.rpartition("@")
        if not name or not count.isdigit():
            raise OprlError(f"{FAULT_VARIABLE}={text!r}: expected RUN@ATTEMPTS[,RUN@ATTEMPTS...], e.g. run-a@1")
        plan[name] = int(count)
    return plan


def terminate_raises(received: list[int] | None = None):
    """In the main thread, make SIGTERM print one line and raise ``SystemExit(143)`` (and append to ``received``);
    the previous handler (None elsewhere). SystemExit, not ``oprl.backends.failure.Interrupted``: the commands layer
    does not reach into the runtime's backends (tests/test_layering.py), and the exit status is the same."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handle(signum, frame):
        if received is not None:
            received.append(signum)
        print("sweep interrupted by SIGTERM; run it again to continue (runs with a checkpoint resume)", file=sys.stderr)
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, handle)


class _Runner:
    """One ``python -m oprl.experiments.sweep_runner`` process; runs one planned run at a time."""

    def __init__(self, env: dict):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "oprl.experiments.sweep_runner"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
            bufsize=1,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None  # both are pipes (PIPE above)
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout

    def start(self, argv: list[str], log_path: Path) -> None:
        self.stdin.write(json.dumps({"argv": argv, "log": str(log_path)}) + "\n")
        self.stdin.flush()

    def result(self) -> int | None:
        """The run's exit code; None when the runner refused it as stale (``sweep_runner``: its code is older
        than the source on disk) and exited."""
        line = self.stdout.readline()
        if not line:  # the process died (killed, crashed in native code): the run failed
            self.proc.wait()
            return self.proc.returncode or 1
        answer = json.loads(line)
        return None if answer.get("stale") else int(answer["rc"])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self, stop: bool = False) -> None:
        """End the runner: after its current run (``stop=False``), or now (``stop=True``: SIGTERM stops the run
        at its next step boundary, as ``oprl train`` does; SIGKILL if that takes over STOP_GRACE_S)."""
        if not self.alive():
            return
        if stop:
            self.proc.terminate()
        self.stdin.close()
        try:
            self.proc.wait(timeout=STOP_GRACE_S if stop else 10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
