"""The rollout engines: behaviour log-probs, padding, EOS, truncation, seeding; trainer agreement on-policy.

Every contract test runs on every engine (lean, hf-generate, vllm); the lean engine is also checked against
``generate`` directly. Models have 2 heads of 32 dimensions: vLLM's CPU attention has no kernel for 16."""

import pytest
import torch

from oprl.models.chat import encode_prompt
from oprl.models.logprobs import pack, response_logprobs
from oprl.models.tiny import build_model, build_tokenizer
from oprl.rollout import HFGenerateEngine, LeanEngine, Sampling
from oprl.rollout.lean_engine import sample_token


def _prompts(tokenizer, texts):
    return [encode_prompt(tokenizer, [{"role": "user", "content": t}]) for t in texts]


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_recomputed_logprobs_match_behaviour_on_policy(policy, temperature, Engine):
    model, tokenizer = policy
    # Prompts of different lengths exercise left padding; random weights rarely emit EOS, so rows differ in length
    # only where they do, and the rest are truncated at the limit.
    prompts = _prompts(tokenizer, ["1+2=", "35+47-9=", "7=", "123*4-56+7="] * 8)
    engine = Engine(model, tokenizer, sampling=Sampling(temperature), max_new_tokens=12)
    rollout = engine.generate(prompts, seed=11)
    input_ids, attention_mask, targets, mask = pack(prompts, rollout.response_ids, tokenizer.pad_token_id)
    with torch.no_grad():
        logprobs, _ = response_logprobs(model, input_ids, attention_mask, targets, sampling=Sampling(temperature))
    behavior = torch.zeros_like(logprobs)
    for i, row in enumerate(rollout.behavior_logprobs):
        behavior[i, : len(row)] = torch.tensor(row)
    assert mask.sum() > 0
    assert (logprobs - behavior)[mask].abs().max() < 1e-4


def certain_model(tokenizer, token: str):
    """A Llama (untied head) that emits ``token`` with certainty at every step, built from weights alone, so that
    every engine serves it: attention and MLP write nothing, every embedding has +10 in dimension 0, the final
    norm keeps only that dimension, and the head turns it into +30 x (~8) for ``token`` and 0 for the rest."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight[:, 0] = 10.0
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[tokenizer.convert_tokens_to_ids(token), 0] = 30.0
    return model


def test_eos_ends_responses_and_truncation_is_flagged(policy, Engine):
    _, tokenizer = policy
    prompts = _prompts(tokenizer, ["1+2=", "3="])
    engine = Engine(certain_model(tokenizer, tokenizer.eos_token), tokenizer, max_new_tokens=5)
    rollout = engine.generate(prompts, seed=0)
    assert rollout.response_ids == [[tokenizer.eos_token_id]] * 2  # EOS is kept: the policy learns to stop
    assert rollout.truncated == [False, False]
    assert rollout.texts == ["", ""]
    assert all(abs(lp[0]) < 1e-6 for lp in rollout.behavior_logprobs)
    rollout = Engine(certain_model(tokenizer, "7"), tokenizer, max_new_tokens=5).generate(prompts, seed=0)
    assert rollout.texts == ["77777", "77777"] and rollout.truncated == [True, True]


def test_same_seed_same_samples_and_batching_invariance(policy, Engine):
    model, tokenizer = policy
    prompts = _prompts(tokenizer, ["1+2=", "9-4="] * 6)
    engine = Engine(model, tokenizer, max_new_tokens=6)
    first, second = engine.generate(prompts, seed=5), engine.generate(prompts, seed=5)
    assert first.response_ids == second.response_ids
    assert first.behavior_logprobs == second.behavior_logprobs
    assert engine.generate(prompts, seed=6).response_ids != first.response_ids


def test_top_p_override_narrows_sampling(policy, Engine):
    model, tokenizer = policy
    prompts = _prompts(tokenizer, ["1+2=", "35+47-9="] * 4)
    engine = Engine(model, tokenizer, sampling=Sampling(), max_new_tokens=6)
    wide = [engine.generate(prompts, seed=s).response_ids for s in (1, 2)]
    assert wide[0] != wide[1]  # untrained weights: full-support sampling differs between seeds
    # top_p -> 0 keeps only the most likely token: sampling becomes greedy and ignores the seed.
    narrow = [engine.generate(prompts, seed=s, sampling=Sampling(top_p=1e-6)).response_ids for s in (1, 2)]
    assert narrow[0] == narrow[1]
    assert engine.sampling == Sampling()  # an override, not a change of the engine


def test_lean_engine_draws_what_generate_draws(policy):
    # Random weights rarely emit EOS, so no row leaves the batch early and both engines consume the random
    # stream identically: same seed -> the same tokens and log-probs, although the lean engine prefills each
    # distinct prompt once and runs its own loop.
    model, tokenizer = policy
    prompts = _prompts(tokenizer, ["1+2=", "35+47-9=", "7="]) * 4
    for top_p in (1.0, 0.7):
        sampling = Sampling(top_p=top_p)
        reference = HFGenerateEngine(model, tokenizer, sampling=sampling, max_new_tokens=7).generate(prompts, seed=4)
        lean = LeanEngine(model, tokenizer, sampling=sampling, max_new_tokens=7).generate(prompts, seed=4)
        assert lean.response_ids == reference.response_ids
        assert lean.truncated == reference.truncated
        for ours, theirs in zip(lean.behavior_logprobs, reference.behavior_logprobs, strict=True):
            assert ours == pytest.approx(theirs, abs=1e-5)


def test_lean_engine_rows_leaving_the_batch_keep_their_cache_aligned(policy):
    # EOS made likely at every step: rows end at many different lengths, so finished rows are dropped from the
    # batch (and the cache) several times. The trainer's recomputation of every surviving row must still match.
    model, tokenizer = policy
    model = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, seed=3)
    with torch.no_grad():
        model.lm_head.weight[tokenizer.eos_token_id] *= 0.0
    head = model.lm_head
    model.lm_head = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        model.lm_head.weight.copy_(head.weight)
        model.lm_head.bias.zero_()
        model.lm_head.bias[tokenizer.eos_token_id] = 3.0
    prompts = _prompts(tokenizer, ["1+2=", "35+47-9=", "7=", "123*4-56+7="] * 6)
    rollout = LeanEngine(model, tokenizer, max_new_tokens=10).generate(prompts, seed=2)
    lengths = [len(r) for r in rollout.response_ids]
    assert len(set(lengths)) >= 4 and min(lengths) < 5 and any(rollout.truncated)
    input_ids, attention_mask, targets, mask = pack(prompts, rollout.response_ids, tokenizer.pad_token_id)
    with torch.no_grad():
        logprobs, _ = response_logprobs(model, input_ids, attention_mask, targets)
    behavior = torch.zeros_like(logprobs)
    for i, row in enumerate(rollout.behavior_logprobs):
        behavior[i, : len(row)] = torch.tensor(row)
    assert (logprobs - behavior)[mask].abs().max() < 1e-4


def test_nucleus_rule_matches_transformers():
    from transformers.generation.logits_process import TopPLogitsWarper

    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(0)) * 3
    for top_p in (0.05, 0.5, 0.9):
        kept_by_transformers = TopPLogitsWarper(top_p)(None, logits.clone()).isfinite()
        torch.manual_seed(0)
        tokens, logprob = sample_token(logits, Sampling(top_p=top_p))
        assert kept_by_transformers[torch.arange(64), tokens].all()
        # The log-prob is that of the renormalised nucleus.
        nucleus = logits.masked_fill(~kept_by_transformers, float("-inf")).log_softmax(-1)
        assert torch.allclose(logprob, nucleus[torch.arange(64), tokens], atol=1e-5)
    # Sampling frequencies follow the distribution: 20,000 draws from one row.
    row = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).expand(20_000, 4)
    torch.manual_seed(1)
    tokens, _ = sample_token(row, Sampling())
    frequencies = torch.bincount(tokens, minlength=4).float() / 20_000
    assert torch.allclose(frequencies, row[0].softmax(-1), atol=0.015)


def test_lean_engine_samples_through_a_lora_wrapper(policy):
    peft = pytest.importorskip("peft")
    _, tokenizer = policy
    model = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, seed=5)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    prompts = _prompts(tokenizer, ["1+2=", "9-4="]) * 3
    lean = LeanEngine(wrapped, tokenizer, max_new_tokens=6).generate(prompts, seed=1)
    assert (
        lean.response_ids
        == HFGenerateEngine(wrapped, tokenizer, max_new_tokens=6).generate(prompts, seed=1).response_ids
    )


@pytest.mark.parametrize("Engine", [LeanEngine, HFGenerateEngine])  # vLLM checks lengths itself
def test_inputs_larger_than_the_model_are_refused_before_sampling(policy, Engine):
    """Issue 25, item 7: a 6,005-token prompt on a 128-position model ran silently with lean and hf-generate;
    max_new_tokens=1e8 and group_size=100000 tried to allocate 16 GB and 3.7 GB before any check."""
    from oprl.errors import OprlError

    model, tokenizer = policy
    context = model.config.max_position_embeddings
    with pytest.raises(OprlError, match=rf"rollout.max_new_tokens=100000000 does not fit .* context of {context}"):
        Engine(model, tokenizer, max_new_tokens=100_000_000)
    engine = Engine(model, tokenizer, max_new_tokens=8)
    too_long = [[5] * (context - 4)]
    with pytest.raises(OprlError, match=rf"a prompt of {context - 4} tokens \+ rollout.max_new_tokens=8 exceeds"):
        engine.generate(too_long, seed=0)
    huge = [[5] * 16] * 10_000_000  # one prompt referenced 10M times: 80 MB of list; 230 GiB of cache
    with pytest.raises(OprlError, match=r"sampling 10000000 rows .* GiB \(key/value cache, .*\), more than"):
        engine.generate(huge, seed=0)


def test_the_sampling_estimate_counts_more_than_the_cache(monkeypatch):
    """The issue's rollout.group_size=100000 (x 4 prompts) passed a cache-only estimate (4.6 GiB) on a 24 GiB
    machine and grew past 11 GiB in 30 s; with activations and logits counted it is refused, while the default
    job's 256 rows and a 32 x 8 SmolLM2-sized batch of this model are not."""
    from oprl.errors import OprlError
    from oprl.rollout import base

    tokenizer = build_tokenizer()
    model = build_model(tokenizer)  # the default embedded model, as in the run
    monkeypatch.setattr(base, "available_memory", lambda device: 24 * 2**30)
    engine = LeanEngine(model, tokenizer, max_new_tokens=8)
    prompt = [5] * 16
    engine.check_fits([prompt] * 256, 256)
    with pytest.raises(OprlError, match=r"sampling 400000 rows"):
        engine.check_fits([prompt] * 400_000, 400_000)
