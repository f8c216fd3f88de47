"""The explorer's OpenAI-compatible endpoint: ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/responses``
over HTTP on 127.0.0.1, served by the explorer's own engine at the current policy version. This module is the
endpoint's state and its explorer side (sessions, the queue of requests, engine batches, the server's life);
the HTTP side (routes, reading, parsing off the event loop, replies) is ``oprl.episodes.endpoint.routes``.

FastAPI + uvicorn, because vLLM's own OpenAI server is built on them (installed with every vLLM extra), and
their pydantic request models are the configuration's validation style; the server runs in a daemon thread
of the explorer's process on a socket bound here (so a port in use is one ``OprlError`` line); requests are
parsed and tokenized on executors of its own (``Endpoint.pool``: huge bodies on one thread of their own).

Every agent run is a **session**: the explorer opens it, hands the agent a client whose base URL is
``http://127.0.0.1:PORT/s/SESSION/v1``, and closes it when the agent returns, fails or times out (later
requests: 404; a reply sampled after it closed is not recorded). Requests need ``Authorization: Bearer
TOKEN`` (a random token per endpoint; 401 otherwise).

Nothing a request does stops the run: a body past ``max_request_bytes`` is a 413 before it is read whole;
every other mistake is a 400 naming the culprit, decided before the engine is called
(``oprl.episodes.endpoint.openai_api``: JSON, nesting, Unicode, message shapes, options; here: token ids outside the
vocabulary, a context past the model's, budgets); an unexpected error is one 500 and one log line. Each
refusal is counted in the session's ``refused`` (``episode/refused_requests_mean``).

- honoured: ``messages`` / ``prompt`` (text or token ids), ``tools`` with ``tool_choice`` auto / none (none:
  rendered, as OpenAI shows them, and the reply returned as text), replies' ``<tool_call>{json}</tool_call>``
  blocks returned as ``tool_calls``, ``n``,
  ``max_tokens`` / ``max_completion_tokens`` up to ``rollout.max_new_tokens`` (the reply is cut there, which is
  what sampling with that limit gives), ``stop`` (``oprl.episodes.endpoint.sessions.stop_at``), ``stream`` (Server-Sent
  Events, sent once sampling is done) with ``stream_options.include_usage``, ``logprobs`` (the behaviour
  log-probs recorded at sampling) with ``top_logprobs`` (the sampler's recorded top-K of each token's
  distribution: the engine call records max(N, ``rollout.record_top_k``), ``Served.top_logprobs``),
  ``temperature`` / ``top_p`` / ``top_k`` (an extra field) mapped onto a
  ``Sampling`` (``requested_sampling``) equal to what the explorer samples with (the trainer scores under the
  rollouts' ``Sampling``; another would make the behaviour log-probs wrong);
- refused with a 400: another temperature, top-p or top-k, more tokens than the engine samples, ``tool_choice``
  required or a named function, ``response_format`` other than text, ``logit_bias``, penalties, ``top_logprobs``
  from an engine that records none (a 400 naming it), image / audio parts.

``/v1/responses`` (the Responses API) is translated to a chat request and back (``responses_api``). Connections
are bounded by the process's files and a session may have ``ConnectionLimits.per_session`` requests open (a 429
past it): ``oprl.episodes.endpoint.connections``.

Requests wait in ``Endpoint.pending`` until ``take`` hands them to the explorer thread as one engine call
(``oprl.episodes.agents``); the reply comes back through a future. Token bookkeeping is
``oprl.episodes.endpoint.sessions``.
"""

import concurrent.futures
import json
import logging
import secrets
import socket
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from oprl.episodes.endpoint import routes
from oprl.episodes.endpoint.connections import (
    MIN_CONNECTIONS,
    RESERVED_FILES,
    connection_limits,
    file_limits,
    guarded,
    open_files,
)
from oprl.episodes.endpoint.openai_api import ChatRequest, CompletionRequest, _Request
from oprl.episodes.endpoint.routes import HEAVY_BYTES, REQUEST_TIMEOUT_S
from oprl.episodes.endpoint.sessions import Choice, RequestRefused, Session
from oprl.episodes.episode import Episode
from oprl.errors import OprlError
from oprl.models.chat import encode_prompt
from oprl.models.truncation import Sampling
from oprl.tasks.bfcl.toolcall import OPEN, parse_calls

log = logging.getLogger("oprl.explorer")

MAX_REQUEST_BYTES = 4 * 2**20
"""Default ``task.max_request_bytes``."""
CLOSED = "the session is closed (its agent returned, failed or timed out)"
LIGHT_WORKERS = 4
"""Threads parsing and tokenizing requests up to ``routes.HEAVY_BYTES`` (``Endpoint.light``); larger ones have
one thread of their own (``Endpoint.heavy``)."""


@dataclass
class PendingReply:
    """A request waiting for the engine: its session, its token context, and where the replies go (a plain
    ``concurrent.futures.Future``; not a backend's ``Pending`` call result)."""

    session: Session
    context: list[int]
    segment: Episode
    """The session's segment the context was built on: the reply is recorded there (``Session.record``)."""
    n: int
    max_tokens: int
    with_tools: bool = False
    stops: list[str] = field(default_factory=list)
    top: int = 0
    """Top log-probs asked for per token (chat ``top_logprobs``, completions ``logprobs``): the engine call
    records at least this many (``oprl.episodes.agents``)."""
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    since: float = field(default_factory=time.monotonic)


@dataclass
class Served:
    """What the explorer samples with during one batch (requests are checked against it). ``context``: the
    engine's context length in positions (None: unknown), prompt and ``max_new_tokens`` included."""

    sampling: Sampling
    """The distribution every reply is drawn from: the engine's (``rollout.*``) or evaluation's (``eval.*``)."""
    max_new_tokens: int
    context: int | None = None
    top_logprobs: bool = False
    """The engine records top log-probs (``capabilities.top_logprobs``): requests may ask for them."""
    record_top_k: int = 0
    """K every engine call records (``rollout.record_top_k``), stored with the rows."""
    engine_name: str = "the engine"
    """The engine's class, named when a request asks it for top log-probs it cannot record."""

    @property
    def room(self) -> int | None:
        """Most prompt tokens a request may have: the context less the reply's ``max_new_tokens``."""
        return None if self.context is None else self.context - self.max_new_tokens


def requested_sampling(body: _Request, served: Sampling) -> Sampling:
    """The ``Sampling`` a request asks for: its ``temperature``, ``top_p`` and ``top_k`` (not an OpenAI field:
    an extra one, as vLLM's server takes it; anything but a positive integer is off, 0), each one it leaves out
    the ``served`` value. A request is served only when this equals ``served``."""
    top_k = (body.model_extra or {}).get("top_k")
    return Sampling(
        temperature=served.temperature if body.temperature is None else body.temperature,
        top_k=served.top_k if top_k is None else (top_k if isinstance(top_k, int) and top_k > 0 else 0),
        top_p=served.top_p if body.top_p is None else body.top_p,
    )


class Endpoint:
    """The HTTP server and its sessions (see the module docstring). ``host``/``port``: where it listens (port
    0 = any free one); ``batch_wait_s``: how long ``take`` waits for the other running agents' requests;
    ``max_request_bytes``: the largest request body (413 past it)."""

    def __init__(
        self,
        tokenizer,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        batch_wait_s: float = 0.05,
        max_request_bytes: int = MAX_REQUEST_BYTES,
    ):
        import uvicorn

        self.tokenizer = tokenizer
        self.vocab = len(tokenizer)
        self.token_chars = max((len(t) for t in tokenizer.get_vocab()), default=0)
        """Most characters one token spells (``Session.token_chars``)."""
        self.message_tokens = message_tokens(tokenizer)
        """Fewest tokens the chat template spends on a message (``Session.message_tokens``)."""
        self.max_request_bytes = max_request_bytes
        self.token = secrets.token_urlsafe(24)
        self.batch_wait_s = batch_wait_s
        self.sessions: dict[str, Session] = {}
        self.pending: list[PendingReply] = []
        self.served = Served(Sampling(), 16)
        self.counts: Counter[str] = Counter()
        """Requests served, refused (by reason), and engine calls: ``oprl.episodes.agents`` logs them."""
        self.failed_batches = 0
        """Batches in a row in which every episode failed (``oprl.episodes.agents``)."""
        self.client: Any = None
        """The agents' shared ``openai.OpenAI`` (``oprl.episodes.agents``), built on first use."""
        self.closers: list[Callable[[], None]] = []
        """What ``stop`` closes besides the server (the shared client's connection pool)."""
        self.lock = threading.Condition()
        """Guards sessions and the pending list; notified when a request arrives or a session closes."""
        sock = bind(host, port)
        self.host, self.port = host, sock.getsockname()[1]
        self.light = concurrent.futures.ThreadPoolExecutor(LIGHT_WORKERS, f"oprl-endpoint-{self.port}-parse")
        self.heavy = concurrent.futures.ThreadPoolExecutor(1, f"oprl-endpoint-{self.port}-parse-heavy")
        """Where requests are parsed, checked and tokenized, off the event loop (``pool``)."""
        config = uvicorn.Config(routes.app(self), log_level="error", access_log=False, lifespan="off")
        config.load()  # the protocol class uvicorn picked, guarded (Server.run keeps a loaded config)
        self.episodes = 0
        """Episodes of the current batch (``expect``): what the connection limits are sized for."""
        self.limits = connection_limits(0)
        self.warned: set[tuple[int, int]] = set()
        config.http_protocol_class = guarded(config.http_protocol_class, self, REQUEST_TIMEOUT_S)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, name=f"oprl-endpoint-{self.port}", daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and self.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self.server.started:
            raise OprlError(f"task: the agent endpoint on {host}:{self.port} did not start")
        LIVE.add(self)

    def expect(self, episodes: int) -> None:
        """Size the connection limits for a batch of ``episodes`` agent runs (with every other live endpoint's,
        e.g. an evaluation's, in the file budget); one warning line when the process's file limit, raised to
        its hard limit first, cannot give each running episode a connection."""
        self.episodes = episodes
        running = sum(e.episodes for e in list(LIVE))
        self.limits = connection_limits(episodes, running)
        if self.limits.bound >= self.limits.needed or (self.limits.bound, running) in self.warned:
            return
        self.warned.add((self.limits.bound, running))
        soft, hard = file_limits()
        log.warning(
            "agent endpoint: the open-file limit (soft %d, hard %d) holds %d agent connections (2 files each) for "
            "%d episodes at once (rollout.prompts_per_step x rollout.group_size, plus evaluation's): the shared "
            "client's requests wait for a connection, other clients' may fail (their episodes are lost: left "
            "out of their groups, counted in episode/lost); raise it: ulimit -n %d",
            soft,
            hard,
            self.limits.bound,
            running,
            2 * (2 * running + MIN_CONNECTIONS) + open_files() + RESERVED_FILES,
        )

    def base_url(self, session_id: str) -> str:
        return f"http://{self.host}:{self.port}/s/{session_id}/v1"

    def open(self, session: Session) -> str:
        session_id = secrets.token_hex(8)
        with self.lock:
            self.sessions[session_id] = session
        return session_id

    def close(self, session_id: str, reason: str = "the episode is over") -> Session | None:
        """End a session: its waiting requests fail (408), later ones get 404, replies are not recorded. Closing
        a closed session does nothing (its agent returning and its timeout can race)."""
        with self.lock:
            session = self.sessions.pop(session_id, None)
            if session is None:
                return None
            session.closed = True
            for request in [p for p in self.pending if p.session is session]:
                self.pending.remove(request)
                request.future.set_exception(RequestRefused(408, f"session closed: {reason}"))
            self.lock.notify_all()
        return session

    def take(self, running: int, timeout: float = 0.05) -> list[PendingReply]:
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
        """Stop listening (the server's thread ends, its socket closes) and close the shared client."""
        self.server.should_exit = True
        self.episodes = 0
        LIVE.discard(self)
        self.thread.join(timeout=5)
        for close in self.closers:
            close()
        self.closers.clear()
        for pool in (self.light, self.heavy):
            pool.shutdown(wait=False, cancel_futures=True)

    # -- request handling (``routes``, on the executors) -----------------------------------------------------
    def pool(self, size: int) -> concurrent.futures.ThreadPoolExecutor:
        """The executor for a request body of ``size`` bytes: ``heavy`` (one thread) past ``HEAVY_BYTES``, where
        huge requests queue behind each other, else ``light``: a small request never waits for a huge one's
        thread, and shares the interpreter with at most one of them."""
        return self.heavy if size > HEAVY_BYTES else self.light

    def bound(self, session: Session, data: dict) -> None:
        """Refuse, before its body is validated or walked, a request whose messages (chat ``messages``, Responses
        ``input`` items: a function call renders more tokens than an empty message) or token ids alone pass the
        context: at least ``message_tokens`` tokens each, one per token id. The session's own rule for a
        context past the model's applies (a 400 naming the limit, the episode truncated)."""
        room, items = self.served.room, data.get("messages", data.get("input"))
        prompt = data.get("prompt")
        tokens = len(items) * self.message_tokens if isinstance(items, list) else 0
        tokens = len(prompt) if isinstance(prompt, list) else tokens
        if room is not None and tokens > room:
            with self.lock:
                if session.closed:
                    raise RequestRefused(404, CLOSED)
                session.bound(tokens, room)

    def submit(self, session: Session, body: _Request) -> PendingReply:
        """Check ``body`` against the engine, extend the session's history, queue the request."""
        limit = self.served.max_new_tokens
        served, asked = self.served.sampling, requested_sampling(body, self.served.sampling)
        for name in ("temperature", "top_p", "top_k"):
            if abs(getattr(asked, name) - getattr(served, name)) > 1e-6:
                value = (body.model_extra or {})["top_k"] if name == "top_k" else getattr(body, name)
                raise RequestRefused(
                    400, f"{name}={value}: this endpoint samples at {name}={getattr(served, name)} (the run's)"
                )
        top = body.top_wanted()
        if top and not self.served.top_logprobs:
            raise RequestRefused(
                400,
                f"{body.top_field}={top}: the engine ({self.served.engine_name}) records no top log-probs (its "
                "capabilities.top_logprobs is False); use rollout.engine=lean, hf-generate or vllm, or omit it",
            )
        max_tokens = getattr(body, "max_completion_tokens", None) or body.max_tokens or limit
        if max_tokens > limit:
            raise RequestRefused(
                400,
                f"max_tokens={max_tokens} exceeds what the engine samples per turn (rollout.max_new_tokens={limit})",
            )
        if isinstance(body, CompletionRequest) and isinstance(body.prompt, list):
            bad = next((k for k, t in enumerate(body.prompt) if not 0 <= t < self.vocab), None)
            if bad is not None:
                raise RequestRefused(400, f"prompt.{bad}: token id {body.prompt[bad]} is not in 0..{self.vocab - 1}")
        messages = body.chat_messages() if isinstance(body, ChatRequest) else []
        tools = body.chat_tools() if isinstance(body, ChatRequest) else []
        with self.lock:
            if session.closed:
                raise RequestRefused(404, CLOSED)
            room = self.served.room
            if isinstance(body, ChatRequest):
                context = session.chat_context(messages, tools, room)
            else:
                assert isinstance(body, CompletionRequest)
                context = session.completion_context(body.prompt, room)
            segment = session.reserve()  # its turn reserved, its reply bound to this segment
            pending = PendingReply(
                session,
                context,
                segment,
                body.n,
                max_tokens,
                with_tools=isinstance(body, ChatRequest) and body.calls_parsed,
                stops=body.stops,
                top=top,
            )
            self.pending.append(pending)
            self.lock.notify_all()
        return pending

    def refuse(self, session: Session | None, exc: RequestRefused) -> None:
        """Count a refusal: by reason for the run's log, in the session for ``episode/refused_requests_mean``."""
        reason = (
            "budget"
            if "episode over" in exc.message
            else {413: "too_large", 404: "closed", 429: "busy"}.get(exc.status)
        )
        with self.lock:
            self.counts["refused/" + (reason or "request")] += 1
            if session is not None and exc.status != 404:
                session.refused += 1


LIVE: "weakref.WeakSet[Endpoint]" = weakref.WeakSet()
"""Endpoints listening in this process (an explorer's, an evaluation's): they share its files."""


def message_tokens(tokenizer) -> int:
    """Fewest tokens the chat template adds per message, content aside: one empty message more, for the roles
    an agent sends (0 when the template cannot render them so: no bound)."""
    counts = []
    for role in ("user", "assistant", "tool", "system"):
        try:
            one = len(encode_prompt(tokenizer, [{"role": "user", "content": ""}, {"role": role, "content": ""}]))
            base = len(encode_prompt(tokenizer, [{"role": "user", "content": ""}]))
        except Exception:  # a template that refuses this order (e.g. a tool message without a call) bounds nothing
            continue
        counts.append(one - base)
    return max(min(counts, default=0), 0)


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
    """The assistant message of a reply: ``<tool_call>`` blocks as ``tool_calls`` when the request had tools.
    Call ids are random (agents such as openai-agents refuse an id reused later in the conversation); they are
    not part of the tokens, and an echo is compared without them."""
    calls = parse_calls(choice.text) if with_tools else None
    if not calls:
        return {"role": "assistant", "content": choice.text}
    content = choice.text.split(OPEN, 1)[0].strip() or None
    tool_calls = [
        {
            "id": f"call_{secrets.token_hex(8)}",
            "type": "function",
            "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
        }
        for k, c in enumerate(calls)
    ]
    return {"role": "assistant", "content": content, "tool_calls": tool_calls}
