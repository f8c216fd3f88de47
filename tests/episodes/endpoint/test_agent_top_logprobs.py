"""The agent endpoint's ``logprobs`` / ``top_logprobs`` through the real ``openai`` client: chat
(``logprobs=true, top_logprobs=N``), completions (``logprobs=N``) and the Responses API (``top_logprobs=N`` with
``include=["message.output_text.logprobs"]``), whole and streamed. The alternatives are the sampler's recorded
top-K of the distribution each token was drawn from (``oprl.rollout.base.top_logprobs``), checked against an
independent reference: ``log_softmax`` of the tiny model's logits at the position, divided by the sampling
temperature, top N. The stored rows do not change when an agent asks for them, and carry the run's
``rollout.record_top_k`` when it is set. Refusals: one 400 naming the field (an engine without top log-probs,
N past 20, ``top_logprobs`` without ``logprobs``)."""

import json
import math

import httpx
import pytest
import torch
from test_agent_endpoint import agent_task, run
from test_agent_options import ScriptEngine

from oprl.episodes.endpoint.openai_api import token_bytes
from oprl.models.tiny import build_model, build_tokenizer
from oprl.rollout import Sampling
from oprl.rollout.lean_engine import LeanEngine

TEMPERATURE, N = 0.7, 5
INCLUDE = ["message.output_text.logprobs"]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, seed=3)


def lean(model, tokenizer, record_top_k: int = 0) -> LeanEngine:
    sampling = Sampling(TEMPERATURE)
    return LeanEngine(model, tokenizer, sampling=sampling, max_new_tokens=8, record_top_k=record_top_k)


def reference(model, prompt: list[int], response: list[int], n: int) -> tuple[list[list[int]], list[list[float]]]:
    """Per response token: the ids and log-probs of the ``n`` largest entries of ``log_softmax(logits / T)`` at
    its position, from one plain forward over prompt + response."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0].float()  # (P + R, V)
    scores = logits[len(prompt) - 1 : len(prompt) - 1 + len(response)] / TEMPERATURE  # (R, V)
    values, ids = torch.log_softmax(scores, dim=-1).topk(n, dim=-1)
    return ids.tolist(), values.tolist()


def ask(client, mode: str, messages: list[dict], n: int = N):
    """One request in ``mode``; ``(sampled [(token, logprob)], alternatives [[(token, logprob)]])`` as the openai
    client parsed them."""
    if mode.startswith("chat"):
        kw = {"model": "policy", "messages": messages, "logprobs": True, "top_logprobs": n}
        if mode == "chat":
            content = client.chat.completions.create(**kw).choices[0].logprobs.content
        else:
            chunks = client.chat.completions.create(**kw, stream=True)
            content = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
        for t in content:  # bytes as OpenAI gives them: the token's own UTF-8
            assert t.bytes == list(t.token.encode()) and all(a.bytes == list(a.token.encode()) for a in t.top_logprobs)
        return [(t.token, t.logprob) for t in content], [
            [(a.token, a.logprob) for a in t.top_logprobs] for t in content
        ]
    if mode.startswith("responses"):
        kw = {"model": "policy", "input": messages, "top_logprobs": n, "include": INCLUDE}
        if mode == "responses":
            items = client.responses.create(**kw).output[0].content[0].logprobs
        else:
            events = list(client.responses.create(**kw, stream=True))
            items = [lp for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
            done = next(e for e in events if e.type == "response.completed").response.output[0].content[0].logprobs
            assert [(t.token, t.logprob) for t in done] == [(t.token, t.logprob) for t in items]
        return [(t.token, t.logprob) for t in items], [[(a.token, a.logprob) for a in t.top_logprobs] for t in items]
    prompt = messages[0]["content"]
    if mode == "completions":
        logprobs = client.completions.create(model="policy", prompt=prompt, logprobs=n).choices[0].logprobs
    else:
        chunks = client.completions.create(model="policy", prompt=prompt, logprobs=n, stream=True)
        logprobs = next(c.choices[0].logprobs for c in chunks if c.choices[0].logprobs is not None)
    sampled = list(zip(logprobs.tokens, logprobs.token_logprobs, strict=True))
    return sampled, [list(top.items()) for top in logprobs.top_logprobs]


MODES = ["chat", "chat-stream", "completions", "completions-stream", "responses", "responses-stream"]


@pytest.mark.parametrize("mode", MODES)
def test_top_logprobs_are_the_samplers_top_n_of_the_tempered_distribution(model, tokenizer, mode):
    seen = {}

    def agent(client, problem):
        seen["reply"] = ask(client, mode, [{"role": "user", "content": "12+30="}])
        return 1.0

    task = agent_task(agent)
    [episode] = run(lean(model, tokenizer), tokenizer, task, task.problems("train")[:1], max_turns=2)
    sampled, alternatives = seen["reply"]
    hidden = set(tokenizer.all_special_ids) if not mode.startswith("completions") else set()
    positions = [t for t, token in enumerate(episode.response_ids) if token not in hidden]  # chat: no EOS
    ids, values = reference(model, episode.prompt_ids, episode.response_ids, N)
    assert len(sampled) == len(positions) > 0
    for t, (token, logprob), alts in zip(positions, sampled, alternatives, strict=True):
        assert token == tokenizer.decode([episode.response_ids[t]])
        assert logprob == pytest.approx(episode.behavior_logprobs[t], abs=1e-6)
        expected = [(tokenizer.decode([i]), v) for i, v in zip(ids[t], values[t], strict=True)]
        if mode.startswith("completions"):  # {token: logprob}: the N, plus the sampled token when not among them
            expected = list({**dict(expected), **({} if token in dict(expected) else {token: logprob})}.items())
        assert [a for a, _ in alts] == [a for a, _ in expected]
        assert [v for _, v in alts] == pytest.approx([v for _, v in expected], abs=1e-5)
    # The sampled token is drawn from that distribution: its log-prob is the reference's at its id.
    assert episode.behavior_logprobs[positions[0]] <= values[positions[0]][0] + 1e-6


def test_chat_and_responses_answer_the_same_values(model, tokenizer):
    replies = []

    def agent(client, problem):
        replies.append(ask(client, "chat" if not replies else "responses", [{"role": "user", "content": "7*6="}]))
        return 1.0

    task = agent_task(agent)
    for _ in range(2):  # one episode each, same seed and context: the same sample
        run(lean(model, tokenizer), tokenizer, task, task.problems("train")[:1], max_turns=2)
    assert replies[0] == replies[1] and replies[0][0]


def rows(episodes) -> list:
    return [
        json.dumps([e.prompt_ids, e.response_ids, e.loss_mask, e.behavior_logprobs, e.top_k_ids, e.top_k_logprobs])
        for e in episodes
    ]


@pytest.mark.parametrize("record_top_k", [0, 2])
def test_rows_do_not_change_when_an_agent_asks_for_top_logprobs(model, tokenizer, record_top_k):
    """Two-turn agents, one asking ``top_logprobs=8`` each turn, one asking nothing: stored rows byte-equal. With
    ``rollout.record_top_k=2`` the rows carry the sampler's top 2 at each sampled token (the reference's) and
    nothing (id 0, ``-inf``) at context tokens, as the dataset path's rows carry them to the trainer."""

    def agent(top):
        def body(client, problem):
            messages = [{"role": "user", "content": "3+4="}]
            for _ in range(2):
                kw = {"logprobs": True, "top_logprobs": top} if top else {}
                reply = client.chat.completions.create(model="policy", messages=messages, **kw)
                messages += [{"role": "assistant", "content": reply.choices[0].message.content}]
                messages += [{"role": "user", "content": "and?"}]
            return 1.0

        return body

    stored = []
    for top in (8, 0):
        task = agent_task(agent(top))
        episodes = run(lean(model, tokenizer, record_top_k), tokenizer, task, task.problems("train")[:2], max_turns=3)
        stored.append(rows(episodes))
    assert stored[0] == stored[1]
    [first, *_] = episodes
    if not record_top_k:
        assert first.top_k == 0 and first.top_k_ids == [] and first.top_k_logprobs == []
        return
    assert len(first.top_k_ids) == len(first.top_k_logprobs) == len(first.response_ids) and sum(first.loss_mask) > 0
    ids, values = reference(model, first.prompt_ids, first.response_ids, 2)
    for t, sampled in enumerate(first.loss_mask):
        if sampled:
            assert first.top_k_ids[t] == ids[t] and first.top_k_logprobs[t] == pytest.approx(values[t], abs=1e-5)
        else:
            assert first.top_k_ids[t] == [0, 0] and first.top_k_logprobs[t] == [-math.inf, -math.inf]


def test_top_logprobs_refusals_name_the_field(tokenizer, model):
    refused = {}

    def agent(client, problem):
        messages = [{"role": "user", "content": "1="}]
        headers = {"Authorization": f"Bearer {client.api_key}"}
        for name, kw in {
            "chat": {"logprobs": True, "top_logprobs": 2},
            "without logprobs": {"top_logprobs": 2},
            "too many": {"logprobs": True, "top_logprobs": 21},
        }.items():
            r = httpx.post(
                str(client.base_url) + "chat/completions", json={"messages": messages, **kw}, headers=headers
            )
            refused[name] = (r.status_code, r.json()["error"]["message"])
        for name, kw in {
            "responses": {"top_logprobs": 2, "include": INCLUDE},
            "responses 21": {"top_logprobs": 21},
        }.items():
            r = httpx.post(str(client.base_url) + "responses", json={"input": "1=", **kw}, headers=headers)
            refused[name] = (r.status_code, r.json()["error"]["message"])
        r = httpx.post(str(client.base_url) + "completions", json={"prompt": "1=", "logprobs": 2}, headers=headers)
        refused["completions"] = (r.status_code, r.json()["error"]["message"])
        return 1.0

    task = agent_task(agent)
    run(ScriptEngine(tokenizer), tokenizer, task, task.problems("train")[:1])
    assert all(status == 400 for status, _ in refused.values()), refused
    engine = "the engine (ScriptEngine) records no top log-probs"
    assert refused["chat"][1].startswith("top_logprobs=2: " + engine)
    assert refused["responses"][1].startswith("top_logprobs=2: " + engine)
    assert refused["completions"][1].startswith("logprobs=2: " + engine)
    assert refused["without logprobs"][1] == "top_logprobs=2: needs logprobs=true"
    assert refused["too many"][1].startswith("top_logprobs: ")
    assert refused["responses 21"][1].startswith("top_logprobs=21: ")


def test_token_bytes_of_a_byte_level_tokenizer_are_the_tokens_own():
    """OpenAI's ``bytes``: a token holding part of a multi-byte character gives its bytes, not U+FFFD's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode  # the byte alphabet, independently

    alphabet = bytes_to_unicode()
    vocab = {alphabet[b]: b for b in range(256)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer, core.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core)
    ids = tokenizer("é!", add_special_tokens=False).input_ids
    assert [token_bytes(tokenizer, i) for i in ids] == [[0xC3], [0xA9], [0x21]]
    assert tokenizer.decode(ids[:1]) == "\ufffd"  # what the token's text shows


TWO_TURN_AGENT = '''
def rollout(client, problem):
    """Two turns (stops at common characters, so the untrained model ends them), asking top_logprobs=5."""
    messages = [{"role": "user", "content": "1+2="}]
    for _ in range(2):
        reply = client.chat.completions.create(
            model="policy", messages=messages, stop=["1", "2", "3", "e"], logprobs=True, top_logprobs=5
        )
        messages += [{"role": "assistant", "content": reply.choices[0].message.content}]
        messages += [{"role": "user", "content": "?"}]
    return float(len(reply.choices[0].message.content) % 2)
'''


def test_an_agent_run_recording_top_k_stores_it_for_the_trainer(tmp_path):
    """``oprl train`` with an agent task and ``rollout.record_top_k=2`` (refused for every multi-turn task before):
    each stored row carries 2 alternatives per response token, the sampler's at sampled tokens (most likely
    first, the sampled token's log-prob at most the first's) and none at context tokens, and the trainer takes
    them (``trainer.inputs.top_k_of``: one K for every row, else the step fails)."""
    from oprl.checkpoint.store import read_parquet
    from oprl.cli import main
    from oprl.tasks.agent import load_agent

    save = load_agent("examples/agents/tiny_long_context.py:save")  # the documented long-context copy
    (tmp_path / "agent.py").write_text(TWO_TURN_AGENT)
    args = [
        "task.name=agent",
        f"task.agent={tmp_path / 'agent.py'}:rollout",
        "task.problems.train_size=8",
        "task.problems.test_size=2",
        f"model.path={save(str(tmp_path / 'tiny-256'), 256)}",
        "rollout.prompts_per_step=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=12",
        "rollout.max_turns=2",
        "rollout.max_episode_tokens=64",
        "rollout.record_top_k=2",
        "eval.interval=0",
        "progress=false",
        "tensorboard=false",
        "runtime.torch_threads=1",
        f"output_dir={tmp_path / 'runs'}",
        "run_name=top-k",
        "steps=2",
    ]
    assert main(["train", *args]) == 0
    rows = [
        e
        for batch in (1, 2)
        for e in read_parquet(tmp_path / "runs" / "top-k" / "experiences" / f"batch-{batch:06d}.parquet")
    ]
    assert rows and sum(sum(e.loss_mask) for e in rows) > 0
    for e in rows:
        assert [len(p) for p in e.top_k_ids] == [2] * len(e.response_ids) == [len(p) for p in e.top_k_logprobs]
        for mask, lp, ids, top in zip(e.loss_mask, e.behavior_logprobs, e.top_k_ids, e.top_k_logprobs, strict=True):
            if mask:
                assert top[0] >= top[1] > -math.inf and lp <= top[0] + 1e-6
            else:
                assert ids == [0, 0] and top == [-math.inf, -math.inf]
