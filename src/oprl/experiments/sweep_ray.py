"""``oprl sweep --backend ray``: a sweep's runs spread over the nodes of a Ray cluster, one Ray task per attempt.

Each attempt of a run is one remote task (``ray.remote(num_cpus=cpus_per_run, max_retries=0)``) that runs
``python -m oprl.cli train <argv>`` as a subprocess in the sweep's working directory, with its output appended to
``<sweep>/logs/<run>.log``: exactly the command a local sweep runs, on whichever node has the CPUs. What to run is
decided on the driver by the local sweep's own code (``prepare``: ``oprl.experiments.sweep._prepare``, the resume
rule: finished runs were skipped before, an unfinished run with a committed checkpoint continues from it, any
other starts over), before every attempt, so a retry of a run that died after a checkpoint continues from it.

Retries are the sweep's, not Ray's (``max_retries=0``): a run whose ``oprl train`` exits non-zero, or whose task
is lost (its worker process killed, its node gone), is submitted again up to ``retries`` times, each with a line on
the console and the resume decision made again; one budget for every kind of failure. Ray retrying a lost task by
itself would rerun the first attempt's arguments (``resume=true`` or not) without that decision, and silently.

Why tasks and not Ray Tune: a sweep here is a fixed grid whose runs already checkpoint and resume themselves
(``oprl train resume=true``) into run directories that ``oprl report`` reads; Tune would add its own trial
directories, its own checkpoint/resume and search-space semantics on top, two resume rules and runs moved out of
``<output_dir>/<run>``. A task per run keeps the local sweep's layout and rule, and only changes where a run
executes.

The run directory must be on storage every node sees (one machine, or a shared filesystem mounted at the same path
everywhere): a task refuses to start when the sweep's ``logs/`` directory, made by the driver, is not there.

Fault injection, a test tool (as ``OPRL_FAULT`` is for workers): ``OPRL_SWEEP_FAULT="RUN@N[,RUN@N...]"`` makes
the first ``N`` attempts of run ``RUN`` fail as a typo would, through ``oprl train`` itself: they get the unknown
override ``sweep_fault=injected`` (exit 2). Read by the driver only (either pool's: ``sweep_local.faults``); nothing
else of oprl reads it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import ray

from oprl.errors import OprlError
from oprl.experiments.sweep_local import FAULT_OVERRIDE, FAULT_VARIABLE, faults, try_again

STOP_GRACE_S = 120.0
"""How long a cancelled attempt waits for its ``oprl train`` to stop at a step boundary (SIGTERM) before SIGKILL."""


@dataclass(frozen=True)
class Attempt:
    """How one attempt of a run ended: ``rc`` (None when its task was lost or raised), where, and why."""

    rc: int | None
    node: str = "?"
    cause: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == 0


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when the task's worker process dies, so that a killed worker
    (``ray.shutdown``, a lost node's raylet) stops its run at a step boundary instead of leaving it orphaned."""
    import ctypes
    import signal

    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _attempt(argv: list[str], log: str, cwd: str, env: dict[str, str], header: str) -> dict:
    """The body of one attempt's Ray task: ``oprl train`` in a subprocess, output appended to ``log``."""
    node = f"{ray.get_runtime_context().get_node_id()[:8]} at {ray.util.get_node_ip_address()}"
    if not Path(log).parent.is_dir():
        raise RuntimeError(
            f"{Path(log).parent} is not on node {node}: a Ray sweep's output directory must be on storage every "
            "node sees (docs/sweeps.md#sweeps-on-a-ray-cluster)"
        )
    with open(log, "ab", buffering=0) as out:
        out.write(f"# oprl sweep: {header} on node {node}, {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
        proc = subprocess.Popen(
            [sys.executable, "-m", "oprl.cli", *argv],
            cwd=cwd,
            env=dict(os.environ, **env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        try:
            rc = None
            while rc is None:  # in Python, not one blocking wait: ray.cancel's KeyboardInterrupt lands between waits
                with contextlib.suppress(subprocess.TimeoutExpired):
                    rc = proc.wait(timeout=1.0)
        except BaseException:  # ray.cancel (KeyboardInterrupt): the run stops as `oprl train` does on SIGTERM
            proc.terminate()
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
    return {"rc": rc, "node": node}


class RayCluster:
    """The sweep's Ray: connects to ``address`` (else ``RAY_ADDRESS``), else starts a local instance with this
    machine's CPUs; one already initialised in this process (a test's) is used and left as it was."""

    def __init__(self, address: str | None, cpus_per_run: float):
        self.cpus_per_run = cpus_per_run
        self._started = False
        if not ray.is_initialized():
            address = address or os.environ.get("RAY_ADDRESS") or None
            try:
                if address:
                    ray.init(address=address, include_dashboard=False, log_to_driver=False)
                else:
                    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
            except ConnectionError as exc:
                raise OprlError(f"sweep --address: cannot connect to the Ray cluster at {address!r}: {exc}") from None
            self._started = True
        self._task = ray.remote(_attempt).options(num_cpus=cpus_per_run, max_retries=0)
        if self.capacity() == 0:
            self.close()
            raise OprlError(
                f"sweep cpus_per_run={cpus_per_run}: no node of the Ray cluster has that many CPUs ({self.describe()})"
            )

    def _node_cpus(self) -> list[float]:
        return [n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n.get("Alive")]

    def capacity(self) -> int:
        """Runs the live nodes hold at once, ``cpus_per_run`` each (read again each time: joining nodes count)."""
        return sum(int(cpus // self.cpus_per_run) for cpus in self._node_cpus())

    def describe(self) -> str:
        cpus = self._node_cpus()
        return f"{len(cpus)} node(s), {sum(cpus):g} CPUs, up to {self.capacity()} runs at once"

    def submit(self, argv: list[str], log: Path, env: dict[str, str], header: str):
        return self._task.remote(argv, str(log), str(Path.cwd()), env, header)

    def ready(self, refs: list, timeout: float) -> list:
        if not refs:
            return []
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        return done

    def result(self, ref) -> Attempt:
        try:
            answer = ray.get(ref)
        except ray.exceptions.RayError as exc:  # lost (worker or node died) or the wrapper raised
            lines = str(exc).strip().splitlines() or [""]
            if isinstance(exc, ray.exceptions.RayTaskError):  # the wrapper's exception, its last line
                return Attempt(rc=None, cause=lines[-1])
            return Attempt(rc=None, cause=f"{type(exc).__name__}: {lines[-1].split('. ')[0]}")  # its first sentence
        return Attempt(rc=int(answer["rc"]), node=answer["node"], cause=f"exit {answer['rc']}")

    def cancel(self, refs: list) -> None:
        """Stop attempts in flight (the sweep was interrupted): each ``oprl train`` gets SIGTERM, then the
        tasks are waited for up to STOP_GRACE_S."""
        for ref in refs:
            ray.cancel(ref)
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=STOP_GRACE_S + 10)

    def close(self) -> None:
        if self._started:
            ray.shutdown()
            self._started = False


def forwarded_env(cpus_per_run: float) -> dict[str, str]:
    """What every attempt's ``oprl train`` gets on top of its node's environment: the driver's ``OPRL_*`` settings
    (the model cache, ...) and torch threads for its CPUs, as a local sweep gives each run cores // parallel."""
    threads = str(max(1, int(cpus_per_run)))
    env = {k: v for k, v in os.environ.items() if k.startswith("OPRL_") and k != FAULT_VARIABLE}
    return env | {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}


def execute(
    todo: list,
    *,
    cluster,
    prepare: Callable[[object], list[str]],
    log_path: Callable[[str], Path],
    retries: int,
    log=print,
    on_success: Callable[[object], None] | None = None,
) -> list[str]:
    """Run ``todo`` (``PlannedRun``s) on ``cluster`` (``RayCluster``, or a fake with its methods): at most
    ``cluster.capacity()`` attempts in flight, each failed run submitted again up to ``retries`` times; the names
    of the runs that still failed. ``on_success(run)`` is called on the driver after each run that succeeded."""
    from oprl.progress import RunProgress

    injected = faults()
    env = forwarded_env(getattr(cluster, "cpus_per_run", 1))
    queue = [(run, 1) for run in todo]
    flying: dict = {}  # ref -> (run, attempt)
    failures: list[str] = []
    done = retried = 0
    finished = False
    try:
        with RunProgress(len(todo), description="sweep", unit="run", interval=1) as progress:
            while queue or flying:
                while queue and len(flying) < max(1, cluster.capacity()):
                    run, attempt = queue.pop(0)
                    argv = prepare(run)
                    if attempt <= injected.get(run.name, 0):
                        argv.append(FAULT_OVERRIDE)
                    header = f"attempt {attempt} of {retries + 1}"
                    flying[cluster.submit(argv, log_path(run.name), env, header)] = (run, attempt)
                for ref in cluster.ready(list(flying), timeout=1.0):
                    run, attempt = flying.pop(ref)
                    outcome = cluster.result(ref)
                    where = f"on node {outcome.node} " if outcome.node != "?" else ""
                    cause = f"{where}({outcome.cause})"
                    if not outcome.ok and try_again(queue, run, attempt, retries, cause, log_path, log):
                        retried += 1
                        continue
                    done += 1
                    if not outcome.ok:
                        failures.append(run.name)
                        tries = f" after {attempt} attempts" if attempt > 1 else ""
                        log(f"run {run.name} failed {where}({outcome.cause}){tries}; see {log_path(run.name)}")
                    elif on_success is not None:
                        on_success(run)
                    counts = [f"{len(flying)} running"]
                    counts += [f"{len(failures)} failed"] if failures else []
                    counts += [f"{retried} retried"] if retried else []
                    status = "ok" if outcome.ok else "failed"
                    progress.update(done, f"{', '.join(counts)}  last: {run.name} ({status}, node {outcome.node})")
        finished = True
    finally:
        if not finished:
            cluster.cancel(list(flying))
    return failures
