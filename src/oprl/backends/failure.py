"""How a run ends early: a worker that dies (``WorkerFailure``) or a signal (``Interrupted``); kept
import-light for the CLI.

SIGTERM and SIGINT stop a run the same way. ``StopSignals`` (entered by ``oprl.runtime.run`` in the main
thread) turns either into a request while the driver runs: the driver polls ``stop_requested`` between
completions, stops the explorers at once, lets the trainer finish the call it is in (so it holds the state
of a completed step), writes a checkpoint of that step and raises ``Interrupted``: one line ("interrupted by
SIGTERM at step N; resume with ..."), exit status 128 + the signal (130, 143). Outside the driver (loading,
warm start: nothing to save yet) a signal raises ``Interrupted`` at once; a second signal too. Worker
processes ignore both signals (``ignore_stop_signals``): a Ctrl-C reaches the whole process group, and the
driver, not the signal, stops them (no worker tracebacks). While a run is on, a worker process that dies
(stopped, killed) in the middle of fetching a shared tensor's file descriptor leaves the parent's
``multiprocessing.resource_sharer`` thread with a ``ConnectionResetError``; that thread's traceback says
nothing the run's own line does not, so ``StopSignals`` keeps it off stderr (every other exception still
prints). The sharer catches the error itself and hands it to ``sys.excepthook`` (not ``threading.excepthook``),
so both hooks are filtered.
"""

from __future__ import annotations

import signal
import sys
import threading
import traceback
from typing import Any


def is_kind(exc: BaseException | None, kind: str) -> bool:
    """Is ``exc`` an exception of type ``kind`` (or of a subclass), raised here, in a worker process
    (``RemoteError.kind``) or in a Ray actor (a ``RayTaskError``: an instance of its cause's class too, and
    holding it as ``cause``)? Matched by name: the class may live in a package not imported here (vLLM's)."""
    while exc is not None:
        if getattr(exc, "kind", "") == kind or any(c.__name__ == kind for c in type(exc).__mro__):
            return True
        cause = getattr(exc, "cause", None)  # WorkerFailure.cause is a line of text, not an exception
        exc = cause if isinstance(cause, BaseException) else None
    return False


def process_died(exc: BaseException | None) -> bool:
    """Did a call fail because the process that ran it died (a worker process's ``ProcessDied``, a Ray actor's
    error), rather than by raising? Which worker died is ``Backend.lost``'s question; this asks only how."""
    return is_kind(exc, "ProcessDied") or is_kind(exc, "RayActorError") or is_kind(exc, "ActorDiedError")


def engine_died(exc: BaseException | None) -> bool:
    """Did a call fail because the worker's model engine died in a process of its own (vLLM's
    ``EngineDeadError``: ``rollout.engine_process=true``), the worker itself alive? Wherever it was raised
    (``is_kind``)."""
    return is_kind(exc, "EngineDeadError")


class WorkerFailure(RuntimeError):
    """A worker (explorer, trainer, buffer) raised or died; the message is one line naming it, what it was
    doing, the cause, and the checkpoint to resume from. The original exception is chained."""

    def __init__(
        self,
        message: str,
        *,
        component: str = "",
        lost: bool = False,
        cause: str = "",
        checkpoint=None,
        starting: bool = False,
    ):
        super().__init__(message)
        self.component = component
        """The worker that failed (``trainer``, ``explorer 0``)."""
        self.lost = lost
        """Its process died (``Backend.lost``), rather than it raising: ``oprl.runtime.run`` restarts a lost
        trainer, teacher or buffer from ``checkpoint``."""
        self.cause = cause
        """The cause in one line (``ProcessDied: worker process exited (-9)``)."""
        self.checkpoint = checkpoint
        """The newest committed checkpoint (a ``Path``), None without one."""
        self.starting = starting
        """It died while its run (or a segment of it) was starting its workers."""


class Interrupted(KeyboardInterrupt):
    """The run was stopped by SIGTERM or SIGINT; the message is its one line. ``exit_code`` = 128 + signal."""

    def __init__(self, signum: int, message: str = ""):
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(message or f"interrupted by {signal.Signals(signum).name}")


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_state: dict[str, Any] = {"requested": None, "deferred": False}


def stop_requested() -> int | None:
    """The signal that asked the run to stop, or None."""
    return _state["requested"]


class StopSignals:
    """``with StopSignals():`` in the main thread: SIGTERM/SIGINT handled as the module docstring says (a
    no-op in another thread, where Python cannot install handlers)."""

    def __enter__(self) -> StopSignals:
        self.previous: dict[int, object] = {}
        _state.update(requested=None, deferred=False)
        self.hook = threading.excepthook
        self.sys_hook = sys.excepthook
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self.previous[signum] = signal.signal(signum, _handle)
            threading.excepthook = self._thread_exception
            sys.excepthook = self._exception
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        if self.previous:
            threading.excepthook = self.hook
            sys.excepthook = self.sys_hook
        _state.update(requested=None, deferred=False)

    def _thread_exception(self, args: threading.ExceptHookArgs) -> None:
        if not is_peer_gone_in_sharer(args.exc_type, args.exc_traceback):
            self.hook(args)

    def _exception(self, exc_type, value, tb) -> None:
        # the path the real error takes: resource_sharer._serve's bare ``except: sys.excepthook(...)``
        if not is_peer_gone_in_sharer(exc_type, tb):
            self.sys_hook(exc_type, value, tb)


def is_peer_gone_in_sharer(exc_type: type[BaseException], tb) -> bool:
    """True for a connection error raised in ``multiprocessing.resource_sharer`` (a worker process that
    died while fetching a shared file descriptor): see the module docstring."""
    if not issubclass(exc_type, (ConnectionError, EOFError)) or tb is None:
        return False
    return any(frame.filename.endswith("resource_sharer.py") for frame in traceback.extract_tb(tb))


class deferring:
    """``with deferring():`` the driver's loop: a signal becomes a request it acts on (a clean stop)."""

    def __enter__(self) -> None:
        _state["deferred"] = True

    def __exit__(self, *exc) -> None:
        _state["deferred"] = False


def _handle(signum: int, _frame) -> None:
    if _state["deferred"] and _state["requested"] is None:
        _state["requested"] = signum
        return
    raise Interrupted(signum)


def ignore_stop_signals() -> None:
    """In a worker process: SIGINT and SIGTERM are the driver's to act on (it stops this process)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
