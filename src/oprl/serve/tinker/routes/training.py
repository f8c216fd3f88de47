"""The training models' routes: create (fresh, or from a checkpoint), info, forward_backward, optim_step, save and
load. Each request that computes carries the model's ``seq_id`` and runs in that order (``futures.py``): a route
reads it with ``common.ordered`` and makes its arrival checks inside ``call.checks()``, so a refused request (a
400) still takes its turn and the client's next call answers."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Request

from oprl.serve.tinker import wire
from oprl.serve.tinker.errors import UserError
from oprl.serve.tinker.futures import PROTO
from oprl.serve.tinker.losses import loss_spec
from oprl.serve.tinker.routes.common import as_json, body_bytes, body_json, future, ordered, ordered_call, server_of

router = APIRouter()


@router.post("/api/v1/create_model")
async def create_model(request: Request):
    server, data = server_of(request), await body_json(request)
    session_id = data["session_id"]
    server.session(session_id, server.owner_of(request))
    model_id = f"{session_id}:train:{data['model_seq_id']}"
    base, lora = data["base_model"], data.get("lora_config") or {"rank": 32}
    server.backend.table.check(base)
    optimizer = (data.get("optimizer_config") or {}).get("type", "adamw")
    if optimizer != "adamw":
        raise UserError(f"optimizer_config.type: {optimizer!r} is not served; only adamw")

    def work():
        if model_id not in server.backend.policies:  # a retried create_model finds it made
            server.backend.create_policy(model_id, session_id, base, lora)
        return as_json({"type": "create_model", "model_id": model_id})

    return future(server.submit(work, (model_id, 0)), model_id=model_id)


@router.post("/api/v1/get_info")
async def get_info(request: Request):
    server, data = server_of(request), await body_json(request)
    return server.backend.info(server.policy(data["model_id"], server.owner_of(request)))


@router.post("/api/v1/forward_backward")
async def forward_backward(request: Request):
    server, raw = server_of(request), await body_bytes(request)
    if request.headers.get("content-encoding") == "zstd":
        import zstandard

        raw = zstandard.ZstdDecompressor().decompress(raw, max_output_size=server.max_body)
    decoded = wire.decode_forward_backward(raw)
    call = ordered_call(request, decoded.model_id, decoded.seq_id)
    with call.checks():
        spec = loss_spec(decoded.loss_fn, decoded.config, server.stable_reinforce)
        if not decoded.data:
            raise UserError("data: empty")

    def work():
        return wire.encode_forward_backward_output(server.backend.forward_backward(call.policy, decoded, spec)), PROTO

    return call.submit(work)


@router.post("/api/v1/optim_step")
async def optim_step(request: Request):
    call = await ordered(request)
    with call.checks():
        params = call.data.get("adam_params")
        if params is None:
            raise UserError("optimizer_params: only AdamParams are served (the model's optimizer is adamw)")

    def work():
        return as_json(call.server.backend.optim_step(call.policy, params))

    return call.submit(work)


@router.post("/api/v1/save_weights")
async def save_weights(request: Request):
    call = await ordered(request)
    name = str(call.data.get("path") or "")
    overwrite = bool(call.data.get("overwrite", False))  # the SDK's SaveWeightsRequest default

    def work():
        path = call.server.backend.save(call.policy, "weights", name, optimizer=True, overwrite=overwrite)
        return as_json({"type": "save_weights", "path": path})

    return call.submit(work)


@router.post("/api/v1/save_weights_for_sampler")
async def save_weights_for_sampler(request: Request):
    call = await ordered(request)
    server, policy = call.server, call.policy
    kind, name = call.data.get("kind", "snapshot"), call.data.get("path")
    with call.checks():
        if kind not in ("snapshot", "inflight"):
            raise UserError(f"kind: {kind!r} is not a sampling client kind (snapshot, inflight)")
        if kind == "inflight" and not server.backend.serves_inflight:
            raise UserError("kind: 'inflight' sampling clients are served without --workers only (docs/tinker.md)")
        if kind == "inflight" and name:
            raise UserError("path: an in-flight save publishes weights for sampling, it writes no checkpoint")
    sampler_id = f"{policy.owner}:sample:{uuid.uuid4().hex[:8]}"

    def work():
        if kind == "inflight":  # the model's shared in-flight weights, published anew
            server.backend.inflight_sampler(policy, sampler_id)
            return as_json({"type": "save_weights_for_sampler", "sampling_session_id": sampler_id})
        if name:  # a named sampler checkpoint on disk
            path = server.backend.save(policy, "sampler_weights", str(name), optimizer=False)
            return as_json({"type": "save_weights_for_sampler", "path": path})
        server.backend.snapshot_sampler(policy, sampler_id)
        return as_json({"type": "save_weights_for_sampler", "sampling_session_id": sampler_id})

    return call.submit(work)


@router.post("/api/v1/load_weights")
async def load_weights(request: Request):
    """Weights (and the optimizer) from a checkpoint: into a new training model when the body names a session
    (``create_training_client_from_state``), else into the named model (``load_state``)."""
    server, data = server_of(request), await body_json(request)
    path, optimizer = str(data["path"]), bool(data.get("optimizer", False))
    if data.get("session_id") is not None:
        return _create_from_checkpoint(request, data, path, optimizer)
    call = ordered_call(request, data["model_id"], data["seq_id"], data)
    with call.checks():
        server.backend.checkpoint(path)  # a bad path is a 400 now

    def load():
        server.backend.load(call.policy, path, optimizer)
        return as_json({"type": "load_weights", "path": path, "model_id": call.policy.model_id})

    return call.submit(load)


def _create_from_checkpoint(request: Request, data: dict[str, Any], path: str, optimizer: bool):
    server = server_of(request)
    server.backend.checkpoint(path)  # a bad path is a 400 now
    session_id = data["session_id"]
    server.session(session_id, server.owner_of(request))
    model_id = f"{session_id}:train:{data['model_seq_id']}"
    base = data.get("base_model")

    def create():
        if model_id not in server.backend.policies:
            server.backend.create_from_checkpoint(model_id, session_id, path, optimizer, base)
        return as_json({"type": "load_weights", "path": path, "model_id": model_id})

    return future(server.submit(create, (model_id, 0)), model_id=model_id)
