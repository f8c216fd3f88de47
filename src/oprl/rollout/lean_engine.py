"""Rollout engine with its own sampling loop over the model's key/value cache (the default engine).

Same contract as ``HFGenerateEngine`` (both are a ``TorchEngine`` with their own sampling step: the same
``Rollout``, the same seeding, behaviour log-probs from the very distribution sampled from), two differences
that matter for RL batches:

- **Each distinct prompt is prefilled once.** A GRPO batch holds every prompt K times; its forward pass runs
  once and the cache is gathered to the K rows (the trainer does the same, ``grouped_response_logprobs``).
- **One decode step is one model call plus the sampling math**: no logits-processor list, no stopping-criteria
  objects, only the last position projected to the vocabulary, and rows that have emitted EOS leave the batch
  (in bulk, once a quarter of it is done, because dropping rows copies the cache).

Sampling per step, for the scaled scores ``s = logits / temperature``: tokens outside the kept set of the call's
``Sampling`` (``oprl.models.truncation``: top-k then top-p, transformers' and vLLM's rule, which the trainer
rebuilds) get ``-inf``; ``log_softmax(s)`` is the behaviour log-prob and the token is drawn with
``torch.multinomial`` from its exponential.

Partial rollouts (``oprl.explorer.switcher``): given a ``switch``, the loop asks it before each decode step whether
other weights take over from there; they are loaded into the same model, so every unfinished row continues
with them. ``kv="keep"`` leaves the cache of the earlier tokens as the old weights computed it;
``kv="recompute"`` runs the prompt and the tokens so far through the new weights once (a fresh cache).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from oprl.lazy import lazy_import
from oprl.models.batching import cache_kwarg, left_pad, output_cache, positions
from oprl.models.truncation import Sampling
from oprl.rollout.base import EngineCapabilities, Switch, TorchEngine, sampling_logprobs, top_logprobs
from oprl.rollout.prefixes import PrefixStore
from oprl.rollout.prefixes import prefill as prefill_reusing

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch", globals())  # imported on first use (oprl.lazy): the config needs only names

COMPACT_FRACTION = 0.25
"""Drop finished rows from the batch once at least this fraction of it has emitted EOS."""


class LeanEngine(TorchEngine):
    """Samples with a plain decode loop on the model's cache (temperature, top-k, top-p). ``settings``: the
    ``TorchEngine`` defaults ``sampling``, ``max_new_tokens``. ``prefix_reuse``: keep
    each row's cache between calls, up to ``kv_cache_gb`` GiB (``oprl.rollout.prefixes``)."""

    capabilities = EngineCapabilities(
        partial_kv=("keep", "recompute"),  # the loop asks the switch before every step (lean_sample)
        prefix_reuse=True,
        row_seeds=False,  # one generator per call
        exact_truncation=True,  # sample_token: oprl.models.truncation's kept set
        top_logprobs=True,  # lean_sample(top_k=): top_logprobs of the distribution each token is drawn from
    )

    def __init__(self, model, tokenizer, *, prefix_reuse: bool = False, kv_cache_gb: float = 1.0, **settings):
        super().__init__(lean_sample, model, tokenizer, **settings)
        self.prefixes = PrefixStore(prefix_reuse, int(kv_cache_gb * 2**30))


def lean_sample(
    model,
    tokenizer,
    prompt_ids: list[list[int]],
    sampling: Sampling,
    max_new_tokens: int,
    switch: Switch | None = None,
    offset: int = 0,
    prefixes: PrefixStore | None = None,
    top_k: int = 0,
):
    """``(tokens (B, T), behaviour log-probs (B, T))`` drawn from ``sampling``'s distribution, on the CPU; anything
    after a row's first EOS is ignored. ``top_k`` = K > 0: also ``(top ids (B, T, K), top log-probs (B, T, K))``,
    ``oprl.rollout.base.top_logprobs`` of the very log-probs each token was drawn from.
    ``switch`` (``oprl.rollout.base.Switch``): ``switch.before(offset + t)`` runs before the distribution of
    token t is computed (t >= 1) and says whether new weights were loaded; ``switch.kv`` what the cache does.
    ``prefixes`` (``oprl.rollout.prefixes``): resume each prompt from its longest stored prefix, count the
    prefill, and keep each row's cache (prompt and fed reply tokens) for the next call."""
    pad_id, eos_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    device = model.device
    prefill = prefill_reusing(model, prompt_ids, pad_id, device, prefixes)
    cache, cache_name = prefill.cache, cache_kwarg(model)
    logits = prefill.output.logits[:, -1][prefill.rows]  # (B, V)
    attention, next_position = prefill.attention, prefill.next_position  # (B, P) grows a column per step; (B,)
    batch, limit = len(prompt_ids), max_new_tokens
    tokens = torch.full((batch, limit), pad_id, dtype=torch.long, device=device)  # (B, T)
    logprobs = torch.zeros((batch, limit), dtype=torch.float32, device=device)  # (B, T)
    if top_k:  # allocated only when recorded: K = 0 adds no tensor and no work
        top_ids = torch.zeros((batch, limit, top_k), dtype=torch.long, device=device)  # (B, T, K)
        top_values = torch.full((batch, limit, top_k), float("-inf"), dtype=torch.float32, device=device)
    live = torch.arange(batch, device=device)  # batch row of each cache row
    done = torch.zeros(batch, dtype=torch.bool, device=device)  # per cache row: EOS emitted
    for step in range(limit):
        logp = sampling_logprobs(logits, sampling)  # (L, V)
        token, logprob = draw(logp)  # (L,), (L,)
        tokens[live, step], logprobs[live, step] = token, logprob
        if top_k:
            top_ids[live, step], top_values[live, step] = top_logprobs(logp, top_k)  # (L, K) each
        done |= token == eos_id
        if step == limit - 1 or bool(done.all()):
            break
        if int(done.sum()) >= max(1, COMPACT_FRACTION * len(live)):
            keep = (~done).nonzero().squeeze(-1)
            if prefixes is not None:  # the finished rows' caches, before they leave the batch
                _save(prefixes, cache, attention, done.nonzero().squeeze(-1), live, prompt_ids, tokens, step, eos_id)
            cache.reorder_cache(keep)
            live, attention, next_position, token, done = (
                t[keep] for t in (live, attention, next_position, token, done)
            )
        if switch is not None and switch.before(offset + step + 1) and switch.kv == "recompute":
            cache, attention, next_position, logits = recompute_prefix(
                model, prompt_ids, tokens, live, step + 1, pad_id
            )
            continue
        attention = torch.cat([attention, attention.new_ones((len(live), 1))], dim=1)
        out = model(
            input_ids=token[:, None],
            attention_mask=attention,
            position_ids=next_position[:, None],
            use_cache=True,
            **{cache_name: cache},
        )
        next_position = next_position + 1
        logits = out.logits[:, -1]
    if prefixes is not None:  # every token up to the last sampled one (never fed) is in the cache
        _save(prefixes, cache, attention, torch.arange(len(live)), live, prompt_ids, tokens, step, eos_id)
    if top_k:
        return tokens.cpu(), logprobs.cpu(), top_ids.cpu(), top_values.cpu()
    return tokens.cpu(), logprobs.cpu()


def _save(prefixes: PrefixStore, cache, attention, rows, live, prompt_ids, tokens, fed: int, eos_id: int) -> None:
    """Keep cache rows ``rows``: each its prompt and the first ``fed`` sampled tokens, cut after its EOS."""
    contexts, replies = [], []
    for i in rows.tolist():
        reply = tokens[int(live[i]), :fed].tolist()
        if eos_id in reply:
            reply = reply[: reply.index(eos_id) + 1]
        contexts.append(prompt_ids[int(live[i])])
        replies.append(reply)
    prefixes.save_rows(cache, attention, rows.tolist(), contexts, replies)


def recompute_prefix(
    model, prompt_ids: list[list[int]], tokens: torch.Tensor, live: torch.Tensor, width: int, pad_id: int
):
    """A fresh cache for the ``live`` rows: prompt + their first ``width`` tokens through the current weights.
    Returns ``(cache, attention (L, P + width), next_position (L,), logits of the next token (L, V))``."""
    rows = [prompt_ids[r] + tokens[r, :width].tolist() for r in live.tolist()]
    ids, mask = (t.to(tokens.device) for t in left_pad(rows, pad_id))  # (L, P + width)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=True, logits_to_keep=1)
    return output_cache(out), mask, mask.sum(1), out.logits[:, -1]


def sample_token(
    logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row of ``logits`` (L, V); returns ``(token (L,), log-prob (L,))`` under ``sampling``'s
    temperature-scaled, truncated distribution the token was drawn from (``Sampling``: the rule the trainer
    rebuilds). ``generator``: draw from it instead of torch's default one (the Tinker server gives each request
    its own, so a request's draws do not depend on what it was batched with)."""
    return draw(sampling_logprobs(logits, sampling), generator)


def draw(logp: torch.Tensor, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row from ``exp(logp)`` (L, V): ``(token (L,), its log-prob (L,))``."""
    token = torch.multinomial(logp.exp(), num_samples=1, generator=generator)  # (L, 1)
    return token.squeeze(-1), logp.gather(-1, token).squeeze(-1)
