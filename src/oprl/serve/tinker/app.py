"""The HTTP side: the routes the Tinker SDK (0.38) calls, sessions, auth. The futures protocol, each model's
request order, the lanes that compute and batched sampling are ``futures.py``'s (``TinkerServer`` is a
``Futures``).

Sessions and isolation: a session belongs to the API key that created it; a request naming a model or sampler
of a session created under another key is refused (404, the same answer as an unknown id). Heartbeats keep a
session; one silent for ``session_timeout`` seconds, or finished, is closed and its models freed.

Errors a client can fix are HTTP 400 (413 for an oversized body) with ``{"detail": "<field>: <why>"}``; the
server keeps serving whatever a request holds.
"""

from __future__ import annotations

import hashlib
import ipaddress
import itertools
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from oprl.errors import OprlError
from oprl.serve.tinker import wire
from oprl.serve.tinker.backend import COMPUTE_LANE, Sampler, TinkerModels
from oprl.serve.tinker.errors import UserError
from oprl.serve.tinker.futures import BATCH_ROWS, PROTO, SAMPLE_WINDOW_S, Futures, _error
from oprl.serve.tinker.losses import LossError, loss_spec
from oprl.serve.tinker.sampling import check_sampling_params

JSON_RESULTS = ("create_model", "optim_step", "save_weights", "save_weights_for_sampler", "load_weights")


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
    ):
        super().__init__(backend, sample_window=sample_window, batch_rows=batch_rows, threads=threads)
        self.api_keys = set(api_keys)
        self.session_timeout = session_timeout
        self.max_body = max_body
        self.sessions: dict[str, ClientSession] = {}
        self.sampled: dict[tuple[str, int], str] = {}
        self.counters: dict[str, itertools.count] = {}

    # ---- sessions ------------------------------------------------------------------------------------------

    def owner_of(self, request: Request) -> str:
        """The caller's identity: a digest of its API key (sessions and their models belong to it)."""
        key = request.headers.get("x-api-key", "")
        return hashlib.sha256(key.encode()).hexdigest()[:16]

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

    def next_id(self, scope: str) -> int:
        return next(self.counters.setdefault(scope, itertools.count()))


class NotFound(LookupError):
    """An id this caller may not see (unknown, or another key's): HTTP 404 naming the field."""


def _json(data: dict[str, Any]) -> tuple[bytes, str]:
    return json.dumps(data).encode(), "application/json"


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def create_app(server: TinkerServer) -> FastAPI:
    """The FastAPI application speaking the Tinker API over ``server``."""
    app = FastAPI(title="oprl Tinker-compatible server")
    app.state.server = server

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

    async def body_json(request: Request) -> dict[str, Any]:
        raw = await request.body()
        if len(raw) > server.max_body:
            raise UserError(f"body: {len(raw)} bytes exceed the server's limit of {server.max_body}")
        data = json.loads(raw or b"{}")
        if not isinstance(data, dict):
            raise UserError("body: a JSON object expected")
        return data

    def future(request_id: str, **extra: Any) -> JSONResponse:
        return JSONResponse({"request_id": request_id, **extra})

    # ---- service -------------------------------------------------------------------------------------------

    @app.get("/api/v1/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.post("/api/v1/client/config")
    async def client_config():
        # Plain API keys (no JWT exchange), uncompressed protobuf forward_backward bodies (zstd is accepted
        # too), per-request polling, custom losses on the client.
        return {"pjwt_auth_enabled": False, "proto_compress_fwdbwd": False, "sample_use_retrieve_futures": False}

    @app.post("/api/v1/client/dynamic_config")
    async def dynamic_config():
        return {"refresh_interval_sec": 300, "sample_cancel_enabled": False}

    @app.post("/api/v1/telemetry")
    async def telemetry():
        return {"status": "accepted"}  # the SDK's telemetry is accepted and dropped

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities():
        models = [{"model_name": name, "trainable": True, "sampleable": True} for name in server.backend.table.entries]
        return {"supported_models": models}

    @app.post("/api/v1/create_session")
    async def create_session(request: Request):
        await body_json(request)
        server.expire()
        session_id = f"session-{uuid.uuid4().hex[:12]}"
        server.sessions[session_id] = ClientSession(server.owner_of(request), time.monotonic())
        return {"type": "create_session", "session_id": session_id}

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat(request: Request):
        data = await body_json(request)
        session = server.sessions.get(data["session_id"])
        if session is None or session.finished:
            return _error(410, f"session_id: session {data['session_id']!r} is finished")
        server.session(data["session_id"], server.owner_of(request))
        return {"type": "session_heartbeat"}

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish(session_id: str, request: Request):
        server.session(session_id, server.owner_of(request))
        server.close(session_id)
        return Response(status_code=200)

    # ---- training ------------------------------------------------------------------------------------------

    @app.post("/api/v1/create_model")
    async def create_model(request: Request):
        data = await body_json(request)
        owner = server.owner_of(request)
        session_id = data["session_id"]
        server.session(session_id, owner)
        model_id = f"{session_id}:train:{data['model_seq_id']}"
        base, lora = data["base_model"], data.get("lora_config") or {"rank": 32}
        server.backend.table.check(base)
        optimizer = (data.get("optimizer_config") or {}).get("type", "adamw")
        if optimizer != "adamw":
            raise UserError(f"optimizer_config.type: {optimizer!r} is not served; only adamw")

        def work():
            if model_id not in server.backend.policies:  # a retried create_model finds it made
                server.backend.create_policy(model_id, session_id, base, lora)
            return _json({"type": "create_model", "model_id": model_id})

        return future(server.submit(work, (model_id, 0)), model_id=model_id)

    @app.post("/api/v1/get_info")
    async def get_info(request: Request):
        data = await body_json(request)
        return server.backend.info(server.policy(data["model_id"], server.owner_of(request)))

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request):
        raw = await request.body()
        if len(raw) > server.max_body:
            raise UserError(f"body: {len(raw)} bytes exceed the server's limit of {server.max_body}")
        if request.headers.get("content-encoding") == "zstd":
            import zstandard

            raw = zstandard.ZstdDecompressor().decompress(raw, max_output_size=server.max_body)
        decoded = wire.decode_forward_backward(raw)
        policy = server.policy(decoded.model_id, server.owner_of(request))
        spec = loss_spec(decoded.loss_fn, decoded.config)
        if not decoded.data:
            raise UserError("data: empty")

        def work():
            return wire.encode_forward_backward_output(server.backend.forward_backward(policy, decoded, spec)), PROTO

        return future(server.submit(work, (decoded.model_id, decoded.seq_id)), model_id=decoded.model_id)

    @app.post("/api/v1/optim_step")
    async def optim_step(request: Request):
        data = await body_json(request)
        policy = server.policy(data["model_id"], server.owner_of(request))
        params = data.get("adam_params")
        if params is None:
            raise UserError("optimizer_params: only AdamParams are served (the model's optimizer is adamw)")

        def work():
            return _json(server.backend.optim_step(policy, params))

        return future(server.submit(work, (policy.model_id, int(data["seq_id"]))), model_id=policy.model_id)

    @app.post("/api/v1/save_weights")
    async def save_weights(request: Request):
        data = await body_json(request)
        policy = server.policy(data["model_id"], server.owner_of(request))

        def work():
            path = server.backend.save(policy, "weights", str(data.get("path") or ""), optimizer=True)
            return _json({"type": "save_weights", "path": path})

        return future(server.submit(work, (policy.model_id, int(data["seq_id"]))), model_id=policy.model_id)

    @app.post("/api/v1/save_weights_for_sampler")
    async def save_weights_for_sampler(request: Request):
        data = await body_json(request)
        owner = server.owner_of(request)
        policy = server.policy(data["model_id"], owner)
        if data.get("kind", "snapshot") != "snapshot":
            raise UserError(f"kind: {data['kind']!r} is not served; only snapshot sampling clients")
        name = data.get("path")
        sampler_id = f"{policy.owner}:sample:{uuid.uuid4().hex[:8]}"

        def work():
            if name:  # a named sampler checkpoint on disk
                path = server.backend.save(policy, "sampler_weights", str(name), optimizer=False)
                return _json({"type": "save_weights_for_sampler", "path": path})
            server.backend.snapshot_sampler(policy, sampler_id)
            return _json({"type": "save_weights_for_sampler", "sampling_session_id": sampler_id})

        return future(server.submit(work, (policy.model_id, int(data["seq_id"]))), model_id=policy.model_id)

    @app.post("/api/v1/load_weights")
    async def load_weights(request: Request):
        data = await body_json(request)
        owner = server.owner_of(request)
        path, optimizer = str(data["path"]), bool(data.get("optimizer", False))
        server.backend.checkpoint(path)  # a bad path is a 400 now
        if data.get("session_id") is not None:  # create a training model from the checkpoint
            session_id = data["session_id"]
            server.session(session_id, owner)
            model_id = f"{session_id}:train:{data['model_seq_id']}"
            base = data.get("base_model")

            def create():
                if model_id not in server.backend.policies:
                    server.backend.create_from_checkpoint(model_id, session_id, path, optimizer, base)
                return _json({"type": "load_weights", "path": path, "model_id": model_id})

            return future(server.submit(create, (model_id, 0)), model_id=model_id)
        policy = server.policy(data["model_id"], owner)

        def load():
            server.backend.load(policy, path, optimizer)
            return _json({"type": "load_weights", "path": path, "model_id": policy.model_id})

        return future(server.submit(load, (policy.model_id, int(data["seq_id"]))), model_id=policy.model_id)

    # ---- sampling ------------------------------------------------------------------------------------------

    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request):
        data = await body_json(request)
        session_id = data["session_id"]
        server.session(session_id, server.owner_of(request))
        sampler_id = f"{session_id}:sample:{data['sampling_session_seq_id']}"
        if data.get("model_path"):
            server.backend.path_sampler(sampler_id, session_id, data["model_path"])
        elif data.get("base_model"):
            server.backend.base_sampler(sampler_id, session_id, data["base_model"])
        else:
            raise UserError("model_path: give a model_path or a base_model")
        return {"type": "create_sampling_session", "sampling_session_id": sampler_id}

    @app.get("/api/v1/samplers/{sampler_id}")
    async def get_sampler(sampler_id: str, request: Request):
        sampler = server.sampler(sampler_id, server.owner_of(request))
        return {"sampler_id": sampler_id, "base_model": sampler.base_model, "model_path": sampler.model_path}

    @app.post("/api/v1/asample")
    async def asample(request: Request):
        data = await body_json(request)
        owner = server.owner_of(request)
        if data.get("sampling_session_id") is None:
            raise UserError("sampling_session_id: required (create a sampling client first)")
        sampler = server.sampler(data["sampling_session_id"], owner)
        check_sampling_params(data.get("sampling_params") or {})
        for name in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k"):
            if data.get(name):
                raise UserError(f"{name}: not served (only the sampled tokens' and the prompt's own log-probs)")
        if data.get("target_prompt_logprobs") is not None:
            raise UserError("target_prompt_logprobs: not served")
        n = int(data.get("num_samples", 1))
        key = (sampler.sampler_id, int(data.get("seq_id") or server.next_id(sampler.sampler_id)))
        if key in server.sampled:  # a retried sample
            request_id = server.sampled[key]
        else:
            request_id = server.sampled[key] = server.submit_sample(sampler, data)
        return future(request_id, sample_sequence_ids=[f"{request_id}:{i}" for i in range(n)])

    @app.post("/api/v1/retrieve_future")
    async def retrieve_future(request: Request):
        data = await body_json(request)
        return await server.retrieve(str(data["request_id"]))

    @app.post("/api/v1/cancel_future")
    async def cancel_future():
        return Response(status_code=200)  # sampling requests are short; they run to the end

    # ---- refused, with the reason ---------------------------------------------------------------------------

    refusals = {
        "/api/v1/save_weights_external": "save_weights_external: not served; save_state writes safetensors "
        "under the server's --state-dir",
        "/api/v1/create_custom_loss": "create_custom_loss: server-side custom losses are not served; "
        "forward_backward_custom runs a callable loss on the client",
        "/api/v1/join_sampling_session": "join_sampling_session: not served",
        "/api/v1/retrieve_futures": "retrieve_futures: not served; poll retrieve_future",
        "/api/v1/copy_weights": "copy_weights: not served",
    }
    for route, message in refusals.items():

        async def refuse(message: str = message):
            return _error(400, message)

        app.post(route)(refuse)
    return app
