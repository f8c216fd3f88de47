"""The weights board of partial rollouts (docs/runtime.md#partial-rollouts): how a version the trainer published
reaches explorers in the middle of a call, on every backend.

The board is a directory (``<run>/weights-board``) holding one safetensors file per version, each written
atomically, which every backend's explorers can read mid-call (the weights sent with calls only arrive between
calls). The run clears versions newer than its start step when it starts (a resumed run must not see the killed
run's future) and writes ``closed`` when it ends, so an explorer waiting for a version that will never come stops.
The writer is the synchronizer (``oprl.runtime.synchronizer.BoardWriter``), the reader the explorer's
``oprl.explorer.switcher.Switcher``.
"""

from __future__ import annotations

import os
from pathlib import Path

from oprl.io import atomic_path

BOARD_DIRNAME = "weights-board"
_CLOSED = "closed"


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


def is_closed(board: str | Path) -> bool:
    """Whether the run that owns ``board`` has ended (``close_board``)."""
    return (Path(board) / _CLOSED).exists()


class BoardClosed(RuntimeError):
    """The run ended while an explorer waited for a version (it never came)."""
