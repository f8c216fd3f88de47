"""The rollout engine: behaviour log-probs, padding, EOS, truncation, seeding; trainer agreement on-policy."""

import pytest
import torch

from oprl.models.chat import encode_prompt
from oprl.models.logprobs import pack, response_logprobs
from oprl.models.tiny import build_model, build_tokenizer
from oprl.rollout import HFGenerateEngine


@pytest.fixture(scope="module")
def policy():
    tokenizer = build_tokenizer()
    return build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=4, seed=3), tokenizer


def _prompts(tokenizer, texts):
    return [encode_prompt(tokenizer, [{"role": "user", "content": t}]) for t in texts]


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_recomputed_logprobs_match_behaviour_on_policy(policy, temperature):
    model, tokenizer = policy
    # Prompts of different lengths exercise left padding; random weights rarely emit EOS, so rows differ in length
    # only where they do, and the rest are truncated at the limit.
    prompts = _prompts(tokenizer, ["1+2=", "35+47-9=", "7=", "123*4-56+7="] * 8)
    engine = HFGenerateEngine(model, tokenizer, temperature=temperature, max_new_tokens=12)
    rollout = engine.generate(prompts, seed=11)
    input_ids, attention_mask, targets, mask = pack(prompts, rollout.response_ids, tokenizer.pad_token_id)
    with torch.no_grad():
        logprobs, _ = response_logprobs(model, input_ids, attention_mask, targets, temperature=temperature)
    behavior = torch.zeros_like(logprobs)
    for i, row in enumerate(rollout.behavior_logprobs):
        behavior[i, : len(row)] = torch.tensor(row)
    assert mask.sum() > 0
    assert (logprobs - behavior)[mask].abs().max() < 1e-4


def test_eos_ends_responses_and_truncation_is_flagged(policy):
    _, tokenizer = policy
    model = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=4, seed=3)
    prompts = _prompts(tokenizer, ["1+2=", "3="])
    # An output head that is all bias makes the next token a certainty: EOS first, then "7".
    bias_model = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    with torch.no_grad():
        bias_model.weight.zero_()
        bias_model.bias.fill_(-30.0)
        bias_model.bias[tokenizer.eos_token_id] = 30.0
    model.lm_head = bias_model
    rollout = HFGenerateEngine(model, tokenizer, max_new_tokens=5).generate(prompts, seed=0)
    assert rollout.response_ids == [[tokenizer.eos_token_id]] * 2
    assert rollout.truncated == [False, False]
    assert rollout.texts == ["", ""]
    assert all(abs(lp[0]) < 1e-6 for lp in rollout.behavior_logprobs)
    with torch.no_grad():
        bias_model.bias[tokenizer.eos_token_id] = -30.0
        bias_model.bias[tokenizer.convert_tokens_to_ids("7")] = 30.0
    rollout = HFGenerateEngine(model, tokenizer, max_new_tokens=5).generate(prompts, seed=0)
    assert rollout.texts == ["77777", "77777"] and rollout.truncated == [True, True]


def test_same_seed_same_samples_and_batching_invariance(policy):
    model, tokenizer = policy
    prompts = _prompts(tokenizer, ["1+2=", "9-4="] * 6)
    engine = HFGenerateEngine(model, tokenizer, max_new_tokens=6)
    first, second = engine.generate(prompts, seed=5), engine.generate(prompts, seed=5)
    assert first.response_ids == second.response_ids
    assert first.behavior_logprobs == second.behavior_logprobs
    assert engine.generate(prompts, seed=6).response_ids != first.response_ids


def test_top_p_override_narrows_sampling(policy):
    model, tokenizer = policy
    prompts = _prompts(tokenizer, ["1+2=", "35+47-9="] * 4)
    engine = HFGenerateEngine(model, tokenizer, temperature=1.0, top_p=1.0, max_new_tokens=6)
    wide = [engine.generate(prompts, seed=s).response_ids for s in (1, 2)]
    assert wide[0] != wide[1]  # untrained weights: full-support sampling differs between seeds
    # top_p -> 0 keeps only the most likely token: sampling becomes greedy and ignores the seed.
    narrow = [engine.generate(prompts, seed=s, top_p=1e-6).response_ids for s in (1, 2)]
    assert narrow[0] == narrow[1]
    assert engine.top_p == 1.0  # an override, not a change of the engine
