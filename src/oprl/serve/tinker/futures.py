"""The futures side of the Tinker server: each request's result, the order of a model's requests, the lanes that
compute, and batched sampling (``app.py`` serves them over HTTP).

Futures: every call that computes (create_model, forward_backward, optim_step, save/load, asample) answers at
once with ``{"request_id": ...}``; the SDK then polls ``/api/v1/retrieve_future`` with it. The server holds each
poll up to ``POLL_S`` seconds and answers the result (protobuf for ``ForwardBackwardOutput`` and
``SampleResponse``, which ``wire.py`` encodes on the lane from the backend's plain results, JSON otherwise),
``{"type": "try_again", ...}`` while it is still running, or ``{"error": ..., "category": "user" | "server"}``
when it failed (the SDK raises ``RequestFailedError`` with it).

Order and retries: the requests of one training model carry ``seq_id`` 1, 2, ... and run in that order on the
model's lane, whatever order they arrive in (the SDK sends the chunks of one forward_backward in
parallel). A request refused on arrival (a 400: an unknown loss, a bad config, an unknown checkpoint) still takes
its turn (``Futures.turn``): the SDK moves its own turn on when a request fails, so the model's next request
must not wait for it. A request whose ``(model_id, seq_id)`` (or ``(sampling_session_id, seq_id)``) was seen before gets
the first one's ``request_id``, so a retried POST never computes twice.

Batched sampling: sample requests of one sampling client wait in a queue; the first to arrive schedules, after
``sample_window`` seconds, one job on the sampler's lane that takes every request queued by the time it runs (up to
``batch_rows`` sampled rows) and answers them from one engine call (``TinkerModels.sample``). tinker-cookbook sends
a batch's prompts (or a group's members) as separate requests at once; one at a time, each paid a prefill and a
decode loop of its own. What a request gets does not depend on its batch (``sampling.py``).
An in-flight sampler's batch decodes ``INFLIGHT_STEPS`` steps per turn of its lane and then queues its next turn
behind whatever arrived meanwhile (a training step, an in-flight save), so its sequences continue on the weights
published between two steps. Each sample result keeps its tokens' weight versions (``Result.versions``).

Lanes: a lane is one thread running the requests of the models of one home (``backend.home_of``) in the order
they were released: every model while they live in this process (one compute thread: on a CPU no two jobs share
the cores), one lane per worker when they are placed (``placement.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import JSONResponse, Response

from oprl.errors import OprlError
from oprl.serve.tinker import wire
from oprl.serve.tinker.backend import COMPUTE_LANE, TinkerModels
from oprl.serve.tinker.errors import UserError
from oprl.serve.tinker.losses import LossError
from oprl.serve.tinker.models import Sampler

POLL_S = 10.0
"""How long one ``retrieve_future`` waits for its result before answering try_again (the SDK's timeout is 45 s)."""
SAMPLE_WINDOW_S = 0.01
"""How long the first queued sample request of a sampler waits for others before its batch is scheduled: the SDK's
concurrent requests arrive within milliseconds, one engine call takes tens of them at least."""
BATCH_ROWS = 256
"""Most sampled rows (sum of ``num_samples``) one engine call takes; the rest wait for the next (bounds memory)."""
INFLIGHT_STEPS = 1
"""Decode steps an in-flight batch takes per turn of its lane: between two turns the model's other requests run,
so a ``kind="inflight"`` save moves the running sequences onto its weights at the next step."""
MAX_RESULTS = 4096
"""Finished results kept for (re)retrieval, oldest dropped first: bounds memory over a long session."""
MAX_SAMPLED = 4096
"""Sample requests remembered by ``(sampling_session_id, seq_id)`` for retries (``Futures.sample_once``), least
recently seen dropped first: bounds memory over a long session (the SDK numbers every request, so one entry per
sample ever asked for otherwise). As many as results are kept: a retry of a dropped key would find its result
dropped too, and is computed anew."""
PROTO = "application/x-protobuf"


@dataclass
class Result:
    """One request's outcome: ``body`` + ``media`` on success, ``error`` + ``category`` on failure."""

    done: asyncio.Event = field(default_factory=asyncio.Event)
    body: bytes | None = None
    media: str = "application/json"
    error: str | None = None
    category: str = "server"
    owner: str | None = None
    """The session of a sample request's sampler (who may read ``versions``)."""
    versions: list[list[int]] | None = None
    """A sample request's sequences: per token, the version of the weights it was drawn under."""


@dataclass
class Ordered:
    """The numbered requests of one training model: the next ``seq_id`` to run and those waiting for it."""

    next_seq: int = 0
    """Creation (create_model, or load_weights creating the model) is seq 0; the SDK numbers the rest from 1."""
    seen: OrderedDict[int, str] = field(default_factory=OrderedDict)
    waiting: dict[int, Callable[[], None]] = field(default_factory=dict)


class Futures:
    """Results, per-model order, lanes and sample batches: what the routes submit work to and poll."""

    def __init__(self, backend: TinkerModels, *, sample_window: float, batch_rows: int, threads: int | None):
        self.backend = backend
        self.sample_window = sample_window
        self.batch_rows = batch_rows
        self.queued: dict[str, list[tuple[dict[str, Any], Result]]] = {}  # sampler id -> requests waiting
        self.queue_lock = threading.Lock()  # the routes append, a lane takes
        self.results: OrderedDict[str, Result] = OrderedDict()
        self.sampled: OrderedDict[tuple[str, int], str] = OrderedDict()
        """(sampling_session_id, seq_id) -> request id, the newest ``MAX_SAMPLED`` (LRU)."""
        self.order: dict[str, Ordered] = {}
        self.threads = threads
        """torch intra-op threads of each lane (None: torch's default). Set in the lane's own thread: OpenMP's
        thread count is per calling thread, and on a loaded machine fewer threads can be much faster (a region
        waits for its slowest thread, which the OS may have descheduled)."""
        self.lanes: dict[str, ThreadPoolExecutor] = {}  # home (backend.home_of) -> its one thread
        self.lanes_lock = threading.Lock()

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
            outcome: dict[str, Any]
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

    @contextlib.contextmanager
    def turn(self, key: tuple[str, int]) -> Iterator[None]:
        """The checks a route makes on arrival of request ``key`` = (model_id, seq_id), before it submits the
        request's work: when one refuses the request (the route answers 4xx), the refusal takes the request's turn
        in the model's order, as a failed request (a retried POST of that seq_id gets its failure), so the model's
        later requests run. The caller's ownership of the model is checked before: another key's refused request
        must not move a model's order."""
        try:
            yield
        except Exception as exc:  # a bug's 500 too: the SDK moves its turn on either way
            refusal = exc  # ``exc`` itself is unbound when the except clause ends

            def refused() -> tuple[bytes, str]:
                raise refusal

            with contextlib.suppress(UserError):  # a seq_id older than the next expected: its turn has passed
                self.submit(refused, key)
            raise

    def sample_once(self, sampler: Sampler, request: dict[str, Any]) -> str:
        """``submit_sample``, once per ``(sampler, seq_id)``: a retried request (same sampler and ``seq_id``; 0 is
        an id like any other) gets the first one's request id while its key is among the ``MAX_SAMPLED`` most
        recently seen; a request without a ``seq_id`` is never taken for another."""
        if request.get("seq_id") is None:
            return self.submit_sample(sampler, request)
        key = (sampler.sampler_id, int(request["seq_id"]))
        if key in self.sampled:
            self.sampled.move_to_end(key)
            return self.sampled[key]
        self.sampled[key] = self.submit_sample(sampler, request)
        while len(self.sampled) > MAX_SAMPLED:
            self.sampled.popitem(last=False)
        return self.sampled[key]

    def submit_sample(self, sampler: Sampler, request: dict[str, Any]) -> str:
        """Queue a sample request for its sampler's next batch (module docstring); returns the request id."""
        request_id = uuid.uuid4().hex
        result = self.results[request_id] = Result(owner=sampler.owner)
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
            taken: list = []
            rows = 0
            while queue and (not taken or rows + _rows(queue[0][0]) <= self.batch_rows):
                rows += _rows(queue[0][0])
                taken.append(queue.pop(0))
            if queue:
                self.lane(self.backend.home_of(sampler.sampler_id)).submit(self._sample_batch, sampler, loop)
            else:
                del self.queued[sampler.sampler_id]  # the next request schedules a new batch
        if sampler.inflight:
            self._inflight_batch(sampler, taken, loop)
            return
        try:
            self._answer(taken, self.backend.sample(sampler, [request for request, _ in taken]), loop)
        except Exception as exc:  # the whole call failed (the sampler's model closed, a bug): each request says so
            self._answer(taken, [exc] * len(taken), loop)

    def _inflight_batch(self, sampler: Sampler, taken: list, loop: asyncio.AbstractEventLoop) -> None:
        """An in-flight sampler's batch, ``INFLIGHT_STEPS`` decode steps per turn of the lane: each turn goes back
        to the end of the lane's queue, behind the requests that arrived meanwhile (a training step, a new
        in-flight save), so the running sequences continue on whatever weights those published."""
        lane = self.lane(self.backend.home_of(sampler.sampler_id))

        def turn(batch) -> None:
            try:
                outcomes = self.backend.sample_step(sampler, batch, INFLIGHT_STEPS)
            except Exception as exc:  # the model closed, a bug: each request says so
                self._answer(taken, [exc] * len(taken), loop)
                return
            if outcomes is None:
                lane.submit(turn, batch)
            else:
                self._answer(taken, outcomes, loop)

        try:
            turn(self.backend.begin_sample(sampler, [request for request, _ in taken]))
        except Exception as exc:
            self._answer(taken, [exc] * len(taken), loop)

    def _answer(self, taken: list, outcomes: list, loop: asyncio.AbstractEventLoop) -> None:
        """Each taken request's result: its ``SampleResponse`` (and its tokens' weight versions), or its failure."""
        for (_, result), o in zip(taken, outcomes, strict=True):
            outcome: dict[str, Any]
            if isinstance(o, Exception):
                outcome = _failure(o)
            else:
                body = wire.encode_sample_response(o)
                outcome = {"body": body, "media": PROTO, "versions": [s.versions for s in o.sequences]}
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
