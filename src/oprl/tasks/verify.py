"""Answer checking with math-verify in worker processes, under a hard per-answer wall-clock timeout.

A reward function hands ``(reference, candidate)`` string pairs to a ``VerifierPool``; each pair is checked
by math-verify (``parse`` then ``verify``, i.e. sympy) inside a separate Python process. The parent waits at
most ``timeout`` seconds for each answer; when that passes, the worker is killed (SIGKILL) and replaced,
and the answer gets the verdict ``"timeout"``. A worker that dies or raises gives ``"error"``. Both score 0
upstream and are counted, so a hostile or merely unlucky model output (``9^9^9^9`` makes sympy compute a
number with 370 million digits) can neither hang training nor crash it.

Why a process: math-verify's own timeout uses ``signal.alarm``, which only works in the main thread and
cannot interrupt C code, and a thread cannot be killed at all. A process can. Messages are JSON lines over
the worker's stdin/stdout (no pickle), the worker runs with a memory limit, and model text is only ever
handed to math-verify's parsers as a string: nothing is evaluated as code.

The transport is generic: ``WorkerPool`` runs any ``python -m MODULE`` whose main calls ``serve(handler)``
(JSON object in, JSON object out, per line) under the same timeout and kill rules; ``VerifierPool`` is it
with the answer-checking workers, and the dataset task's user rewards (``oprl.tasks.user_reward``) use it too.

Not here: extracting the answer from a response (``oprl.tasks.rewards``), any notion of reward.
Run one worker by hand: ``echo '{"gold": "72", "pred": "72"}' | python -m oprl.tasks.verify``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

from oprl.errors import OprlError

VERDICTS = ("match", "mismatch", "malformed", "timeout", "error")
KINDS = ("math", "tool-call")
"""Worker kinds: ``math`` imports math-verify at start-up; ``tool-call`` checks ``oprl.tasks.toolcall`` verdicts."""
# The worker's address-space limit: sympy on a pathological input can allocate without bound before the
# timeout fires; 2 GiB is far above what honest answers need (~200 MB with the imports).
WORKER_MEMORY_BYTES = 2 * 1024**3
_SRC_DIR = Path(__file__).resolve().parents[2]  # so the worker imports this very copy of oprl


def require_math_verify(task: str) -> None:
    """One-line ``OprlError`` when math-verify is missing (checked up front, not in a worker)."""
    import importlib.util

    if importlib.util.find_spec("math_verify") is None:
        raise OprlError(f"task.name={task}: answer checking needs math-verify; pip install 'oprl[math]'")


@dataclass(frozen=True)
class Job:
    """One comparison: ``gold`` is the reference answer, ``pred`` the model's (already extracted) answer.

    ``mode`` says how to read them: ``plain`` (free text such as ``72``, ``$1,000`` or ``\\frac{1}{2}``,
    the GSM8k reward) or ``latex`` (the content of a ``\\boxed{}``, the MATH reward), both for ``math``
    workers; ``tool-call`` / ``tool-call-nothink`` for ``tool-call`` workers: ``gold`` is the JSON ground
    truth, ``pred`` the whole response, the verdict ``oprl.tasks.toolcall.verdict``'s (with / without the
    think-tag rules).
    """

    gold: str
    pred: str
    mode: str = "plain"


class WorkerPool:
    """``workers`` JSON-line worker processes (``python -m <command...>``) under a hard per-request timeout.

    ``run(requests)`` sends each request (a JSON object) to a free worker and returns one reply object per
    request, in order. A request that outlives ``timeout`` seconds (counted from the moment it is sent, so
    start-up is never charged to it) gets ``{"verdict": "timeout"}`` and its worker is killed and replaced; a
    worker that dies on a request gives ``{"verdict": "error", "error": "worker exited"}``. Workers start on
    first use and are killed by ``close()``, at garbage collection or at interpreter exit. The worker side is
    ``serve``. ``what`` names the workers in start-up errors.
    """

    def __init__(
        self,
        command: list[str],
        workers: int = 1,
        timeout: float = 5.0,
        startup_timeout: float = 120.0,
        what: str = "worker",
    ):
        if workers < 1 or timeout <= 0:
            raise ValueError("a worker pool needs workers >= 1 and timeout > 0")
        self.command = list(command)
        self.num_workers = workers
        self.timeout = timeout
        self.startup_timeout = startup_timeout
        self.what = what
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()  # one batch at a time: callers may share a task across threads
        self._finalizer = weakref.finalize(self, _kill_all, self._workers)

    def run(self, requests: list[dict]) -> list[dict]:
        """One reply per request, in order (see the class docstring for timeouts and crashes)."""
        with self._lock:
            return self._run(requests)

    def close(self) -> None:
        self._finalizer()

    def _worker(self) -> _Worker:
        return _Worker(self.startup_timeout, self.command, self.what)

    def _run(self, requests: list[dict]) -> list[dict]:
        results: list[dict | None] = [None] * len(requests)
        queue = list(range(len(requests)))[::-1]
        while len(self._workers) < self.num_workers:
            self._workers.append(self._worker())
        selector = selectors.DefaultSelector()
        try:
            while queue or any(w.job is not None for w in self._workers):
                for worker in self._workers:
                    if worker.ready and worker.job is None and queue:
                        index = queue.pop()
                        worker.send(index, requests[index], self.timeout)
                self._wait(selector)
                for slot, worker in enumerate(self._workers):
                    outcome = worker.poll()
                    if outcome is None:
                        continue
                    settled, reply = outcome
                    if settled is not None:
                        results[settled] = reply
                    if not worker.alive:
                        self._workers[slot] = self._worker()
        finally:
            selector.close()
        return [r if r is not None else {"verdict": "error", "error": "no reply"} for r in results]

    def _wait(self, selector: selectors.BaseSelector) -> None:
        """Block until some worker has output or the earliest deadline passes."""
        busy = [w for w in self._workers if not w.ready or w.job is not None]
        if not busy or any(b"\n" in w.buffer for w in busy):
            return
        for key in list(selector.get_map().values()):
            selector.unregister(key.fileobj)
        for worker in busy:
            selector.register(worker.stdout, selectors.EVENT_READ)
        wait = min(w.deadline for w in busy) - time.monotonic()
        selector.select(max(wait, 0.0))


class VerifierPool(WorkerPool):
    """``workers`` answer-checking processes of ``kind`` (math-verify or tool-call); ``check(jobs)`` returns
    one verdict per job, in order. ``counts`` accumulates verdicts over the pool's life."""

    def __init__(self, workers: int = 1, timeout: float = 5.0, startup_timeout: float = 120.0, kind: str = "math"):
        if kind not in KINDS:
            raise ValueError(f"VerifierPool needs kind in {KINDS}")
        super().__init__(["oprl.tasks.verify", kind], workers, timeout, startup_timeout, "answer-checking worker")
        self.kind = kind
        self.counts = dict.fromkeys(VERDICTS, 0)
        self._cache: dict[Job, str] = {}

    def check(self, jobs: list[Job]) -> list[str]:
        """Verdicts (``match``/``mismatch``/``timeout``/``error``) for ``jobs``; identical jobs are checked once."""
        with self._lock:
            return self._check(jobs)

    def _check(self, jobs: list[Job]) -> list[str]:
        verdicts: list[str | None] = [self._cache.get(job) for job in jobs]
        todo: dict[Job, list[int]] = {}
        for index, job in enumerate(jobs):
            if verdicts[index] is None:
                todo.setdefault(job, []).append(index)
        requests = [{"gold": job.gold, "pred": job.pred, "mode": job.mode} for job in todo]
        for job, reply in zip(todo, self._run(requests), strict=True):
            verdict = _verdict(reply)
            if verdict in ("match", "mismatch", "malformed"):  # a timeout may be load; never cache it
                if len(self._cache) > 100_000:
                    self._cache.clear()
                self._cache[job] = verdict
            for index in todo[job]:
                verdicts[index] = verdict
        settled = [v for v in verdicts if v is not None]
        assert len(settled) == len(verdicts)  # every job was cached or has just been checked
        for v in settled:
            self.counts[v] += 1
        return settled


def _verdict(reply: dict) -> str:
    if reply.get("verdict") in VERDICTS:
        return reply["verdict"]
    return "error" if "error" in reply else ("match" if reply.get("match") else "mismatch")


class _Worker:
    """One child process and the parent's view of it (ready?, current job, deadline, partial output)."""

    def __init__(self, startup_timeout: float, command: list[str], what: str):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_SRC_DIR), env.get("PYTHONPATH")]))
        self.what = what
        self.process = subprocess.Popen(
            [sys.executable, "-m", *command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            bufsize=0,
            env=env,
        )
        assert self.process.stdin is not None and self.process.stdout is not None  # both are pipes (PIPE above)
        self.stdin, self.stdout = self.process.stdin, self.process.stdout
        os.set_blocking(self.stdout.fileno(), False)
        self.buffer = b""
        self.ready = False
        self.alive = True
        self.job: int | None = None
        self.deadline = time.monotonic() + startup_timeout
        _LIVE.add(self.process)

    def send(self, index: int, request: dict, timeout: float) -> None:
        self.job = index
        self.deadline = time.monotonic() + timeout
        message = json.dumps(request) + "\n"
        with contextlib.suppress(OSError):  # the worker is gone; poll() reports it
            self.stdin.write(message.encode())

    def poll(self) -> tuple[int | None, dict] | None:
        """``(job index, reply)`` once the current job is settled, else None. Start-up failure raises."""
        line = self._read_line()
        if line is not None:
            try:
                reply = json.loads(line)
            except ValueError:
                reply = {"error": "unreadable reply"}
            if not self.ready:
                if "ready" not in reply:
                    self.kill()
                    raise RuntimeError(f"{self.what} failed to start: {reply.get('fatal', reply)}")
                self.ready = True
                return None
            index, self.job = self.job, None
            return index, reply
        exited = self.process.poll() is not None
        if not self.ready and (exited or time.monotonic() > self.deadline):
            self.kill()
            raise RuntimeError(f"{self.what} did not start")
        if self.job is not None and (exited or time.monotonic() > self.deadline):
            index = self.job
            self.kill()
            return index, {"verdict": "error", "error": "worker exited"} if exited else {"verdict": "timeout"}
        return None

    def _read_line(self) -> bytes | None:
        while b"\n" not in self.buffer:
            try:
                chunk = os.read(self.stdout.fileno(), 65536)
            except BlockingIOError:
                return None
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def kill(self) -> None:
        self.alive, self.ready = False, False
        _stop(self.process)


_LIVE: weakref.WeakSet = weakref.WeakSet()


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()
    for stream in (process.stdin, process.stdout):
        if stream is not None:
            stream.close()
    _LIVE.discard(process)


def _kill_all(workers: list[_Worker]) -> None:
    for worker in workers:
        _stop(worker.process)
    workers.clear()


@atexit.register
def _kill_leftovers() -> None:
    for process in list(_LIVE):
        _stop(process)


# ---------------------------------------------------------------- the worker side (a separate process)


def _verify_pair(gold: str, pred: str, mode: str) -> bool:
    """math-verify's verdict on one pair; its own signal-based timeouts are off (the parent enforces one)."""
    from math_verify import parse, verify

    def read(text: str):
        if mode == "latex":
            return parse(f"$\\boxed{{{text}}}$", parsing_timeout=None) or parse(text, parsing_timeout=None)
        return parse(text, parsing_timeout=None) or parse(f"${text}$", parsing_timeout=None)

    gold_parsed, pred_parsed = read(gold), read(pred)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))


def serve(handle, *, memory_limit: int | None = WORKER_MEMORY_BYTES) -> None:
    """The worker side of ``WorkerPool``: say ready, then answer each JSON request line with ``handle(request)``
    (a JSON object); an exception becomes ``{"error": "<type>: <message>"}``. The protocol keeps the real
    stdout: anything the handler prints goes to stderr. ``memory_limit`` caps the address space (None = none)."""
    import resource

    if memory_limit is not None:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    out, sys.stdout = sys.stdout, sys.stderr
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        try:
            reply = handle(json.loads(line))
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            reply = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


def fatal(message: str) -> None:
    """Report a start-up failure to the parent (the worker then exits)."""
    sys.stdout.write(json.dumps({"fatal": message}) + "\n")
    sys.stdout.flush()


def _check_request(request: dict) -> dict:
    gold, pred, mode = str(request["gold"]), str(request["pred"]), request.get("mode", "plain")
    if mode.startswith("tool-call"):
        from oprl.tasks.toolcall import verdict

        return {"verdict": verdict(gold, pred, think=mode == "tool-call")}
    return {"match": _verify_pair(gold, pred, mode)}


def _worker_main(kind: str = "math") -> None:
    import logging

    logging.disable(logging.WARNING)  # math-verify warns about the disabled timeouts on every call
    if kind == "math":
        try:
            import math_verify  # noqa: F401
        except ImportError as exc:
            return fatal(f"math-verify is not installed ({exc})")
    serve(_check_request)


if __name__ == "__main__":
    _worker_main(sys.argv[1] if len(sys.argv) > 1 else "math")
