"""The Ray backend: every worker is a Ray actor (its own process), on a local instance or a cluster.

The only module of oprl that imports ray (``pip install 'oprl[ray]'``). It offers the same small interface as
``oprl.runtime.local``: ``start`` a worker, ``call`` a method (object refs come back; refs passed as
arguments are resolved by Ray inside the receiving actor, so experiences and weights travel through the
object store, not through the driver), ``wait_any``, ``get``. Each actor sets its torch intra-op threads to
the same value the local backend gives a worker thread, which is what makes both backends compute
bit-for-bit the same numbers in scheduled mode.

With ``runtime.ray_address`` unset a local instance is started with ``runtime.ray_num_cpus`` CPUs and shut
down at the end; an instance that was already running (a test fixture, ``ray start``) is left running. On a
multi-node cluster the run directory must be on a filesystem every node sees (the trainer actor writes
checkpoints and the experience store there).
"""

from __future__ import annotations

import os

import ray

from oprl.errors import OprlError


@ray.remote
class _Host:
    """Builds one worker inside its actor process and forwards method calls to it."""

    def __init__(self, factory, args, threads):
        if threads:
            import torch

            torch.set_num_threads(threads)
        self.worker = factory(*args)

    def ready(self) -> bool:
        return True

    def call(self, method: str, *args):
        return getattr(self.worker, method)(*args)


class RayActor:
    def __init__(self, name: str, handle):
        self.name = name
        self.handle = handle

    def call(self, method: str, *args, num_returns: int = 1):
        refs = self.handle.call.options(num_returns=num_returns).remote(method, *args)
        return tuple(refs) if num_returns > 1 else refs


class RayBackend:
    name = "ray"
    cpu_snapshots = True  # weights go through the object store, which holds CPU tensors

    def __init__(self, *, address: str | None, num_cpus: int | None, workers: int):
        self._started = False
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

    def start(self, name: str, factory, *args, threads: int | None = None, compute: bool = True) -> RayActor:
        handle = _Host.options(num_cpus=self.cpus_per_worker if compute else 0).remote(factory, args, threads)
        return RayActor(name, handle)

    def wait_ready(self, actor: RayActor) -> None:
        ray.get(actor.handle.ready.remote())

    def wait_any(self, futures, timeout: float | None = None) -> list:
        done, _ = ray.wait(list(futures), num_returns=1, timeout=timeout)
        return done

    def get(self, future):
        return ray.get(future)

    def done(self, future) -> bool:
        done, _ = ray.wait([future], timeout=0)
        return bool(done)

    def put(self, value):
        return ray.put(value)

    def describe(self, exc: BaseException) -> str:
        if isinstance(exc, ray.exceptions.RayTaskError) and exc.cause is not None:
            exc = exc.cause
        elif isinstance(exc, ray.exceptions.RayActorError):
            return "its process died (RayActorError)"
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"

    def shutdown(self, actors) -> None:
        for actor in actors:
            ray.kill(actor.handle)
        if self._started:
            ray.shutdown()
