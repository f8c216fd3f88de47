"""Partial rollouts in the lean engine: a response generated across a weight switch, token by token.

Before the switch the tokens equal a run that never switched; after it, the behaviour log-probs are what the
new weights give that prefix (stale cache kept, or the prefix recomputed), and every token carries the version
that sampled it. Each check fails if the switch is skipped, lands on a copy of the model, or versions are
tagged per response."""

import copy
import threading
import time

import pytest
import torch

from oprl.checkpoint.board import BoardClosed, close_board, post_weights
from oprl.explorer.switcher import Switcher
from oprl.models.chat import encode_prompt
from oprl.models.tiny import build_model, build_tokenizer
from oprl.rollout import LeanEngine
from oprl.schedule import policy_version, switch_version

SWITCH, LIMIT = 4, 10


@pytest.fixture(scope="module")
def policies():
    tokenizer = build_tokenizer()
    old = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, seed=3).eval()
    new = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, seed=4).eval()
    return old, new, tokenizer


def _prompts(tokenizer):
    texts = ["1+2=", "35+47-9=", "7=", "123*4-56+7="]
    return [encode_prompt(tokenizer, [{"role": "user", "content": t}]) for t in texts]


def _generate(policies, tmp_path, kv, switch=True):
    old, new, tokenizer = policies
    board = tmp_path / "board"
    post_weights(board, 1, new.state_dict())
    engine = LeanEngine(copy.deepcopy(old), tokenizer, max_new_tokens=LIMIT)
    switcher = Switcher(engine, board, 0, at_step=SWITCH, target=1 if switch else None, kv=kv)
    return engine.generate(_prompts(tokenizer), seed=5, switch=switcher), engine


def _logprobs_keep(old, new, prompt, response):
    """log pi(response[t]) for t >= SWITCH with the old weights' cache of prompt + response[:SWITCH - 1] and the
    new weights from there on: what a switch before decode step SWITCH with a kept cache computes."""
    with torch.no_grad():
        head = torch.tensor([prompt + response[: SWITCH - 1]])
        cache = old(input_ids=head, use_cache=True).past_key_values
        tail = torch.tensor([response[SWITCH - 1 : -1]])
        logits = new(input_ids=tail, past_key_values=cache, use_cache=True).logits[0]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(response[SWITCH:])[:, None]).squeeze(-1)


def _logprobs_all(model, prompt, response):
    """Teacher-forced log pi(response[t]) under ``model`` (every t)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


@pytest.mark.parametrize("kv", ["keep", "recompute"])
def test_response_across_a_switch(policies, tmp_path, kv):
    old, new, tokenizer = policies
    switched, engine = _generate(policies, tmp_path, kv)
    unswitched, _ = _generate(policies, tmp_path / "none", kv, switch=False)
    prompts = _prompts(tokenizer)
    long_rows = [i for i, r in enumerate(switched.response_ids) if len(r) > SWITCH + 1]
    assert len(long_rows) >= 2  # random weights rarely emit EOS
    for i in range(len(prompts)):
        response, behaviour = switched.response_ids[i], torch.tensor(switched.behavior_logprobs[i])
        # Before the switch: the very tokens and log-probs of the run that never switched (no extra draws).
        assert response[:SWITCH] == unswitched.response_ids[i][:SWITCH]
        assert behaviour[:SWITCH].tolist() == unswitched.behavior_logprobs[i][:SWITCH]
        assert torch.allclose(behaviour[:SWITCH], _logprobs_all(old, prompts[i], response)[:SWITCH], atol=1e-4)
        # Per token, not per response.
        assert switched.behavior_versions[i] == [0] * min(SWITCH, len(response)) + [1] * (len(response) - SWITCH)
    for i in long_rows:
        response, behaviour = switched.response_ids[i], torch.tensor(switched.behavior_logprobs[i])
        if kv == "recompute":  # the new weights' distribution of that prefix, all of it under the new weights
            expected = _logprobs_all(new, prompts[i], response)[SWITCH:]
        else:  # stale keys/values of the earlier tokens, new weights from the switch on
            expected = _logprobs_keep(old, new, prompts[i], response)
        assert torch.allclose(behaviour[SWITCH:], expected, atol=1e-4)
        assert not torch.allclose(behaviour[SWITCH:], _logprobs_all(old, prompts[i], response)[SWITCH:], atol=1e-2)
    # The engine's own model now serves the new weights (not a copy of them).
    assert all(
        torch.equal(p, q) for p, q in zip(engine.model.state_dict().values(), new.state_dict().values(), strict=True)
    )


def test_kept_and_recomputed_caches_differ_after_the_switch(policies, tmp_path):
    keep, _ = _generate(policies, tmp_path / "k", "keep")
    recompute, _ = _generate(policies, tmp_path / "r", "recompute")
    row = max(range(4), key=lambda i: len(keep.response_ids[i]))
    assert keep.response_ids[row][:SWITCH] == recompute.response_ids[row][:SWITCH]
    assert keep.behavior_logprobs[row][SWITCH] != pytest.approx(recompute.behavior_logprobs[row][SWITCH], abs=1e-6)


def test_switch_counts_decode_steps_over_calls(policies, tmp_path):
    """Episodes: one switcher over several generate calls; the switch can fall between two of them."""
    old, new, tokenizer = policies
    board = tmp_path / "board"
    post_weights(board, 1, new.state_dict())
    engine = LeanEngine(copy.deepcopy(old), tokenizer, max_new_tokens=LIMIT)
    switcher = Switcher(engine, board, 0, at_step=LIMIT, target=1)
    first = engine.generate(_prompts(tokenizer)[:1], seed=1, switch=switcher)  # runs LIMIT steps: no switch yet
    second = engine.generate(_prompts(tokenizer)[:1], seed=2, switch=switcher)
    assert first.behavior_versions == [[0] * len(first.response_ids[0])]
    assert second.behavior_versions == [[1] * len(second.response_ids[0])]
    assert switcher.changes == [(0, 0), (len(first.response_ids[0]), 1)]


def test_scheduled_switch_waits_for_the_version_and_stops_when_closed(policies, tmp_path):
    old, new, tokenizer = policies
    board = tmp_path / "board"
    board.mkdir()
    engine = LeanEngine(copy.deepcopy(old), tokenizer, max_new_tokens=LIMIT)
    lock = threading.RLock()
    posted = []

    def post_later():
        time.sleep(0.3)
        with lock:  # the waiting explorer let the sampling lock go
            posted.append(time.perf_counter())
        post_weights(board, 1, new.state_dict())

    threading.Thread(target=post_later).start()
    with lock:
        rollout = engine.generate(
            _prompts(tokenizer), seed=5, switch=Switcher(engine, board, 0, at_step=SWITCH, target=1, lock=lock)
        )
    assert posted and max(len(v) for v in rollout.behavior_versions) > SWITCH
    assert rollout.response_ids == _generate(policies, tmp_path / "again", "keep")[0].response_ids  # timing-free
    close_board(board)
    with pytest.raises(BoardClosed, match="version-000002"):
        engine.generate(_prompts(tokenizer), seed=5, switch=Switcher(engine, board, 1, at_step=SWITCH, target=2))


def test_free_running_takes_the_newest_posted_version_within_bound(policies, tmp_path):
    old, new, tokenizer = policies
    board = tmp_path / "board"
    post_weights(board, 1, new.state_dict())
    post_weights(board, 2, old.state_dict())
    engine = LeanEngine(copy.deepcopy(old), tokenizer, max_new_tokens=LIMIT)
    rollout = engine.generate(_prompts(tokenizer), seed=5, switch=Switcher(engine, board, 0, free=True, newest=1))
    assert rollout.behavior_versions == [[1] * len(r) for r in rollout.response_ids]  # 2 is beyond the bound
    post_weights(board, 3, old.state_dict(), keep_from=2)
    assert sorted(p.name for p in board.iterdir()) == ["version-000002.safetensors", "version-000003.safetensors"]


@pytest.mark.parametrize("k, m", [(1, 0), (1, 1), (2, 2), (1, 3), (3, 0)])
def test_switch_rule(k, m):
    for b in range(1, 20):
        target = switch_version(b, k, m)
        v = policy_version(b, k, m)
        if target is None:
            assert v + k > b - 1  # the trainer does not reach the next sync point before step b
        else:
            assert target == v + k <= b - 1
    if m == 0:
        assert all(switch_version(b, k, m) is None for b in range(1, 20))  # on-policy / k-step refresh: none
