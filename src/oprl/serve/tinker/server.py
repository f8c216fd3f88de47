"""The server's state: sessions (each owned by the API key that created it; heartbeats keep it, one silent for
``session_timeout`` seconds or finished is closed and its models freed), and (``Futures``) the results, each model's
request order and the lanes. The HTTP application over it is ``app.py``'s; the routes (``routes/``) read it, and
this module imports neither, so no import of the package comes back to itself."""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass

from fastapi import Request

from oprl.serve.tinker.backend import COMPUTE_LANE, TinkerModels
from oprl.serve.tinker.errors import NotFound
from oprl.serve.tinker.futures import BATCH_ROWS, SAMPLE_WINDOW_S, Futures
from oprl.serve.tinker.models import Sampler


@dataclass
class ClientSession:
    owner: str
    last_seen: float
    finished: bool = False


class TinkerServer(Futures):
    """State shared by the routes: sessions, and (``Futures``) results, per-model order and the lanes."""

    def __init__(
        self,
        backend: TinkerModels,
        *,
        api_keys: list[str],
        session_timeout: float,
        max_body: int,
        sample_window: float = SAMPLE_WINDOW_S,
        batch_rows: int = BATCH_ROWS,
        threads: int | None = None,
        stable_reinforce: str | None = None,
    ):
        super().__init__(backend, sample_window=sample_window, batch_rows=batch_rows, threads=threads)
        self.stable_reinforce = stable_reinforce
        """The oprl preset ``loss_fn="stable_reinforce"`` is served as (``--stable-reinforce``); None: refused."""
        self.api_keys = set(api_keys)
        self.session_timeout = session_timeout
        self.max_body = max_body
        self.sessions: dict[str, ClientSession] = {}

    # ---- sessions ------------------------------------------------------------------------------------------

    def owner_of(self, request: Request) -> str:
        """The caller's identity: a digest of its API key (sessions and their models belong to it)."""
        key = request.headers.get("x-api-key", "")
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def open_session(self, owner: str) -> str:
        """A new session of ``owner`` (closing the sessions that stopped heartbeating first); its id."""
        self.expire()
        session_id = f"session-{uuid.uuid4().hex[:12]}"
        self.sessions[session_id] = ClientSession(owner, time.monotonic())
        return session_id

    def session(self, session_id: str, owner: str) -> ClientSession:
        session = self.sessions.get(session_id)
        if session is None or session.owner != owner or session.finished:
            raise NotFound(f"session_id: no open session {session_id!r} for this API key")
        session.last_seen = time.monotonic()
        return session

    def policy(self, model_id: str, owner: str):
        policy = self.backend.policies.get(model_id)
        if policy is None or self.sessions[policy.owner].owner != owner:
            raise NotFound(f"model_id: no model {model_id!r} in a session of this API key")
        return policy

    def sampler(self, sampler_id: str, owner: str) -> Sampler:
        sampler = self.backend.samplers.get(sampler_id)
        if sampler is None or self.sessions[sampler.owner].owner != owner:
            raise NotFound(f"sampling_session_id: no sampler {sampler_id!r} in a session of this API key")
        return sampler

    def expire(self) -> None:
        """Close the sessions that stopped heartbeating (their client died): their models leave memory."""
        deadline = time.monotonic() - self.session_timeout
        for session_id, session in list(self.sessions.items()):
            if not session.finished and session.last_seen < deadline:
                self.close(session_id)

    def close(self, session_id: str) -> None:
        self.sessions[session_id].finished = True

        def free() -> None:
            for home in self.backend.close_owner(session_id):  # placed models: their workers stopped
                with self.lanes_lock:
                    lane = self.lanes.pop(home, None)
                if lane is not None:
                    lane.shutdown(wait=False)

        self.lane(COMPUTE_LANE).submit(free)
