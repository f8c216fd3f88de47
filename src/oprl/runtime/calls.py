"""The driver's calls in flight and what a failed one means: ``Call`` (a submitted call, with what its handler
needs) and ``blame`` (a failed call as the run's ``Failure``: who failed doing what, in one line, and whether
that worker's process was lost, which decides whether ``oprl.runtime.healing`` starts every worker again).

A call's error does not always name the worker to blame: a ``train`` call fails with the error of the ``take``
it waited for (the buffer failed), an explorer's call with the judge's death (``JudgeLost``), a ``put`` with the
death of the teacher whose scores it stored (the driver tells it, ``scored``). ``blame`` names the worker that
failed, so that the line, the checkpoint kept and the healing all follow the right one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from oprl.backends import failure

if TYPE_CHECKING:  # annotations only
    from oprl.runtime.healing import Restart


@dataclass
class Call:
    """A submitted call the driver waits for, with what its handler needs."""

    kind: str
    """explore, put, train, eval, weights, post (to the weights board), part (of a checkpoint), score (teacher),
    restart (a restarted worker becoming ready)."""
    component: str
    """The worker, as named in error messages (``explorer 0``, ``trainer``, ``buffer``; ``synchronizer`` for
    the weights board writes it makes in the driver's process)."""
    doing: str
    """What it was doing, for error messages."""
    step: int = 0
    """train, eval: the trainer step."""
    batch: int = 0
    """explore, put: the batch index."""
    explorer: int = 0
    """explore: which explorer."""
    experiences: Any = None
    """explore: the future of the batch's experiences (handed to the buffer unresolved)."""
    stats: Any = None
    """train: the future of the buffer's ``take`` metrics."""
    restart: Restart | None = None
    """restart: what is being restarted, and why."""


@dataclass
class Failure:
    component: str
    message: str
    """One line: who failed doing what, and why."""
    cause: BaseException
    lost: bool = False
    """The trainer's, the teacher's, the judge's or the buffer's process died (a Ray actor, or a worker process;
    ``oprl.runtime.run`` goes on from the newest checkpoint)."""


def blame(call: Call, exc: BaseException, backend, holders: dict, scored: int | None = None, note: str = "") -> Failure:
    """The run's failure after ``call`` failed with ``exc`` (module docstring). ``holders``: the handles of the
    workers whose death is a lost process (trainer, teacher, buffer: their ``actor`` is asked of ``backend``);
    ``scored``: the batch whose teacher died under it (the teacher failed, not the buffer); ``note``: added to
    the line (why a dead explorer was not restarted)."""
    component, doing = call.component, call.doing
    judge_lost = failure.is_kind(exc, "JudgeLost")
    if judge_lost:  # the explorer is fine: the judge it called died (roles.JudgeClient)
        component = "judge"
    if call.kind == "train":
        try:
            backend.get(call.stats)
        except Exception:  # ``take`` failed and the trainer only saw its error
            component, doing = "buffer", f"while handing out batch {call.step}"
    if scored is not None:
        component, doing = "teacher", f"while scoring batch {scored}"
    message = f"{component} failed {doing}: {backend.describe(exc)}{note}"
    holder = holders.get(component)
    # A sharded trainer's rank that died is a lost trainer too (its front raises ``RankLost``).
    rank_lost = failure.is_kind(exc, "RankLost")
    lost = judge_lost or (holder is not None and (backend.lost(exc, holder.actor) or rank_lost))
    return Failure(component, " ".join(message.split()), exc, lost)
