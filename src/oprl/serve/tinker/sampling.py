"""Sampling for the Tinker server: ``num_samples`` continuations of a prompt from whatever weights the caller put
in the module, with each sampled token's log-prob under the distribution it was drawn from (the lean engine's
``sample_token``), and the prompt's own log-probs (``compute_logprobs``).

Temperature, top-k and top-p (Tinker's ``SamplingParams``; its ``top_k`` -1 is off) are oprl's ``Sampling``
(``oprl.models.truncation``): scores s = logits / temperature, top-k then top-p on them, and the token drawn from
μ = softmax over the kept set. **The log-prob returned for a sampled token is log μ(y)**, the behaviour
distribution's, not the model's: ``forward_backward`` scores π(y) at temperature 1 untruncated, so the loss sees
ρ = π(y) / μ(y), the exact importance weight of a token drawn from μ (ρ = 1 on-policy only at the defaults,
tested). Prompt log-probs are always the model's own (temperature 1, untruncated), whatever the parameters.

Batching: ``sample_batch`` runs several requests on the same weights as one engine call (the server gathers the
requests of one sampling client that arrive together, ``app.py``): every distinct prompt is prefilled once, and
each decode step is one model call for every row of every request. Each request draws from **its own generator**
(seeded: ``seed``'s; unseeded: seeded from one draw of the process's generator, so unseeded requests differ), on
its own rows only, and a request draws exactly as many steps as it would alone: what a request gets does not
depend on what it was batched with, up to the float rounding of a wider padded batch (tokens equal, log-probs
within 1e-5 on the CPU, tested).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from oprl.models.batching import cache_kwarg, output_cache, prefill_shared_prompts
from oprl.models.truncation import PLAIN, Sampling
from oprl.rollout.lean_engine import COMPACT_FRACTION, sample_token
from oprl.serve.tinker.errors import UserError, check_tokens, context_of
from oprl.serve.tinker.records import Sampled, Sequence

SERVED = PLAIN
"""The distribution ``forward_backward`` scores under (temperature 1, nothing truncated), the prompt log-probs'
too, and the sampler's at the default ``SamplingParams``."""


def requested_sampling(params: dict[str, Any]) -> Sampling:
    """Tinker's ``SamplingParams`` as a ``Sampling`` (its ``top_k`` -1 is off, oprl's 0; absent fields are off)."""
    top_k = int(params.get("top_k", -1))
    temperature, top_p = float(params.get("temperature", 1.0)), float(params.get("top_p", 1.0))
    return Sampling(temperature, 0 if top_k == -1 else top_k, top_p)


def check_sampling_params(params: dict[str, Any]) -> Sampling:
    """The ``Sampling`` a request asks for, after checking each field's range (``UserError`` naming it)."""
    if not isinstance(params, dict):
        raise UserError(f"sampling_params: an object of SamplingParams fields, got a {type(params).__name__}")
    asked = requested_sampling(params)
    if not (math.isfinite(asked.temperature) and asked.temperature > 0):
        raise UserError(f"sampling_params.temperature: must be > 0, got {params.get('temperature')}")
    if asked.top_k < 0:
        raise UserError(f"sampling_params.top_k: -1 (off) or >= 1, got {params.get('top_k')}")
    if not 0 < asked.top_p <= 1:
        raise UserError(f"sampling_params.top_p: must be in (0, 1], got {params.get('top_p')}")
    if params.get("max_tokens") is not None and int(params["max_tokens"]) < 1:
        raise UserError(f"sampling_params.max_tokens: must be >= 1, got {params['max_tokens']}")
    return asked


@dataclass
class Planned:
    """One checked sample request: what to draw, how long, where to stop, from which generator."""

    prompt: list[int]
    n: int
    max_tokens: int
    stop_tokens: set[int]
    stop_strings: list[str]
    seed: int | None
    sampling: Sampling
    request: dict[str, Any]


def plan(tokenizer, model, request: dict[str, Any]) -> Planned:
    """Check a sample request against the model (``UserError`` naming the field) before anything runs."""
    prompt = [t for chunk in request["prompt"]["chunks"] for t in chunk.get("tokens", [])]
    params = request.get("sampling_params") or {}
    sampling = check_sampling_params(params)
    n = int(request.get("num_samples", 1))
    check_tokens(prompt, len(tokenizer), "prompt")
    if not prompt:
        raise UserError("prompt: empty")
    if not 1 <= n <= 1024:
        raise UserError(f"num_samples: must be between 1 and 1024, got {n}")
    limit = context_of(model) or 10**9
    if len(prompt) > limit:
        raise UserError(f"prompt: {len(prompt)} tokens exceed the model's context of {limit}")
    # The last sampled token is never fed back (nothing is drawn after it), so a prompt filling the context can
    # still draw one: a sequence of limit + 1 tokens, whose model input (all but its last token) forward_backward
    # takes too. compute_logprobs of a full-context sequence is such a request (max_tokens=1).
    room = limit - len(prompt) + 1
    max_tokens = room if params.get("max_tokens") is None else int(params["max_tokens"])
    if max_tokens > room:
        raise UserError(
            f"sampling_params.max_tokens: prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceed the "
            f"model's context of {limit} by more than the last sampled token (never fed back)"
        )
    if request.get("prompt_logprobs") and request.get("prompt_logprobs_last_n") is not None:
        last = int(request["prompt_logprobs_last_n"])
        if not 1 <= last <= len(prompt) - 1:
            raise UserError(f"prompt_logprobs_last_n: must be between 1 and {len(prompt) - 1}, got {last}")
    stop_tokens, stop_strings = _stops(params.get("stop"), tokenizer)
    seed = params.get("seed")
    seed = None if seed is None else int(seed)
    return Planned(prompt, n, max_tokens, stop_tokens, stop_strings, seed, sampling, request)


@torch.inference_mode()  # cheaper than no_grad (no version counters); nothing sampled here is trained through
def sample(model, tokenizer, request: dict[str, Any], device) -> Sampled:
    """One request alone: ``sample_batch`` of one (the same draws it gets in any batch)."""
    (outcome,) = sample_batch(model, tokenizer, [request], device)
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


@torch.inference_mode()  # cheaper than no_grad (no version counters); nothing sampled here is trained through
def sample_batch(model, tokenizer, requests: list[dict[str, Any]], device) -> list[Sampled | UserError]:
    """Each request's sequences and prompt log-probs (or the ``UserError`` that refuses it alone), the valid ones
    sampled together in one decode loop (module docstring); ``wire.encode_sample_response`` makes the SDK's
    ``SampleResponse`` of one."""
    outcomes: list[Sampled | UserError | None] = [None] * len(requests)
    planned: list[tuple[int, Planned]] = []
    for i, request in enumerate(requests):
        try:
            planned.append((i, plan(tokenizer, model, request)))
        except UserError as exc:
            outcomes[i] = exc
    if planned:
        plans = [p for _, p in planned]
        # Generators in arrival order; an unseeded request takes one draw of the process's generator, so the
        # next unseeded request (cookbook groups: one num_samples=1 request per member) draws something else.
        generators = [_generator(p.seed, device) for p in plans]
        sequences = _decode(model, tokenizer, plans, generators, device)
        for (i, p), rows in zip(planned, sequences, strict=True):
            scored = p.request.get("prompt_logprobs")
            prompt_logprobs = _prompt_logprobs(model, p.prompt, p.request, device) if scored else None
            outcomes[i] = Sampled(rows, prompt_logprobs)
    return outcomes  # type: ignore[return-value]  # every slot filled above


def _generator(seed: int | None, device) -> torch.Generator:
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,)))  # advances the process's generator: unseeded requests differ
    generator = torch.Generator(device=torch.device(device))
    generator.manual_seed(seed % 2**64)
    return generator


def _stops(stop, tokenizer) -> tuple[set[int], list[str]]:
    """Stop token ids and stop strings (``SamplingParams.stop``: a string, strings, or token ids) and EOS, as the
    SDK defines them: ``None`` stops at EOS only, ``[]`` at nothing (a row runs to ``max_tokens``), and
    stops given keep EOS too."""
    items = [stop] if isinstance(stop, str) else list(stop if stop is not None else [])
    tokens = {int(s) for s in items if isinstance(s, int)}
    strings = [s for s in items if isinstance(s, str)]
    disabled = stop is not None and not items
    if tokenizer.eos_token_id is not None and not disabled:
        tokens.add(int(tokenizer.eos_token_id))
    return tokens, strings


def _decode(model, tokenizer, plans: list[Planned], generators, device) -> list[list[Sequence]]:
    """The lean engine's decode loop over every row of every request (prompts left-padded, each distinct prompt
    prefilled once, the attention mask growing a column a step). Per step, each unfinished request draws one
    token for each of its rows with ``sample_token`` under its own ``Sampling`` from its generator; a row ends at a stop
    token (kept) or once its text holds a stop string, a request once all its rows ended or it drew
    ``max_tokens``. Rows of finished requests leave the batch (in bulk, as in the lean engine)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    owner = [k for k, p in enumerate(plans) for _ in range(p.n)]  # batch row -> request
    members = [[r for r, o in enumerate(owner) if o == k] for k in range(len(plans))]  # request -> batch rows
    prompts = [p.prompt for p in plans for _ in range(p.n)]
    prefill = prefill_shared_prompts(model, prompts, pad, device, logits_to_keep=1)
    cache, name = prefill.cache, cache_kwarg(model)
    logits = prefill.output.logits[:, -1][prefill.rows]  # (B, V)
    attention, position = prefill.attention, prefill.next_position  # (B, P) grows a column a step; (B,)
    live = list(range(len(owner)))  # batch row of each cache row
    tokens: list[list[int]] = [[] for _ in owner]
    logprobs: list[list[float]] = [[] for _ in owner]
    done, stopped = [False] * len(owner), [False] * len(owner)
    finished = [False] * len(plans)
    step = 0
    while True:
        where = {row: c for c, row in enumerate(live)}  # batch row -> cache row
        fed = torch.full((len(live),), pad, dtype=torch.long, device=logits.device)  # (L,)
        for k, p in enumerate(plans):
            if finished[k]:
                continue
            rows = members[k]
            index = torch.tensor([where[r] for r in rows], device=logits.device)
            token, logprob = sample_token(logits[index], p.sampling, generators[k])  # (n,), (n,): log μ(y)
            fed[index] = token
            for row, t, lp in zip(rows, token.tolist(), logprob.tolist(), strict=True):
                if done[row]:
                    continue
                tokens[row].append(t)
                logprobs[row].append(lp)
                text = tokenizer.decode(tokens[row]) if p.stop_strings else ""
                if t in p.stop_tokens or any(s in text for s in p.stop_strings):
                    done[row] = stopped[row] = True
            finished[k] = step + 1 >= p.max_tokens or all(done[r] for r in rows)
        step += 1
        if all(finished):
            break
        leaving = [c for c, row in enumerate(live) if finished[owner[row]]]
        if leaving and len(leaving) >= max(1, COMPACT_FRACTION * len(live)):
            keep = torch.tensor([c for c in range(len(live)) if not finished[owner[live[c]]]], device=logits.device)
            cache.reorder_cache(keep)
            live = [live[c] for c in keep.tolist()]
            attention, position, fed = attention[keep], position[keep], fed[keep]
        attention = torch.cat([attention, attention.new_ones((len(live), 1))], dim=1)
        out = model(
            input_ids=fed[:, None], attention_mask=attention, position_ids=position[:, None], use_cache=True,
            **{name: cache},
        )  # fmt: skip
        cache, logits, position = output_cache(out), out.logits[:, -1], position + 1
    sequences = [Sequence(t, lp, s) for t, lp, s in zip(tokens, logprobs, stopped, strict=True)]
    return [[sequences[r] for r in rows] for rows in members]


def _prompt_logprobs(model, prompt: list[int], request: dict[str, Any], device) -> list[float]:
    """log π(prompt_t | prompt_<t) for t ≥ 1 (NaN at 0, and before the last ``prompt_logprobs_last_n``)."""
    ids = torch.tensor([prompt], device=device)
    logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()  # (P-1, V)
    values = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None]).squeeze(-1).tolist()
    out = [math.nan, *values]
    last = request.get("prompt_logprobs_last_n")
    if last is not None:  # its range was checked by plan()
        out[: len(prompt) - int(last)] = [math.nan] * (len(prompt) - int(last))
    return out
