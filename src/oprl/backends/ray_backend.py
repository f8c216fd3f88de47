"""The Ray backend: every worker is a Ray actor (its own process), on a local instance or a cluster.

The only module of oprl that imports ray (``pip install 'oprl[ray]'``). It offers the same small interface as
``oprl.backends.local``: ``start`` a worker, ``call`` a method (object refs come back; refs passed as
arguments are resolved by Ray inside the receiving actor, so experiences and weights travel through the
object store, not through the driver), ``wait_any``, ``get``, and a ``peer`` for an actor that calls another
(an explorer asking the judge). Each actor sets its torch intra-op threads to the same value the local backend
gives a worker thread, which is what makes both backends compute bit-for-bit the same numbers in scheduled
mode.

With ``runtime.ray_address`` unset a local instance is started with ``runtime.ray_num_cpus`` CPUs and shut
down at the end; an instance that was already running (a test fixture, ``ray start``) is left running. On a
multi-node cluster the run directory must be on a filesystem every node sees (the trainer actor writes
checkpoints and the experience store there).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass

import ray

from oprl.backends import faults
from oprl.backends import faults as faults_module  # where a parameter is named ``faults``
from oprl.backends.actor import free_port
from oprl.backends.base import Backend, Placement
from oprl.errors import OprlError


class _HostWorker:
    """Builds one worker inside its actor process and forwards method calls to it."""

    def __init__(self, factory, args, threads):
        if threads:
            import torch

            torch.set_num_threads(threads)
        self.worker = factory(*args)

    def ready(self) -> bool:
        return True

    def pid(self) -> int:
        """This actor's process (a restart is done once another process answers)."""
        return os.getpid()

    def node_id(self) -> str:
        """The Ray node this actor runs on (where a lost node's actors were)."""
        return ray.get_runtime_context().get_node_id()

    def call(self, method: str, *args):
        return getattr(self.worker, method)(*args)

    def doomed_call(self, after: float, method: str, *args):
        """``call``, in which this actor's process dies after ``after`` seconds (``OPRL_FAULT``)."""
        faults.die(after)
        return self.call(method, *args)


_Host = ray.remote(_HostWorker)  # the actor class (ray.remote returns a new class with .options)


class RayActor:
    def __init__(self, name: str, handle, plan: faults.FaultPlan | None = None):
        self.name = name
        self.handle = handle
        self.plan = plan if plan is not None else faults.FaultPlan()

    def call(self, method: str, *args, num_returns: int = 1):
        doomed = self.plan.due(self.name, args)
        if doomed is None:
            refs = self.handle.call.options(num_returns=num_returns).remote(method, *args)
        else:
            refs = self.handle.doomed_call.options(num_returns=num_returns).remote(doomed, method, *args)
        return tuple(refs) if num_returns > 1 else refs


class RayPeer:
    """An actor's line to another actor (``base.Peer``): the target's handle, pickled into the caller's actor.
    ``faults``: ``OPRL_FAULT`` parts for the target (``judge@call=4``), which this line fires: the caller's calls
    go straight to the target's actor, past the driver's side where the other workers' faults fire."""

    def __init__(self, handle, name: str = "", faults: tuple[str, ...] = ()):
        self.handle, self.name, self.faults = handle, name, faults
        self._plan: faults_module.FaultPlan | None = None

    def __getstate__(self) -> dict:
        return {"handle": self.handle, "name": self.name, "faults": self.faults}

    def __setstate__(self, state: dict) -> None:
        type(self).__init__(self, **state)

    def call(self, method: str, *args):
        if self.faults and self._plan is None:
            self._plan = faults_module.FaultPlan.parse(self.faults)
        doomed = None if self._plan is None else self._plan.due(self.name, args)
        if doomed is None:
            return ray.get(self.handle.call.remote(method, *args))
        return ray.get(self.handle.doomed_call.remote(doomed, method, *args))


class RayBackend(Backend):
    name = "ray"
    cpu_snapshots = True  # weights go through the object store, which holds CPU tensors

    def __init__(
        self,
        *,
        address: str | None,
        num_cpus: int | None,
        workers: int,
        restarts: bool = False,
        plan: faults.FaultPlan | None = None,
    ):
        self._started = False
        self.restarts = restarts
        """Whether restartable actors get Ray's actor restarts (``runtime.max_restarts`` > 0; the driver keeps
        the budget)."""
        self.faults = plan if plan is not None else faults.FaultPlan()
        """The faults to inject (``oprl.backends.faults``)."""
        if not ray.is_initialized():
            try:
                if address:
                    ray.init(address=address, include_dashboard=False, log_to_driver=False)
                else:
                    ray.init(num_cpus=num_cpus or os.cpu_count(), include_dashboard=False, log_to_driver=False)
            except ConnectionError as exc:
                raise OprlError(f"runtime.ray_address: cannot connect to {address!r}: {exc}") from None
            self._started = True
        cpus = ray.cluster_resources().get("CPU", 1.0)
        # Logical CPUs per compute worker: all of them fit at once on a small local instance.
        self.cpus_per_worker = min(1.0, cpus / max(workers, 1))

    def host(self, name: str, factory, args: tuple, place: Placement) -> RayActor:
        """``place.gpus``: GPUs the actor requests (an explorer's vLLM engine then runs on them).
        ``place.restartable``: Ray restarts the actor when its process dies (``max_restarts``, unbounded here: the
        driver's ``runtime.max_restarts`` decides when a run stops instead); its calls are not retried
        (``max_task_retries=0``), the driver resubmits a lost batch with the weights it needs."""
        options = {"num_cpus": self.cpus_per_worker if place.compute else 0}
        options |= {"num_gpus": place.gpus} if place.gpus else {}
        if place.restartable and self.restarts:
            options |= {"max_restarts": -1, "max_task_retries": 0}
        handle = _Host.options(**options).remote(factory, args, place.threads)
        return RayActor(name, handle, self.faults)

    def lost(self, exc: BaseException, actor: RayActor) -> bool:
        """``actor``'s process died (its ``RayActorError``), as opposed to a method that raised (``RayTaskError``)
        or the death of the actor an argument came from."""
        if not isinstance(exc, ray.exceptions.RayActorError):
            return False
        return exc.actor_id is None or exc.actor_id == actor.handle._actor_id.hex()

    def replaceable(self, actor: RayActor) -> bool:
        return self.restarts  # Ray restarts a restartable actor killed with its restart allowed

    def restart(self, actor: RayActor, *, alive: bool = False) -> Future:
        """Ray restarts a restartable actor by itself (its constructor runs again); a future done once it serves
        (asked again while Ray still reports the actor unavailable, for at most ``RESTART_PATIENCE_S``).
        ``alive``: the actor's process still runs (its engine process died): it is killed with Ray's restart
        allowed (``ray.kill(no_restart=False)``), so Ray restarts it as after a death."""
        future: Future = Future()
        waiter = threading.Thread(target=_wait_restarted, args=(actor.handle, future, alive), daemon=True)
        waiter.start()
        return future

    def peer(self, actor: RayActor) -> RayPeer:
        """The caller's actor calls ``actor`` through its handle (values through the object store); the first line
        to a worker carries that worker's faults (``OPRL_FAULT``), once per run."""
        return RayPeer(actor.handle, actor.name, self.faults.hand_over(actor.name.split(" ")[0]))

    def wait_ready(self, actor: RayActor) -> None:
        ray.get(actor.handle.ready.remote())

    def wait_any(self, futures, timeout: float | None = None) -> list:
        """Object refs, and the driver's own ``concurrent.futures.Future``s (the synchronizer's board writes),
        which are polled: one that finishes while Ray waits is seen at the next call."""
        refs = [f for f in futures if not isinstance(f, Future)]
        own = [f for f in futures if isinstance(f, Future)]
        done = [f for f in own if f.done()]
        if done or not refs:
            return done or list(wait(own, timeout=timeout, return_when=FIRST_COMPLETED)[0])
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        return ready

    def get(self, future):
        """The value of a done future (waits for one that is not done yet)."""
        return future.result() if isinstance(future, Future) else ray.get(future)

    def put(self, value):
        return ray.put(value)

    def describe(self, exc: BaseException) -> str:
        if isinstance(exc, ray.exceptions.RayTaskError) and exc.cause is not None:
            exc = exc.cause
        elif isinstance(exc, ray.exceptions.RayActorError):
            return "its process died (RayActorError)"
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"

    def rank_launcher(self, threads: int | None = None, gpus: float = 0.0) -> RayRanks:
        """Trainer ranks as Ray actors in one placement group (see ``RayRanks``), with the ranks' faults
        (``trainer-rank:1@step=4``), handed over once per run."""
        return RayRanks(threads, gpus, self.faults.hand_over("trainer-rank"))

    def shutdown(self, actors) -> None:
        for actor in actors:
            ray.kill(actor.handle)
        if self._started:
            ray.shutdown()


RESTART_PATIENCE_S = 300.0


def _wait_restarted(handle, future: Future, alive: bool = False) -> None:
    """Set ``future`` once the restarted actor answers ``ready``. Right after a death Ray may still answer for
    the old process (``RayActorError``) before it marks the actor as restarting: ask again until the deadline.
    ``alive``: kill the live process first, and count only an answer from another process."""
    deadline = time.monotonic() + RESTART_PATIENCE_S
    old = None
    if alive:
        try:
            old = ray.get(handle.pid.remote())
            ray.kill(handle, no_restart=False)
        except ray.exceptions.RayActorError:
            pass  # it died meanwhile: Ray restarts it as it is
        except BaseException as exc:
            future.set_exception(exc)
            return
    while True:
        try:
            if old is not None and ray.get(handle.pid.remote()) == old:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the actor's process {old} was not replaced in {RESTART_PATIENCE_S:g} s")
                time.sleep(0.5)  # the kill has not landed yet
                continue
            future.set_result(ray.get(handle.ready.remote()))
            return
        except ray.exceptions.RayActorError as exc:
            if time.monotonic() > deadline:
                future.set_exception(exc)
                return
            time.sleep(0.5)
        except BaseException as exc:  # its constructor failed this time: the restart's failure, named
            future.set_exception(exc)
            return


class _RankHost:
    """Actor body of one rank of a group: builds ``factory(*args)`` and forwards calls to it."""

    def __init__(self, factory, args: tuple, threads: int | None):
        if threads:
            import torch

            torch.set_num_threads(threads)
        self.rank = factory(*args)

    def rendezvous(self) -> str:
        """``node-ip:port`` for the group to meet at (asked of rank 0)."""
        return f"{ray.util.get_node_ip_address()}:{free_port()}"

    def call(self, method: str, *args):
        if method in ("ping", "node"):  # readiness; the node this rank runs on
            return ray.get_runtime_context().get_node_id()
        return getattr(self.rank, method)(*args)

    def doomed_call(self, after: float, method: str, *args):
        """``call``, in which this rank's process dies after ``after`` seconds (``OPRL_FAULT``)."""
        faults.die(after)
        return self.call(method, *args)


class _RayRank:
    """A rank as a Ray actor (the ``base.Rank`` protocol); calls come back as ``concurrent.futures`` futures."""

    def __init__(self, handle, group, name: str = "", plan: faults.FaultPlan | None = None):
        self.handle, self.group, self.name = handle, group, name
        self.plan = plan if plan is not None else faults.FaultPlan()
        self.ready = handle.call.remote("ping").future()

    def call(self, method: str, *args):
        doomed = self.plan.due(self.name, args)
        if doomed is not None:
            return self.handle.doomed_call.remote(doomed, method, *args).future()
        return self.handle.call.remote(method, *args).future()

    def rendezvous(self):
        return self.handle.rendezvous.remote().future()

    def kill(self) -> None:
        ray.kill(self.handle)
        with contextlib.suppress(Exception):  # the first rank's kill frees the bundles; later ones find none
            ray.util.remove_placement_group(self.group)


@dataclass(frozen=True)
class RayRanks:
    """``backend=ray``'s rank launcher (``base.RankLauncher``): the ranks as actors in one placement group, a
    bundle of 1 CPU (+ ``gpus`` GPUs) per rank, packed onto as few nodes as fit."""

    threads: int | None = None
    gpus: float = 0.0
    faults: tuple[str, ...] = ()
    """``OPRL_FAULT`` parts for the ranks, handed over by the driver's plan once per run (``LocalRanks.faults``)."""

    def __call__(self, name: str, factory, args_per_rank: list[tuple]) -> list[_RayRank]:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        size = len(args_per_rank)
        bundle = {"CPU": 1.0} | ({"GPU": self.gpus} if self.gpus > 0 else {})
        group = placement_group([bundle] * size, strategy="PACK")
        if not group.wait(timeout_seconds=120):
            ray.util.remove_placement_group(group)
            raise OprlError(
                f"trainer.world_size={size}: the Ray cluster has no room for {size} bundles of {bundle} "
                f"(it has {ray.cluster_resources()})"
            )
        host = ray.remote(_RankHost)
        plan = faults.FaultPlan.parse(self.faults)  # one plan for the group: a fault fires once
        return [
            _RayRank(
                host.options(
                    num_cpus=1.0,
                    num_gpus=self.gpus,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=group, placement_group_bundle_index=rank
                    ),
                ).remote(factory, args, self.threads),
                group,
                f"{name} {rank}",
                plan,
            )
            for rank, args in enumerate(args_per_rank)
        ]
