"""The driver's side of an actor that a queue feeds: shared by local threads and local processes.

Kept apart from both implementations so neither imports the other (``local`` starts ``processes`` lazily).
Also the one free-port helper the rank launchers of every backend use to pick a rendezvous address.
"""

from __future__ import annotations

import queue
import socket
import threading
from concurrent.futures import CancelledError, Future


class QueuedActor:
    """The driver's side of a local actor (``LocalActor``, ``processes.ProcessActor``): ``call`` queues
    ``(method, args, futures)`` on ``_inbox`` and returns the futures at once; whoever drains ``_inbox`` (the
    worker's thread, or the sender thread of a process) runs the calls in order and stops at ``None``."""

    name: str
    _inbox: queue.Queue
    _stopping: bool

    _guard = threading.Lock()
    """Orders ``call`` against ``stop``: a call is queued before the end marker or fails at once, never
    queued behind it where nobody would run or fail it (a caller waiting on it would hang: a sharded
    trainer's evaluation queued while its ranks were being stopped held a run's exit forever)."""

    def call(self, method: str, *args, num_returns: int = 1):
        """Queue ``worker.method(*args)``; one future, or a tuple of ``num_returns`` for a tuple result. After
        ``stop`` the futures fail at once (``CancelledError``)."""
        futures: tuple[Future, ...] = tuple(Future() for _ in range(num_returns))
        with self._guard:
            if not getattr(self, "_stopping", False):
                self._inbox.put((method, args, futures))
                return futures[0] if num_returns == 1 else futures
        for future in futures:
            future.set_exception(CancelledError(f"{self.name}: stopped before {method} was called"))
        return futures[0] if num_returns == 1 else futures

    def stop(self) -> None:
        """Cancel the calls not yet started; the worker ends after its running call (``join`` waits for it)."""
        with self._guard:
            self._stopping = True
            self._inbox.put(None)


def release(worker) -> None:
    """End of a worker's serving loop: let it free what it holds (``release()``, e.g. the sharded trainer's
    rank processes, which would otherwise outlive the run and block the interpreter's exit: they ignore the
    SIGTERM that multiprocessing sends its daemonic children at exit)."""
    free = getattr(worker, "release", None)
    if callable(free):
        free()


def free_port() -> int:
    """A TCP port nobody listens on now (for torch.distributed's rendezvous)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
