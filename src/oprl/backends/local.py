"""The local backend: every worker is a thread of this process with its own call queue (or, with
``runtime.workers=processes``, each compute worker is a process of this machine: ``oprl.backends.processes``).

``start`` builds the worker inside its thread (after setting that thread's torch intra-op threads), and
``call`` queues a method call, returning futures at once; calls to one worker run in submission order, and
future arguments are resolved in the worker's thread before its method runs, so data moves between workers
without passing through the driver. torch releases the GIL inside its kernels, so a trainer thread and an
explorer thread compute at the same time, each on its own intra-op threads (docs/runtime.md has the numbers).

Shutdown stops every worker and *joins* its thread: calls still queued are cancelled, the running one
finishes. A thread left running torch code at interpreter exit would be frozen inside a C++ frame when it
next takes the GIL, and the process would abort (``terminate called without an active exception``) after
the run's one-line error; an ``atexit`` hook joins any worker a failure path left behind.

Deliberately not here: other machines (use backend=ray), and any knowledge of what the workers do.
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from concurrent.futures import FIRST_COMPLETED, CancelledError, Future, wait

from oprl.backends.actor import QueuedActor, release
from oprl.backends.base import Backend, Placement
from oprl.backends.faults import FaultPlan


class LocalActor(QueuedActor):
    def __init__(self, name: str, factory, args: tuple, threads: int | None):
        self.name = name
        self.ready: Future = Future()
        self._inbox = queue.Queue()
        self._stopping = False
        self._thread = threading.Thread(
            target=self._serve, args=(factory, args, threads), name=f"oprl-{name}", daemon=True
        )
        self._thread.start()
        _LIVE.add(self)

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _serve(self, factory, args, threads) -> None:
        if threads:
            import torch  # here, not at the top: a worker process imports this module for QueuedActor alone

            torch.set_num_threads(threads)  # per thread: each worker gets its own share of the cores
        try:
            worker = factory(*args)
        except BaseException as exc:  # reported through every future, the first one ends the run
            self.ready.set_exception(exc)
            worker = None
        else:
            self.ready.set_result(True)
        while (item := self._inbox.get()) is not None:
            method, call_args, futures = item
            try:
                if self._stopping:
                    raise CancelledError(f"{self.name}: stopped before {method} ran")
                if worker is None:
                    raise self.ready.exception() or RuntimeError(f"{self.name}: the worker was not built")
                resolved = [a.result() if isinstance(a, Future) else a for a in call_args]
                result = getattr(worker, method)(*resolved)
                results = (result,) if len(futures) == 1 else tuple(result)
                for future, value in zip(futures, results, strict=True):
                    future.set_result(value)
            except BaseException as exc:
                for future in futures:
                    future.set_exception(exc)
        release(worker)


class ThreadPeer:
    """A worker thread's line to another worker thread (``base.Peer``): queue the call, wait for its value."""

    def __init__(self, actor: QueuedActor):
        self.actor = actor

    def call(self, method: str, *args):
        return self.actor.call(method, *args).result()


class LocalBackend(Backend):
    name = "local"

    def __init__(self, workers: str = "threads", plan: FaultPlan | None = None):
        """``plan``: the faults to inject (``oprl.backends.faults``; worker processes only)."""
        self.workers = workers
        self.faults = plan if plan is not None and workers == "processes" else FaultPlan()
        self._relays: list = []  # processes.Relay: one per peer, closed at shutdown
        # Threads share memory, so snapshots stay on the model's device; processes receive CPU copies.
        self.cpu_snapshots = workers == "processes"

    def host(self, name: str, factory, args: tuple, place: Placement):
        """Every worker process can be restarted (``restart``), so ``place.restartable`` changes nothing here."""
        if place.compute and self.workers == "processes":
            from oprl.backends.processes import ProcessActor

            return ProcessActor(name, factory, args, place.threads, self.faults)
        return LocalActor(name, factory, args, place.threads)

    def lost(self, exc: BaseException, actor) -> bool:
        """Did ``exc`` come from ``actor``'s process dying (killed, out of memory), rather than from a worker that
        raised, or from the death of the worker an argument came from? Threads never die on their own."""
        from oprl.backends.processes import RemoteError

        return isinstance(exc, RemoteError) and exc.kind == "ProcessDied" and exc.worker == actor.name

    def replaceable(self, actor) -> bool:
        return self.workers == "processes"

    def restart(self, actor, *, alive: bool = False) -> Future:
        """A new process in place of ``actor``'s dead one (``alive``: of its live one, which is told to stop and
        exits once its calls are done), built like the first; done once it is ready."""
        return actor.restart()

    def peer(self, actor):
        """Threads: a ``ThreadPeer`` on ``actor``; processes: a ``processes.PipePeer`` whose calls a relay
        thread of this process queues on ``actor`` (closed at ``shutdown``)."""
        if self.workers != "processes":
            return ThreadPeer(actor)
        from oprl.backends.processes import Relay

        relay = Relay(actor)
        self._relays.append(relay)
        return relay.peer

    def wait_ready(self, actor: LocalActor) -> None:
        actor.ready.result()

    def wait_any(self, futures, timeout: float | None = None) -> list:
        done, _ = wait(list(futures), timeout=timeout, return_when=FIRST_COMPLETED)
        return list(done)

    def get(self, future):
        return future.result()

    def put(self, value):
        """A completed future holding ``value`` (e.g. weights read from a checkpoint)."""
        future: Future = Future()
        future.set_result(value)
        return future

    def rank_launcher(self, threads: int | None = None, gpus: float = 0.0):
        """Trainer ranks as spawned processes of this machine (``processes.LocalRanks``)."""
        from oprl.backends.processes import LocalRanks

        return LocalRanks(threads, gpus, self.faults.hand_over("trainer-rank"))

    def describe(self, exc: BaseException) -> str:
        from oprl.backends.processes import RemoteError

        if isinstance(exc, RemoteError):
            return str(exc)
        return f"{type(exc).__name__}: {exc}"

    def shutdown(self, actors) -> None:
        """Stop every worker, then wait for each (threads finish their running call; processes exit)."""
        for actor in actors:
            actor.stop()
        for actor in actors:
            actor.join()
        for relay in self._relays:
            relay.close()
        self._relays.clear()


_LIVE: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _join_leftovers() -> None:
    """Safety net for a path that never reached ``shutdown`` (see the module docstring)."""
    for actor in list(_LIVE):
        actor.stop()
    for actor in list(_LIVE):
        actor.join(timeout=60)
