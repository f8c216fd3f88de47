"""The explorer's OpenAI-compatible endpoint: ``/v1/chat/completions`` and ``/v1/completions`` over HTTP on
127.0.0.1, served by the explorer's own engine at the current policy version.

FastAPI + uvicorn, because vLLM's own OpenAI server is built on them (installed with every vLLM extra), and
their pydantic request models are the configuration's validation style; the server runs in a daemon thread
of the explorer's process on a socket bound here (so a port in use is one ``OprlError`` line).

Every agent run is a **session**: the explorer opens it, hands the agent a client whose base URL is
``http://127.0.0.1:PORT/s/SESSION/v1``, and closes it when the agent returns, fails or times out. Requests
need ``Authorization: Bearer TOKEN`` (a random token per endpoint; 401 otherwise). A request body that is not
JSON or not a valid request is a 400 with the reason; so is an unsupported option:

- honoured: ``messages`` / ``prompt`` (text or token ids), ``tools`` (rendered by the chat template, replies'
  ``<tool_call>{json}</tool_call>`` blocks returned as ``tool_calls``), ``n``, ``max_tokens`` /
  ``max_completion_tokens`` up to ``rollout.max_new_tokens`` (the reply is cut there, which is what sampling
  with that limit gives), ``temperature`` / ``top_p`` equal to what the explorer samples with (the trainer
  scores at ``rollout.temperature``; another value would make the behaviour log-probs wrong), ``seed`` (ignored:
  seeds are the run's, see ``oprl.explorer.agents``);
- refused: ``stream=true``, ``stop``, ``logprobs``, other temperatures, more tokens than the engine samples.

Requests wait in ``Endpoint.pending`` until ``take`` hands them to the explorer thread as one engine call
(``oprl.explorer.agents``); the reply comes back through a future. Token bookkeeping is
``oprl.explorer.sessions``.
"""

import asyncio
import concurrent.futures
import json
import secrets
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from oprl.errors import OprlError
from oprl.explorer.sessions import Choice, RequestRefused, Session
from oprl.tasks.toolcall import OPEN, parse_calls


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = "policy"
    n: int = Field(1, ge=1, le=64)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    stop: str | list[str] | None = None
    logprobs: bool | int | None = None
    seed: int | None = None


class ChatRequest(_Request):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    max_completion_tokens: int | None = Field(None, ge=1)


class CompletionRequest(_Request):
    prompt: str | list[int]


@dataclass
class Pending:
    """A request waiting for the engine: its session, its token context, and where the replies go."""

    session: Session
    context: list[int]
    n: int
    max_tokens: int
    with_tools: bool = False
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    since: float = field(default_factory=time.monotonic)


@dataclass
class Sampling:
    """What the explorer samples with during one batch (requests are checked against it)."""

    temperature: float
    top_p: float
    max_new_tokens: int


class Endpoint:
    """The HTTP server and its sessions (see the module docstring). ``host``/``port``: where it listens (port
    0 = any free one); ``batch_wait_s``: how long ``take`` waits for the other running agents' requests."""

    def __init__(self, tokenizer, *, host: str = "127.0.0.1", port: int = 0, batch_wait_s: float = 0.05):
        import uvicorn

        self.tokenizer = tokenizer
        self.token = secrets.token_urlsafe(24)
        self.batch_wait_s = batch_wait_s
        self.sessions: dict[str, Session] = {}
        self.pending: list[Pending] = []
        self.sampling = Sampling(1.0, 1.0, 16)
        self.counts: Counter[str] = Counter()
        """Requests served, refused (by reason), and engine calls: ``oprl.explorer.agents`` logs them."""
        self.client: Any = None
        """The agents' shared ``openai.OpenAI`` (``oprl.explorer.agents``), built on first use."""
        self.lock = threading.Condition()
        """Guards sessions and the pending list; notified when a request arrives or a session closes."""
        sock = bind(host, port)
        self.host, self.port = host, sock.getsockname()[1]
        config = uvicorn.Config(_app(self), log_level="error", access_log=False, lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and self.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self.server.started:
            raise OprlError(f"task: the agent endpoint on {host}:{self.port} did not start")

    def base_url(self, session_id: str) -> str:
        return f"http://{self.host}:{self.port}/s/{session_id}/v1"

    def open(self, session: Session) -> str:
        session_id = secrets.token_hex(8)
        with self.lock:
            self.sessions[session_id] = session
        return session_id

    def close(self, session_id: str, reason: str = "the episode is over") -> Session:
        """End a session: its waiting requests fail (408) and later ones get 404."""
        with self.lock:
            session = self.sessions.pop(session_id)
            for request in [p for p in self.pending if p.session is session]:
                self.pending.remove(request)
                request.future.set_exception(RequestRefused(408, f"session closed: {reason}"))
            self.lock.notify_all()
        return session

    def take(self, running: int, timeout: float = 0.05) -> list[Pending]:
        """The requests for the next engine call: all waiting ones, once ``running`` sessions have a request
        waiting (every running agent asked) or the oldest waited ``batch_wait_s``; [] after ``timeout`` or
        when woken otherwise (an agent finished: the caller counts the running ones again)."""
        with self.lock:
            for _ in range(2):  # check, wait once (a request, a finished agent, a deadline), check again
                now = time.monotonic()
                waiting = len({id(p.session) for p in self.pending})
                if self.pending and (waiting >= running or now - self.pending[0].since >= self.batch_wait_s):
                    batch, self.pending = self.pending, []
                    return batch
                if not self.pending:
                    self.lock.wait(timeout)
                else:
                    self.lock.wait(max(min(timeout, self.pending[0].since + self.batch_wait_s - now), 0.0))
            return []

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)

    # -- request handling (uvicorn's thread) -------------------------------------------------------------------
    def submit(self, session_id: str, kind: str, body: _Request) -> Pending:
        """Check ``body`` against the engine, extend the session's history, queue the request."""
        limit = self.sampling.max_new_tokens
        for name, value, served in (
            ("temperature", body.temperature, self.sampling.temperature),
            ("top_p", body.top_p, self.sampling.top_p),
        ):
            if value is not None and abs(value - served) > 1e-6:
                raise RequestRefused(400, f"{name}={value}: this endpoint samples at {name}={served} (the run's)")
        if body.stream:
            raise RequestRefused(400, "stream=true is not supported: the endpoint answers whole replies")
        if body.stop:
            raise RequestRefused(400, "stop is not supported: replies end at the model's end-of-turn token")
        if body.logprobs:
            raise RequestRefused(400, "logprobs are not returned: the explorer records them itself")
        max_tokens = getattr(body, "max_completion_tokens", None) or body.max_tokens or limit
        if max_tokens > limit:
            raise RequestRefused(
                400,
                f"max_tokens={max_tokens} exceeds what the engine samples per turn (rollout.max_new_tokens={limit})",
            )
        with self.lock:
            session = self.sessions.get(session_id)
            if session is None:
                raise RequestRefused(404, f"no open session {session_id!r} (finished, timed out, or never opened)")
            try:
                if isinstance(body, ChatRequest):
                    context = session.chat_context(body.messages, list(body.tools or []))
                else:
                    assert isinstance(body, CompletionRequest)
                    context = session.completion_context(body.prompt)
            except RequestRefused:
                session.refused += 1
                raise
            tools = isinstance(body, ChatRequest) and bool(body.tools)
            pending = Pending(session, context, body.n, max_tokens, with_tools=tools)
            self.pending.append(pending)
            self.lock.notify_all()
        return pending


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``, or one OprlError line saying why not."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        raise OprlError(f"task.port: the agent endpoint cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def reply_message(choice: Choice, with_tools: bool) -> dict:
    """The assistant message of a reply: ``<tool_call>`` blocks as ``tool_calls`` when the request had tools."""
    calls = parse_calls(choice.text) if with_tools else None
    if not calls:
        return {"role": "assistant", "content": choice.text}
    content = choice.text.split(OPEN, 1)[0].strip() or None
    tool_calls = [
        {
            "id": f"call_{k}",
            "type": "function",
            "function": {"name": c["name"], "arguments": _json(c["arguments"])},
        }
        for k, c in enumerate(calls)
    ]
    return {"role": "assistant", "content": content, "tool_calls": tool_calls}


def _json(value) -> str:
    return json.dumps(value)


def _finish(choice: Choice, message: dict | None) -> Literal["stop", "length", "tool_calls"]:
    if not choice.ended:
        return "length"
    return "tool_calls" if message is not None and message.get("tool_calls") else "stop"


def _app(endpoint: "Endpoint"):  # no __future__ annotations here: FastAPI reads the handlers' types
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    app = FastAPI(title="oprl explorer endpoint", docs_url=None, redoc_url=None, openapi_url=None)

    def error(status: int, message: str) -> JSONResponse:
        kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error"}
        body = {"error": {"message": message, "type": kind.get(status, "server_error"), "code": status}}
        return JSONResponse(body, status_code=status)

    async def handle(request: Request, session_id: str, model: type[_Request]) -> JSONResponse:
        if request.headers.get("authorization") != f"Bearer {endpoint.token}":
            endpoint.counts["refused/unauthorized"] += 1
            return error(401, "missing or wrong API key: use the token the explorer handed the agent")
        try:
            body = model.model_validate(await request.json())
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            endpoint.counts["refused/malformed"] += 1
            return error(400, f"{where}: {first['msg']}")
        except ValueError:
            endpoint.counts["refused/malformed"] += 1
            return error(400, "the request body is not JSON")
        try:
            pending = endpoint.submit(session_id, model.__name__, body)
            choices = await asyncio.wrap_future(pending.future)
        except RequestRefused as exc:
            endpoint.counts["refused/" + ("budget" if "episode over" in exc.message else "request")] += 1
            return error(exc.status, exc.message)
        endpoint.counts["served"] += 1
        return JSONResponse(_response(body, choices))

    @app.post("/s/{session_id}/v1/chat/completions")
    async def chat(session_id: str, request: Request):
        return await handle(request, session_id, ChatRequest)

    @app.post("/s/{session_id}/v1/completions")
    async def completions(session_id: str, request: Request):
        return await handle(request, session_id, CompletionRequest)

    @app.get("/s/{session_id}/v1/models")
    async def models(session_id: str, request: Request):
        if request.headers.get("authorization") != f"Bearer {endpoint.token}":
            return error(401, "missing or wrong API key: use the token the explorer handed the agent")
        return JSONResponse({"object": "list", "data": [{"id": "policy", "object": "model", "owned_by": "oprl"}]})

    return app


def _response(body: _Request, choices: list[Choice]) -> dict:
    prompt_tokens = choices[0].prompt_tokens if choices else 0
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": sum(len(c.ids) for c in choices),
        "total_tokens": prompt_tokens + sum(len(c.ids) for c in choices),
    }
    common = {"id": f"oprl-{secrets.token_hex(6)}", "created": int(time.time()), "model": body.model, "usage": usage}
    if isinstance(body, ChatRequest):
        return common | {
            "object": "chat.completion",
            "choices": [
                {"index": i, "message": c.message, "finish_reason": _finish(c, c.message), "logprobs": None}
                for i, c in enumerate(choices)
            ],
        }
    return common | {
        "object": "text_completion",
        "choices": [
            {"index": i, "text": c.text, "finish_reason": _finish(c, None), "logprobs": None}
            for i, c in enumerate(choices)
        ],
    }
