"""Local worker processes: the ``runtime.workers=processes`` flavour of the local backend.

Each compute worker (trainer, explorers) runs in its own ``spawn``-ed process, so Python code on one side
(Hugging Face ``generate`` is mostly Python between small kernels) never waits for the GIL held by the other;
the buffer stays a thread of the driver. A ``ProcessActor`` is a ``actor.QueuedActor`` like ``LocalActor``:
calls return futures at once; a sender thread resolves future arguments and pipes the call to the process, a
receiver thread sets the futures from the replies. Arguments and results are pickled through the pipe (torch
tensors through shared memory, as ``torch.multiprocessing`` arranges). Errors come back as ``RemoteError``
with the original type name; a process that dies fails every pending call with ``ProcessDied``, and
``ProcessActor.restart`` puts a fresh process behind the same actor (the driver's self-healing,
docs/runtime.md#self-healing-runs). ``OPRL_FAULT`` (``oprl.backends.faults``) kills a worker at a given step.

A worker process that calls another worker (an explorer asking the judge) holds a ``PipePeer``: its calls go
over a pipe of their own to a ``Relay`` thread of the driver, which queues each on the target's actor like
any call of the driver's and sends the value back (the rows cross the driver: they are texts).

``LocalRanks`` is the local backend's rank launcher: a group of ranks (``oprl.trainer.ranks.TrainerRank``)
as processes of this machine that meet at a free port of 127.0.0.1 (no torchrun).

Deliberately not here: more than one machine (use backend=ray).
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import multiprocessing.connection
import queue
import threading
import traceback
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass

from oprl.backends import faults
from oprl.backends.actor import QueuedActor, free_port, release
from oprl.backends.failure import ignore_stop_signals


class RemoteError(RuntimeError):
    """An exception raised inside a worker process (its type name and message); the worker's traceback is
    attached as a note, which ``--debug`` prints and the one-line message leaves out."""

    def __init__(self, kind: str, message: str, remote_traceback: str = "", worker: str = ""):
        super().__init__(f"{kind}: {message}")
        self.kind, self.message = kind, message
        self.worker = worker
        """``ProcessDied``: the worker whose process it was (a call whose argument came from that worker fails
        with the same error, and must not be taken for its own worker's death)."""
        if remote_traceback:  # what add_note (3.11+) does, also on 3.10
            self.__notes__ = [*getattr(self, "__notes__", []), f"in the worker process:\n{remote_traceback.rstrip()}"]


def _error(exc: BaseException) -> tuple[str, str, str]:
    return type(exc).__name__, str(exc), traceback.format_exc()


def _serve(conn, factory, args, threads) -> None:
    """The worker process: build the worker, then answer calls until told to stop or the pipe closes."""
    ignore_stop_signals()  # a Ctrl-C to the process group is the driver's to act on: it stops this process
    if threads:
        import torch

        torch.set_num_threads(threads)
    try:
        worker = factory(*args)
    except BaseException as exc:
        conn.send(("ready", None, False, _error(exc)))
        return
    conn.send(("ready", None, True, None))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return release(worker)  # the driver is gone (even after kill -9): nothing left to serve
        if message is None:
            return release(worker)
        call_id, method, call_args, returns, doomed = message
        if doomed is not None:  # OPRL_FAULT: this call is where the test kills the worker
            faults.die(doomed)
        try:
            result = getattr(worker, method)(*call_args)
            conn.send(("result", call_id, True, result if returns == 1 else tuple(result)))
        except BaseException as exc:
            conn.send(("result", call_id, False, _error(exc)))


class _Life:
    """One incarnation of a worker process: the process, its pipe, the calls not yet sent (``inbox``) and
    those sent and not yet answered (``pending``), with the sender and receiver threads that move them. A
    restart starts a new one; the old one's threads fail whatever it still held and end on their own, touching
    nothing of the new one."""

    def __init__(self, name: str, factory, args: tuple, threads: int | None, plan: faults.FaultPlan):
        self.name, self.plan = name, plan
        self.ready: Future = Future()
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=_serve, args=(child, factory, args, threads), name=f"oprl-{name}", daemon=True
        )
        self.process.start()
        child.close()
        self.pending: dict[int, tuple[Future, ...]] = {}
        self.dead: BaseException | None = None
        self.stopping = False
        self.ids = itertools.count()
        self.inbox: queue.Queue = queue.Queue()  # calls not yet sent (``stop`` cancels them)
        self.sender = threading.Thread(target=self._send, name=f"oprl-{name}-send", daemon=True)
        self.sender.start()
        self.receiver = threading.Thread(target=self._receive, name=f"oprl-{name}-receive", daemon=True)
        self.receiver.start()

    def _send(self) -> None:
        while (item := self.inbox.get()) is not None:
            method, args, futures = item
            try:
                if self.dead is not None:
                    raise self.dead
                if self.stopping:
                    raise CancelledError(f"{self.name}: stopped before {method} ran")
                resolved = [a.result() if isinstance(a, Future) else a for a in args]
                call_id = next(self.ids)
                self.pending[call_id] = futures
                doomed = self.plan.due(self.name, tuple(resolved))
                self.conn.send((call_id, method, resolved, len(futures), doomed))
            except BaseException as exc:
                if isinstance(exc, (BrokenPipeError, ConnectionResetError)):  # it died before the receiver saw it
                    self.receiver.join(timeout=10)
                    exc = self.dead or exc
                for future in futures:
                    if not future.done():
                        future.set_exception(exc)
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()  # it ignores SIGTERM (ignore_stop_signals)

    def _receive(self) -> None:
        while True:
            try:
                kind, call_id, ok, payload = self.conn.recv()
            except (EOFError, OSError):
                self.process.join(timeout=2)  # reaped, so the line says how it ended (-9: SIGKILL)
                exited = f"worker process exited ({self.process.exitcode})"
                self._fail_all(RemoteError("ProcessDied", exited, worker=self.name))
                return
            if kind == "ready":
                if ok:
                    self.ready.set_result(True)
                else:
                    self.ready.set_exception(RemoteError(*payload))
                continue
            futures = self.pending.pop(call_id)
            if not ok:
                for future in futures:
                    future.set_exception(RemoteError(*payload))
                continue
            values = (payload,) if len(futures) == 1 else payload
            for future, value in zip(futures, values, strict=True):
                future.set_result(value)

    def _fail_all(self, exc: BaseException) -> None:
        self.dead = exc
        if not self.ready.done():
            self.ready.set_exception(exc)
        for futures in list(self.pending.values()):
            for future in futures:
                if not future.done():
                    future.set_exception(exc)
        self.pending.clear()


class ProcessActor(QueuedActor):
    """A worker in a process of its own (``_Life``), which ``restart`` replaces by a fresh one built the same
    way: the same object stays the driver's handle and the run's to shut down."""

    def __init__(self, name: str, factory, args: tuple, threads: int | None, plan: faults.FaultPlan | None = None):
        self.name = name
        self._build = (factory, args, threads)
        self._plan = plan if plan is not None else faults.FaultPlan()
        self._stopping = False
        self._life = _Life(name, factory, args, threads, self._plan)
        self._inbox = self._life.inbox  # where QueuedActor.call queues: always the current process's
        self._lives = [self._life]

    @property
    def ready(self) -> Future:
        """Done once the current process has built its worker."""
        return self._life.ready

    @property
    def pid(self) -> int | None:
        """The worker process's id (None before it started)."""
        return self._life.process.pid

    def restart(self) -> Future:
        """Replace a dead worker process by a new one built from the same factory and arguments; returns its
        ``ready``. Calls queued from now on go to the new process (they wait in its pipe while it builds)."""
        with self._guard:  # against ``call``: nothing is queued on the old life after this
            if self._stopping:
                raise RuntimeError(f"{self.name}: stopped, not restarted")
            old, self._life = self._life, _Life(self.name, *self._build, self._plan)
            self._inbox = self._life.inbox
            self._lives.append(self._life)
            old.stopping = True
            old.inbox.put(None)
        return self._life.ready

    def stop(self) -> None:
        """Cancel the calls not yet sent; the process ends after its running call (``join`` waits for it)."""
        with self._guard:
            self._stopping = self._life.stopping = True
            self._inbox.put(None)

    def terminate(self) -> None:
        """Kill the process now (a peer of a failed collective would otherwise wait for its timeout)."""
        if self._life.process.is_alive():
            self._life.process.kill()
        self.stop()

    def join(self, timeout: float = 15.0) -> None:
        """Wait until every process this actor started has exited and its pipe is drained (after ``stop``)."""
        for life in self._lives:
            life.sender.join(timeout)
            life.receiver.join(timeout)


class PipePeer:
    """A worker process's line to another worker (``base.Peer``): one end of the pipe its ``Relay`` serves.
    Pickled into the calling worker's process with its factory arguments (the pipe's descriptor goes along)."""

    def __init__(self, conn):
        self._conn = conn
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {"_conn": self._conn}

    def __setstate__(self, state: dict) -> None:
        self._conn, self._lock = state["_conn"], threading.Lock()

    def call(self, method: str, *args):
        with self._lock:  # one call on the pipe at a time: replies come back in order
            self._conn.send((method, args))
            ok, payload = self._conn.recv()
        if not ok:
            raise RemoteError(*payload)
        return payload


class Relay:
    """The driver's side of a ``PipePeer``: a thread that queues each call it reads on ``actor`` and sends the
    value (or the error's type name and message) back, until ``close`` (the backend's shutdown, after the
    workers: a caller still waiting gets its answer)."""

    def __init__(self, actor: QueuedActor):
        self._conn, caller = multiprocessing.get_context("spawn").Pipe()
        self.peer = PipePeer(caller)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(actor,), name=f"oprl-{actor.name}-relay", daemon=True)
        self._thread.start()

    def _serve(self, actor: QueuedActor) -> None:
        while not self._closed.is_set():
            try:
                if not multiprocessing.connection.wait([self._conn], timeout=0.5):
                    continue  # poll: close() cannot wake a thread blocked reading a pipe
                method, args = self._conn.recv()
            except (EOFError, OSError):
                return
            try:
                reply = (True, actor.call(method, *args).result())
            except RemoteError as exc:
                reply = (False, (exc.kind, exc.message))
            except BaseException as exc:
                reply = (False, (type(exc).__name__, str(exc)))
            try:
                self._conn.send(reply)
            except OSError:
                return

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
        self._conn.close()


class LocalRank:
    """A rank in a spawned process of this machine (the ``base.Rank`` protocol)."""

    def __init__(self, name: str, factory, args: tuple, threads: int | None, plan: faults.FaultPlan | None = None):
        self.actor = ProcessActor(name, factory, args, threads, plan)
        self.ready = self.actor.ready

    def call(self, method: str, *args) -> Future:
        return self.actor.call(method, *args)

    def rendezvous(self) -> Future:
        future: Future = Future()
        future.set_result(f"127.0.0.1:{free_port()}")  # every rank is on this machine
        return future

    def kill(self) -> None:
        self.actor.terminate()


@dataclass(frozen=True)
class LocalRanks:
    """``backend=local``'s rank launcher (``base.RankLauncher``): one spawned process per rank, ``threads``
    torch intra-op threads each; ``gpus`` is Ray's request (local ranks see every GPU and pick by rank)."""

    threads: int | None = None
    gpus: float = 0.0
    faults: tuple[str, ...] = ()
    """``OPRL_FAULT`` parts for the ranks (``trainer-rank:1@step=4``), handed over by the driver's plan once per run
    (``FaultPlan.hand_over``): the front that starts the ranks may be another process, or a restarted one."""

    def __call__(self, name: str, factory, args_per_rank: list[tuple]) -> list[LocalRank]:
        plan = faults.FaultPlan.parse(self.faults)  # one plan for the group: a fault fires once
        return [LocalRank(f"{name} {r}", factory, args, self.threads, plan) for r, args in enumerate(args_per_rank)]
