"""Reward processes: child processes for code that may hang, crash, print or allocate, in a pool under a hard
per-request timeout. (Not oprl's role workers, ``TrainerWorker`` / ``ExplorerWorker``: these only score.)

``RewardPool`` runs ``processes`` reward processes calling ``MODULE._process_main(*args)``, which calls
``serve(handler)``; each request (a JSON object) goes to a free reward process and comes back as one JSON reply.
The answer checkers of ``oprl.tasks.rewards.verify`` (math-verify, tool calls), the reasoning-gym scorer and the
user rewards of ``oprl.tasks.rewards.user`` run here.

What a reward process cannot do to the run:
- **hang it**: a request that outlives ``timeout`` seconds (counted from the moment it is sent) gets
  ``{"verdict": "timeout"}`` and its process is killed (SIGKILL) and replaced; a process that does not start
  within ``startup_timeout`` (a module that blocks at import) is one ``OprlError`` line;
- **attach a reply to the wrong request**: requests and replies travel on a pipe pair of their own, not
  on fds 0/1/2, which the handler's children (``subprocess.run``) and C code that prints inherit. The
  process's stdin is ``/dev/null`` and its stdout and stderr go to ``log_path`` (default: the file named by
  the environment variable ``OPRL_REWARD_LOG``, which a run sets to ``<run_dir>/workers.log``, a name kept
  from before the rename; without one, the parent's stderr), so a user's prints are kept. Each request
  carries an ``id`` that its reply must echo; a reply with another id kills the process and the request is
  an ``error``;
- **exhaust memory**: the process's address space is capped at ``memory_mb`` (``resource.setrlimit``,
  before it imports anything of its own); an allocation past it raises ``MemoryError``, which the reply
  reports as ``{"error": "MemoryError: ...", "memory": true}``.

Not here: what a request means (``oprl.tasks.rewards.verify``, ``oprl.tasks.rewards.user``), any notion of reward.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import selectors
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from oprl.errors import OprlError

LOG_ENV = "OPRL_REWARD_LOG"
"""Environment variable naming the file reward processes append their stdout and stderr to (a run sets it)."""
LOG_NAME = "workers.log"
"""That file's name in a run directory."""
_CHANNEL_ENV = "OPRL_REWARD_CHANNEL"  # "<request fd>,<reply fd>" in the reward process
_MEMORY_ENV = "OPRL_REWARD_MEMORY_MB"
_ENTRY = "import sys; from {module} import _process_main; _process_main(*sys.argv[1:])"
_SRC_DIR = Path(__file__).resolve().parents[2]  # so the reward process imports this very copy of oprl


@contextlib.contextmanager
def reward_log(path: Path) -> Iterator[None]:
    """Reward processes started inside the block (in this process or its children) log to ``path``."""
    previous = os.environ.get(LOG_ENV)
    os.environ[LOG_ENV] = str(path)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(LOG_ENV, None)
        else:
            os.environ[LOG_ENV] = previous


_EXITED = "reward process exited"
"""The error of a row whose reward process died while scoring it (retried once in a new process)."""


class RewardPool:
    """``processes`` reward processes running ``command[0]._process_main(*command[1:])`` under a hard
    per-request timeout.

    ``run(requests)`` returns one reply object per request, in order; ``start()`` starts every process and
    waits until each is ready (else ``OprlError``; ``run`` starts them on first use otherwise). They are
    killed by ``close()``, at garbage collection or at interpreter exit. ``what`` names them in errors.
    """

    def __init__(
        self,
        command: list[str],
        processes: int = 1,
        timeout: float = 5.0,
        startup_timeout: float = 120.0,
        what: str = "reward process",
        *,
        memory_mb: int | None = None,
        log_path: str | Path | None = None,
    ):
        if processes < 1 or timeout <= 0:
            raise ValueError("a reward pool needs processes >= 1 and timeout > 0")
        self.command = list(command)
        self.num_processes = processes
        self.timeout = timeout
        self.startup_timeout = startup_timeout
        self.what = what
        self.memory_mb = memory_mb
        self.log_path = log_path
        self._ids = itertools.count()
        self._processes: list[_RewardProcess] = []
        self._lock = threading.Lock()  # one batch at a time: callers may share a task across threads
        self._finalizer = weakref.finalize(self, _kill_all, self._processes)

    def run(self, requests: list[dict]) -> list[dict]:
        """One reply per request, in order (see the class docstring for timeouts and crashes)."""
        with self._lock:
            return self._run(requests)

    def start(self) -> None:
        """Start every reward process and wait until all are ready; ``OprlError`` naming why one is not."""
        with self._lock:
            self._fill()
            while not all(w.ready for w in self._processes):
                self._wait([w for w in self._processes if not w.ready])
                for child in self._processes:
                    child.poll()

    def close(self) -> None:
        self._finalizer()

    def _fill(self) -> None:
        log = self.log_path or os.environ.get(LOG_ENV)
        self._processes[:] = [w for w in self._processes if w.alive]
        while len(self._processes) < self.num_processes:
            self._processes.append(_RewardProcess(self.command, self.startup_timeout, self.what, self.memory_mb, log))

    def _run(self, requests: list[dict]) -> list[dict]:
        results: list[dict | None] = [None] * len(requests)
        queue = list(range(len(requests)))[::-1]
        retried: set[int] = set()
        self._fill()
        while queue or any(w.job is not None for w in self._processes):
            for child in self._processes:
                if child.ready and child.job is None and queue:
                    index = queue.pop()
                    child.send(index, next(self._ids), requests[index], self.timeout)
            self._wait([w for w in self._processes if not w.ready or w.job is not None])
            for child in self._processes:
                settled = child.poll()
                if settled is None:
                    continue
                index, reply = settled
                # A process that died under a row (killed from outside, out of memory) scores it once more in a
                # fresh one: rewards are deterministic, so the row gets the reward an undisturbed run gives it. A
                # row whose reward kills every process it runs in is an error after that one retry.
                if reply.get("error") == _EXITED and index not in retried:
                    retried.add(index)
                    queue.append(index)
                else:
                    results[index] = reply
            self._fill()  # replace the reward processes that were killed or died
        return [r if r is not None else {"verdict": "error", "error": "no reply"} for r in results]

    @staticmethod
    def _wait(busy: list[_RewardProcess]) -> None:
        """Block until one of ``busy`` has output or the earliest deadline passes."""
        if not busy or any(b"\n" in w.buffer for w in busy):
            return
        with selectors.DefaultSelector() as selector:
            for child in busy:
                selector.register(child.replies, selectors.EVENT_READ)
            selector.select(max(min(w.deadline for w in busy) - time.monotonic(), 0.0))


class _RewardProcess:
    """One child process and the parent's view of it (ready?, current job and its id, deadline, partial reply)."""

    def __init__(self, command: list[str], startup_timeout: float, what: str, memory_mb: int | None, log):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_SRC_DIR), env.get("PYTHONPATH")]))
        requests_read, requests_write = os.pipe()
        replies_read, replies_write = os.pipe()
        env[_CHANNEL_ENV] = f"{requests_read},{replies_write}"
        if memory_mb:
            env[_MEMORY_ENV] = str(memory_mb)
        self.what = what
        output: IO[bytes] | None = open(log, "ab") if log else None  # noqa: SIM115 (closed right after Popen)
        try:
            self.process = subprocess.Popen(
                # `-c`, not `-m MODULE`: the modules with a _process_main are imported by oprl.tasks, and
                # running one as __main__ after that makes runpy warn on every start.
                [sys.executable, "-c", _ENTRY.format(module=command[0]), *command[1:]],
                stdin=subprocess.DEVNULL,
                stdout=output if output is not None else 2,  # fd 2 itself: sys.stderr may be a capture object
                stderr=output,
                pass_fds=(requests_read, replies_write),
                env=env,
            )
        finally:
            os.close(requests_read)
            os.close(replies_write)
            if output is not None:
                output.close()
        self.requests = os.fdopen(requests_write, "wb", buffering=0)
        self.replies = os.fdopen(replies_read, "rb", buffering=0)
        os.set_blocking(replies_read, False)
        self.buffer = b""
        self.ready = False
        self.alive = True
        self.job: int | None = None
        self.job_id: int | None = None
        self.deadline = time.monotonic() + startup_timeout
        self.startup_timeout = startup_timeout
        _LIVE.add(self)

    def send(self, index: int, job_id: int, request: dict, timeout: float) -> None:
        self.job, self.job_id = index, job_id
        self.deadline = time.monotonic() + timeout
        with contextlib.suppress(OSError):  # the reward process is gone; poll() reports it
            self.requests.write((json.dumps({**request, "id": job_id}) + "\n").encode())

    def poll(self) -> tuple[int, dict] | None:
        """``(job index, reply)`` once the current job is settled, else None. Start-up failure: ``OprlError``."""
        # Exit status first, pipe second: a process that writes its last line (a fatal diagnosis, a reply) and
        # exits between the two checks would otherwise be seen as exited with nothing said; read in this
        # order, whatever an exited process wrote is already in the pipe.
        exited = self.process.poll() is not None
        line = self._read_line()
        if line is not None:
            try:
                reply = json.loads(line)
            except ValueError:
                reply = {"error": "unreadable reply"}
            if not isinstance(reply, dict):
                reply = {"error": "unreadable reply"}
            if not self.ready:
                if "ready" not in reply:
                    self.kill()
                    raise OprlError(f"{self.what} failed to start: {str(reply.get('fatal', reply))[:300]}")
                self.ready = True
                return None
            index, self.job = self.job, None
            if index is None:
                return None
            if reply.pop("id", None) != self.job_id:  # the channel is private: never expected, but never trusted
                self.kill()
                return index, {"verdict": "error", "error": "reward process replied to another request (killed)"}
            return index, reply
        if not self.ready and (exited or time.monotonic() > self.deadline):
            self.kill()
            if exited:
                raise OprlError(f"{self.what} exited while starting (its output is in the reward processes' log)")
            raise OprlError(
                f"{self.what} did not start within {self.startup_timeout:g}s (does the module block at import?)"
            )
        if self.job is not None and (exited or time.monotonic() > self.deadline):
            index, self.job = self.job, None
            self.kill()
            return index, {"verdict": "error", "error": _EXITED} if exited else {"verdict": "timeout"}
        return None

    def _read_line(self) -> bytes | None:
        while b"\n" not in self.buffer:
            try:
                chunk = os.read(self.replies.fileno(), 65536)
            except BlockingIOError:
                return None
            except OSError:
                return None
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def kill(self) -> None:
        self.alive, self.ready = False, False
        _stop(self)


_LIVE: weakref.WeakSet = weakref.WeakSet()


def _stop(child: _RewardProcess) -> None:
    if child.process.poll() is None:
        child.process.kill()
    child.process.wait()
    for stream in (child.requests, child.replies):
        with contextlib.suppress(OSError):
            stream.close()
    _LIVE.discard(child)


def _kill_all(children: list[_RewardProcess]) -> None:
    for child in children:
        _stop(child)
    children.clear()


@atexit.register
def _kill_leftovers() -> None:
    for child in list(_LIVE):
        _stop(child)


# ---------------------------------------------------------------- the reward process side (a separate process)


def _channel() -> tuple[IO[bytes], IO[bytes]]:
    """The reward process's ``(requests, replies)`` streams: the private pipes, kept from its own children.
    Started by hand (no channel in the environment), stdin and stdout."""
    fds = os.environ.pop(_CHANNEL_ENV, None)
    if fds is None:
        return sys.stdin.buffer, sys.stdout.buffer
    read, write = (int(fd) for fd in fds.split(","))
    os.set_inheritable(read, False)
    os.set_inheritable(write, False)
    return os.fdopen(read, "rb"), os.fdopen(write, "wb", buffering=0)


_STREAMS: list[tuple[IO[bytes], IO[bytes]]] = []


def _streams() -> tuple[IO[bytes], IO[bytes]]:
    if not _STREAMS:
        _STREAMS.append(_channel())
    return _STREAMS[0]


def start_reward_process() -> int | None:
    """Call first in a reward process's main: ignore SIGINT when a pool started it (a Ctrl-C to the process
    group is the parent's to handle; it kills its reward processes, and one whose parent is gone reads
    end-of-file and exits), open the channel, and cap the address space at the pool's ``memory_mb`` before any user code
    is imported. Returns that limit in MB (None = none)."""
    import resource
    import signal

    if _CHANNEL_ENV in os.environ:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    _streams()
    megabytes = int(os.environ.pop(_MEMORY_ENV, "0") or 0)
    if megabytes <= 0:
        return None
    limit = megabytes * 1024**2
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return megabytes


def _send(message: dict[str, Any]) -> None:
    _streams()[1].write((json.dumps(message) + "\n").encode())


def serve(handle: Callable[[dict], dict], *, memory_mb: int | None = None) -> None:
    """The reward process's side of ``RewardPool``: say ready, then answer each request line with
    ``handle(request)`` (a JSON object) on the private channel, echoing the request's ``id``. An exception becomes
    ``{"error": "<type>: <message>"}`` (``"memory": true`` for a ``MemoryError``; ``memory_mb`` is the limit
    ``start_reward_process`` set, for its message)."""
    requests, _ = _streams()
    _send({"ready": True})
    for line in requests:
        request = json.loads(line)
        try:
            reply = handle(request)
        except MemoryError:
            limit = f" of {memory_mb} MB" if memory_mb else ""
            reply = {"error": f"MemoryError: ran past the reward process's memory limit{limit}", "memory": True}
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            reply = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        sys.stdout.flush()  # the handler's prints reach the log in order with the replies
        _send({**reply, "id": request.get("id")})


def fatal(message: str) -> None:
    """Report a start-up failure to the parent (the reward process then exits)."""
    _send({"fatal": message})
