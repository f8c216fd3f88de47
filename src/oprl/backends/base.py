"""The contracts of the runtime: what a backend offers the driver, and what the trainer role answers.

A ``Backend`` hosts workers (plain objects built by a factory) and runs their methods in submission order;
the driver only ever submits calls and reacts to their completion, so a backend is five verbs and a
shutdown, one more for a worker that calls another itself (``peer``: the explorers ask the judge), and two
for a worker whose process died (``lost`` tells a death from a raised error, ``restart`` brings it back).
``LocalBackend`` (threads, or processes with ``runtime.workers=processes``) and ``RayBackend`` (Ray actors)
implement it; ``oprl.backends.make.make_backend`` picks one from ``backend``. A call returns futures at once; futures
passed as arguments are resolved inside the receiving worker, so data moves between workers without passing
through the driver.

What each role answers, and the typed handles the driver calls it through, are ``oprl.roles``: a backend
moves a call by its method's name and knows nothing of what the workers do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Pending(Protocol[T_co]):
    """The future of a call's result of type ``T_co``: a ``concurrent.futures.Future`` on the local backend,
    a Ray ``ObjectRef`` on Ray. Only the backend that made it reads it (``Backend.get``), or a worker it is
    passed to as an argument (resolved there)."""


class Actor(Protocol):
    """A started worker, as the driver holds it."""

    name: str
    """As named in error messages (``trainer``, ``explorer 0``, ``buffer``)."""

    def call(self, method: str, *args: Any, num_returns: int = 1) -> Any:
        """Queue ``worker.method(*args)``; a future, or a tuple of ``num_returns`` futures for a tuple result."""
        ...


class Peer(Protocol):
    """A started worker as another worker calls it (``Backend.peer``): synchronous, and picklable where the
    caller runs in a process of its own (it travels with the caller's factory arguments)."""

    def call(self, method: str, *args: Any) -> Any:
        """``worker.method(*args)``'s value, after the calls queued before it (raises what the worker raised)."""
        ...


class Rank(Protocol):
    """One rank of a group (``trainer.sharding``), as its front holds it: calls return ``concurrent.futures``."""

    ready: Future
    """Done once the rank's worker is built."""

    def call(self, method: str, *args: Any) -> Future: ...

    def rendezvous(self) -> Future:
        """``host:port`` the group meets at (asked of rank 0, on its node)."""
        ...

    def kill(self) -> None: ...


class RankLauncher(Protocol):
    """How a backend places a group of ranks (``processes.LocalRanks``, ``ray_backend.RayRanks``)."""

    def __call__(self, name: str, factory: Callable[..., Any], args_per_rank: list[tuple]) -> Sequence[Rank]:
        """Rank ``r`` builds ``factory(*args_per_rank[r])`` in a process of its own."""
        ...


@dataclass(frozen=True)
class Placement:
    """How ``Backend.start`` places a worker: one value for every backend, each reading what applies to it."""

    threads: int | None = None
    """torch intra-op threads of the worker (None: torch's default)."""
    compute: bool = True
    """False for a worker that only moves data (the buffer): Ray reserves it no CPU, the local backend keeps it
    a thread of the driver's process even with ``runtime.workers=processes``."""
    gpus: float = 0.0
    """GPUs it requests where the backend places by resources (Ray sets its CUDA_VISIBLE_DEVICES); local
    workers see every GPU of the machine and ignore it."""
    restartable: bool = False
    """The driver may ``restart`` it after it died, which Ray must know when it creates the actor (local worker
    processes can always be restarted)."""


@runtime_checkable
class Backend(Protocol):
    name: str
    cpu_snapshots: bool
    """Whether weights snapshots must be CPU copies (they leave the process)."""

    def start(
        self,
        name: str,
        factory,
        *args: Any,
        threads: int | None = None,
        compute: bool = True,
        gpus: float = 0.0,
        restartable: bool = False,
    ) -> Actor:
        """Build ``factory(*args)`` in a worker of its own, placed as the keywords say (``Placement``'s fields).
        Written once here: a backend subclasses ``Backend`` and implements ``host``."""
        return self.host(name, factory, args, Placement(threads, compute, gpus, restartable))

    def host(self, name: str, factory, args: tuple, place: Placement) -> Actor:
        """``start``'s work: ``factory(*args)`` built in a worker placed as ``place`` says."""
        ...

    def lost(self, exc: BaseException, actor: Any) -> bool:
        """Did ``exc`` (the failure of a call to ``actor``) come from ``actor``'s process dying, rather than from
        a raised error or the death of the worker one of its arguments came from? Only a lost worker is
        restarted: a raised error would be raised again by the same call."""
        ...

    def replaceable(self, actor: Any) -> bool:
        """Does ``actor`` run in a process of its own, which ``restart`` can replace while it lives (a worker whose
        engine process died)? Not a thread: the driver's process is the run."""
        ...

    def restart(self, actor: Any, *, alive: bool = False) -> Pending[bool]:
        """Bring back a lost ``actor``, built as it first was (Ray: its own actor restart); done once ready.
        ``alive``: its process still runs but lost a part (its engine process died): it is replaced all the same."""
        ...

    def rank_launcher(self, threads: int | None = None, gpus: float = 0.0) -> RankLauncher:
        """How this backend places a group of ranks (``trainer.sharding``): a picklable launcher the
        trainer's front calls where it runs (``threads`` intra-op threads, ``gpus`` GPUs per rank)."""
        ...

    def peer(self, actor: Any) -> Peer:
        """A line from one worker to ``actor`` (one per calling worker, passed to it as a factory argument):
        threads call the actor directly; worker processes through a relay thread of the driver; Ray actors
        through the actor's handle."""
        ...

    def wait_ready(self, actor: Any) -> None:
        """Block until ``actor`` is built; raise what its factory raised."""
        ...

    def wait_any(self, futures, timeout: float | None = None) -> list:
        """Block until at least one of ``futures`` is done; the done ones. ``futures`` may also hold
        ``concurrent.futures.Future``s of the driver's own process (the synchronizer's weights board writes)."""
        ...

    def get(self, future: Pending[T]) -> T:
        """The value of a future (raises what the worker raised; waits for one not done yet: the
        synchronizer's board writer resolves weights snapshots this way, off the driver's thread)."""
        ...

    def put(self, value) -> Any:
        """A done future holding ``value`` (e.g. weights read from a checkpoint)."""
        ...

    def describe(self, exc: BaseException) -> str:
        """One line for a worker's failure (unwrapping the backend's own exception types)."""
        ...

    def shutdown(self, actors: Any) -> None:
        """Stop ``actors`` (and whatever the backend started itself)."""
        ...
