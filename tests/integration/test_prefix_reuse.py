"""Key/value reuse across turns on vLLM (``rollout.prefix_reuse``): multi-turn contexts prefill only what is
new since their last full cache block, samples equal those without reuse (float32, CPU), and nothing is reused
across a weight load (the cache is salted by the policy version)."""

import pytest
import torch

pytest.importorskip("vllm")

from oprl.models.tiny import build_model, build_tokenizer
from oprl.rollout.vllm_engine import VLLMEngine

TURNS, ROWS, PROMPT, OBSERVATION = 4, 4, 300, 20


def episodes(engine):
    """Four turns of four rows: each turn appends the reply and a 20-token observation."""
    contexts = [[4] + [10 + (i * 7 + r) % 80 for i in range(PROMPT)] for r in range(ROWS)]
    replies, needed = [], sum(len(c) for c in contexts)
    for turn in range(TURNS):
        out = engine.generate(contexts, seed=turn)
        replies.append((out.response_ids, out.behavior_logprobs))
        contexts = [c + ids + [12 + turn] * OBSERVATION for c, ids in zip(contexts, out.response_ids, strict=True)]
        needed += 0 if turn == TURNS - 1 else sum(len(ids) + OBSERVATION for ids in out.response_ids)
    return replies, needed


def test_prefix_reuse_prefills_less_and_samples_the_same():
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    model = build_model(tokenizer, max_positions=1024)
    fresh = VLLMEngine(model, tokenizer, max_new_tokens=12)
    reused = VLLMEngine(model, tokenizer, max_new_tokens=12, prefix_reuse=True)
    without, needed = episodes(fresh)
    with_reuse, _ = episodes(reused)
    assert with_reuse == without  # same tokens and log-probs, bit for bit
    assert fresh.prefill_tokens == fresh.prompt_tokens  # today: every turn prefills its whole context
    assert reused.prompt_tokens == fresh.prompt_tokens
    assert needed <= reused.prefill_tokens < 0.5 * fresh.prefill_tokens
    # A new policy version reuses nothing: the same contexts prefill in full after a weight load.
    reused.load_weights({k: v.detach().clone() for k, v in model.named_parameters()})
    before = reused.prefill_tokens
    reused.generate([[4] + [10 + (i * 7) % 80 for i in range(PROMPT)]], seed=0)
    assert reused.prefill_tokens - before == PROMPT + 1
