"""Third-party lines that tell an oprl user nothing, kept off the console and in the run's ``workers.log``.

``NOISE`` lists them, each with why it is noise:

- vLLM's "Triton is installed, but doesn't include CPU backend. Disabling Triton." (every CPU run: oprl's CPU
  engine needs no Triton);
- torch's C++ "Warning: NUMA binding: Using MEMBIND policy ..." that vLLM's CPU worker triggers as it binds its
  memory to the node it runs on (every CPU engine start; nothing to act on);
- Ray's "Token authentication is disabled/enabled for this Ray cluster ..." (``ray.init`` of the local instance a
  run starts for itself; oprl's own cluster, reachable only from this machine unless ``runtime.ray_address``).

Two ways in, because the lines take two roads to the terminal:

- Python logging records (``keep_noise_out``): a filter on each emitting logger drops the record from every
  console handler and appends it to ``workers.log`` (``$OPRL_REWARD_LOG``, which a run sets); outside a run
  it is dropped from the console all the same;
- bytes written straight to file descriptor 2 by C++ (``stderr_kept``, around a vLLM engine's start): file
  descriptor 2 is pointed at a scratch file beside ``workers.log`` for the block; then every line is appended
  to ``workers.log`` and all but the noise echoed to the real stderr. Anything another thread writes to stderr
  during the block reaches the console when it ends, in order; a process killed inside the block leaves the
  scratch file (``workers.log.<pid>.stderr``) with everything it wrote.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

NOISE: tuple[tuple[str | None, re.Pattern[str]], ...] = (
    ("vllm.triton_utils.importing", re.compile(r"Triton is installed, but doesn't include CPU backend")),
    (None, re.compile(r"Warning: NUMA binding: Using MEMBIND policy")),
    ("ray._private.authentication.authentication_token_setup", re.compile(r"Token authentication is (dis|en)abled")),
)
"""``(emitting logger, or None for a C++ line on file descriptor 2; pattern)`` of every line kept off the console."""

LOG_ENV = "OPRL_REWARD_LOG"
"""Where a run's ``workers.log`` is (``oprl.tasks.rewards.processes.LOG_ENV``, set by the run)."""


def is_noise(line: str) -> bool:
    return any(pattern.search(line) for _, pattern in NOISE)


def workers_log() -> Path | None:
    """The running run's ``workers.log``; None outside a run."""
    path = os.environ.get(LOG_ENV)
    return Path(path) if path else None


def _append(lines: list[str]) -> None:
    path = workers_log()
    if path is None or not lines:
        return
    with contextlib.suppress(OSError), open(path, "a", encoding="utf-8", errors="replace") as log:
        log.writelines(line if line.endswith("\n") else line + "\n" for line in lines)


class _KeptOut(logging.Filter):
    """Drops a noise record from the console (every handler its logger reaches) into ``workers.log``."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not is_noise(message):
            return True
        _append([f"{record.levelname} {record.name}: {message}"])
        return False


_FILTER = _KeptOut()


def keep_noise_out() -> None:
    """Filter ``NOISE``'s logging records (idempotent; before or after the library configured its logging)."""
    for name, _ in NOISE:
        if name is not None and _FILTER not in logging.getLogger(name).filters:
            logging.getLogger(name).addFilter(_FILTER)


_REDIRECT = threading.Lock()
_held: list[tuple[int, Path]] = []  # (the real stderr's duplicate, the scratch file) while any block runs
_depth = 0  # blocks running (threads building engines at once share one redirection)


@contextlib.contextmanager
def stderr_kept() -> Iterator[None]:
    """Inside a run, file descriptor 2 goes to a scratch file during the block and only the lines that are not
    ``NOISE`` reach the console, after it; all of them go to ``workers.log`` (module docstring). Blocks of several
    threads at once share one redirection, undone when the last ends. Outside a run: nothing changes."""
    global _depth
    keep_noise_out()
    path = workers_log()
    if path is None:
        yield
        return
    with _REDIRECT:
        if _depth == 0:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            # One scratch file per process: worker processes (trainer, explorers) start engines at once, and one
            # unlinking a shared file left the other's read a FileNotFoundError ("trainer: failed to start").
            scratch = path.with_name(f"{path.name}.{os.getpid()}.stderr")
            _held.append((os.dup(2), scratch))
            with open(scratch, "wb") as sink:
                os.dup2(sink.fileno(), 2)
        _depth += 1
    try:
        yield
    finally:
        with _REDIRECT:
            _depth -= 1
            if _depth == 0:
                _restore(*_held.pop())


def _restore(saved: int, scratch: Path) -> None:
    """File descriptor 2 back to ``saved``; the scratch file's lines into ``workers.log``, the others echoed."""
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os.dup2(saved, 2)
    os.close(saved)
    lines = scratch.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
    _append(lines)
    shown = "".join(line for line in lines if not is_noise(line))
    if shown:
        os.write(2, shown.encode())
    scratch.unlink(missing_ok=True)
