"""Running the user's agents (``task.name=agent``) against the explorer's endpoint, and their episodes.

``run_agent_episodes`` is ``run_episodes`` for agent tasks (called by it, with its arguments as one
``EpisodeSettings``): one agent run per entry of ``problems`` (a problem repeated K times is a group), each in a
thread of its own with an ``openai.OpenAI`` client (an ``async def`` agent gets an ``openai.AsyncOpenAI`` and
its own event loop) pointed at its session of the endpoint. This thread serves them: it hands the waiting
requests to the engine as one call (``Endpoint.take``: every running agent asked, or ``task.batch_wait_s``
passed), and returns the replies.

Seeds: the request of episode ``i`` at turn ``t`` samples with the row seed of ``(seed + t, i, choice)`` on
engines that seed rows (vLLM: a row's samples do not depend on its batch, so episodes are repeatable
whatever the agents' timing); the torch engines draw a whole call from one generator seeded ``seed + t``
(t of the call's first request), so their episodes repeat when the calls do. When every agent asks at each
turn (all wait for the engine) the calls are the built-in path's: turn t over the running episodes in order,
seeded ``seed + t``, so the same agent logic gives the same rows as ``run_episodes`` (tested).

A session closes when its agent returns, raises or times out (later requests get 404; a reply sampled for it
after that is not recorded), so the stored row is the conversation the agent saw. Faults, each counted and
logged in one line, never stopping the run: an agent that raises, returns something other than a number or a
dict with ``reward`` (finite, within ±1e6: ``oprl.tasks.agent.agent_reward``), or runs past
``rollout.episode_timeout`` seconds (the thread is left behind, it cannot be killed) scores 0 and keeps the
tokens it had sampled (an agent that failed before its first request: one
end-of-turn token, mask 0, so its row carries no gradient). Requests past the turn or token budget or the
model's context get a 400 and truncate the episode (scores 0, ``response/truncated_frac``), as the built-in
episodes do; an agent that raises on that 400 is truncated, not failed. An episode whose agent failed on the
infrastructure (a connection error or timeout of its client, a 5xx: ``lost_to``) is **lost**, not scored 0:
``Episode.lost``, which the explorer leaves out of its group (``episode/lost``). The endpoint's connections are
sized from the batch (``Endpoint.expect``). A batch in which every episode failed
is one warning line with the most common cause; ``task.max_failed_batches`` of them in a row stop the run
(``OprlError``). An engine call refused by the engine's own checks fails its requests with a 400.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from oprl.episodes.endpoint.server import Endpoint, PendingReply, Served, reply_message
from oprl.episodes.endpoint.sessions import Choice, RequestRefused, Session, stop_at
from oprl.episodes.episode import Episode, EpisodeSettings, run_episodes
from oprl.errors import OprlError
from oprl.models.chat import encode_problem
from oprl.rollout.base import capabilities_of
from oprl.tasks.agent import agent_reward, problem_dict
from oprl.tasks.base import Problem, Reward

log = logging.getLogger("oprl.explorer")


@dataclass
class AgentRun:
    """One agent run: its thread, its session, and how it ended."""

    index: int
    problem: Problem
    session: Session
    session_id: str = ""
    started: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)
    result: object = None
    fault: str = ""
    """Why the episode failed: raised, lost (to the infrastructure: ``lost_to``), timeout, bad_return, no_request
    ("" = it did not)."""


def endpoint_of(task, tokenizer, port: int | None = None) -> Endpoint:
    """The task's endpoint, started on first use (one per task object, i.e. per explorer), on ``task.port``
    or on ``port`` when given (0: any free one)."""
    if task.endpoint is None:
        c = task.config
        task.endpoint = Endpoint(
            tokenizer,
            host=c.host,
            port=c.port if port is None else port,
            batch_wait_s=c.batch_wait_s,
            max_request_bytes=c.max_request_bytes,
        )
    return task.endpoint


def close_task(task) -> None:
    """Stop the endpoint of an agent task (also one wrapped by a judge, ``JudgedTask.task``), if it has one
    listening; a later batch starts it again. Any other task: nothing to do."""
    inner = getattr(task, "task", task)
    for candidate in (task, inner):
        endpoint = getattr(candidate, "endpoint", None)
        if isinstance(endpoint, Endpoint):
            candidate.endpoint = None
            endpoint.stop()


def task_episodes(engine, tokenizer, task, problems, **settings) -> list[Episode]:
    """The episodes of any episodic task, one per entry of ``problems``: an agent task's (``task.name=agent``)
    through its agents and the endpoint, every other task's against its environment (``run_episodes``).
    ``settings`` are ``run_episodes``' keyword arguments (``EpisodeSettings``' fields). The one place that
    tells the two apart, above both, so ``episodes`` never imports this module."""
    if getattr(task, "name", "") == "agent":
        return run_agent_episodes(engine, tokenizer, task, problems, EpisodeSettings(**settings))
    return run_episodes(engine, tokenizer, task, problems, **settings)


def run_agent_episodes(engine, tokenizer, task, problems, settings: EpisodeSettings) -> list[Episode]:
    """One episode per entry of ``problems``, written by ``task``'s agent through the endpoint; ``run_episodes``
    calls it for agent tasks with its own arguments (``settings``)."""
    if settings.switch is not None:
        raise OprlError(
            "sync.partial=true: agent tasks (task.name=agent) sample without switching weights; set sync.partial=false"
        )
    endpoint, s = endpoint_of(task, tokenizer), settings
    endpoint.expect(len(problems))  # connection limits sized for this batch (one line if the files cannot hold it)
    sampling = engine.sampling if s.sampling is None else s.sampling
    endpoint.served = served_by(engine, sampling)
    runs = [AgentRun(i, p, Session(i, tokenizer, s.max_turns, s.max_tokens)) for i, p in enumerate(problems)]
    for run in runs:
        run.session.token_chars, run.session.message_tokens = endpoint.token_chars, endpoint.message_tokens
        run.session.record_top_k = endpoint.served.record_top_k
        run.session_id = endpoint.open(run.session)
        _start(task, endpoint, run, s.episode_timeout)
    calls = 0
    while True:
        _check_timeouts(endpoint, runs, s.episode_timeout)
        running = [r for r in runs if not r.done.is_set()]
        if not running:
            break
        batch = endpoint.take(len(running))
        if batch:
            _sample(engine, endpoint, batch, s.seed)
            calls += 1
    episodes = [_episode(endpoint, run, tokenizer) for run in runs]
    _report(endpoint, runs, calls, getattr(task.config, "max_failed_batches", 0), task.config.agent)
    return episodes


def served_by(engine, sampling) -> Served:
    """What ``engine`` serves the agents with: ``sampling``, its ``max_new_tokens``, its context, and its top
    log-probs (``capabilities.top_logprobs``; ``record_top_k``: the K every row records, ``rollout.record_top_k``)."""
    inner = getattr(engine, "engine", engine)  # a LockedEngine's sampler names the engine in a refusal
    return Served(
        sampling,
        engine.max_new_tokens,
        context_length(engine),
        top_logprobs=capabilities_of(engine).top_logprobs,
        record_top_k=int(getattr(engine, "record_top_k", 0) or 0),
        engine_name=type(inner).__name__,
    )


def context_length(engine) -> int | None:
    """The engine's context in positions (prompt and reply): the model's (torch engines) or vLLM's."""
    shared = getattr(engine, "shared", None)
    value = getattr(shared, "max_model_len", None) if shared is not None else getattr(engine, "context", None)
    return value if isinstance(value, int) and value > 0 else None


def _start(task, endpoint: Endpoint, run: AgentRun, timeout: float) -> None:
    try:
        import openai
    except ImportError:
        raise OprlError("task.name=agent needs the openai client: pip install 'oprl[agent]'") from None
    url, problem = endpoint.base_url(run.session_id), problem_dict(run.problem)

    def body() -> None:
        fault, result = "", None
        try:
            settings: dict[str, Any] = {"base_url": url, "api_key": endpoint.token, "timeout": timeout}
            settings["max_retries"] = 0  # a refused request is the agent's to handle, never silently resent
            if task.is_async:  # an async client is bound to its event loop: one each, closed inside it
                result = asyncio.run(_run_async(task.rollout, openai.AsyncOpenAI(**settings), problem))
            else:  # one connection pool for all (building a client costs ~40 ms: its SSL context)
                client = _client(endpoint, openai).with_options(base_url=url, timeout=timeout)
                result = task.rollout(client, problem)
        except BaseException as exc:  # the agent's failure is its episode's, never the run's
            fault, result = ("lost" if lost_to(exc) else "raised"), f"{type(exc).__name__}: {str(exc)[:200]}"
        finally:  # the session closes with its agent: a later request is a 404 and cannot touch the row
            with endpoint.lock:
                if not run.done.is_set():  # else it timed out: that verdict stands
                    run.fault, run.result = fault, result
                    endpoint.close(run.session_id, "its agent returned")
                run.done.set()
                endpoint.lock.notify_all()

    run.started = time.monotonic()
    threading.Thread(target=body, name=f"oprl-agent-{run.index}", daemon=True).start()


async def _run_async(rollout, client, problem: dict):
    """An async agent with its ``AsyncOpenAI``, closed inside the agent's event loop: a connection left behind
    (a request the agent cancelled) is closed here, not by the client's finalizer on a loop already closed (a
    "Task exception was never retrieved ... Event loop is closed" traceback per episode)."""
    async with client:
        return await rollout(client, problem)


def lost_to(exc: BaseException) -> bool:
    """Whether the agent failed on the infrastructure rather than on its own: a connection error or timeout of
    the client (``openai.APIConnectionError``, ``APITimeoutError``; ``httpx.TransportError``) or a 5xx reply,
    raised as is or wrapped by a framework (its ``__cause__`` / ``__context__`` chain)."""
    import httpx
    import openai

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, openai.APIConnectionError | httpx.TransportError):
            return True
        if isinstance(current, openai.APIStatusError) and current.status_code >= 500:
            return True
        current = current.__cause__ or current.__context__
    return False


def _client(endpoint: Endpoint, openai):
    """The endpoint's shared ``openai.OpenAI`` (thread-safe); each session gets a copy with its own URL. Its
    connection pool ignores ``close()`` (one agent's ``with client:`` or ``client.close()`` would close every
    sync agent's pool): ``Endpoint.stop`` closes it."""
    with endpoint.lock:
        if endpoint.client is None:
            import httpx

            bound = endpoint.limits.bound  # past it, requests wait for a pooled connection (files are spent)
            http = _shared_pool(openai.DefaultHttpxClient)(limits=httpx.Limits(max_connections=bound))
            endpoint.client = openai.OpenAI(
                base_url=endpoint.base_url("-"), api_key=endpoint.token, max_retries=0, http_client=http
            )
            endpoint.closers.append(http.shutdown)
        return endpoint.client


def _shared_pool(base: Any) -> Any:
    """``base`` (the ``openai`` client's HTTP client class) whose ``close`` does nothing; ``shutdown`` closes it."""

    class SharedPool(base):
        def close(self) -> None:  # an agent closing its client: the pool stays, the other agents use it
            pass

        def shutdown(self) -> None:
            base.close(self)

    return SharedPool


def _check_timeouts(endpoint: Endpoint, runs: list[AgentRun], timeout: float) -> None:
    now = time.monotonic()
    for run in runs:
        if run.done.is_set() or now - run.started <= timeout:
            continue
        with endpoint.lock:  # the agent's own ending sets `done` under the lock: one of the two wins
            if not run.done.is_set():
                run.fault, run.result = "timeout", f"still running after rollout.episode_timeout={timeout:g} s"
                run.done.set()  # the thread is abandoned; its session closes so it cannot add tokens
                endpoint.close(run.session_id, "rollout.episode_timeout passed")


def choice_seed(seed: int, turn: int, index: int, choice: int) -> int:
    """63 bits of a hash of (batch seed + turn, episode, choice): the seed of one sampled row, one choice of
    one request (passed to ``Engine.generate`` as ``row_seeds``; not vLLM's ``row_seed(seed, row)``)."""
    digest = hashlib.blake2b(f"{seed + turn}/{index}/{choice}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def _sample(engine, endpoint: Endpoint, batch: list[PendingReply], seed: int) -> None:
    """One engine call for the waiting requests (their ``n`` rows each, in episode order); replies to each."""
    batch.sort(key=lambda p: (p.session.turns, p.session.index))
    rows = [(p, choice) for p in batch for choice in range(p.n)]
    contexts = [p.context for p, _ in rows]
    turn = batch[0].session.turns
    row_seeds = [choice_seed(seed, p.session.turns, p.session.index, c) for p, c in rows]
    # Top log-probs: the engine records its own K for every row (rollout.record_top_k); a request asking for more
    # (top_logprobs N) has the call record N (recording draws no random number: the samples are the same).
    asked, own = max(p.top for p in batch), endpoint.served.record_top_k
    extra = {"record_top_k": asked} if asked > own else {}
    try:
        rollout = engine.generate(
            contexts, seed=seed + turn, sampling=endpoint.served.sampling, row_seeds=row_seeds, **extra
        )
    except OprlError as exc:  # the engine's own checks (memory, lengths) refused the call: the requests' fault
        log.warning("agent endpoint: the engine refused %d requests: %s", len(batch), exc)
        with endpoint.lock:
            for p in batch:
                p.session.release(p.segment)
                p.session.refused += 1
                if not p.future.done():
                    p.future.set_exception(RequestRefused(400, f"the engine refused the request: {exc}"))
        return
    except BaseException as exc:
        for p in batch:
            p.future.set_exception(exc)
        raise
    choices: dict[int, list[Choice]] = {id(p): [] for p in batch}
    for row, (p, _) in enumerate(rows):
        ids, logprobs, ended = rollout.response_ids[row], rollout.behavior_logprobs[row], not rollout.truncated[row]
        text = rollout.texts[row]
        if len(ids) > p.max_tokens:  # the request's max_tokens below the engine's: the same prefix, cut
            ids, logprobs, ended = ids[: p.max_tokens], logprobs[: p.max_tokens], False
            text = endpoint.tokenizer.decode(ids, skip_special_tokens=True)
        cut = stop_at(ids, endpoint.tokenizer, p.stops) if p.stops else None
        if cut is not None:  # the tokens before the first stop sequence, their text returned (sessions.stop_at)
            ids, logprobs, text, ended = ids[: cut[0]], logprobs[: cut[0]], cut[1], True
        choice = Choice(ids=list(ids), logprobs=list(logprobs), text=text, ended=ended, prompt_tokens=len(p.context))
        if rollout.top_k_ids is not None and rollout.top_k_logprobs is not None:  # cut as the reply's tokens were
            choice.top_ids = rollout.top_k_ids[row][: len(ids)]
            choice.top_logprobs = rollout.top_k_logprobs[row][: len(ids)]
        choice.stop = cut[2] if cut is not None else ""
        choice.message = reply_message(choice, p.with_tools)
        choices[id(p)].append(choice)
    endpoint.counts["engine_calls"] += 1
    endpoint.counts["engine_rows"] += len(rows)
    with endpoint.lock:
        for p in batch:
            p.session.record(choices[id(p)], p.segment)
    for p in batch:
        if not p.future.done():
            p.future.set_result(choices[id(p)])


def _episode(endpoint: Endpoint, run: AgentRun, tokenizer) -> Episode:
    """The stored episode of ``run`` (``oprl.episodes.endpoint.sessions``: the last segment), rewarded."""
    with endpoint.lock:
        if run.session_id in endpoint.sessions:
            endpoint.close(run.session_id)
        episode = run.session.finish()
    if episode is None:  # no request reached the engine: one end-of-turn token, no gradient
        episode = Episode(prompt_ids=encode_problem(tokenizer, run.problem), top_k=run.session.record_top_k)
        episode.add([tokenizer.eos_token_id], None)
        if run.session.overflowed:  # its only prompt was past the model's context: truncated, not a fault
            episode.truncated, run.fault = True, ""
        elif not run.fault:
            run.fault, run.result = "no_request", "the agent returned without asking the model"
    if run.fault == "raised" and episode.truncated:  # the 400 of a spent budget, re-raised: truncation, not a fault
        run.fault = ""
    episode.lost = run.fault == "lost"
    notes: dict[str, Any] = {}
    if not run.fault and not episode.truncated:
        try:  # a NaN, an inf or 1e30 never reaches the advantages (the dataset path's bound, one home)
            episode.reward, notes = agent_reward(run.result)
        except TypeError as exc:
            run.fault, run.result = "bad_return", str(exc)
    if run.fault or episode.reward is None:
        episode.reward = Reward(total=0.0, components={})
    s = run.session
    episode.info = {
        "segments": float(max(s.segments, 1)),
        "dropped_tokens": float(s.dropped_tokens),
        "refused_requests": float(s.refused),
        "agent_failed": float(bool(run.fault)),
    }
    if notes:
        episode.info["agent_notes"] = notes
    return episode


def _report(endpoint: Endpoint, runs: list[AgentRun], calls: int, stop_after: int = 0, agent: str = "") -> None:
    """One line per failed episode naming ``agent`` (``task.agent``); when every episode failed, one line with
    the most common cause instead, and an ``OprlError`` once ``stop_after`` batches in a row failed whole (0:
    never)."""
    faults = Counter(r.fault for r in runs if r.fault)
    causes = Counter(f"{r.fault}: {str(r.result)[:240]}" for r in runs if r.fault)
    if runs and len(causes) and sum(causes.values()) == len(runs):
        endpoint.failed_batches += 1
        cause, count = causes.most_common(1)[0]
        log.warning(
            "agent %s: all %d episodes of this batch failed; most common cause (%d): %s", agent, len(runs), count, cause
        )
        if stop_after and endpoint.failed_batches >= stop_after:
            raise OprlError(
                f"task.agent: every episode of the last {stop_after} batches failed (most common cause: {cause}); "
                "fix the agent, or set task.max_failed_batches=0 to go on"
            )
    else:
        endpoint.failed_batches = 0
        lost = [r for r in runs if r.fault == "lost"]
        if lost:  # one line, not one per episode: a connection failure rarely comes alone
            log.warning(
                "agent %s: %d of %d episodes lost to the infrastructure, left out of their groups (episode/lost); "
                "e.g. episode %d: %s",
                agent,
                len(lost),
                len(runs),
                lost[0].index,
                lost[0].result,
            )
        for run in runs:
            if run.fault and run.fault != "lost":
                log.warning(
                    "agent %s, episode %d (%s) scores 0: %s: %s",
                    agent,
                    run.index,
                    run.problem.task_id,
                    run.fault,
                    run.result,
                )
    rewritten = sum(r.session.segments > 1 for r in runs)
    if rewritten:
        log.info(
            "agent: %d of %d episodes rewrote their history (new segments); the last segment is stored",
            rewritten,
            len(runs),
        )
    log.debug("agent: %d engine calls for %d episodes; faults %s", calls, len(runs), dict(faults))
