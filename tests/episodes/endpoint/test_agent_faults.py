"""Nothing a request does stops the run (issue 41, faults 1-7): each hostile request gets its 4xx (or one
500 and one log line), the batch finishes, the other episodes' rows are what they would be without it, and
no traceback reaches stderr."""

import json
import resource
import threading
import time

import httpx
import pytest
from test_agent_endpoint import EndingEngine, agent_task, run

from oprl.errors import OprlError
from oprl.models.tiny import build_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


class ContextEngine(EndingEngine):
    """``EndingEngine`` with the tiny model's context of 128 positions."""

    context = 128


def post(client, path: str, content: bytes | None = None, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {client.api_key}", "Content-Type": "application/json"}
    return httpx.post(str(client.base_url) + path, content=content, headers=headers, timeout=60, **kw)


def plain(client, problem) -> float:
    """A well-behaved agent: one question, reward 1."""
    client.chat.completions.create(model="policy", messages=problem["messages"])
    return 1.0


def batch_with(engine, tokenizer, hostile, **kw):
    """Episode 0 runs ``hostile(client, problem)`` (it returns the statuses it got), episode 1 the plain agent;
    returns (episodes, statuses)."""
    statuses = []

    def agent(client, problem):
        if problem["task_id"] == first:
            statuses.extend(hostile(client, problem))
            return plain(client, problem)
        return plain(client, problem)

    task = agent_task(agent, **kw)
    problems = task.problems("train")[:2]
    first = problems[0].task_id
    return run(engine, tokenizer, task, problems), statuses


def reference_rows(tokenizer):
    episodes, _ = batch_with(ContextEngine(tokenizer), tokenizer, lambda client, problem: [])
    return [(e.prompt_ids, e.response_ids, e.loss_mask, e.behavior_logprobs) for e in episodes]


BODIES = {
    "a token id past the vocabulary": ("completions", {"prompt": [5, 10**6]}, 400, "not in 0.."),
    "a token id of -1": ("completions", {"prompt": [5, -1]}, 400, "not in 0.."),
    "a token id of 10**12": ("completions", {"prompt": [10**12]}, 400, "not in 0.."),
    "a message without role": ("chat/completions", {"messages": [{"content": "hi"}]}, 400, "role"),
    "tool_calls not objects": (
        "chat/completions",
        {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": ["x"]}]},
        400,
        "tool_calls",
    ),
    "a tool call without a function": (
        "chat/completions",
        {"messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "1", "type": "function"}]}]},
        400,
        "function",
    ),
    "an image part": (
        "chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        400,
        "messages.0.content.0: image_url",
    ),
    "a request as a list": ("chat/completions", [1, 2], 400, "not a JSON object"),
}
RAW = {
    "100,000-deep nesting": (b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nests deeper"),
    "70-deep nesting": (b'{"messages": [{"role": "user", "content": "x", "z": ' + b"[" * 70 + b"]" * 70 + b"}]}", "64"),
    "a lone surrogate": (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "messages.0.content: not valid"),
    "not UTF-8": (b'{"messages": [{"role": "user", "content": "\xff"}]}', "not JSON"),
}


def test_hostile_bodies_are_one_400_each_and_the_run_goes_on(tokenizer, capfd):
    """Faults 2 and 4: ids outside the vocabulary, nesting, lone surrogates, message shapes, malformed
    tool_calls: 400 naming the culprit, no traceback, the other episode's row unchanged."""
    before = reference_rows(tokenizer)

    def hostile(client, problem):
        out = []
        for name, (path, body, status, text) in BODIES.items():
            r = post(client, path, json.dumps(body).encode())
            out.append((name, r.status_code, r.json()["error"]["message"], status, text))
        for name, (raw, text) in RAW.items():
            r = post(client, "chat/completions", raw)
            out.append((name, r.status_code, r.json()["error"]["message"], 400, text))
        return out

    episodes, statuses = batch_with(ContextEngine(tokenizer), tokenizer, hostile)
    for name, got, message, status, text in statuses:
        assert got == status and text in message, (name, got, message)
    assert episodes[0].info["refused_requests"] == len(BODIES) + len(RAW)
    after = [(e.prompt_ids, e.response_ids, e.loss_mask, e.behavior_logprobs) for e in episodes]
    assert after == before  # the hostile requests changed no row
    assert "Traceback" not in capfd.readouterr().err


def test_a_context_past_the_model_is_a_400_naming_the_limit(tokenizer):
    """Fault 1: a tool schema that makes the prompt longer than the model's context: a 400 naming the limit,
    the episode truncated (scores 0, counted), nothing past the context stored, the batch goes on."""
    tools = [{"type": "function", "function": {"name": "add", "description": "x" * 300}}]

    def hostile(client, problem):
        r = post(client, "chat/completions", json.dumps({"messages": problem["messages"], "tools": tools}).encode())
        return [(r.status_code, r.json()["error"]["message"])]

    def agent(client, problem):
        if problem["task_id"].endswith("0"):
            client.chat.completions.create(model="policy", messages=problem["messages"])
            r = post(client, "chat/completions", json.dumps({"messages": problem["messages"], "tools": tools}).encode())
            seen.append((r.status_code, r.json()["error"]["message"]))
            return 1.0
        return plain(client, problem)

    seen: list = []
    task = agent_task(agent)
    problems = task.problems("train")[:2]
    episodes = run(ContextEngine(tokenizer), tokenizer, task, problems)
    [(status, message)] = seen
    assert status == 400 and "past the 118" in message and "rollout.max_new_tokens" in message
    assert episodes[0].truncated and episodes[0].outcome.total == 0.0 and episodes[0].info["refused_requests"] == 1
    assert not episodes[1].truncated and episodes[1].outcome.total == 1.0
    assert all(len(e.prompt_ids) + len(e.response_ids) <= ContextEngine.context for e in episodes)
    # A first request past the context is refused before it is tokenized; a shorter one after it is served.
    episodes, statuses = batch_with(ContextEngine(tokenizer), tokenizer, hostile)
    assert statuses[0][0] == 400 and "past the 118" in statuses[0][1]
    assert episodes[0].outcome.total == 1.0 and episodes[0].info["refused_requests"] == 1


def test_a_large_body_is_a_413_before_it_is_read_whole(tokenizer):
    """Fault 3: a 50 MB body, declared or chunked, is refused at task.max_request_bytes; memory stays bounded."""

    def hostile(client, problem):
        big = b'{"messages": [{"role": "user", "content": "' + b"x" * (50 * 2**20) + b'"}]}'
        declared = post(client, "chat/completions", big)

        def chunks():
            yield big[: 2**20]
            for start in range(2**20, len(big), 2**20):
                yield big[start : start + 2**20]

        chunked = post(client, "chat/completions", chunks())
        small = b'{"messages": [{"role": "user", "content": "' + b"x" * (2 * 2**20) + b'"}]}'
        under = post(client, "chat/completions", small)  # under the limit: refused by the context check
        return [declared.status_code, chunked.status_code, under.status_code, under.json()["error"]["message"]]

    rss_before = _rss_mb()
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    episodes, statuses = batch_with(ContextEngine(tokenizer), tokenizer, hostile, max_request_bytes=4 * 2**20)
    assert statuses[:3] == [413, 413, 400] and "past the 118" in statuses[3]
    assert episodes[1].outcome.total == 1.0
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - max(peak_before, rss_before)
    assert grown < 400, f"peak RSS grew by {grown:.0f} MB"  # the client holds the 50 MB body twice


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def test_a_request_after_the_agent_returned_is_a_404_and_leaves_the_row(tokenizer):
    """Fault 5: a request to an episode's session 1 s after its agent returned, while another episode still
    runs, gets a 404 and cannot touch the stored row."""
    kept = {}

    def agent(client, problem):
        if problem["task_id"].endswith("0"):
            kept["client"] = client
            kept["reply"] = client.chat.completions.create(model="policy", messages=problem["messages"])
            kept["returned"] = time.monotonic()
            return 1.0
        while "returned" not in kept:
            time.sleep(0.01)
        time.sleep(1.0)
        message = kept["reply"].choices[0].message.content
        late = [*problem["messages"], {"role": "assistant", "content": message}, {"role": "user", "content": "x"}]
        r = post(kept["client"], "chat/completions", json.dumps({"messages": late}).encode())
        kept["late"] = (r.status_code, r.json()["error"]["message"])
        return plain(client, problem)

    engine = EndingEngine(tokenizer)
    task = agent_task(agent)
    episodes = run(engine, tokenizer, task, task.problems("train")[:2])
    assert kept["late"][0] == 404
    first = episodes[0]
    assert first.response_ids == engine.sampled[0][0] and first.loss_mask == [1] * len(first.response_ids)
    assert first.outcome.total == 1.0 and first.info["segments"] == 1


def test_concurrent_requests_cannot_pass_max_turns(tokenizer):
    """Fault 6: 20 requests of one session at once with rollout.max_turns=3: at most 3 are served."""
    codes: list[int] = []

    def agent(client, problem):
        body = json.dumps({"messages": problem["messages"]}).encode()

        def one():
            codes.append(post(client, "chat/completions", body).status_code)

        threads = [threading.Thread(target=one) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return 1.0

    task = agent_task(agent)
    [episode] = run(EndingEngine(tokenizer), tokenizer, task, task.problems("train")[:1], max_turns=3)
    assert codes.count(200) <= 3 and codes.count(400) >= 17 and set(codes) <= {200, 400}
    assert episode.info["refused_requests"] == codes.count(400)


def test_option_refusals_are_counted_and_an_all_failed_batch_is_one_line(tokenizer, caplog):
    """Fault 7: refused options count in episode/refused_requests_mean; a batch in which every episode failed
    is one warning line with the most common cause; task.max_failed_batches such batches stop the run."""

    def agent(client, problem):
        client.chat.completions.create(model="policy", messages=problem["messages"], tool_choice="required")

    task = agent_task(agent, max_failed_batches=2)
    problems = task.problems("train")[:4]
    episodes = run(EndingEngine(tokenizer), tokenizer, task, problems)
    assert [e.info["refused_requests"] for e in episodes] == [1.0] * 4
    assert [e.info["agent_failed"] for e in episodes] == [1.0] * 4
    lines = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert len(lines) == 1 and "all 4 episodes" in lines[0] and "tool_choice" in lines[0]
    with pytest.raises(OprlError, match=r"last 2 batches failed .*tool_choice"):
        run(EndingEngine(tokenizer), tokenizer, task, problems)


def test_an_unexpected_error_is_one_500_and_one_log_line(tokenizer, caplog, capfd):
    task = agent_task(plain)
    seen = []

    def agent(client, problem):
        endpoint = task.endpoint
        real = endpoint.submit
        endpoint.submit = lambda *a: (_ for _ in ()).throw(KeyError("boom"))
        r = post(client, "chat/completions", json.dumps({"messages": problem["messages"]}).encode())
        endpoint.submit = real
        seen.append((r.status_code, r.json()["error"]["message"]))
        return plain(client, problem)

    task.rollout = agent
    [episode] = run(EndingEngine(tokenizer), tokenizer, task, task.problems("train")[:1])
    assert seen == [(500, "internal error: KeyError (logged by the explorer)")] and episode.outcome.total == 1.0
    lines = [r.getMessage() for r in caplog.records if "500 on" in r.getMessage()]
    assert len(lines) == 1 and lines[0].endswith("/v1/chat/completions: KeyError: 'boom'")
    assert "Traceback" not in capfd.readouterr().err


def test_closing_a_session_twice_does_nothing(tokenizer):
    """An agent returning just as its timeout passes closes its session twice: the second is a no-op, never a
    KeyError in the explorer thread."""
    from oprl.episodes.endpoint.server import Endpoint
    from oprl.episodes.endpoint.sessions import Session

    endpoint = Endpoint(tokenizer)
    try:
        session_id = endpoint.open(Session(0, tokenizer, 3, 48))
        assert endpoint.close(session_id) is not None and endpoint.close(session_id) is None
    finally:
        endpoint.stop()


@pytest.mark.parametrize("size", [20_000, 300])
def test_a_refused_tool_result_keeps_the_reply_the_agent_was_given(tokenizer, size):
    """Issue 67, item 4: a tool result past the context ends the episode (400, truncated) with the reply the agent
    had been given stored, sampled tokens and log-probs, whether it is refused before tokenizing (20,000
    characters; 9790d4b: 0 tokens stored and 0 counted dropped) or after (300, the smaller over-limit result,
    which kept it already)."""

    def agent(client, problem):
        messages = list(problem["messages"])
        reply = client.chat.completions.create(model="policy", messages=messages).choices[0].message
        messages += [{"role": "assistant", "content": reply.content}, {"role": "tool", "content": "7" * size}]
        r = post(client, "chat/completions", json.dumps({"messages": messages}).encode())
        seen.append((r.status_code, r.json()["error"]["message"]))
        return 1.0

    seen: list = []
    engine = ContextEngine(tokenizer)
    engine.sampled = []
    task = agent_task(agent)
    [episode] = run(engine, tokenizer, task, task.problems("train")[:1])
    [(status, message)] = seen
    assert status == 400 and "past the 118" in message
    [[sampled]] = engine.sampled  # the one reply: "[2*3]" and EOS
    assert episode.truncated and episode.outcome.total == 0.0
    assert episode.response_ids == sampled and episode.loss_mask == [1] * len(sampled)
    assert episode.behavior_logprobs == [-0.25] * len(sampled) and episode.info["dropped_tokens"] == 0


def test_a_reply_that_arrives_after_its_segment_ended_is_counted_dropped(tokenizer):
    """A request in flight while another of the session is refused past the context: the segment ends
    truncated, and the reply that comes after is counted in ``dropped_tokens`` (9790d4b: neither stored nor
    counted)."""
    from oprl.episodes.endpoint.sessions import Choice, RequestRefused, Session

    session = Session(0, tokenizer, max_turns=4, max_tokens=48, token_chars=4)
    messages = [{"role": "user", "content": "2*3="}]
    session.chat_context(messages, [], room=118)
    segment = session.reserve()  # its reply is being sampled
    with pytest.raises(RequestRefused, match="past the 118"):
        session.chat_context([*messages, {"role": "user", "content": "7" * 2000}], [], room=118)
    session.record([Choice(ids=[28, 26, 2], logprobs=[-0.1] * 3, text="42", ended=True)], segment)
    episode = session.finish()
    assert episode.truncated and session.dropped_tokens == 3 and 28 not in episode.response_ids
