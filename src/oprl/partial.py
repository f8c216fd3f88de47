"""Partial rollouts: weights that change between two decode steps of a batch, and every token tagged with the
policy version that sampled it (docs/runtime.md#partial-rollouts).

**Switch rule.** Batch b starts from the version the schedule gives it, ``v(b)`` (``oprl.schedule``).
With ``sync.partial=true``:

- ``sync.mode=scheduled`` (deterministic): if the next sync version ``v(b) + k`` is one the trainer reaches
  before step b trains (``v(b) + k <= b - 1``), it becomes active at decode step ``j = sync.switch_step`` of
  batch b, counted over every generate call the batch makes (the turns of an episode add up, so a switch
  can fall inside a turn or between two). The explorer waits there for that version if the trainer has
  not published it yet. The point depends only on (b, k, m, j) and the tokens sampled, never on timing:
  the same config and seed give the same tokens and versions per token on any backend and after resume.
- ``sync.mode=async`` (free-running): before every decode step the explorer loads the newest version
  published so far if it is newer than the one it samples with. When that happens depends on timing; the
  version of every token is still recorded exactly.

A switch draws no random numbers, so the tokens before it equal those of a run that never switched.

**Transport.** Published versions are posted to a *weights board* (``<run>/weights-board``), one
safetensors file per version written atomically, which every backend's explorers can read mid-call (the
weights sent with calls only arrive between calls). The run clears versions newer than its start step
when it starts (a resumed run must not see the killed run's future) and writes ``closed`` when it ends,
so an explorer waiting for a version that will never come stops.

**Per-token versions.** ``Experience.behavior_versions[t]`` is the version whose weights computed the
distribution token t was drawn from; ``policy_version`` stays the version the response started with (its
oldest token), which is what ``sync.max_staleness`` bounds. ``token_lag_metrics`` reports the lag per
token, ``mask_stale_tokens`` drops tokens older than a bound from the loss (slime's on-policy-tokens-only
mode, for comparison): data shaping before the loss, which itself needs no change.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from oprl.io import atomic_path
from oprl.messages import Experience
from oprl.schedule import policy_version

BOARD_DIRNAME = "weights-board"
_CLOSED = "closed"
FREE_CHUNK = 8
"""Free-running with an engine that samples in segments (vLLM): decode steps between two looks at the board."""
KV_SETTINGS = ("keep", "recompute")
"""What happens to the cache of the tokens sampled before a switch: ``keep`` the stale keys/values (the
peers' default: no extra compute), or ``recompute`` the prefix under the new weights (one prefill)."""


# -- the rule ----------------------------------------------------------------------------------------------
def switch_version(batch: int, interval: int, offset: int) -> int | None:
    """The version that takes over batch ``batch`` at the switch step in scheduled mode, None when there is
    none: ``v(b) + k`` if ``v(b) + k <= b - 1`` (the trainer reaches it before step b), else None."""
    target = policy_version(batch, interval, offset) + interval
    return target if target <= batch - 1 else None


# -- per-token versions --------------------------------------------------------------------------------------
def token_versions(exp: Experience) -> list[int]:
    """The version of each response token (all ``policy_version`` for a row sampled by one policy)."""
    if exp.behavior_versions is not None:
        return exp.behavior_versions
    return [exp.policy_version] * len(exp.response_ids)


def _model_token_versions(exp: Experience) -> list[int]:
    versions = token_versions(exp)
    if exp.loss_mask is None:
        return versions
    return [v for v, m in zip(versions, exp.loss_mask, strict=True) if m]


def token_lag_metrics(batch: list[Experience], version: int) -> dict[str, float]:
    """Per-token lag of the model tokens of ``batch`` against the trainer's ``version``:
    ``lag/token_min|mean|max``, ``lag/token_frac_<L>`` (fraction of tokens at lag L, for each L present),
    ``batch/version_min|max`` over tokens and ``batch/switched_frac`` (rows sampled by more than one policy)."""
    versions = [v for e in batch for v in _model_token_versions(e)] or [e.policy_version for e in batch]
    counts = Counter(version - v for v in versions)
    out = {
        "lag/token_min": float(min(counts)),
        "lag/token_mean": sum(lag * n for lag, n in counts.items()) / len(versions),
        "lag/token_max": float(max(counts)),
        "batch/version_min": float(min(versions)),
        "batch/version_max": float(max(versions)),
        "batch/switched_frac": sum(len(set(token_versions(e))) > 1 for e in batch) / len(batch),
    }
    out |= {f"lag/token_frac_{lag}": n / len(versions) for lag, n in sorted(counts.items())}
    return out


def mask_stale_tokens(batch: list[Experience], version: int, max_lag: int) -> tuple[list[Experience], float]:
    """``batch`` with every model token older than ``max_lag`` versions (lag = ``version`` - its version)
    taken out of the loss (``loss_mask`` 0: context only), and the fraction of model tokens masked. Rows are
    copied; the buffer's objects stay as they are. ``max_lag=0`` keeps on-policy tokens only (slime)."""
    out, masked, total = [], 0, 0
    for exp in batch:
        mask = list(exp.loss_mask) if exp.loss_mask is not None else [1] * len(exp.response_ids)
        for t, v in enumerate(token_versions(exp)):
            if mask[t]:
                total += 1
                if version - v > max_lag:
                    mask[t], masked = 0, masked + 1
        out.append(replace(exp, loss_mask=mask) if mask != (exp.loss_mask or [1] * len(mask)) else exp)
    return out, masked / max(total, 1)


# -- the weights board ---------------------------------------------------------------------------------------
def board_file(board: Path, version: int) -> Path:
    return Path(board) / f"version-{version:06d}.safetensors"


def post_weights(board: str | Path, version: int, weights: dict, keep_from: int | None = None) -> None:
    """Write ``weights`` (name -> tensor) as version ``version`` of the board (atomic: whole file or none),
    then remove the versions below ``keep_from`` (no batch still to be sampled can need them)."""
    from safetensors.torch import save_file

    root = Path(board)
    path = board_file(root, version)
    if not path.exists():  # same run, same version: same weights (a resumed run posts what it restores again)
        tensors = {name: t.detach().cpu().contiguous().clone() for name, t in weights.items()}
        with atomic_path(path) as temporary:
            save_file(tensors, str(temporary))
    for old in posted_versions(root):
        if keep_from is not None and old < min(keep_from, version):
            board_file(root, old).unlink(missing_ok=True)


def open_board(board: str | Path, start_step: int) -> None:
    """Prepare the board of a run starting after step ``start_step``: versions newer than it (a killed run's
    future) and the ``closed`` mark are removed."""
    root = Path(board)
    root.mkdir(parents=True, exist_ok=True)
    (root / _CLOSED).unlink(missing_ok=True)
    for version in posted_versions(root):
        if version > start_step:
            board_file(root, version).unlink(missing_ok=True)


def close_board(board: str | Path) -> None:
    """Mark the board closed: explorers still waiting for a version give up (the run is ending)."""
    root = Path(board)
    if root.is_dir():
        (root / _CLOSED).touch()


def posted_versions(board: Path) -> list[int]:
    names = os.listdir(board) if board.is_dir() else []
    return sorted(int(n[8:14]) for n in names if n.startswith("version-") and n.endswith(".safetensors"))


@dataclass(frozen=True)
class PartialSettings:
    """What an explorer needs to switch weights inside a batch (``sync.partial``; pickles to any worker)."""

    board: str
    mode: str
    """``scheduled`` (the deterministic rule) or ``async`` (free-running)."""
    interval: int
    offset: int
    switch_step: int
    kv: str

    @classmethod
    def of(cls, config, board: str | Path) -> PartialSettings | None:
        """The settings of a run's ``config`` (None without ``sync.partial``)."""
        sync = config.sync
        if not sync.partial:
            return None
        return cls(str(board), sync.mode, sync.interval, sync.offset, sync.switch_step, sync.partial_kv)

    def switcher(self, engine, batch: int, version: int, lock=None) -> Switcher:
        """The ``Switcher`` of batch ``batch`` starting from ``version`` on ``engine``."""
        if self.mode == "scheduled":
            target = switch_version(batch, self.interval, self.offset)
            return Switcher(engine, self.board, version, at_step=self.switch_step, target=target, kv=self.kv, lock=lock)
        return Switcher(engine, self.board, version, free=True, newest=batch - 1, kv=self.kv, lock=lock)


class BoardClosed(RuntimeError):
    """The run ended while an explorer waited for a version (it never came)."""


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
                if (self.board / _CLOSED).exists():
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
