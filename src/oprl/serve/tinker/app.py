"""The HTTP side: the application, auth and the errors' answers over the server's state (``server.py``); the
routes the Tinker SDK (0.38) calls are ``routes/``'s, one router per resource. The futures protocol, each model's
request order, the lanes that compute and batched sampling are ``futures.py``'s (``TinkerServer`` is a ``Futures``).

Sessions and isolation: a session belongs to the API key that created it; a request naming a model or sampler
of a session created under another key is refused (404, the same answer as an unknown id). Heartbeats keep a
session; one silent for ``session_timeout`` seconds, or finished, is closed and its models freed.

Errors a client can fix are HTTP 400 (413 for an oversized body) with ``{"detail": "<field>: <why>"}``; the
server keeps serving whatever a request holds.
"""

from __future__ import annotations

import ipaddress

from fastapi import FastAPI, Request

from oprl.errors import OprlError
from oprl.serve.tinker import wire
from oprl.serve.tinker.errors import NotFound, UserError
from oprl.serve.tinker.futures import _error
from oprl.serve.tinker.losses import LossError
from oprl.serve.tinker.routes import sampling, service, training
from oprl.serve.tinker.server import ClientSession, TinkerServer

__all__ = ["ClientSession", "TinkerServer", "create_app", "is_loopback"]


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
