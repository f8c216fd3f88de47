"""The roles as the driver calls them: what each worker answers (a protocol) and a typed handle per role.

The driver, ``run`` and the checkpoint writer never name a worker method by a string. A handle wraps the
backend's ``Actor`` and has one method per verb of its role, with the role's argument types (a future may
stand for an argument that comes from another worker: backends resolve it inside the receiving worker) and the
type of what comes back, ``Pending[T]`` (resolve with ``Backend.get``). The verb a handle sends is the role
protocol's own method, checked to belong to that role at the boundary (``Handle._call``) and sent by its
``__name__``: the protocol is the one source of the verbs, for local threads, processes and Ray alike
(tests/test_contracts.py checks that every worker class implements its role, and every handle its role's
verbs).

One role is called by other workers rather than by the driver: the judge, which every explorer asks for the
verdicts of its batch. A worker holds it as a ``JudgeClient``: the same verb check over a ``Peer`` (the
backend's line from one worker to another), whose calls block until the value is back.

Deliberately not here: how a call travels (``oprl.backends``) or what the workers compute.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from oprl.backends.base import Actor, Peer, Pending
from oprl.backends.failure import process_died
from oprl.messages import (
    Experience,
    ExploreResult,
    FlatWeights,
    JudgeRow,
    ScoreResult,
    SwitchPlan,
    TrainResult,
    Verdicts,
)


@runtime_checkable
class TrainerRole(Protocol):
    """The trainer worker: ``TrainerWorker`` (one process) and ``ShardedTrainer`` (``trainer.sharding``)."""

    def ping(self) -> int: ...

    def train(self, step: int, batch: list[Experience]) -> TrainResult:
        """Train step ``step`` on ``batch`` (whole groups): its metrics, the version reached, the clock."""
        ...

    def weights(self) -> FlatWeights:
        """A snapshot of the trainable weights for the explorers."""
        ...

    def evaluate(self, step: int) -> dict[str, float]:
        """The ``eval/*`` columns of the current weights."""
        ...

    def save(self, directory: str) -> int:
        """The trainer's part of a checkpoint; returns its version."""
        ...

    def restore(self, directory: str) -> int:
        """Inverse of ``save``; returns the version."""
        ...

    def save_final(self, directory: str) -> None:
        """The trained model as a Hugging Face directory."""
        ...


@runtime_checkable
class ExplorerRole(Protocol):
    """An explorer worker (``ExplorerWorker``)."""

    def ping(self) -> int: ...

    def explore(
        self, batch: int, version: int, weights: dict | None = None, switch: SwitchPlan | None = None
    ) -> tuple[list[Experience], ExploreResult]:
        """Batch ``batch`` sampled by version ``version`` (loading ``weights`` first when given); under partial
        rollouts ``switch`` says which weights take over mid-batch (the synchronizer's ``switch_plan``)."""
        ...


@runtime_checkable
class BufferRole(Protocol):
    """The buffer worker (``ExperienceBuffer``): the run's data and I/O worker."""

    def put(self, batch: int, experiences: list[Experience], keep: bool = True) -> int: ...

    def take(self, step: int) -> tuple[list[Experience], dict[str, float]]:
        """The batch of trainer step ``step`` and the ``buffer/*`` / ``replay/*`` columns."""
        ...

    def save(self, directory: str) -> list[int]: ...

    def restore(self, directory: str) -> list[int]: ...


@runtime_checkable
class TeacherRole(Protocol):
    """The teacher worker (``TeacherWorker``): scores the student's tokens with a second model (distillation)."""

    def ping(self) -> int: ...

    def score(self, batch: int, experiences: list[Experience]) -> tuple[list[Experience], ScoreResult]:
        """Batch ``batch``'s experiences with ``teacher_logprobs`` set, and the teacher's report (its clock)."""
        ...


@runtime_checkable
class JudgeRole(Protocol):
    """The judge worker (``JudgeWorker``): a model that scores replies, asked by the explorers (``judge.path``)."""

    def ping(self) -> int: ...

    def judge(self, rows: list[JudgeRow]) -> Verdicts:
        """The verdicts of ``rows`` ((prompt, completion, reference) each): scores, unparsed flags, seconds."""
        ...


@runtime_checkable
class EvaluatorRole(Protocol):
    """The worker of ``mode=eval`` (``Evaluator``)."""

    def load_checkpoint(self, checkpoint: str) -> int: ...

    def evaluate(self, step: int) -> dict[str, float]: ...


class Handle:
    """A started worker of one role, called by typed methods (subclasses name the role)."""

    role: type

    def __init__(self, actor: Actor):
        self.actor = actor
        self.name = actor.name

    def _call(self, verb: Callable[..., Any], *args: Any, returns: int = 1) -> Any:
        """Queue ``worker.verb(*args)``: ``verb`` is the role protocol's method, sent by its name."""
        if getattr(self.role, verb.__name__, None) is not verb:
            raise TypeError(f"{verb.__qualname__} is not a verb of {self.role.__name__}")
        return self.actor.call(verb.__name__, *args, num_returns=returns)


class TrainerHandle(Handle):
    role = TrainerRole

    def ping(self) -> Pending[int]:
        return self._call(TrainerRole.ping)

    def train(self, step: int, batch: list[Experience] | Pending[list[Experience]]) -> Pending[TrainResult]:
        return self._call(TrainerRole.train, step, batch)

    def weights(self) -> Pending[FlatWeights]:
        return self._call(TrainerRole.weights)

    def evaluate(self, step: int) -> Pending[dict[str, float]]:
        return self._call(TrainerRole.evaluate, step)

    def save(self, directory: str) -> Pending[int]:
        return self._call(TrainerRole.save, directory)

    def restore(self, directory: str) -> Pending[int]:
        return self._call(TrainerRole.restore, directory)

    def save_final(self, directory: str) -> Pending[None]:
        return self._call(TrainerRole.save_final, directory)


class ExplorerHandle(Handle):
    role = ExplorerRole

    def ping(self) -> Pending[int]:
        return self._call(ExplorerRole.ping)

    def explore(
        self,
        batch: int,
        version: int,
        weights: dict | Pending[FlatWeights] | None = None,
        switch: SwitchPlan | None = None,
    ) -> tuple[Pending[list[Experience]], Pending[ExploreResult]]:
        """Two futures: the experiences (handed to the buffer unresolved) and the report (for the driver)."""
        return self._call(ExplorerRole.explore, batch, version, weights, switch, returns=2)


class BufferHandle(Handle):
    role = BufferRole

    def put(
        self, batch: int, experiences: list[Experience] | Pending[list[Experience]], keep: bool = True
    ) -> Pending[int]:
        return self._call(BufferRole.put, batch, experiences, keep)

    def take(self, step: int) -> tuple[Pending[list[Experience]], Pending[dict[str, float]]]:
        return self._call(BufferRole.take, step, returns=2)

    def save(self, directory: str) -> Pending[list[int]]:
        return self._call(BufferRole.save, directory)

    def restore(self, directory: str) -> Pending[list[int]]:
        return self._call(BufferRole.restore, directory)


class TeacherHandle(Handle):
    role = TeacherRole

    def ping(self) -> Pending[int]:
        return self._call(TeacherRole.ping)

    def score(
        self, batch: int, experiences: list[Experience] | Pending[list[Experience]]
    ) -> tuple[Pending[list[Experience]], Pending[ScoreResult]]:
        """Two futures: the scored experiences (handed on unresolved) and the report (for the driver)."""
        return self._call(TeacherRole.score, batch, experiences, returns=2)


class EvaluatorHandle(Handle):
    role = EvaluatorRole

    def load_checkpoint(self, checkpoint: str) -> Pending[int]:
        return self._call(EvaluatorRole.load_checkpoint, checkpoint)

    def evaluate(self, step: int) -> Pending[dict[str, float]]:
        return self._call(EvaluatorRole.evaluate, step)


class JudgeLost(RuntimeError):
    """The judge's process died under an explorer's call (killed, out of memory, a lost node), rather than the
    judge raising: the driver then restarts every worker from the newest checkpoint, as when the teacher dies
    (docs/runtime.md#self-healing-runs)."""


class JudgeClient:
    """The judge as a worker calls it (an explorer scoring a batch): the role's verbs over a ``Peer``, each
    returning its value. Picklable with its peer: it travels to the explorer with its factory arguments."""

    role = JudgeRole

    def __init__(self, peer: Peer):
        self.peer = peer

    def _call(self, verb: Callable[..., Any], *args: Any) -> Any:
        if getattr(self.role, verb.__name__, None) is not verb:
            raise TypeError(f"{verb.__qualname__} is not a verb of {self.role.__name__}")
        return self.peer.call(verb.__name__, *args)

    def ping(self) -> int:
        return self._call(JudgeRole.ping)

    def judge(self, rows: list[JudgeRow]) -> Verdicts:
        try:
            return self._call(JudgeRole.judge, rows)
        except Exception as exc:
            if process_died(exc):
                raise JudgeLost(f"the judge died while judging {len(rows)} rows: {exc}") from exc
            raise
