"""Fault injection, a test tool: ``OPRL_FAULT`` kills a worker process when a call for a given step reaches it.

    OPRL_FAULT="explorer:0@step=5"          explorer 0 dies as batch 5's ``explore`` call reaches it
    OPRL_FAULT="explorer@step=5"            whichever explorer generates batch 5 dies (which one is timing's)
    OPRL_FAULT="trainer@step=3+0.5"         the trainer dies 0.5 s into its first call for step 3 (``train``)
    OPRL_FAULT="explorer:0@step=2,explorer:1@step=6"   two kills in one run

A fault is ``WORKER@step=N[+SECONDS]``: ``WORKER`` is a worker's name with ``:`` for the space
(``explorer:1``, ``trainer``, ``teacher``, ``judge``), or a kind alone for any worker of that kind
(``explorer``); the call is the first one whose first argument is ``N``
(``explore(batch)``, ``train(step)``, ``score(batch)``, ``evaluate(step)``). The worker dies as a ``kill -9``
would leave it (``SIGKILL`` to its own process: no cleanup, no reply). Each fault fires once per run: the
driver's side of the worker (``processes.ProcessActor``, ``ray_backend.RayActor``) remembers it, so a restarted
worker regenerating the same batch is not killed again.

Only worker processes read it (``runtime.workers=processes``, ``backend=ray``); a run on threads, where a kill
would take the driver along, refuses it in one line. Nothing else of oprl reads the variable.
"""

from __future__ import annotations

import os
import re
import signal
import threading
from dataclasses import dataclass, field

from oprl.errors import OprlError

VARIABLE = "OPRL_FAULT"
_FAULT = re.compile(r"^(?P<worker>[a-z_]+(?::\d+)?)@step=(?P<step>\d+)(?:\+(?P<after>\d+(?:\.\d*)?))?$")


@dataclass
class Fault:
    worker: str
    """As the worker is named in error lines (``explorer 0``)."""
    step: int
    after: float = 0.0
    """Seconds into the call."""
    fired: bool = False


@dataclass
class FaultPlan:
    """The faults ``OPRL_FAULT`` names, held on the driver's side of the workers (one plan per backend)."""

    faults: list[Fault] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def from_environment(cls) -> FaultPlan:
        text = os.environ.get(VARIABLE, "").strip()
        faults = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            match = _FAULT.match(part)
            if match is None:
                raise OprlError(f"{VARIABLE}={text!r}: {part!r} is not WORKER@step=N[+SECONDS] (explorer:0@step=5)")
            worker = match["worker"].replace(":", " ")
            faults.append(Fault(worker, int(match["step"]), float(match["after"] or 0.0)))
        return cls(faults)

    def __bool__(self) -> bool:
        return bool(self.faults)

    def due(self, worker: str, args: tuple) -> float | None:
        """Seconds after which ``worker`` must die in the call with ``args``, or None; a fault fires once."""
        if not self.faults or not args or type(args[0]) is not int:
            return None
        with self._lock:  # the sender threads of several workers ask at once
            for fault in self.faults:
                named = fault.worker == worker or worker.startswith(f"{fault.worker} ")
                if not fault.fired and named and fault.step == args[0]:
                    fault.fired = True
                    return fault.after
        return None


def die(after: float) -> None:
    """In a worker process: SIGKILL this process now, or ``after`` seconds from now (mid-call)."""
    if after <= 0:
        os.kill(os.getpid(), signal.SIGKILL)
    timer = threading.Timer(after, os.kill, (os.getpid(), signal.SIGKILL))
    timer.daemon = True
    timer.start()
