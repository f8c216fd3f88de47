"""Sampling for the Tinker server: ``num_samples`` continuations of one prompt from whatever weights the
caller put in the module, with each sampled token's log-prob under the distribution it was drawn from (the lean
engine's ``sample_token`` under ``SERVED``), and the prompt's own log-probs (``compute_logprobs``).

Only ``SERVED``, temperature 1 without top-k/top-p truncation, is served: ``forward_backward`` scores under it,
so only those samples carry behaviour log-probs the trainer reproduces (ρ = 1 on-policy, tested).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from oprl.models.batching import cache_kwarg, output_cache, prefill_shared_prompts
from oprl.models.truncation import PLAIN, Sampling
from oprl.rollout.lean_engine import sample_token
from oprl.serve.tinker import wire
from oprl.serve.tinker.errors import UserError, check_tokens, context_of

SERVED = PLAIN
"""The one distribution served, temperature 1 without truncation: the one ``forward_backward`` scores under."""


def requested_sampling(params: dict[str, Any]) -> Sampling:
    """Tinker's ``SamplingParams`` as a ``Sampling`` (its ``top_k`` -1 is off, oprl's 0; absent fields are off)."""
    top_k = int(params.get("top_k", -1))
    temperature, top_p = float(params.get("temperature", 1.0)), float(params.get("top_p", 1.0))
    return Sampling(temperature, 0 if top_k == -1 else top_k, top_p)


def check_sampling_params(params: dict[str, Any]) -> None:
    """Refuse what the trainer cannot reproduce: ``forward_backward`` scores under ``SERVED``, so only samples
    from that distribution have behaviour log-probs it can compare with."""
    asked = requested_sampling(params)
    if asked.temperature != SERVED.temperature:
        raise UserError(
            f"sampling_params.temperature: {params['temperature']} is not 1.0; forward_backward scores at "
            "temperature 1, so the sampler's log-probs would not be the trainer's (ρ ≠ 1 on-policy)"
        )
    if asked.top_k != SERVED.top_k:
        raise UserError("sampling_params.top_k: truncated sampling is not reproducible by forward_backward; use -1")
    if asked.top_p != SERVED.top_p:
        raise UserError("sampling_params.top_p: truncated sampling is not reproducible by forward_backward; use 1.0")
    if params.get("max_tokens") is not None and int(params["max_tokens"]) < 1:
        raise UserError(f"sampling_params.max_tokens: must be >= 1, got {params['max_tokens']}")


@torch.no_grad()
def sample(model, tokenizer, request: dict[str, Any], device) -> bytes:
    prompt = [t for chunk in request["prompt"]["chunks"] for t in chunk.get("tokens", [])]
    params = request["sampling_params"]
    n = int(request.get("num_samples", 1))
    vocab = len(tokenizer)
    check_tokens(prompt, vocab, "prompt")
    if not prompt:
        raise UserError("prompt: empty")
    if not 1 <= n <= 1024:
        raise UserError(f"num_samples: must be between 1 and 1024, got {n}")
    limit = context_of(model) or 10**9
    room = limit - len(prompt)
    max_tokens = room if params.get("max_tokens") is None else int(params["max_tokens"])
    if max_tokens > room:
        raise UserError(
            f"sampling_params.max_tokens: prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceed the "
            f"model's context of {limit}"
        )
    stop_tokens, stop_strings = _stops(params.get("stop"), tokenizer)
    prompt_logprobs = _prompt_logprobs(model, prompt, request, device) if request.get("prompt_logprobs") else None
    seed = params.get("seed")
    if seed is None:
        # Unseeded draws advance the process's generator: requests for the same prompt must differ
        # (tinker-cookbook sends a group as num_samples=1 requests, one per member; in a forked, restored state
        # every member would be the same sequence and every group's advantages zero).
        sequences = _decode(model, tokenizer, prompt, n, max_tokens, stop_tokens, stop_strings, device)
    else:
        # Seeded: reproducible, and leaves the unseeded requests' generator where it was.
        with torch.random.fork_rng(devices=[device] if torch.device(device).type == "cuda" else []):
            torch.manual_seed(int(seed))
            sequences = _decode(model, tokenizer, prompt, n, max_tokens, stop_tokens, stop_strings, device)
    return wire.encode_sample_response(sequences, prompt_logprobs)


def _stops(stop, tokenizer) -> tuple[set[int], list[str]]:
    """Stop token ids and stop strings (``SamplingParams.stop``: a string, strings, or token ids); EOS always."""
    items = [stop] if isinstance(stop, str) else list(stop or [])
    tokens = {int(s) for s in items if isinstance(s, int)}
    strings = [s for s in items if isinstance(s, str)]
    if tokenizer.eos_token_id is not None:
        tokens.add(int(tokenizer.eos_token_id))
    return tokens, strings


def _decode(model, tokenizer, prompt, n, max_tokens, stop_tokens, stop_strings, device) -> list[wire.Sequence]:
    """The lean engine's decode step (``sample_token`` under ``SERVED``) on one prompt prefilled once for its
    ``n`` rows; a row ends at a stop token (kept) or once its text holds a stop string."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    prefill = prefill_shared_prompts(model, [prompt] * n, pad, device, logits_to_keep=1)
    cache, name = prefill.cache, cache_kwarg(model)
    logits = prefill.output.logits[:, -1][prefill.rows]  # (n, V)
    position = prefill.next_position  # (n,)
    tokens: list[list[int]] = [[] for _ in range(n)]
    logprobs: list[list[float]] = [[] for _ in range(n)]
    done = [False] * n
    stopped = [False] * n
    for _step in range(max_tokens):
        token, logprob = sample_token(logits, SERVED)  # (n,), (n,)
        for row, (t, lp) in enumerate(zip(token.tolist(), logprob.tolist(), strict=True)):
            if done[row]:
                continue
            tokens[row].append(t)
            logprobs[row].append(lp)
            text = tokenizer.decode(tokens[row]) if stop_strings else ""
            if t in stop_tokens or any(s in text for s in stop_strings):
                done[row] = stopped[row] = True
        if all(done):
            break
        out = model(input_ids=token[:, None], position_ids=position[:, None], use_cache=True, **{name: cache})
        cache, logits, position = output_cache(out), out.logits[:, -1], position + 1
    return [wire.Sequence(t, lp, s) for t, lp, s in zip(tokens, logprobs, stopped, strict=True)]


def _prompt_logprobs(model, prompt: list[int], request: dict[str, Any], device) -> list[float]:
    """log π(prompt_t | prompt_<t) for t ≥ 1 (NaN at 0, and before the last ``prompt_logprobs_last_n``)."""
    ids = torch.tensor([prompt], device=device)
    logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()  # (P-1, V)
    values = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None]).squeeze(-1).tolist()
    out = [math.nan, *values]
    last = request.get("prompt_logprobs_last_n")
    if last is not None:
        if not 1 <= int(last) <= len(prompt) - 1:
            raise UserError(f"prompt_logprobs_last_n: must be between 1 and {len(prompt) - 1}, got {last}")
        out[: len(prompt) - int(last)] = [math.nan] * (len(prompt) - int(last))
    return out
