"""The agent endpoint's HTTP side: its routes, and what each request goes through, in this order.

1. **authorised**: ``Authorization: Bearer TOKEN``, the endpoint's random token (401 otherwise);
2. **admitted** to its open session (404 when closed or unknown) while the session has fewer than
   ``ConnectionLimits.per_session`` requests open (429 past it), before its body is read: nothing is held;
3. **read** whole within ``REQUEST_TIMEOUT_S`` (408) and ``task.max_request_bytes`` (413, as soon as it passes);
4. **parsed, checked and tokenized off the event loop**, on an executor of the endpoint's own chosen by the
   body's size (``Endpoint.pool``): bodies up to ``HEAVY_BYTES`` on ``Endpoint.light``, larger ones on
   ``Endpoint.heavy``, one thread, where they queue behind each other, never in front of a small request.
   Before any of the body is walked, a request whose messages (or token ids) alone pass the context is refused
   (``Endpoint.bound``): 100,000 empty messages cost one ``json.loads``, not a validation;
5. **queued** for the engine (``Endpoint.submit``) and **answered** once sampled: JSON, or Server-Sent Events
   (``openai_api`` / ``responses_api`` shapes).

A refusal is one JSON error naming the culprit (``RequestRefused``; a Responses request's names its own fields,
``responses_api.renamed``), counted (``Endpoint.refuse``); a bug of ours is one 500 and one log line, never a
traceback. The bound this gives another agent's small request is measured in
``benchmarks/agent_endpoint_parsing.py`` (docs/tasks.md). Deliberately not here: sessions, batching and the
engine (``server``), the wire formats (``openai_api``, ``responses_api``).
"""

import asyncio
import contextlib
import logging

from oprl.episodes.endpoint import responses_api
from oprl.episodes.endpoint.openai_api import (
    ChatRequest,
    CompletionRequest,
    _Request,
    logprobs_of,
    parse,
    response,
    stream_events,
)
from oprl.episodes.endpoint.sessions import Choice, RequestRefused, Session

log = logging.getLogger("oprl.explorer")

REQUEST_TIMEOUT_S = 10.0
"""A connection must deliver a whole request (headers, then body) this long after it opened or after its last
reply, else it is closed (headers) or answered 408 (body): idle and trickling connections cannot pile up."""
HEAVY_BYTES = 256 * 2**10
"""A request body past this is parsed on ``Endpoint.heavy`` (one thread): an agent's ordinary request (tens of
KiB with a framework's tool schemas) never waits behind one of megabytes."""
FORMATS: dict[str, type[_Request] | None] = {
    "chat/completions": ChatRequest,
    "completions": CompletionRequest,
    "responses": None,
}
"""The POST routes under ``/s/SESSION/v1/`` and their request format (None: the Responses API, as chat)."""
KINDS = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}
KINDS[408] = KINDS[413] = KINDS[400]
UNAUTHORIZED = "missing or wrong API key: use the token the explorer handed the agent"


def app(endpoint):  # no __future__ annotations in this module: FastAPI reads the handlers' types
    """The FastAPI app of ``endpoint`` (``server.Endpoint``): the three POST formats and ``GET models``."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    api = FastAPI(title="oprl explorer endpoint", docs_url=None, redoc_url=None, openapi_url=None)

    def route(model: type[_Request] | None):
        async def post(session_id: str, request: Request):
            return await serve(endpoint, request, session_id, model)

        return post

    for path, model in FORMATS.items():
        api.add_api_route(f"/s/{{session_id}}/v1/{path}", route(model), methods=["POST"])

    @api.get("/s/{session_id}/v1/models")
    async def models(session_id: str, request: Request):
        if not authorized(endpoint, request):
            return error(401, UNAUTHORIZED)
        return JSONResponse({"object": "list", "data": [{"id": "policy", "object": "model", "owned_by": "oprl"}]})

    return api


def error(status: int, message: str):
    """OpenAI's error shape: ``{"error": {"message", "type", "code"}}`` with ``status``."""
    from fastapi.responses import JSONResponse

    body = {"error": {"message": message, "type": KINDS.get(status, "server_error"), "code": status}}
    return JSONResponse(body, status_code=status)


def authorized(endpoint, request) -> bool:
    if request.headers.get("authorization") == f"Bearer {endpoint.token}":
        return True
    endpoint.counts["refused/unauthorized"] += 1
    return False


async def serve(endpoint, request, session_id: str, model: type[_Request] | None):
    """One request through the steps of the module docstring; its reply (or its error) whole."""
    from starlette.requests import ClientDisconnect

    if not authorized(endpoint, request):
        return error(401, UNAUTHORIZED)
    session = endpoint.sessions.get(session_id)
    try:
        with admitted(endpoint, session, session_id) as session:
            raw = await read_body(request, endpoint.max_request_bytes)
            pool = endpoint.pool(len(raw))  # one hop off the loop: each hop waits for the interpreter anew
            body, data, pending = await asyncio.get_running_loop().run_in_executor(
                pool, queued, endpoint, session, raw, model
            )
            choices = await asyncio.wrap_future(pending.future)
            reply = _reply(body, data, choices, endpoint.tokenizer, responses=model is None)  # whole, before sending
    except RequestRefused as exc:
        endpoint.refuse(session, exc)
        return error(exc.status, exc.message)
    except ClientDisconnect:  # the client closed its connection mid-body: nobody to answer, nothing of ours
        endpoint.counts["refused/disconnected"] += 1
        return error(400, "the client disconnected before its request arrived")
    except Exception as exc:  # a bug of ours: one line, one 500, the run goes on (an agent raising on it: lost)
        endpoint.counts["errors"] += 1
        log.warning("agent endpoint: 500 on %s: %s: %s", request.url.path, type(exc).__name__, str(exc)[:200])
        return error(500, f"internal error: {type(exc).__name__} (logged by the explorer)")
    endpoint.counts["served"] += 1
    return reply


@contextlib.contextmanager
def admitted(endpoint, session: Session | None, session_id: str):
    """``session`` while this request is open in it (``Session.open_requests``), or a 404 (no open session) / a
    429 (``ConnectionLimits.per_session`` requests open already: one agent cannot hold every connection)."""
    if session is None:
        raise RequestRefused(404, f"no open session {session_id!r} (finished, timed out, or never opened)")
    if session.open_requests >= endpoint.limits.per_session:
        raise RequestRefused(
            429,
            f"this session has {session.open_requests} requests open, the most one episode may have "
            f"({endpoint.limits.per_session}); wait for a reply",
        )
    session.open_requests += 1
    try:
        yield session
    finally:
        session.open_requests -= 1


async def read_body(request, limit: int) -> bytes:
    """The request body within ``REQUEST_TIMEOUT_S`` (else a 408), or a 413 as soon as it passes ``limit`` bytes
    (declared or received): memory per request is bounded by the limit, whatever the client sends."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise RequestRefused(413, f"the request body is {declared} bytes, past task.max_request_bytes={limit}")

    async def whole() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestRefused(413, f"the request body passes task.max_request_bytes={limit}")
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(whole(), REQUEST_TIMEOUT_S)
    except TimeoutError:
        raise RequestRefused(408, f"the request body did not arrive within {REQUEST_TIMEOUT_S:g} s") from None


def queued(endpoint, session: Session, raw: bytes, model: type[_Request] | None):
    """The request in ``raw`` parsed and checked (its size against the context first: ``Endpoint.bound``; a
    Responses body as its chat request, with the body for the reply), then queued for the engine
    (``Endpoint.submit``): ``(body, data, pending)``. Runs on one of the endpoint's executors; a refusal of a
    Responses request names the Responses field (``responses_api.renamed``)."""
    gate = lambda data: endpoint.bound(session, data)  # noqa: E731
    body, data = responses_api.chat_request(raw, gate) if model is None else (parse(raw, model, gate), {})
    try:
        return body, data, endpoint.submit(session, body)
    except RequestRefused as exc:
        raise responses_api.renamed(exc, body._names) if isinstance(body, ChatRequest) else exc from None


def _reply(body: _Request, data: dict, choices: list[Choice], tokenizer, *, responses: bool):
    """The HTTP reply to a served request: one JSON object, or Server-Sent Events when it asked for a stream
    (``responses``: in the Responses API's format, ``data`` its body)."""
    from fastapi.responses import JSONResponse, StreamingResponse

    sse = "text/event-stream"
    if responses:  # the text's log-probs as a chat request's (include: message.output_text.logprobs)
        logprobs = (
            logprobs_of(choices[0], tokenizer, True, body.top_wanted())["content"] if body.wants_logprobs() else None
        )
        if data.get("stream"):
            return StreamingResponse(iter(responses_api.stream_events(data, choices[0], logprobs)), media_type=sse)
        return JSONResponse(responses_api.response(data, choices[0], logprobs))
    if body.stream:
        return StreamingResponse(iter(stream_events(body, choices, tokenizer)), media_type=sse)
    return JSONResponse(response(body, choices, tokenizer))
