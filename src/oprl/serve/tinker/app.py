"""The HTTP side: the application, sessions, auth, and the errors' answers; the routes the Tinker SDK (0.38) calls
are ``routes/``'s, one router per resource. The futures protocol, each model's request order, the lanes that
compute and batched sampling are ``futures.py``'s (``TinkerServer`` is a ``Futures``).

Sessions and isolation: a session belongs to the API key that created it; a request naming a model or sampler
of a session created under another key is refused (404, the same answer as an unknown id). Heartbeats keep a
session; one silent for ``session_timeout`` seconds, or finished, is closed and its models freed.

Errors a client can fix are HTTP 400 (413 for an oversized body) with ``{"detail": "<field>: <why>"}``; the
server keeps serving whatever a request holds.
"""

from __future__ import annotations

import hashlib
import ipaddress
import time
import uuid
from dataclasses import dataclass

from fastapi import FastAPI, Request

from oprl.errors import OprlError
from oprl.serve.tinker import wire
from oprl.serve.tinker.backend import COMPUTE_LANE, TinkerModels
from oprl.serve.tinker.errors import NotFound, UserError
from oprl.serve.tinker.futures import BATCH_ROWS, SAMPLE_WINDOW_S, Futures, _error
from oprl.serve.tinker.losses import LossError
from oprl.serve.tinker.models import Sampler
from oprl.serve.tinker.routes import sampling, service, training


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


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def create_app(server: TinkerServer) -> FastAPI:
    """The FastAPI application speaking the Tinker API over ``server``: the routers of ``routes/``, the guard
    (auth, body size) and the errors' answers."""
    app = FastAPI(title="oprl Tinker-compatible server")
    app.state.server = server  # what ``routes.common.server_of`` finds

    @app.middleware("http")
    async def guard(request: Request, call_next):
        """Auth (``X-API-Key`` among ``api_keys`` when any are configured) and the body size limit."""
        if server.api_keys and request.headers.get("x-api-key") not in server.api_keys:
            return _error(401, "X-API-Key: not a key this server accepts (oprl serve tinker --api-key)")
        length = request.headers.get("content-length")
        if length is not None and int(length) > server.max_body:
            return _error(413, f"body: {int(length)} bytes exceed the server's limit of {server.max_body}")
        return await call_next(request)

    @app.exception_handler(NotFound)
    async def not_found(request: Request, exc: NotFound):
        return _error(404, str(exc))

    @app.exception_handler(ValueError)  # UserError, LossError, WireError, json's errors: the client's to fix
    async def bad_input(request: Request, exc: ValueError):
        if isinstance(exc, UserError | LossError | wire.WireError):
            return _error(400, str(exc))
        return _error(400, f"body: malformed request ({type(exc).__name__}: {exc})")

    @app.exception_handler(KeyError)
    async def missing_field(request: Request, exc: KeyError):
        return _error(400, f"{exc.args[0]}: required")

    @app.exception_handler(OprlError)
    async def oprl_error(request: Request, exc: OprlError):
        return _error(400, str(exc))

    for router in (service.router, training.router, sampling.router):
        app.include_router(router)
    return app
