"""Fault injection, a test tool: ``OPRL_FAULT`` kills a worker process when a call for a given step reaches it.

    OPRL_FAULT="explorer:0@step=5"          explorer 0 dies as batch 5's ``explore`` call reaches it
    OPRL_FAULT="explorer@step=5"            whichever explorer generates batch 5 dies (which one is timing's)
    OPRL_FAULT="trainer@step=3+0.5"         the trainer dies 0.5 s into its first call for step 3 (``train``)
    OPRL_FAULT="explorer:0@step=2,explorer:1@step=6"   two kills in one run
    OPRL_FAULT="explorer@switch=4"          the explorer of batch 4 dies as it loads other weights mid-batch
                                            (partial rollouts: the switch to the batch's target version)
    OPRL_FAULT="trainer@save=4"             the trainer dies as its part of step 4's checkpoint is asked for
                                            (the buffer's part may be written: the checkpoint is torn)
    OPRL_FAULT="judge@call=2"               the judge dies as its second call (an explorer's batch) reaches it
    OPRL_FAULT="engine@step=3"              the vLLM engine process of batch 3's explorer is killed as the batch
                                            reaches it (rollout.engine_process=true; ``engine:0`` for explorer 0's)

A fault is ``WORKER@step=N[+SECONDS]``, ``WORKER@switch=N`` or ``WORKER@save=N``: ``WORKER`` is a worker's name
with ``:`` for the space (``explorer:1``, ``trainer``, ``teacher``, ``judge``, ``trainer-rank:1`` for a rank of
a sharded trainer, ``engine:1`` for explorer 1's vLLM engine process), or a kind alone for any worker of that kind
(``explorer``, ``engine``); ``step=N`` names the first call
whose first argument is ``N`` (``explore(batch)``, ``train(step)``, ``score(batch)``, ``evaluate(step)``);
``switch=N`` the same call, the worker dying only when a partial rollout's switcher loads other weights in it
(``oprl.explorer.switcher``: the worker process's ``OPRL_DIE_AT_SWITCH``, set here, is read there); ``save=N`` the
worker's ``save(directory)`` for the checkpoint of step ``N`` (its staging directory ``.tmp-step-N``); ``call=N``
the worker's ``N``-th call, for a worker whose calls name no step (the judge: ``judge(rows)``). The worker
dies as a ``kill -9`` would leave it (``SIGKILL`` to its own process: no cleanup, no reply). An ``engine`` fault
kills no worker: the explorer's call sets ``OPRL_KILL_ENGINE`` in its process, and its vLLM engine
(``oprl.rollout.vllm_engine``) SIGKILLs its own engine process before it samples, as the OOM killer would; the
explorer then raises vLLM's ``EngineDeadError``. Each fault fires once
per run: the driver's side of the worker (``processes.ProcessActor``, ``ray_backend.RayActor``) remembers it, so a
restarted worker regenerating the same batch is not killed again.

Only worker processes read it (``runtime.workers=processes``, ``backend=ray``); a run on threads, where a kill
would take the driver along, refuses it in one line, and so does an ``engine`` fault without an engine process
(``rollout.engine_process=true``). Nothing else of oprl reads the variable (the switcher reads only the doomed
process's ``OPRL_DIE_AT_SWITCH``, the vLLM engine its ``OPRL_KILL_ENGINE``).
"""

from __future__ import annotations

import os
import re
import signal
import threading
from dataclasses import dataclass, field

from oprl.errors import OprlError

VARIABLE = "OPRL_FAULT"
_FAULT = re.compile(
    r"^(?P<worker>[a-z_-]+(?::\d+)?)@(?:step=(?P<step>\d+)(?:\+(?P<after>\d+(?:\.\d*)?))?|(?P<point>switch|save|call)=(?P<at>\d+))$"
)
_FORM = "WORKER@step=N[+SECONDS], WORKER@switch=N, WORKER@save=N or WORKER@call=N (explorer:0@step=5)"
_ENGINE_FORM = "engine[:N]@step=N (engine:0@step=5)"
SWITCH = "switch"
"""``due``'s answer for a ``switch=N`` fault: the worker dies at the call's first weight switch, not at a time."""
AT_SWITCH = "OPRL_DIE_AT_SWITCH"
"""Set in a doomed worker process only (``die``): its switcher kills the process as it loads other weights."""
ENGINE = "engine"
"""``due``'s answer for an ``engine`` fault: the worker's engine process is killed, not the worker."""
KILL_ENGINE = "OPRL_KILL_ENGINE"
"""Set in the worker process of an ``engine`` fault (``die``): its vLLM engine kills its own engine process."""
_STAGING = re.compile(r"\.tmp-step-0*(\d+)")


@dataclass
class Fault:
    worker: str
    """As the worker is named in error lines (``explorer 0``)."""
    step: int
    after: float = 0.0
    """Seconds into the call."""
    point: str = "step"
    """``step`` (the call), ``switch`` (its first weight switch), ``save`` (a checkpoint part's save) or ``call``
    (the worker's ``step``-th call)."""
    fired: bool = False

    @property
    def kind(self) -> str:
        """The kind of worker it names (``explorer``, ``engine``, ``trainer-rank``)."""
        return self.worker.split(" ")[0]


@dataclass
class FaultPlan:
    """The faults ``OPRL_FAULT`` names, held on the driver's side of the workers (one plan per backend)."""

    faults: list[Fault] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _calls: dict[str, int] = field(default_factory=dict, repr=False)
    """Calls seen per worker (``call=N``)."""

    @classmethod
    def from_environment(cls) -> FaultPlan:
        return cls._of(os.environ.get(VARIABLE, "").strip())

    @classmethod
    def _of(cls, text: str) -> FaultPlan:
        faults = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            match = _FAULT.match(part)
            if match is None:
                raise OprlError(f"{VARIABLE}={text!r}: {part!r} is not {_FORM}")
            worker = match["worker"].replace(":", " ")
            if worker.split(" ")[0] == ENGINE and (match["point"] or match["after"]):
                raise OprlError(
                    f"{VARIABLE}={text!r}: {part!r}: an engine is killed as a step's call reaches it: {_ENGINE_FORM}"
                )
            if match["point"]:
                faults.append(Fault(worker, int(match["at"]), point=match["point"]))
            else:
                faults.append(Fault(worker, int(match["step"]), float(match["after"] or 0.0)))
        return cls(faults)

    def __bool__(self) -> bool:
        return bool(self.faults)

    def hand_over(self, kind: str) -> tuple[str, ...]:
        """The faults of ``kind``'s workers not yet fired, as ``OPRL_FAULT`` parts, marked fired here: a group of
        workers started elsewhere (a sharded trainer's ranks, started by its front) gets them once per run, not
        once per restarted segment."""
        out = []
        with self._lock:
            for fault in self.faults:
                if not fault.fired and fault.worker.split(" ")[0] == kind:
                    fault.fired = True
                    at = fault.worker.replace(" ", ":")
                    if fault.point == "step":
                        out.append(f"{at}@step={fault.step}" + (f"+{fault.after:g}" if fault.after else ""))
                    else:
                        out.append(f"{at}@{fault.point}={fault.step}")
        return tuple(out)

    @classmethod
    def parse(cls, parts: tuple[str, ...]) -> FaultPlan:
        """A plan of ``OPRL_FAULT`` parts (``hand_over``'s)."""
        return cls._of(",".join(parts))

    def due(self, worker: str, args: tuple) -> float | str | None:
        """Seconds after which ``worker`` must die in the call with ``args`` (``SWITCH``: at its first weight
        switch), or None; a fault fires once."""
        if not self.faults:
            return None
        first = args[0] if args else None
        step = first if type(first) is int else None
        saved = _STAGING.search(first) if isinstance(first, str) else None
        with self._lock:  # the sender threads of several workers ask at once
            calls = self._calls[worker] = self._calls.get(worker, 0) + 1
            for fault in self.faults:
                # An engine fault names the explorer whose engine it kills (``engine 0``: explorer 0's).
                target = fault.worker.replace("engine", "explorer", 1) if fault.kind == ENGINE else fault.worker
                named = target == worker or worker.startswith(f"{target} ")
                if fault.fired or not named:
                    continue
                if fault.point == "call" and calls == fault.step:
                    fault.fired = True
                    return 0.0
                if fault.point == "save" and saved is not None and int(saved[1]) == fault.step:
                    fault.fired = True
                    return 0.0
                if fault.point in ("step", "switch") and step == fault.step:
                    fault.fired = True
                    if fault.kind == ENGINE:
                        return ENGINE
                    return SWITCH if fault.point == "switch" else fault.after
        return None


def die(after: float | str) -> None:
    """In a worker process: SIGKILL this process now, ``after`` seconds from now (mid-call), (``SWITCH``) as
    this call's switcher loads other weights, or (``ENGINE``) have its vLLM engine kill its engine process."""
    if after == SWITCH:
        os.environ[AT_SWITCH] = "1"  # this process only: a restarted worker starts without it
        return
    if after == ENGINE:
        os.environ[KILL_ENGINE] = "1"  # read (and cleared) by the engine's next call
        return
    assert isinstance(after, float)
    if after <= 0:
        os.kill(os.getpid(), signal.SIGKILL)
    timer = threading.Timer(after, os.kill, (os.getpid(), signal.SIGKILL))
    timer.daemon = True
    timer.start()
