"""Fixtures the rollout engine tests share: every engine class, and one tiny policy per test module.

The policy has 2 heads of 32 dimensions (vLLM's CPU attention has no kernel for 16). It is built once per module,
not per session, so that a module that changes its weights cannot reach another's; the vLLM engines need no more
than this to stay one per test session: ``oprl.rollout.vllm_shared`` keeps one ``LLM`` per process for a model
configuration (and dtype, KV-cache size, LoRA slots), and every module's policy has the same configuration."""

import pytest

from oprl.models.tiny import build_model, build_tokenizer
from oprl.rollout import ENGINES


@pytest.fixture(params=sorted(ENGINES))
def Engine(request):
    """Each registered engine class in turn (lean, hf-generate, vllm): a test taking it runs on every engine."""
    return ENGINES[request.param]


@pytest.fixture(scope="module")
def policy():
    """``(model, tokenizer)``: the tiny Llama (hidden 64, 2 layers, 2 heads, seed 3) and its tokenizer."""
    tokenizer = build_tokenizer()
    return build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, seed=3), tokenizer
