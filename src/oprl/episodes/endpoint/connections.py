"""The agent endpoint's connections and the process's files: how many connections it holds, and the uvicorn
protocol that holds it to them.

Agents run in the explorer's process, so each connection costs two of its files (the agent's end and the
endpoint's). ``connection_limits`` sizes the bound from what the files hold, the soft open-file limit raised to
the hard one first (``file_limits``), and compares it with what a batch asks for (two connections per
episode); ``guarded`` keeps uvicorn to it (idle connections replaced, slowloris closed). The agents' shared
client is sized to the same bound (``oprl.episodes.agents``), so their requests wait for a connection rather
than fail. Deliberately not here: sessions and requests (``oprl.episodes.endpoint.server``).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any

RESERVED_FILES = 64
"""Files left free for the rest of the run (checkpoints, data, logs) beyond those open when a batch starts."""
MIN_CONNECTIONS = 16
MIN_PER_SESSION = 8
"""Requests one session may have open at once, at least (an agent's parallel calls); more is a 429."""


@dataclass
class ConnectionLimits:
    """How many connections the endpoint holds and how many the run asks for (``connection_limits``)."""

    bound: int
    """Connections open at once: what the process's files hold (two files each: the agent's end and the
    endpoint's, both in this process), this endpoint's share. Past it a new connection replaces the oldest idle
    one, else is closed at once (the agents' shared client never opens more: its requests wait for one)."""
    needed: int
    """What the batch asks for: two per episode (a request and a keep-alive spare) and ``MIN_CONNECTIONS``."""
    per_session: int
    """Requests one session may have open at once (a 429 past it): one agent cannot take every slot."""


def file_limits() -> tuple[int, int]:
    """The process's open-file limit (soft, hard), the soft one raised to the hard one first (as Ray does at
    start: the soft default, often 1,024, is a per-process courtesy; the hard one is what the system allows)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # a hard limit the system does not honour (macOS caps at OPEN_MAX)
            pass
    return (soft if soft != resource.RLIM_INFINITY else 1 << 20), (hard if hard != resource.RLIM_INFINITY else -1)


def open_files() -> int:
    """Files this process has open now (Linux: /proc/self/fd; elsewhere 0: the reserve alone is kept)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def connection_limits(episodes: int, running: int | None = None) -> ConnectionLimits:
    """The limits of an endpoint serving ``episodes`` agent runs at once, ``running`` in all live endpoints
    (default: these): ``bound`` = (soft file limit, raised to the hard one, - open files - ``RESERVED_FILES``) / 2
    connections, shared by the live endpoints in proportion to their episodes; ``needed`` = 2 x episodes +
    ``MIN_CONNECTIONS``; ``per_session`` = needed / episodes, at least ``MIN_PER_SESSION``. A soft limit of 1,024
    under a higher hard one: raised, so 64 x 8 episodes get their 1,040 connections."""
    soft, _ = file_limits()
    running = max(running if running is not None else episodes, episodes, 1)
    files = max((soft - open_files() - RESERVED_FILES) // 2, MIN_CONNECTIONS)
    bound = max(files * max(episodes, 1) // running, MIN_CONNECTIONS)
    needed = 2 * episodes + MIN_CONNECTIONS
    return ConnectionLimits(bound, needed, max(needed // max(episodes, 1), MIN_PER_SESSION))


def guarded(base: Any, endpoint: Any, timeout: float) -> Any:
    """uvicorn's HTTP protocol class ``base`` with two guards: at most ``endpoint.limits.bound`` connections are
    open (at the bound a new one replaces the oldest idle one, one with no request being served, or is closed at
    once when none is idle: the process never runs out of files, and idle connections cannot lock agents out),
    and one that has not delivered a request's headers ``timeout`` seconds after it opened or after its last
    reply is closed (slowloris)."""

    class Guarded(base):
        refused = False
        deadline: asyncio.TimerHandle | None = None
        timed: Any = None
        """The request cycle the deadline was armed after: a newer one means headers arrived."""
        opened = 0.0

        def connection_made(self, transport) -> None:
            served = self.server_state.connections
            if len(served) >= endpoint.limits.bound:
                idle = [c for c in served if c.cycle is None or c.cycle.response_complete]
                if not idle:
                    self.refused = True
                    transport.abort()
                    return
                oldest = min(idle, key=lambda c: c.opened)
                served.discard(oldest)  # counted out now; its connection_lost comes later
                oldest.transport.abort()
            self.opened = time.monotonic()
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc) -> None:
            if self.refused:
                return
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.cycle is not None and self.cycle is not self.timed:
                self._disarm()  # a request's headers arrived; its body has read_body's deadline

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            if self.cycle is not None and not self.cycle.response_complete:  # a pipelined request runs already
                return
            self.timed = self.cycle
            self.deadline = self.loop.call_later(timeout, self._expire)

        def _disarm(self) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
                self.deadline = None

        def _expire(self) -> None:
            self.deadline = None
            if not self.transport.is_closing() and (self.cycle is None or self.cycle is self.timed):
                self.transport.close()

    return Guarded
