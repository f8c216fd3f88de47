"""Rollout engine on Hugging Face ``generate``: sampled responses plus the behaviour log-prob of each token.

The behaviour log-prob is read from the very scores ``generate`` sampled from (after temperature, top-k and top-p),
so it is the log-probability under the true sampling distribution: the number the off-policy losses need
(docs/paper.md#losses: it is recorded, never recomputed). Prompts are left-padded, responses stop at EOS
(kept, so the policy also learns when to stop) or at ``max_new_tokens`` (marked truncated).

The seeding, batching, EOS cutting and decoding are ``oprl.rollout.base.TorchEngine``'s; this module is the
sampling step alone. Deliberately not here: paged KV caches, continuous batching (the vllm engine).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from oprl.lazy import lazy_import
from oprl.models.batching import left_pad
from oprl.models.truncation import Sampling
from oprl.rollout.base import EngineCapabilities, TorchEngine, top_logprobs

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch", globals())  # imported on first use (oprl.lazy): the config needs only names


class HFGenerateEngine(TorchEngine):
    """Samples with ``model.generate`` (multinomial, temperature, top-k, top-p). ``settings``: the
    ``TorchEngine`` defaults ``sampling``, ``max_new_tokens``. One policy per call
    (``generate`` has no hook between decode steps: no partial rollouts), no caches kept between calls."""

    capabilities = EngineCapabilities(
        exact_truncation=True,  # transformers' top-k/top-p = oprl.models.truncation
        top_logprobs=True,  # hf_generate_sample(top_k=): top_logprobs of the processed scores sampled from
    )

    def __init__(self, model, tokenizer, **settings):
        super().__init__(hf_generate_sample, model, tokenizer, **settings)


def hf_generate_sample(
    model,
    tokenizer,
    prompt_ids: list[list[int]],
    sampling: Sampling,
    max_new_tokens: int,
    top_k: int = 0,
):
    """``(tokens (B, T), behaviour log-probs (B, T))`` drawn from ``sampling``'s distribution (transformers'
    warpers: the same kept set as ``Sampling.kept``), on the CPU; anything after a row's first EOS is ignored.
    ``top_k`` = K > 0: also ``(top ids (B, T, K), top log-probs (B, T, K))`` of the same scores
    (``oprl.rollout.base.top_logprobs``)."""
    pad_id = tokenizer.pad_token_id
    inputs, attention = left_pad(prompt_ids, pad_id)  # (B, P)
    out = model.generate(
        input_ids=inputs.to(model.device),
        attention_mask=attention.to(model.device),
        do_sample=True,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,  # 0 = off; transformers applies it before top-p, as vLLM and the lean engine do
        max_new_tokens=max_new_tokens,
        pad_token_id=pad_id,
        eos_token_id=tokenizer.eos_token_id,
        output_scores=True,
        return_dict_in_generate=True,
    )
    tokens = out.sequences[:, inputs.shape[1] :].cpu()  # (B, T)
    scores = torch.stack(out.scores, dim=1).float().cpu()  # (B, T, V), processed = what was sampled from
    logp = torch.log_softmax(scores, dim=-1)  # (B, T, V)
    sampled = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (B, T)
    return (tokens, sampled, *top_logprobs(logp, top_k)) if top_k else (tokens, sampled)
