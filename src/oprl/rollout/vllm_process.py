"""vLLM and oprl's processes: its engine core in a process of its own (``rollout.engine_process=true``), what makes
that heal, and what building an ``LLM`` does to the calling process, undone.

Why this exists: an in-process ``vllm.LLM`` dies with its explorer, so the driver's restart of that explorer heals
it; an engine core in a process of its own can die alone (killed, out of memory). Then the calling worker should
get vLLM's ``EngineDeadError``, which the driver heals by restarting that worker with a fresh engine
(docs/runtime.md#self-healing-runs). vLLM 0.32 does not do three things this needs for a caller like oprl's, so
they are done here (``oprl.rollout.vllm_engine`` builds the engine and calls them):

- a call waiting on an engine that was killed raises instead of waiting forever (``EngineWatch``);
- the engine's processes end when their caller is killed (``follow_caller``, run in vLLM's worker);
- a daemonic worker process (oprl's process workers are daemonic) may start the engine (``children_allowed``,
  under ``engine_mode``, which also turns vLLM's multiprocessing on for this one engine).

Weights cross to the engine process as ``torch.save``'s bytes (``send_weights``): vLLM's messages carry no tensors
in a call's arguments. ``KILL_ENGINE`` is a test's fault: the engine's next call SIGKILLs its own process first.

Every ``LLM`` build, in-process or not, runs under ``process_state_kept``: vLLM's CPU build changes the process's
thread count, global random generators and child-process environment, which oprl's workers own.

``oprl.rollout.vllm_engine`` builds the engine and calls these; nothing here imports it, so the engine process
unpickles ``reload_bytes``/``follow_caller`` from here.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import multiprocessing.connection
import multiprocessing.util
import os
import random
import signal
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any

from oprl.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch", globals())  # imported on first use (oprl.lazy)

KILL_ENGINE = "OPRL_KILL_ENGINE"
"""Set in a worker process by a test's fault (``oprl.backends.faults``, ``engine@step=N``): the next call of its
engine SIGKILLs the engine's own process first, as the kernel's OOM killer would."""


@contextlib.contextmanager
def engine_mode(engine_process: bool):
    """Build this engine in-process or with its own engine process, whatever was built before in this process:
    vLLM reads ``VLLM_ENABLE_V1_MULTIPROCESSING`` as the ``LLM`` is built, from a cache that an in-process engine
    turns on (``vllm.envs.enable_envs_cache``), so the cache is turned off for the build. An engine process
    also needs ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``: oprl's reload is a function (``reload_bytes``), which
    vLLM's messages carry pickled only then; the sockets are this machine's, between this process and its own
    engine."""
    if not engine_process:
        yield
        return
    import vllm.envs

    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    with contextlib.suppress(AttributeError):
        vllm.envs.disable_envs_cache()
    try:
        with children_allowed():
            yield
    finally:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the next in-process engine of this process


@contextlib.contextmanager
def children_allowed():
    """multiprocessing refuses children to a daemonic process (oprl's worker processes are daemonic, so that they
    end with the driver): the engine process is one, and its end is seen to by ``follow_caller`` instead."""
    config = multiprocessing.current_process()._config  # type: ignore[attr-defined]
    had, daemon = "daemon" in config, config.get("daemon")
    config["daemon"] = False
    try:
        yield
    finally:
        if had:
            config["daemon"] = daemon
        else:
            config.pop("daemon", None)


def attach(shared: Any) -> EngineWatch:
    """After ``shared.llm`` (a ``SharedLLM``'s) was built with an engine process: watch that process, let vLLM's
    worker follow this process, and shut the engine down before multiprocessing joins this process's children at
    its exit (a worker process's return, the driver's exit), where a live engine process would be waited for."""
    llm = shared.llm
    watch = EngineWatch(llm)
    llm.collective_rpc(follow_caller, args=(os.getpid(),))
    multiprocessing.util.Finalize(shared, _shut_down, args=(llm,), exitpriority=10)
    return watch


class EngineWatch:
    """Wakes the calls waiting on an engine process that died. vLLM 0.32's synchronous client notices the death
    (its monitor marks the engine dead) but a ``generate`` waiting for outputs waits on forever (measured here:
    SIGKILL of the engine process 0.5 s into a 0.7 s call, no return in 300 s). Once the process is gone, this
    hands every waiter vLLM's own ``EngineDeadError``: the call raises it, and the driver restarts the worker."""

    def __init__(self, llm):
        from vllm.v1.engine.exceptions import EngineDeadError

        self.client = llm.llm_engine.engine_core
        self.process = self.client.resources.engine_manager.processes[0]
        self.dead = threading.Event()
        self._error = EngineDeadError
        threading.Thread(target=self._watch, name="oprl-vllm-engine-watch", daemon=True).start()

    def _watch(self) -> None:
        multiprocessing.connection.wait([self.process.sentinel])
        self.client.resources.engine_dead = True
        self.client.outputs_queue.put_nowait(self._error())
        for future in list(self.client.utility_results.values()):  # a reload or cache reset under way
            if not future.done():
                future.set_exception(self._error())
        self.dead.set()

    def kill(self) -> None:
        """SIGKILL the engine's own process and return once this process knows it is dead."""
        os.kill(self.process.pid, signal.SIGKILL)
        self.dead.wait(timeout=60)


def take_fault(watch: EngineWatch | None) -> None:
    """A test's fault: when ``KILL_ENGINE`` is set (and then cleared), SIGKILL the engine's own process before the
    call that follows, which then raises ``EngineDeadError`` whatever the timing (``EngineWatch.kill``)."""
    if not os.environ.pop(KILL_ENGINE, None):
        return
    if watch is None:
        raise RuntimeError("a fault for a vLLM engine process, but this engine runs in-process")
    watch.kill()


def send_weights(llm, weights: dict[str, torch.Tensor]) -> None:
    """Reload ``weights`` (checkpoint-format tensors) on the engine process's worker, as bytes."""
    buffer = io.BytesIO()
    torch.save(weights, buffer)
    llm.collective_rpc(reload_bytes, args=(buffer.getvalue(),))


def reload_bytes(worker, data: bytes) -> None:
    """Runs on the worker of an engine process: the in-place reload of ``oprl.rollout.vllm_engine``'s ``_reload``,
    from ``torch.save``'s bytes."""
    weights = torch.load(io.BytesIO(data), weights_only=True)
    worker.model_runner.reload_weights(weights_iterator=iter(weights.items()), is_checkpoint_format=True)


def follow_caller(worker, caller: int) -> None:
    """Runs in vLLM's worker process: end the engine's processes (this one and those between it and ``caller``)
    once ``caller`` dies. vLLM ends its workers with the engine process, but not the engine process with its
    caller (measured: an engine process outlived its SIGKILLed caller by 20 s and more, till killed by hand); a
    caller killed by a test or the OOM killer would leave it behind. Linux only (``/proc``); elsewhere a no-op."""
    chain, pid = [], os.getpid()
    while pid not in (caller, 0, 1):
        chain.append(pid)
        pid = _parent_of(pid)
    if pid != caller:
        return

    def follow() -> None:
        while _parent_of(chain[-1]) == caller:  # re-parented at the caller's death, before it is reaped
            time.sleep(1.0)
        for pid in reversed(chain):  # the engine process first, this one last
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    threading.Thread(target=follow, name="oprl-follow-caller", daemon=True).start()


def _parent_of(pid: int) -> int:
    """``pid``'s parent (0 when it is gone or ``/proc`` is not there)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _shut_down(llm) -> None:
    with contextlib.suppress(Exception):  # an engine that died already has nothing left to shut
        llm.llm_engine.engine_core.shutdown()


# -- what building an LLM does to this process ------------------------------------------------------------------
CHILD_ENVIRONMENT = ("LD_PRELOAD", "LD_LIBRARY_PATH")
"""Variables vLLM's CPU platform sets in ``os.environ`` for its own engine processes (tcmalloc and torch's
libgomp preloaded, OpenCV's library path). oprl's engine is in-process, so they would only leak into every
later subprocess of oprl (process workers, sweep workers, reward pools, tests) and change their allocator."""


@contextlib.contextmanager
def child_environment_kept():
    saved = {key: os.environ.get(key) for key in CHILD_ENVIRONMENT}
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def process_state_kept():
    """Undo what building an in-process ``LLM`` does to the process: vLLM's CPU worker replaces
    ``torch.set_num_threads`` by a no-op and sets 1 intra-op thread (right for a dedicated serving process,
    wrong for oprl, whose workers set their own thread counts), and it seeds the global generators of
    ``random``, numpy and torch (the trainer's and the other engines' streams must not depend on it); it also
    preloads libraries for child processes (``CHILD_ENVIRONMENT``)."""
    import numpy as np

    set_threads, threads = torch.set_num_threads, torch.get_num_threads()
    python_state, numpy_state = random.getstate(), np.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    try:
        with torch.random.fork_rng(devices=devices), warnings.catch_warnings(), child_environment_kept():
            warnings.simplefilter("ignore", FutureWarning)  # deprecated torch.distributed names, inside vLLM
            yield
    finally:
        torch.set_num_threads = set_threads
        torch.set_num_threads(threads)
        random.setstate(python_state)
        np.random.set_state(numpy_state)
