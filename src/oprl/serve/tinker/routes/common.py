"""What the route modules share: the ``TinkerServer`` behind a request, a request's body (size-limited JSON, or the
raw protobuf of ``forward_backward``), the answer of a request that computes (a future to poll), and a training
model's numbered request (``ordered``: its model, its turn, its checks, its submission)."""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import JSONResponse

from oprl.serve.tinker.errors import UserError

if TYPE_CHECKING:
    from collections.abc import Callable

    from oprl.serve.tinker.models import Policy
    from oprl.serve.tinker.server import TinkerServer


def server_of(request: Request) -> TinkerServer:
    return request.app.state.server


async def body_bytes(request: Request) -> bytes:
    """The raw body, within the server's limit (checked again here: a chunked body carries no content-length)."""
    raw = await request.body()
    limit = server_of(request).max_body
    if len(raw) > limit:
        raise UserError(f"body: {len(raw)} bytes exceed the server's limit of {limit}")
    return raw


async def body_json(request: Request) -> dict[str, Any]:
    data = json.loads(await body_bytes(request) or b"{}")
    if not isinstance(data, dict):
        raise UserError("body: a JSON object expected")
    return data


def as_json(data: dict[str, Any]) -> tuple[bytes, str]:
    """A result body as computed work returns it (``Futures.submit``). Strict JSON: a NaN or ±inf fails the
    request (a server error) instead of reaching the SDK as a bare ``NaN``, which its parser refuses."""
    return json.dumps(data, allow_nan=False).encode(), "application/json"


def future(request_id: str, **extra: Any) -> JSONResponse:
    """The immediate answer of a request that computes: the id the SDK polls ``retrieve_future`` with."""
    return JSONResponse({"request_id": request_id, **extra})


@dataclass
class OrderedCall:
    """A training model's numbered request: the server, the caller's model (ownership checked), its turn
    ``key`` = (model_id, seq_id) and the JSON body (empty for ``forward_backward``'s protobuf)."""

    server: TinkerServer
    policy: Policy
    key: tuple[str, int]
    data: dict[str, Any] = field(default_factory=dict)

    def checks(self) -> AbstractContextManager[None]:
        """Where a route checks the request on arrival: a refusal (a 400) still takes the request's turn
        (``Futures.turn``), so the client's next call is answered."""
        return self.server.turn(self.key)

    def submit(self, work: Callable[[], tuple[bytes, str]]):
        """Queue ``work`` for the request's turn; the future the SDK polls."""
        return future(self.server.submit(work, self.key), model_id=self.policy.model_id)


def ordered_call(request: Request, model_id: str, seq_id: Any, data: dict[str, Any] | None = None) -> OrderedCall:
    """The numbered request ``seq_id`` of the caller's model ``model_id`` (404 when it is not the caller's)."""
    server = server_of(request)
    policy = server.policy(model_id, server.owner_of(request))
    return OrderedCall(server, policy, (policy.model_id, int(seq_id)), data or {})


async def ordered(request: Request) -> OrderedCall:
    """A training model's numbered request with a JSON body naming ``model_id`` and ``seq_id``."""
    data = await body_json(request)
    return ordered_call(request, data["model_id"], data["seq_id"], data)
