"""The explorer's side of partial rollouts (docs/runtime.md#partial-rollouts): other weights between two decode
steps of one batch.

The driver sends each batch a ``SwitchPlan`` (``oprl.messages``: the synchronizer's answer, which version takes
over and at which decode step, or free-running), so the explorer never reads the schedule itself; ``Switcher``
carries it out with the engine, reading versions from the weights board (``oprl.checkpoint.board``). The rule is
``oprl.schedule.switch_version``'s; the per-token versions the engine records are the trainer's to use
(``oprl.trainer.staleness``).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from oprl.checkpoint.board import BoardClosed, board_file, is_closed, posted_versions
from oprl.messages import SwitchPlan

FREE_CHUNK = 8
"""Free-running with an engine that samples in segments (vLLM): decode steps between two looks at the board."""
KV_SETTINGS = ("keep", "recompute")
"""What happens to the cache of the tokens sampled before a switch: ``keep`` the stale keys/values (the
peers' default: no extra compute), or ``recompute`` the prefix under the new weights (one prefill)."""


class Switcher:
    """The in-flight weight update of one batch: the engine calls it between decode steps.

    Decode steps are counted over the batch's generate calls (``start`` returns the count so far, ``finish``
    adds a call's steps). ``before(step)`` runs before the distribution of global decode step ``step`` is
    computed and returns True when it has just loaded other weights into the engine. ``at_step`` and
    ``target`` give the scheduled switch (wait for ``target`` at ``at_step``); ``target=None`` with
    ``free=True`` takes any newer board version as soon as it is posted (never past ``newest``).
    """

    def __init__(
        self,
        engine,
        board: str | Path,
        version: int,
        *,
        at_step: int = 0,
        target: int | None = None,
        free: bool = False,
        newest: int | None = None,
        kv: str = "keep",
        lock=None,
    ):
        self.engine, self.board = engine, Path(board)
        self.version, self.at_step, self.target, self.free, self.newest = version, at_step, target, free, newest
        self.kv = kv
        self.lock = lock
        """The sampling lock held around generate (threads share torch's generator): released while waiting."""
        self.waited = 0.0
        """Wall seconds spent waiting for a scheduled version (``_wait_for``)."""
        self.changes: list[tuple[int, int]] = [(0, version)]
        """(first global decode step, version) of every policy that sampled this batch, in order."""
        self.steps = 0

    @classmethod
    def of(cls, plan: SwitchPlan, engine, version: int, lock=None) -> Switcher:
        """The ``Switcher`` that carries ``plan`` out on ``engine``, starting from ``version``."""
        return cls(
            engine,
            plan.board,
            version,
            at_step=plan.at_step,
            target=plan.target,
            free=plan.free,
            newest=plan.newest,
            kv=plan.kv,
            lock=lock,
        )

    def start(self) -> int:
        """A generate call begins: the global step of its token 0 (a switch due there happens now)."""
        self.before(self.steps)
        return self.steps

    def finish(self, steps: int) -> None:
        """A generate call ran ``steps`` decode steps (its longest row)."""
        self.steps += steps

    def before(self, step: int) -> bool:
        """Called before decode step ``step`` (global): switch now if due; True when the weights changed."""
        if self.target is not None and step >= self.at_step and self.version != self.target:
            return self._load(self.target, wait=True, step=step)
        if self.free:
            posted = [v for v in posted_versions(self.board) if v > self.version]
            if self.newest is not None:
                posted = [v for v in posted if v <= self.newest]
            if posted:
                return self._load(posted[-1], wait=False, step=step)
        return False

    def next_point(self, step: int) -> int | None:
        """The first global decode step after ``step`` at which ``before`` may load other weights: the scheduled
        switch step while its target is pending, every ``FREE_CHUNK``-th step when free-running (until
        ``newest``), None when no switch can come. For engines that sample in segments (vLLM)."""
        if self.target is not None and self.version != self.target and self.at_step > step:
            return self.at_step
        if self.free and (self.newest is None or self.version < self.newest):
            return step + FREE_CHUNK
        return None

    def version_at(self, step: int) -> int:
        """The version that sampled global decode step ``step``."""
        return [v for first, v in self.changes if first <= step][-1]

    def _load(self, version: int, *, wait: bool, step: int) -> bool:
        from safetensors.torch import load_file

        if os.environ.get("OPRL_DIE_AT_SWITCH"):  # a test's fault (oprl.backends.faults, switch=N): die here, now
            os.kill(os.getpid(), signal.SIGKILL)

        path = board_file(self.board, version)
        if wait and not path.exists():
            self._wait_for(path)
        self.engine.load_weights(load_file(str(path)))
        self.version = version
        self.changes.append((step, version))
        return True

    def _wait_for(self, path: Path) -> None:
        """Block until ``path`` is posted; the sampling lock is let go meanwhile (with torch's generator state
        put back after), so other samplers of this process (the trainer's evaluation) are not held up."""
        import torch

        state, start = torch.random.get_rng_state(), time.perf_counter()
        held = self.lock is not None and _release(self.lock)
        try:
            while not path.exists():
                if is_closed(self.board):
                    raise BoardClosed(f"the run ended while waiting for {path.name}")
                time.sleep(0.005)
        finally:
            if held:
                self.lock.acquire()
            torch.random.set_rng_state(state)
            self.waited += time.perf_counter() - start


def _release(lock) -> bool:
    """Release ``lock`` if this thread holds it (an RLock held once); whether it did."""
    if isinstance(lock, type(threading.RLock())) and lock._is_owned():  # type: ignore[attr-defined]
        lock.release()
        return True
    return False
