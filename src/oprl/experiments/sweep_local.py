"""How ``oprl sweep`` runs its runs on this machine (``backend: local``): ``parallel`` long-lived runner processes
(``python -m oprl.experiments.sweep_runner``: torch and transformers imported once per runner, not once per run), fed
one planned run at a time over a pipe, each run's output in its log; SIGTERM stops them all at a step boundary.

Split from ``oprl.experiments.sweep`` (the spec, the plan, the resume rule, the table), which prepares each run and
calls ``execute``, to keep each module under ~500 lines (#23); ``oprl.experiments.sweep_ray`` is the Ray backend's
counterpart.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

STOP_GRACE_S = 120.0
"""How long an interrupted sweep waits for a run to stop at a step boundary before it kills the runner."""


def execute(todo: list, parallel: int, *, prepare, log_path, log, on_success=None) -> list[str]:
    """Run ``todo`` (planned runs) on ``parallel`` long-lived runner processes (``oprl.experiments.sweep_runner``):
    ``prepare(run)`` gives a run's ``oprl`` arguments just before it starts, ``log_path(name)`` its log;
    ``on_success(run)`` after each run that succeeded. The names of the runs that failed."""
    import selectors

    from oprl.progress import RunProgress

    threads = max(1, (os.cpu_count() or 1) // parallel)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    idle = [_Runner(env) for _ in range(min(parallel, len(todo)))]
    busy: dict[_Runner, Any] = {}
    failures: list[str] = []
    queue = list(todo)
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
                    run, runner = queue.pop(0), idle.pop()
                    runner.start(prepare(run), log_path(run.name))
                    busy[runner] = run
                    selector.register(runner.stdout, selectors.EVENT_READ, runner)
                for key, _ in selector.select(timeout=1.0):
                    runner = key.data
                    selector.unregister(runner.stdout)
                    run = busy.pop(runner)
                    rc = runner.result()
                    if rc is None:  # the runner's oprl is older than the source on disk: a fresh one runs it
                        runner.close()
                        queue.insert(0, run)
                        idle.append(_Runner(env))
                        continue
                    done += 1
                    if rc != 0:
                        failures.append(run.name)
                        log(f"run {run.name} failed (exit {rc}); see {log_path(run.name)}")
                    elif on_success is not None:
                        on_success(run)
                    failed = f", {len(failures)} failed" if failures else ""
                    progress.update(done, f"last: {run.name} ({'ok' if rc == 0 else 'failed'}){failed}")
                    idle.append(runner if runner.alive() else _Runner(env))
        finished = True
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        for runner in busy:  # interrupted: each run stops as `oprl train` does on SIGTERM, then its runner exits
            runner.close(stop=not finished)
        for runner in idle:
            runner.close()
    return failures


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
