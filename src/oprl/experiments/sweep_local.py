"""How ``oprl sweep`` runs its runs on this machine (``backend: local``): ``parallel`` long-lived runner processes
(``python -m oprl.experiments.sweep_runner``: torch and transformers imported once per runner, not once per run), fed
one planned run at a time over a pipe, each run's output in its log; SIGTERM stops them all at a step boundary.

A run whose ``oprl train`` exits non-zero, or whose runner process dies under it (killed for memory, a crash in
native code), is given again, up to ``retries`` times, to a runner (a fresh one when its own died), with a line on
the console; the resume decision (``prepare``) is made again, so the retry of a run that died after a checkpoint
continues from it. A run still failing after its retries is reported, and the sweep goes on with the others.

``oprl.experiments.sweep`` (the resume rule, the table) prepares each run and calls ``execute``;
``oprl.experiments.sweep_ray`` is the Ray backend's counterpart, with the same retries and the same fault injection
(``OPRL_SWEEP_FAULT``, ``faults``).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
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
    from oprl.progress import RunProgress

    threads = max(1, (os.cpu_count() or 1) // parallel)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    pool = _Pool(env, [(run, 1) for run in todo], [_Runner(env) for _ in range(min(parallel, len(todo)))])
    injected = faults()
    # SIGTERM (``kill``, a job scheduler) reaches this process alone, not its runners: turn it into an exception
    # so that the ``finally`` below stops them. Without it they ran on, orphaned, to the end of their runs.
    previous = terminate_raises()
    finished = False
    try:
        # Runs done of the total (a bar on a terminal, a line per finished run elsewhere), the last one named.
        with RunProgress(len(todo), description="sweep", unit="run", interval=1) as progress:
            done = 0
            while pool.queue or pool.busy:
                pool.start_waiting(prepare, injected, log_path, retries)
                for key, _ in pool.selector.select(timeout=1.0):
                    settled = pool.settle(key.data, retries, log_path, log)
                    if settled is None:  # tried again, or handed to a fresh runner
                        continue
                    (run, attempt), rc = settled
                    done += 1
                    if rc != 0:
                        pool.failures.append(run.name)
                        tries = f" after {attempt} attempts" if attempt > 1 else ""
                        log(f"run {run.name} failed (exit {rc}){tries}; see {log_path(run.name)}")
                    elif on_success is not None:
                        on_success(run)
                    progress.update(done, pool.status(run, rc))
        finished = True
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        pool.close(stop=not finished)
    return pool.failures


@dataclass
class _Pool:
    """The runner processes of one ``execute`` and its attempts: ``queue`` of ``(run, attempt)`` still to start,
    ``idle`` runners, ``busy`` runner -> its attempt, watched by ``selector`` for the attempt's answer."""

    env: dict
    queue: list
    idle: list[_Runner]
    busy: dict[_Runner, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    retried: int = 0
    selector: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)

    def start_waiting(self, prepare, injected: dict[str, int], log_path, retries: int) -> None:
        """Give queued attempts to idle runners, each prepared just before it starts (``prepare``), an injected
        fault appended (``faults``)."""
        while self.queue and self.idle:
            (run, attempt), runner = self.queue.pop(0), self.idle.pop()
            argv = prepare(run)
            if attempt <= injected.get(run.name, 0):
                argv.append(FAULT_OVERRIDE)
            if attempt > 1:  # the log keeps every attempt's output; say where the retry's begins
                with open(log_path(run.name), "a") as header:
                    when = time.strftime("%F %T")
                    header.write(f"# oprl sweep: attempt {attempt} of {retries + 1}, {when}\n")
            runner.start(argv, log_path(run.name))
            self.busy[runner] = (run, attempt)
            self.selector.register(runner.stdout, selectors.EVENT_READ, runner)

    def settle(self, runner: _Runner, retries: int, log_path, log) -> tuple[tuple, int] | None:
        """A runner that answered: ``((run, attempt), exit code)`` when its run is done (succeeded, or failed past
        its retries), None when the attempt goes back to the queue (a stale runner, or a retry: ``try_again``)."""
        self.selector.unregister(runner.stdout)
        run, attempt = self.busy.pop(runner)
        rc = runner.result()
        if rc is None:  # the runner's oprl is older than the source on disk: a fresh one runs it
            runner.close()
            self.queue.insert(0, (run, attempt))
            self.idle.append(_Runner(self.env))
            return None
        self.idle.append(runner if runner.alive() else _Runner(self.env))  # a runner that died is replaced
        if rc != 0 and try_again(self.queue, run, attempt, retries, f"(exit {rc})", log_path, log):
            self.retried += 1
            return None
        return (run, attempt), rc

    def status(self, run, rc: int) -> str:
        """The progress line's text after ``run`` finished with ``rc``."""
        counts = [f", {len(self.failures)} failed"] if self.failures else []
        counts += [f", {self.retried} retried"] if self.retried else []
        return f"last: {run.name} ({'ok' if rc == 0 else 'failed'}){''.join(counts)}"

    def close(self, stop: bool) -> None:
        """End every runner: an interrupted sweep (``stop``) stops each run as ``oprl train`` does on SIGTERM."""
        for runner in self.busy:
            runner.close(stop=stop)
        for runner in self.idle:
            runner.close()


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
