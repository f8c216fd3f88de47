"""No request, agent or client stops a run of an agent task (issue 52, items 4-12), each with the real ``openai``
client or raw HTTP: empty prompts and malformed Responses fields are 400s naming the field, one agent closing its
client leaves the others' pool open, a flood of empty messages is refused before it is rendered, the evaluation
endpoint never takes the explorer's ``task.port`` and every endpoint stops with its run, and ``sync.partial``
with an agent task is refused by the configuration."""

import asyncio
import json
import socket
import threading
import time

import httpx
import openai
import pytest
from test_agent_sessions import Recorder, run_agent

from oprl.cli import main
from oprl.config import load_config
from oprl.episodes.agents import close_task, endpoint_of
from oprl.episodes.endpoint.sessions import RequestRefused, Session
from oprl.episodes.evaluation import evaluation_row
from oprl.models.tiny import build_tokenizer
from oprl.tasks import build_task
from oprl.tasks.agent import AgentTaskConfig, load_agent


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def post(client, path: str, body: bytes) -> httpx.Response:
    headers = {"Authorization": f"Bearer {client.api_key}", "Content-Type": "application/json"}
    return httpx.post(str(client.base_url) + path, content=body, headers=headers, timeout=30)


def test_an_empty_completion_prompt_is_a_400_naming_it(tokenizer):
    """Item 4: ``"prompt": ""`` and ``[]`` (4db1016: the engine's RuntimeError, re-raised: the run stopped)."""
    seen = []

    def agent(client, problem):
        for prompt in ("", []):
            with pytest.raises(openai.BadRequestError) as refused:
                client.completions.create(model="policy", prompt=prompt)
            seen.append(refused.value.message)
        return float(
            client.completions.create(model="policy", prompt="<|user|>hi</s><|assistant|>").choices[0].text == "ok"
        )

    _, [episode] = run_agent(agent, Recorder(tokenizer), tokenizer)
    assert all("prompt: empty" in m for m in seen), seen
    assert episode.outcome.total == 1.0 and episode.info["refused_requests"] == 2


def test_malformed_responses_fields_are_400s_naming_the_field(tokenizer):
    """Item 9: fields of the wrong type (4db1016: 500 each) and a NaN temperature (4db1016: accepted)."""
    answers = []
    bodies = [
        {"text": "plain"},
        {"text": {"format": "json"}},
        {"reasoning": "high"},
        {"tools": 5},
        {"instructions": ["be brief"]},
    ]

    def agent(client, problem):
        for extra in bodies:
            response = post(client, "responses", json.dumps({"model": "policy", "input": "hi"} | extra).encode())
            answers.append((response.status_code, response.json()["error"]["message"]))
        for path, body in (("responses", '{"input": "hi", "temperature": NaN}'), ("chat/completions", "")):
            body = body or '{"messages": [{"role": "user", "content": "hi"}], "top_p": Infinity}'
            response = post(client, path, body.encode())
            answers.append((response.status_code, response.json()["error"]["message"]))
        return 1.0

    run_agent(agent, Recorder(tokenizer), tokenizer)
    assert [status for status, _ in answers] == [400] * 7, answers
    for (_, message), field in zip(
        answers, ["text", "text.format", "reasoning", "tools", "instructions", "temperature", "top_p"], strict=True
    ):
        assert message.startswith(field + ":"), message


def test_one_agent_closing_its_client_leaves_the_others_pool_open(tokenizer):
    """Item 5: an agent's ``with client:`` and ``client.close()`` (4db1016: they closed the connection pool every
    sync agent shares; every later request failed and the run stopped after 5 failed batches)."""

    def agent(client, problem):
        if problem["task_id"].endswith("0"):
            with client:
                client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "a"}])
            return 1.0
        if problem["task_id"].endswith("1"):
            client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "a"}])
            client.close()
            return 1.0
        time.sleep(0.3)  # after the others closed theirs
        reply = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "b"}])
        return float(reply.choices[0].message.content == "ok")

    for _ in range(2):  # and the next batch, on the same endpoint
        task, episodes = run_agent(agent, Recorder(tokenizer), tokenizer, problems=4, batch_wait_s=0.0)
        assert [e.info["agent_failed"] for e in episodes] == [0.0] * 4
        assert [e.outcome.total for e in episodes] == [1.0] * 4
        close_task(task)


def test_a_flood_of_empty_messages_is_refused_before_it_is_rendered(tokenizer, monkeypatch):
    """Item 8: 20,000 empty messages are at least 40,000 tokens of the tiny template (``<|user|></s>`` each): a
    400 before the template renders them (4db1016 counted content only: 0 characters, so it rendered them all)."""
    import oprl.episodes.endpoint.sessions as sessions

    def no_render(*args, **kwargs):
        raise AssertionError("rendered")

    monkeypatch.setattr(sessions, "encode_prompt", no_render)
    session = Session(0, tokenizer, max_turns=4, max_tokens=400, token_chars=8, message_tokens=2)
    messages = [{"role": "user", "content": ""}] * 20_000
    with pytest.raises(RequestRefused) as refused:
        session.chat_context(messages, [], room=1000)
    assert refused.value.status == 400 and "at least 40000 tokens" in refused.value.message


def test_the_template_cost_of_a_message_is_measured(tokenizer):
    from oprl.episodes.endpoint.server import message_tokens

    assert message_tokens(tokenizer) == 2  # <|role|> and </s>


def test_evaluation_never_takes_the_explorers_port_and_stops_with_its_evaluation(tokenizer):
    """Items 6 and 12: with a fixed ``task.port``, the explorer's endpoint listens on it and the evaluation of the
    same run on a free port, stopped once it has evaluated (4db1016: both bound task.port, exit 1)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    fields = {"agent": "tests/episodes/endpoint/test_agent_sessions.py:chat_tool_agent", "port": port}
    fields["problems"] = {"name": "tool-arithmetic", "train_size": 8, "test_size": 2}
    explorer_task, evaluation_task = build_task(AgentTaskConfig(**fields)), build_task(AgentTaskConfig(**fields))
    explorer_endpoint = endpoint_of(explorer_task, tokenizer)
    assert explorer_endpoint.port == port
    config = load_config(
        overrides=[
            "task.name=agent",
            f"task.agent={fields['agent']}",
            f"task.port={port}",
            "task.problems.train_size=8",
            "task.problems.test_size=2",
            "eval.num_problems=2",
        ]
    )
    engine = Recorder(tokenizer)
    engine.weights_changed = lambda: None
    row = evaluation_row(config, engine, evaluation_task, tokenizer, step=1)
    assert row["eval/num_problems"] == 2.0 and row["eval/reward"] == 1.0  # served, on another port
    assert evaluation_task.endpoint is None
    close_task(explorer_task)
    assert explorer_task.endpoint is None and not explorer_endpoint.thread.is_alive()
    with socket.socket() as again:  # nothing listens on the port any more
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))


def test_partial_rollouts_with_an_agent_task_are_refused_by_the_configuration(capsys):
    """Item 11: one line and exit 2 from ``oprl config`` (4db1016: accepted; refused only at the first batch, after
    the warm start)."""
    args = ["task.name=agent", "task.agent=examples/calculator_agent.py:rollout", "sync.partial=true"]
    assert main(["config", *args, "runtime.overlap=true"]) == 2
    assert "sync.partial=true: agent tasks (task.name=agent)" in capsys.readouterr().err


def test_an_async_agent_that_cancels_a_request_leaves_no_traceback(tokenizer, capfd):
    """Item 10: the per-episode ``AsyncOpenAI`` is closed inside the agent's event loop, so a request the agent
    cancelled leaves nothing for a finalizer to close on a closed loop."""

    async def agent(client, problem):
        create = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "a"}])
        with pytest.raises((asyncio.TimeoutError, TimeoutError)):
            await asyncio.wait_for(create, 0.01)
        reply = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "b"}])
        return float(reply.choices[0].message.content == "ok")

    gate = threading.Event()  # the first call waits: the cancelled requests are in flight when cancelled
    threading.Timer(0.5, gate.set).start()
    _, episodes = run_agent(agent, Recorder(tokenizer, gate), tokenizer, problems=3)
    import gc

    gc.collect()
    assert [e.outcome.total for e in episodes] == [1.0] * 3
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Event loop is closed" not in err, err[-2000:]


def test_idle_and_surplus_connections_are_closed_and_the_endpoint_serves_on(tokenizer, monkeypatch):
    """Item 7, functionally (bounds in benchmarks/agent_endpoint_abuse.py): past ``ConnectionLimits.bound`` open
    ones a connection is closed at once, one that sends nothing or trickles its headers is closed after
    ``REQUEST_TIMEOUT_S``, and an agent is served all along (4db1016: none closed, the process ran out of files)."""
    import oprl.episodes.endpoint.server as endpoint_module
    from oprl.episodes.endpoint.connections import ConnectionLimits

    monkeypatch.setattr(endpoint_module, "REQUEST_TIMEOUT_S", 0.5)
    endpoint = endpoint_module.Endpoint(tokenizer)
    endpoint.limits = ConnectionLimits(bound=8, needed=8, per_session=8)
    try:
        idle = [socket.create_connection((endpoint.host, endpoint.port)) for _ in range(12)]
        idle[0].sendall(b"POST /s/x/v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        closed = []
        for sock in idle:
            sock.settimeout(3.0)
            try:
                closed.append(sock.recv(1) == b"")  # EOF: the endpoint closed it
            except ConnectionResetError:  # aborted: refused past ConnectionLimits.bound
                closed.append(True)
            except TimeoutError:  # still open after 3 s
                closed.append(False)
        assert closed == [True] * len(idle)
        models = httpx.get(endpoint.base_url("s") + "/models", headers={"Authorization": f"Bearer {endpoint.token}"})
        assert models.status_code == 200
    finally:
        for sock in idle:
            sock.close()
        endpoint.stop()


def test_a_run_with_a_fixed_port_finishes_and_leaves_no_endpoint_listening(tmp_path):
    """Items 6 and 12 end to end: ``oprl train`` of an agent task on a fixed ``task.port`` with an evaluation,
    in process: exit 0 (4db1016: exit 1, both endpoints bound the port), and afterwards nothing listens on it
    and no endpoint thread is left (4db1016: each in-process run left its two endpoints listening)."""
    save = load_agent("examples/agents/tiny_long_context.py:save")  # the documented long-context copy
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = save(str(tmp_path / "tiny-long"), 256)
    args = [
        "task.name=agent",
        "task.agent=examples/calculator_agent.py:rollout",
        f"task.port={port}",
        "task.problems.train_size=16",
        "task.problems.test_size=2",
        f"model.path={model}",
        "rollout.prompts_per_step=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=8",
        "rollout.max_turns=2",
        "rollout.max_episode_tokens=32",
        "eval.num_problems=2",
        "eval.interval=1",
        "progress=false",
        "tensorboard=false",
        "runtime.torch_threads=1",
        f"output_dir={tmp_path / 'runs'}",
        "run_name=port",
        "steps=1",
    ]
    before = endpoint_threads()  # other tests' endpoints, started without a run
    assert main(["train", *args]) == 0
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    assert endpoint_threads() <= before


def endpoint_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("oprl-endpoint") and t.is_alive()}
