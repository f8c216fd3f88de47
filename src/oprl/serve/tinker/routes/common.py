"""What the route modules share: the ``TinkerServer`` behind a request, a request's body (size-limited JSON, or the
raw protobuf of ``forward_backward``), and the answer of a request that computes (a future to poll)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import JSONResponse

from oprl.serve.tinker.errors import UserError

if TYPE_CHECKING:
    from oprl.serve.tinker.app import TinkerServer


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
