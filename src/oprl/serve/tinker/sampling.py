"""Sampling for the Tinker server: ``num_samples`` continuations of a prompt from whatever weights the caller put
in the module, with each sampled token's log-prob under the distribution it was drawn from (the lean engine's
``sample_token``), and the prompt's own log-probs (``compute_logprobs``).

Temperature, top-k and top-p (Tinker's ``SamplingParams``; its ``top_k`` -1 is off) are oprl's ``Sampling``
(``oprl.models.truncation``): scores s = logits / temperature, top-k then top-p on them, and the token drawn from
μ = softmax over the kept set. **The log-prob returned for a sampled token is log μ(y)**, the behaviour
distribution's, not the model's: ``forward_backward`` scores π(y) at temperature 1 untruncated, so the loss sees
ρ = π(y) / μ(y), the exact importance weight of a token drawn from μ (ρ = 1 on-policy only at the defaults,
tested). Prompt log-probs are always the model's own (temperature 1, untruncated), whatever the parameters.

Top-K fields (the sampler's one rule, ``oprl.rollout.base.top_logprobs``, on ``sampling_logprobs``: the
*processed* distribution, as the agent endpoint's ``top_logprobs``): ``topk_sample_logprobs`` = K gives, per
sampled token, the K most likely tokens of μ, the distribution it was drawn from (computed from the very
log-probs the token is drawn from, so asking changes no draw); ``topk_prompt_logprobs`` = K gives, per prompt
position t ≥ 1, the K most likely of μ_t, the distribution token t would be drawn from under the request's
``SamplingParams``; ``target_prompt_logprobs`` gives log μ_t of the ids it names. At the default parameters μ is
π, and these agree with ``prompt_logprobs``; otherwise ``prompt_logprobs`` stays log π (docs/tinker.md).
Entries at ``-inf`` (outside top-k/top-p's kept set) go on the wire as the SDK's empty sentinel.

Batching: ``sample_batch`` runs several requests on the same weights as one engine call (the server gathers the
requests of one sampling client that arrive together, ``app.py``): every distinct prompt is prefilled once, and
each decode step is one model call for every row of every request. Each request draws from **its own generator**
(seeded: ``seed``'s; unseeded: seeded from one draw of the process's generator, so unseeded requests differ), on
its own rows only, and a request draws exactly as many steps as it would alone: what a request gets does not
depend on what it was batched with, up to the float rounding of a wider padded batch (tokens equal, log-probs
within 1e-5 on the CPU, tested).

The decode loop (``Decoding``, driven by ``SampleBatch``) is resumable between steps: an in-flight sampler runs it
a step at a time while the weights in the module change in between (the cache kept), each token recording the
version of the weights it was drawn under; ``sample_batch`` runs it to the end at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from oprl.models.batching import cache_kwarg, output_cache, prefill_shared_prompts
from oprl.models.truncation import PLAIN, Sampling
from oprl.rollout.base import sampling_logprobs, top_logprobs
from oprl.rollout.lean_engine import COMPACT_FRACTION, draw
from oprl.serve.tinker.errors import UserError, check_tokens, context_of
from oprl.serve.tinker.records import Sampled, Sequence, Target, target_of

MAX_TOP_K = 20
"""Largest ``topk_sample_logprobs`` / ``topk_prompt_logprobs`` served (Tinker's bound on a top-k width)."""

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
    topk_sample: int = 0
    topk_prompt: int = 0
    target: Target | None = None


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
    topk_sample, topk_prompt = check_top_k(request)
    target = target_of(request.get("target_prompt_logprobs"), len(prompt), len(tokenizer))
    stop_tokens, stop_strings = _stops(params.get("stop"), tokenizer)
    seed = params.get("seed")
    seed = None if seed is None else int(seed)
    return Planned(
        prompt, n, max_tokens, stop_tokens, stop_strings, seed, sampling, request, topk_sample, topk_prompt, target
    )


def check_top_k(request: dict[str, Any]) -> tuple[int, int]:
    """``(topk_sample_logprobs, topk_prompt_logprobs)``, each an integer in [0, ``MAX_TOP_K``] (0 = none), or a
    ``UserError`` naming the field; ``prompt_alt_tokens_k`` is refused (not served)."""
    ks = []
    for name in ("topk_sample_logprobs", "topk_prompt_logprobs"):
        value = request.get(name) or 0
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOP_K:
            raise UserError(f"{name}: an integer between 0 (none) and {MAX_TOP_K}, got {value!r}")
        ks.append(value)
    if request.get("prompt_alt_tokens_k"):
        raise UserError("prompt_alt_tokens_k: not served (top-K and target log-probs are; docs/tinker.md)")
    return ks[0], ks[1]


@torch.inference_mode()  # cheaper than no_grad (no version counters); nothing sampled here is trained through
def sample(model, tokenizer, request: dict[str, Any], device) -> Sampled:
    """One request alone: ``sample_batch`` of one (the same draws it gets in any batch)."""
    (outcome,) = sample_batch(model, tokenizer, [request], device)
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


@torch.inference_mode()  # cheaper than no_grad (no version counters); nothing sampled here is trained through
def sample_batch(
    model, tokenizer, requests: list[dict[str, Any]], device, version: int = 0
) -> list[Sampled | UserError]:
    """Each request's sequences and prompt log-probs (or the ``UserError`` that refuses it alone), the valid ones
    sampled together in one decode loop (module docstring), every token under the weights of ``version``;
    ``wire.encode_sample_response`` makes the SDK's ``SampleResponse`` of one."""
    batch = SampleBatch(model, tokenizer, requests, device)
    while not batch.advance(model, math.inf, version):
        pass
    return batch.outcomes(model)


class SampleBatch:
    """Sample requests checked and decoding together, resumable between decode steps (``advance``): what an
    in-flight sampler runs a few steps at a time, the weights in the module changing in between."""

    def __init__(self, model, tokenizer, requests: list[dict[str, Any]], device):
        self.device = device
        self.results: list[Sampled | UserError | None] = [None] * len(requests)
        self.planned: list[tuple[int, Planned]] = []
        for i, request in enumerate(requests):
            try:
                self.planned.append((i, plan(tokenizer, model, request)))
            except UserError as exc:
                self.results[i] = exc
        plans = [p for _, p in self.planned]
        # Generators in arrival order; an unseeded request takes one draw of the process's generator, so the
        # next unseeded request (cookbook groups: one num_samples=1 request per member) draws something else.
        generators = [_generator(p.seed, device) for p in plans]
        self.decoding = Decoding(model, tokenizer, plans, generators, device) if plans else None

    def advance(self, model, steps: float, version: int) -> bool:
        """Up to ``steps`` decode steps under ``model``'s weights now (their ``version``); True once done."""
        return self.decoding is None or self.decoding.advance(model, steps, version)

    @torch.inference_mode()
    def outcomes(self, model) -> list[Sampled | UserError]:
        """Once done: each request's ``Sampled`` (prompt log-probs under ``model``'s weights now) or refusal."""
        if self.decoding is not None:
            for (i, p), rows in zip(self.planned, self.decoding.sequences(), strict=True):
                self.results[i] = _prompt_side(model, p, rows, self.device)
        return self.results  # type: ignore[return-value]  # every slot filled above


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


class Decoding:
    """The lean engine's decode loop over every row of every request, resumable between steps (in-flight
    sampling: the weights in ``model`` may change between two ``advance`` calls; the cache keeps what earlier
    weights computed, as in oprl's partial rollouts). Prompts left-padded, each distinct prompt prefilled once,
    the attention mask growing a column a step. Per step, each unfinished request draws one token for each of its
    rows with ``sample_token`` under its own ``Sampling`` from its generator; a row ends at a stop token (kept) or
    once its text holds a stop string, a request once all its rows ended or it drew ``max_tokens``. Rows of
    finished requests leave the batch (in bulk, as in the lean engine). Each sampled token records the weights'
    ``version`` it was drawn under (the version ``advance`` was given)."""

    def __init__(self, model, tokenizer, plans: list[Planned], generators, device):
        self.tokenizer, self.plans, self.generators = tokenizer, plans, generators
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.owner = [k for k, p in enumerate(plans) for _ in range(p.n)]  # batch row -> request
        self.members = [[r for r, o in enumerate(self.owner) if o == k] for k in range(len(plans))]  # request -> rows
        self.prompts = [p.prompt for p in plans for _ in range(p.n)]
        self.device = device
        self.cache: Any = None  # prefilled at the first step, under the weights of that step
        self.live = list(range(len(self.owner)))  # batch row of each cache row
        self.tokens: list[list[int]] = [[] for _ in self.owner]
        self.logprobs: list[list[float]] = [[] for _ in self.owner]
        self.versions: list[list[int]] = [[] for _ in self.owner]
        self.top_ids: list[list[list[int]]] = [[] for _ in self.owner]  # per row, per token: topk_sample ids
        self.top_logprobs: list[list[list[float]]] = [[] for _ in self.owner]
        self.done, self.stopped = [False] * len(self.owner), [False] * len(self.owner)
        self.finished = [False] * len(plans)
        self.step = 0

    @torch.inference_mode()
    def advance(self, model, steps: float, version: int = 0) -> bool:
        """Up to ``steps`` decode steps under the weights ``model`` holds now (``version``); True once done."""
        if self.cache is None:
            prefill = prefill_shared_prompts(model, self.prompts, self.pad, self.device, logits_to_keep=1)
            self.cache, self.logits = prefill.cache, prefill.output.logits[:, -1][prefill.rows]  # (B, V)
            self.attention, self.position = prefill.attention, prefill.next_position  # (B, P), (B,)
        elif not all(self.finished):
            self._feed(model)
        taken = 0
        while taken < steps:
            self._draw(version)
            taken += 1
            if all(self.finished):
                return True
            if taken < steps:
                self._feed(model)
        return all(self.finished)

    def _draw(self, version: int) -> None:
        """One token for each row of each unfinished request, from the current logits."""
        logits = self.logits
        where = {row: c for c, row in enumerate(self.live)}  # batch row -> cache row
        self.fed = torch.full((len(self.live),), self.pad, dtype=torch.long, device=logits.device)  # (L,)
        for k, p in enumerate(self.plans):
            if self.finished[k]:
                continue
            rows = self.members[k]
            index = torch.tensor([where[r] for r in rows], device=logits.device)
            logp = sampling_logprobs(logits[index], p.sampling)  # (n, V): log μ, what the token is drawn from
            token, logprob = draw(logp, self.generators[k])  # (n,), (n,): log μ(y)
            top = [t.tolist() for t in top_logprobs(logp, p.topk_sample)] if p.topk_sample else None
            self.fed[index] = token
            for j, (row, t, lp) in enumerate(zip(rows, token.tolist(), logprob.tolist(), strict=True)):
                if self.done[row]:
                    continue
                self.tokens[row].append(t)
                self.logprobs[row].append(lp)
                self.versions[row].append(version)
                if top is not None:
                    self.top_ids[row].append(top[0][j])
                    self.top_logprobs[row].append(top[1][j])
                text = self.tokenizer.decode(self.tokens[row]) if p.stop_strings else ""
                if t in p.stop_tokens or any(s in text for s in p.stop_strings):
                    self.done[row] = self.stopped[row] = True
            self.finished[k] = self.step + 1 >= p.max_tokens or all(self.done[r] for r in rows)
        self.step += 1

    def _feed(self, model) -> None:
        """The drawn tokens through the model (the rows of finished requests leaving first): the next logits."""
        live, fed, attention, position = self.live, self.fed, self.attention, self.position
        leaving = [c for c, row in enumerate(live) if self.finished[self.owner[row]]]
        if leaving and len(leaving) >= max(1, COMPACT_FRACTION * len(live)):
            keep = [c for c in range(len(live)) if not self.finished[self.owner[live[c]]]]
            index = torch.tensor(keep, device=fed.device)
            self.cache.reorder_cache(index)
            live = self.live = [live[c] for c in keep]
            attention, position, fed = attention[index], position[index], fed[index]
        attention = torch.cat([attention, attention.new_ones((len(live), 1))], dim=1)
        out = model(
            input_ids=fed[:, None], attention_mask=attention, position_ids=position[:, None], use_cache=True,
            **{cache_kwarg(model): self.cache},
        )  # fmt: skip
        self.cache, self.logits, self.position, self.attention = (
            output_cache(out),
            out.logits[:, -1],
            position + 1,
            attention,
        )

    def sequences(self) -> list[list[Sequence]]:
        """Per request, its rows' sequences (tokens, log μ, stopped, the version of each token)."""
        asked = [self.plans[k].topk_sample > 0 for k in self.owner]
        tops = zip(self.top_ids, self.top_logprobs, asked, strict=True)
        rows = zip(self.tokens, self.logprobs, self.stopped, self.versions, tops, strict=True)
        sequences = [Sequence(t, lp, s, v, *((ti, tl) if a else (None, None))) for t, lp, s, v, (ti, tl, a) in rows]
        return [[sequences[r] for r in rows] for rows in self.members]


def _prompt_side(model, p: Planned, sequences: list[Sequence], device) -> Sampled:
    """A request's ``Sampled``: its sequences and, as asked, the prompt's log-probs, top-K and target log-probs,
    all from one forward of the prompt under ``model``'s weights now (none when nothing is asked)."""
    scored = p.request.get("prompt_logprobs")
    if not (scored or p.topk_prompt or p.target is not None):
        return Sampled(sequences)
    ids = torch.tensor([p.prompt], device=device)
    logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()  # (P-1, V): row i predicts token i+1
    last = p.request.get("prompt_logprobs_last_n") if scored else None  # range checked by plan(); needs scored
    skipped = len(p.prompt) - int(last) if last is not None else 1  # positions 0 .. skipped-1 carry nothing
    out = Sampled(sequences)
    if scored:
        values = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None]).squeeze(-1).tolist()  # log π
        out.prompt_logprobs = [*[math.nan] * skipped, *values[skipped - 1 :]]
    if p.topk_prompt or p.target is not None:
        logp = sampling_logprobs(logits, p.sampling)  # (P-1, V): log μ_t, the request's distribution
        if p.topk_prompt:
            top_ids, top_values = top_logprobs(logp, p.topk_prompt)  # (P-1, K) each
            all_ids = np.zeros((len(p.prompt), p.topk_prompt), dtype=np.int64)
            all_values = np.full((len(p.prompt), p.topk_prompt), -math.inf, dtype=np.float32)
            all_ids[skipped:], all_values[skipped:] = top_ids[skipped - 1 :].cpu(), top_values[skipped - 1 :].cpu()
            out.topk_prompt = (all_ids, all_values)
        if p.target is not None:
            t = p.target
            named = t.ids >= 0
            scored = np.zeros(t.ids.shape, dtype=np.float32)
            rows, cols = torch.as_tensor(t.rows[named]), torch.as_tensor(t.ids[named])
            scored[named] = logp[rows.to(logp.device), cols.to(logp.device)].cpu().numpy()
            t.logprobs = scored
            out.target = t
    return out
