"""The service's routes: health, the client's configuration, sessions (create, heartbeat, finish), polling a
future, and the endpoints this server refuses with the reason.

Sessions and isolation: a session belongs to the API key that created it (``TinkerServer.session``); heartbeats
keep it, one silent for ``session_timeout`` seconds, or finished, is closed and its models freed."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from oprl.serve.tinker.futures import _error
from oprl.serve.tinker.routes.common import body_json, server_of

router = APIRouter()


@router.get("/api/v1/healthz")
async def healthz():
    return {"status": "ok"}


@router.post("/api/v1/client/config")
async def client_config():
    # Plain API keys (no JWT exchange), uncompressed protobuf forward_backward bodies (zstd is accepted too),
    # per-request polling, custom losses (create_custom_loss too) run by the SDK on the client.
    return {
        "pjwt_auth_enabled": False,
        "proto_compress_fwdbwd": False,
        "sample_use_retrieve_futures": False,
        "custom_loss_server_side": False,
    }


@router.post("/api/v1/client/dynamic_config")
async def dynamic_config():
    return {"refresh_interval_sec": 300, "sample_cancel_enabled": False}


@router.post("/api/v1/telemetry")
async def telemetry():
    return {"status": "accepted"}  # the SDK's telemetry is accepted and dropped


@router.get("/api/v1/get_server_capabilities")
async def capabilities(request: Request):
    names = server_of(request).backend.table.servable()  # not a model whose package is missing
    return {"supported_models": [{"model_name": name, "trainable": True, "sampleable": True} for name in names]}


@router.post("/api/v1/create_session")
async def create_session(request: Request):
    server = server_of(request)
    await body_json(request)
    return {"type": "create_session", "session_id": server.open_session(server.owner_of(request))}


@router.post("/api/v1/session_heartbeat")
async def heartbeat(request: Request):
    server, data = server_of(request), await body_json(request)
    session = server.sessions.get(data["session_id"])
    if session is None or session.finished:
        return _error(410, f"session_id: session {data['session_id']!r} is finished")
    server.session(data["session_id"], server.owner_of(request))
    return {"type": "session_heartbeat"}


@router.post("/api/v1/sessions/{session_id}/finish")
async def finish(session_id: str, request: Request):
    server = server_of(request)
    server.session(session_id, server.owner_of(request))
    server.close(session_id)
    return Response(status_code=200)


@router.post("/api/v1/retrieve_future")
async def retrieve_future(request: Request):
    data = await body_json(request)
    return await server_of(request).retrieve(str(data["request_id"]))


@router.post("/api/v1/cancel_future")
async def cancel_future():
    return Response(status_code=200)  # sampling requests are short; they run to the end


REFUSED_ROUTES = {
    "/api/v1/save_weights_external": "save_weights_external: not served; save_state writes safetensors "
    "under the server's --state-dir",
    "/api/v1/create_custom_loss": "create_custom_loss: server-side custom losses are not served; "
    "forward_backward_custom runs a callable loss on the client",
    "/api/v1/join_sampling_session": "join_sampling_session: not served",
    "/api/v1/retrieve_futures": "retrieve_futures: not served; poll retrieve_future",
    "/api/v1/copy_weights": "copy_weights: not served",
}
"""Endpoints of the SDK this server answers with a 400 and the reason."""


def _refusal(message: str):
    async def refuse():
        return _error(400, message)

    return refuse


for _route, _message in REFUSED_ROUTES.items():
    router.post(_route)(_refusal(_message))
