"""The HTTP side: the routes the Tinker SDK (0.38) calls, the futures protocol, sessions, auth.

Futures: every call that computes (create_model, forward_backward, optim_step, save/load, asample) answers at
once with ``{"request_id": ...}``; the SDK then polls ``/api/v1/retrieve_future`` with it. The server holds each
poll up to ``POLL_S`` seconds and answers the result (protobuf for ``ForwardBackwardOutput`` and
``SampleResponse``, JSON otherwise), ``{"type": "try_again", ...}`` while it is still running, or ``{"error":
..., "category": "user" | "server"}`` when it failed (the SDK raises ``RequestFailedError`` with it).

Order and retries: the requests of one training model carry ``seq_id`` 1, 2, ... and run in that order on the
model's lane, whatever order they arrive in (the SDK sends the chunks of one forward_backward in
parallel); a request whose ``(model_id, seq_id)`` (or ``(sampling_session_id, seq_id)``) was seen before gets
the first one's ``request_id``, so a retried POST never computes twice.

Batched sampling: sample requests of one sampling client wait in a queue; the first to arrive schedules, after
``sample_window`` seconds, one job on the sampler's lane that takes every request queued by the time it runs (up to
``batch_rows`` sampled rows) and answers them from one engine call (``TinkerModels.sample``). tinker-cookbook sends
a batch's prompts (or a group's members) as separate requests at once; one at a time, each paid a prefill and a
decode loop of its own. What a request gets does not depend on its batch (``sampling.py``).

Sessions and isolation: a session belongs to the API key that created it; a request naming a model or sampler
of a session created under another key is refused (404, the same answer as an unknown id). Heartbeats keep a
session; one silent for ``session_timeout`` seconds, or finished, is closed and its models freed.

Errors a client can fix are HTTP 400 (413 for an oversized body) with ``{"detail": "<field>: <why>"}``; the
server keeps serving whatever a request holds.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import itertools
import json
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from oprl.errors import OprlError
from oprl.serve.tinker import wire
from oprl.serve.tinker.backend import COMPUTE_LANE, Sampler, TinkerModels
from oprl.serve.tinker.errors import UserError
from oprl.serve.tinker.losses import LossError, loss_spec
from oprl.serve.tinker.sampling import check_sampling_params

POLL_S = 10.0
"""How long one ``retrieve_future`` waits for its result before answering try_again (the SDK's timeout is 45 s)."""
SAMPLE_WINDOW_S = 0.01
"""How long the first queued sample request of a sampler waits for others before its batch is scheduled: the SDK's
concurrent requests arrive within milliseconds, one engine call takes tens of them at least."""
BATCH_ROWS = 256
"""Most sampled rows (sum of ``num_samples``) one engine call takes; the rest wait for the next (bounds memory)."""
MAX_RESULTS = 4096
"""Finished results kept for (re)retrieval, oldest dropped first: bounds memory over a long session."""
PROTO = "application/x-protobuf"
JSON_RESULTS = ("create_model", "optim_step", "save_weights", "save_weights_for_sampler", "load_weights")


@dataclass
class Result:
    """One request's outcome: ``body`` + ``media`` on success, ``error`` + ``category`` on failure."""

    done: asyncio.Event = field(default_factory=asyncio.Event)
    body: bytes | None = None
    media: str = "application/json"
    error: str | None = None
    category: str = "server"


@dataclass
class Ordered:
    """The numbered requests of one training model: the next ``seq_id`` to run and those waiting for it."""

    next_seq: int = 0
    """Creation (create_model, or load_weights creating the model) is seq 0; the SDK numbers the rest from 1."""
    seen: OrderedDict[int, str] = field(default_factory=OrderedDict)
    waiting: dict[int, Callable[[], None]] = field(default_factory=dict)


@dataclass
class ClientSession:
    owner: str
    last_seen: float
    finished: bool = False


class TinkerServer:
    """State shared by the routes: sessions, results, per-model order, and the lanes that compute.

    A lane is one thread running the requests of the models of one home (``backend.home_of``) in the order they
    were released: every model while they live in this process (one compute thread: on a CPU no two jobs share
    the cores), one lane per worker when they are placed (``placement.py``)."""

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
        self.backend = backend
        self.sample_window = sample_window
        self.batch_rows = batch_rows
        self.queued: dict[str, list[tuple[dict[str, Any], Result]]] = {}  # sampler id -> requests waiting
        self.queue_lock = threading.Lock()  # the routes append, a lane takes
        self.api_keys = set(api_keys)
        self.session_timeout = session_timeout
        self.max_body = max_body
        self.sessions: dict[str, ClientSession] = {}
        self.results: OrderedDict[str, Result] = OrderedDict()
        self.order: dict[str, Ordered] = {}
        self.sampled: dict[tuple[str, int], str] = {}
        self.counters: dict[str, itertools.count] = {}
        self.threads = threads
        """torch intra-op threads of each lane (None: torch's default). Set in the lane's own thread: OpenMP's
        thread count is per calling thread, and on a loaded machine fewer threads can be much faster (a region
        waits for its slowest thread, which the OS may have descheduled)."""
        self.lanes: dict[str, ThreadPoolExecutor] = {}  # home (backend.home_of) -> its one thread
        self.lanes_lock = threading.Lock()

    # ---- futures -------------------------------------------------------------------------------------------

    def submit(self, work: Callable[[], tuple[bytes, str]], key: tuple[str, int] | None = None) -> str:
        """Run ``work`` on its lane now (or, with ``key`` = (model_id, seq_id), once every earlier
        request of that model ran); returns the request id. A key seen before returns its first request id."""
        if key is not None:
            ordered = self.order.setdefault(key[0], Ordered())
            if key[1] in ordered.seen:
                return ordered.seen[key[1]]
            if key[1] < ordered.next_seq:
                older = f"{key[1]} of model {key[0]} is older than the next expected ({ordered.next_seq})"
                raise UserError(f"seq_id: {older}")
        request_id = uuid.uuid4().hex
        result = self.results[request_id] = Result()
        loop = asyncio.get_running_loop()

        def run() -> None:
            try:
                body, media = work()
                outcome = {"body": body, "media": media}
            except Exception as exc:  # the request fails (a bug too), the server keeps serving
                outcome = _failure(exc)
            loop.call_soon_threadsafe(self._finish, result, outcome)

        if key is None:
            self.lane(COMPUTE_LANE).submit(run)
        else:
            ordered = self.order[key[0]]
            ordered.seen[key[1]] = request_id
            while len(ordered.seen) > MAX_RESULTS:
                ordered.seen.popitem(last=False)
            ordered.waiting[key[1]] = run
            while ordered.next_seq in ordered.waiting:  # release this one and any that waited for it
                self.lane(self.backend.home_of(key[0])).submit(ordered.waiting.pop(ordered.next_seq))
                ordered.next_seq += 1
        self._trim()
        return request_id

    def submit_sample(self, sampler: Sampler, request: dict[str, Any]) -> str:
        """Queue a sample request for its sampler's next batch (module docstring); returns the request id."""
        request_id = uuid.uuid4().hex
        result = self.results[request_id] = Result()
        loop = asyncio.get_running_loop()
        with self.queue_lock:
            first = sampler.sampler_id not in self.queued  # no batch of this sampler is scheduled yet
            self.queued.setdefault(sampler.sampler_id, []).append((request, result))
        if first:
            lane = self.lane(self.backend.home_of(sampler.sampler_id))
            loop.call_later(self.sample_window, lambda: lane.submit(self._sample_batch, sampler, loop))
        self._trim()
        return request_id

    def _sample_batch(self, sampler: Sampler, loop: asyncio.AbstractEventLoop) -> None:
        """On the sampler's lane: take the sampler's queued requests (up to ``batch_rows`` rows), answer them from
        one engine call; what is left is the next batch, scheduled at once."""
        with self.queue_lock:
            queue = self.queued[sampler.sampler_id]
            taken, rows = [], 0
            while queue and (not taken or rows + _rows(queue[0][0]) <= self.batch_rows):
                rows += _rows(queue[0][0])
                taken.append(queue.pop(0))
            if queue:
                self.lane(self.backend.home_of(sampler.sampler_id)).submit(self._sample_batch, sampler, loop)
            else:
                del self.queued[sampler.sampler_id]  # the next request schedules a new batch
        try:
            outcomes = self.backend.sample(sampler, [request for request, _ in taken])
            finished = [
                _failure(o) if isinstance(o, Exception) else {"body": o, "media": PROTO} for o in outcomes
            ]  # fmt: skip
        except Exception as exc:  # the whole call failed (the sampler's model closed, a bug): each request says so
            finished = [_failure(exc)] * len(taken)
        for (_, result), outcome in zip(taken, finished, strict=True):
            loop.call_soon_threadsafe(self._finish, result, outcome)

    def _finish(self, result: Result, outcome: dict[str, Any]) -> None:
        for name, value in outcome.items():
            setattr(result, name, value)
        result.done.set()

    def _trim(self) -> None:
        finished = [rid for rid, r in self.results.items() if r.done.is_set()]
        for rid in finished[: max(0, len(self.results) - MAX_RESULTS)]:
            del self.results[rid]

    async def retrieve(self, request_id: str) -> Response:
        result = self.results.get(request_id)
        if result is None:
            return _error(404, f"request_id: unknown or expired request {request_id!r}")
        try:
            await asyncio.wait_for(result.done.wait(), POLL_S)
        except asyncio.TimeoutError:
            return JSONResponse({"type": "try_again", "request_id": request_id, "queue_state": "active"})
        if result.error is not None:
            return JSONResponse({"error": result.error, "category": result.category})
        return Response(result.body, media_type=result.media)

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

    def lane(self, home: str) -> ThreadPoolExecutor:
        """The one thread that runs the requests of ``home``'s models, in the order they were released: every
        model while they live in this process (``COMPUTE_LANE``), one per worker when they are placed, so that
        models on different workers compute at once while each one's requests keep their order."""
        with self.lanes_lock:
            lane = self.lanes.get(home)
            if lane is None:
                lane = self.lanes[home] = ThreadPoolExecutor(
                    max_workers=1,
                    thread_name_prefix="oprl-tinker-lane",
                    initializer=_set_threads,
                    initargs=(self.threads,),
                )
            return lane

    def next_id(self, scope: str) -> int:
        return next(self.counters.setdefault(scope, itertools.count()))


class NotFound(LookupError):
    """An id this caller may not see (unknown, or another key's): HTTP 404 naming the field."""


def _set_threads(threads: int | None) -> None:
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def _failure(exc: Exception) -> dict[str, str]:
    """A failed request's outcome: the client's to fix (``user``) or the server's (a bug, ``server``)."""
    if isinstance(exc, UserError | LossError | wire.WireError | OprlError):
        return {"error": str(exc), "category": "user"}
    return {"error": f"internal error: {type(exc).__name__}: {exc}", "category": "server"}


def _rows(request: dict[str, Any]) -> int:
    """Rows a sample request adds to a batch (its num_samples, checked later; a bad value counts as one)."""
    try:
        return max(1, int(request.get("num_samples", 1)))
    except (TypeError, ValueError):
        return 1


def _error(status: int, detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status)


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
            return server.backend.forward_backward(policy, decoded, spec), PROTO

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
