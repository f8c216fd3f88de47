"""Trainer-side log-probs of response tokens, computed the way the sampler computed them.

Layout matches generation: ``[left-padded prompt | response | right padding]`` with position ids from the
attention mask, scored under the sampler's ``Sampling`` (``oprl.models.truncation``): logits divided by its
temperature and, when it truncates (top-k / top-p), renormalised over the kept set rebuilt from these logits by
the sampler's own rule (``Sampling.kept``), so that on-policy the recomputed log-probs equal the recorded
behaviour log-probs up to float error.

Truncated scoring, for scaled scores ``s`` and the sampled token ``y`` (docs/runtime.md, "Top-k and top-p"):

    log pi_theta(y) = s_y - logsumexp_{i in S(s) + {y}} s_i

``S(s)`` is the current policy's kept set. Inside it this is the truncated, renormalised log-prob the sampler
recorded. A token outside it (stale data: the behaviour policy kept it, the current one would not; or a
cumulative sum within float rounding of 1 - top_p) is scored as if the kept set also held it: finite, so rho
stays finite and the loss's clipping / weighting handles it like any other small ratio. ``keep_chosen=False``
scores a fixed truncated distribution instead (the teacher's, ``teacher.support=truncated``): a token outside
``S(s)`` has probability 0, log-prob -inf.

Only the valid response tokens are projected to the vocabulary, in chunks of bounded size, so neither logits
nor log-softmax of shape ``(batch, length, vocab)`` ever exist: log-probs are ``logit[target] -
logsumexp(logits)`` computed chunk by chunk.
"""

from __future__ import annotations

import itertools

import torch
from torch.utils.checkpoint import checkpoint

from oprl.models.batching import cache_kwarg, left_pad, positions, prefill_shared_prompts, right_pad
from oprl.models.truncation import PLAIN, Sampling


def pack(prompt_ids: list[list[int]], response_ids: list[list[int]], pad_id: int):
    """Build model inputs: ``input_ids`` / ``attention_mask`` ``(B, P+T)``, ``targets`` / ``mask`` ``(B, T)``."""
    prompts, prompt_mask = left_pad(prompt_ids, pad_id)  # (B, P)
    targets, mask = right_pad(response_ids, pad_id)  # (B, T)
    input_ids = torch.cat([prompts, targets], dim=1)  # (B, P+T)
    attention_mask = torch.cat([prompt_mask, mask.long()], dim=1)  # (B, P+T)
    return input_ids, attention_mask, targets, mask


LOGIT_CHUNK_BYTES = 64 * 2**20
"""Budget for one chunk of float32 logits ``(tokens, vocab)``: 64 MiB is ~340 tokens of a 49k vocabulary."""


def response_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    targets: torch.Tensor,
    *,
    sampling: Sampling = PLAIN,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    chunk_bytes: int = LOGIT_CHUNK_BYTES,
    keep_chosen: bool = True,
    extra_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """log pi(target_t | prefix) under ``sampling``'s distribution, for the ``T`` response positions: logits over
    its temperature and, when it truncates, renormalised over its kept set, which holds the target too unless
    ``keep_chosen`` is False (then a target outside it scores -inf; module docstring).

    Returns ``(logprobs (B, T), entropy (B, T) or None)``; padded response positions (where the response part
    of ``attention_mask`` is 0) hold 0. With ``extra_ids`` (B, T, K) int64 (the sampler's top-K ids,
    ``rollout.record_top_k``) a third tensor follows: ``extra (B, T, K)``, log pi of each of those ids at each
    position, gathered from the same log-softmax as the target's (no second forward; -inf for an id outside the
    kept set, 0 at padded positions). Entropy (of the temperature-scaled distribution) is computed only when
    ``with_entropy``, and carries gradient only when ``entropy_grad`` (an entropy bonus); as a pure metric it
    is computed without building a graph.

    Memory: the backbone's final hidden states are taken at the valid response tokens only, and the vocabulary
    projection + log-softmax run over chunks of at most ``chunk_bytes`` of float32 logits. Under autograd each
    chunk is checkpointed (only its hidden states are kept; the logits are recomputed in backward), so no
    ``(B, T, V)`` tensor exists at any time, forward or backward. Models whose head is not a plain linear map
    of the last hidden state (logit soft-capping, logit scaling) take the fallback: full logits of the
    response positions, then the same chunked log-softmax.
    """
    mask = attention_mask[:, -targets.shape[1] :].bool()  # (B, T): pack() puts the response mask there
    features, head = response_features(model, input_ids, attention_mask, targets.shape[1])  # (B, T, ·)
    features = features[mask]  # (N, H) or (N, V), valid tokens only
    chosen = targets.to(features.device)[mask.to(features.device)]  # (N,)
    extra = None if extra_ids is None else extra_ids.to(features.device)[mask.to(features.device)]  # (N, K)
    return _chunked_logprobs(
        head, features, chosen, mask, sampling, with_entropy, entropy_grad, chunk_bytes, keep_chosen, extra
    )


def response_features(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_targets: int
) -> tuple[torch.Tensor, torch.nn.Module]:
    """The model's forward over packed rows ``(B, L)`` (``pack``), up to the head: ``(features (B, T, H), head)``
    at the ``num_targets`` positions that predict the response tokens (L-T-1 .. L-2; the last position predicts
    nothing), position ids from the attention mask as generate builds them. A model whose logits are not a plain
    linear map of the last hidden state (soft-capping, logit scaling) runs its own forward: ``(logits (B, T, V),
    Identity)``. ``head(features)`` are the logits either way; every row's tensors stay (B, ·, ·)."""
    position_ids = positions(attention_mask)  # (B, L)
    head = _plain_head(model)
    if head is not None:
        hidden = _decoder(model)(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state  # (B, L, H)
        return hidden[:, -num_targets - 1 : -1], head
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        logits_to_keep=num_targets + 1,
        use_cache=False,
    ).logits[:, :-1]  # (B, T, V)
    return logits, torch.nn.Identity()


def row_logprobs(model, input_ids, attention_mask, targets, sampling: Sampling = PLAIN) -> torch.Tensor:
    """(B, T) log-probs of ``targets`` (B, T) with every row's tensors kept (B, ·, ·) through the forward and the
    head (``response_features``), the same numbers as ``response_logprobs`` without flattening tokens across
    rows: per-row gradients (``oprl.trainer.score_norms``) need each row's slice. Padding positions hold their
    targets' log-probs (mask them); float32 logits of the whole (B, T, V) are formed, unchunked."""
    features, head = response_features(model, input_ids, attention_mask, targets.shape[1])
    logits = head(features)  # (B, T, V)
    batch, width, vocab = logits.shape
    logprobs, _ = _token_logprobs(
        torch.nn.Identity(), logits.reshape(batch * width, vocab), targets.reshape(-1), sampling, False, False
    )
    return logprobs.reshape(batch, width)


def packed_response_logprobs(
    model, prompt_ids: list[list[int]], response_ids: list[list[int]], pad_id: int, **kwargs
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """``response_logprobs`` of rows given as token lists, each row's prompt and response packed (``pack``) and
    run whole: no key/value cache, so every layer's forward can be recomputed in backward (activation
    checkpointing), at the cost of running each group's prompt once per row. Returns ``(logprobs (B, T),
    entropy (B, T) or None, mask (B, T))``, equal to ``grouped_response_logprobs`` up to float rounding, and
    with ``extra_ids`` (B, T, K) the log-probs of those ids, ``(B, T, K)``, as a fourth (``response_logprobs``)."""
    device = next(model.parameters()).device
    input_ids, attention_mask, targets, mask = (t.to(device) for t in pack(prompt_ids, response_ids, pad_id))
    logprobs, entropy, *extra = response_logprobs(model, input_ids, attention_mask, targets, **kwargs)
    return (logprobs, entropy, mask, *extra)


def grouped_response_logprobs(
    model,
    prompt_ids: list[list[int]],
    response_ids: list[list[int]],
    pad_id: int,
    *,
    sampling: Sampling = PLAIN,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    chunk_bytes: int = LOGIT_CHUNK_BYTES,
    keep_chosen: bool = True,
    extra_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """``response_logprobs`` for rows given as token lists, running each distinct prompt through the model once.

    A GRPO batch holds every prompt K times (its group); recomputing the prompt for each response costs K
    times the prompt's share of the forward and backward. Here the distinct prompts go through the backbone
    once (``use_cache``), their key/value cache is gathered to the rows (differentiably: the prompt's gradient
    sums over its group), and only the response tokens run per row. Positions and masks are those of
    ``pack``, so the numbers equal ``response_logprobs(*pack(...))`` up to float rounding (tested).

    Returns ``(logprobs (B, T), entropy (B, T) or None, mask (B, T))`` and, with ``extra_ids`` (B, T, K), the
    log-probs of those ids from the same log-softmax, ``(B, T, K)``, as a fourth (``response_logprobs``). Models
    without a plain linear head (see ``response_logprobs``) fall back to it.
    """
    head = _plain_head(model)
    if head is None:
        return packed_response_logprobs(  # type: ignore[return-value]  # (logprobs, entropy or None, mask[, extra])
            model,
            prompt_ids,
            response_ids,
            pad_id,
            sampling=sampling,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
            chunk_bytes=chunk_bytes,
            keep_chosen=keep_chosen,
            extra_ids=extra_ids,
        )
    decoder, device = _decoder(model), head.weight.device
    prefill = prefill_shared_prompts(decoder, prompt_ids, pad_id, device)
    targets, mask = (t.to(device) for t in right_pad(response_ids, pad_id))  # (B, T)
    width = targets.shape[1]
    # The last prompt position predicts response token 0.
    hidden = prefill.output.last_hidden_state[:, -1][prefill.rows][:, None]  # (B, 1, H)
    if width > 1:
        rest = _after_prefill(decoder, prefill, targets[:, :-1], mask[:, :-1])  # (B, T-1, H): t predicts t+1
        hidden = torch.cat([hidden, rest], dim=1)  # (B, T, H)
    extra = None if extra_ids is None else extra_ids.to(device)[mask]  # (N, K)
    logprobs, entropy, *rest = _chunked_logprobs(
        head, hidden[mask], targets[mask], mask, sampling, with_entropy, entropy_grad, chunk_bytes, keep_chosen, extra
    )
    return (logprobs, entropy, mask, *rest)


def prefix_shared_logprobs(
    model,
    inputs: list[list[int]],
    targets: list[list[int]],
    shared: list[int],
    pad_id: int,
    *,
    sampling: Sampling = PLAIN,
    chunk_bytes: int = LOGIT_CHUNK_BYTES,
    prefix_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """log pi(targets[b][t] | inputs[b][:t+1]) at **every** position t of every row, each row's first
    ``shared[b]`` input tokens run through the backbone once for all the rows that start with them.

    The general form of ``grouped_response_logprobs`` for rows whose targets are given apart from their inputs
    (Tinker's datums: position t of the input predicts target t): the distinct prefixes ``inputs[b][:shared[b]]``
    are prefilled once (``use_cache``), their hidden states and cache gathered to the rows (differentiably: a
    prefix's gradient sums over its rows), and only the rest of each row runs per row, attending to its prefix's
    cache. Each position's feature is the prefix pass's hidden state (t < shared[b]) or the row pass's, the same
    causal computation as running the row whole, so the numbers equal ``response_logprobs`` on the row laid out
    whole up to float rounding (tested in tests/serve/tinker). ``1 <= shared[b] <= len(inputs[b])``.

    ``prefix_grad=False`` (the caller's loss has no gradient at the prefix positions: advantage 0 there): the
    prefix positions' log-probs are computed without autograd, once per distinct (prefix, targets) rather than
    once per row, and only the rest's positions are projected to the vocabulary under autograd (the gradient
    still reaches the prefix's pass through the cache the rest attends to). Same values up to float rounding.

    Returns ``(logprobs (B, T), mask (B, T))`` with T the longest row, or None for a model without a plain linear
    head (``response_logprobs`` handles those)."""
    head = _plain_head(model)
    if head is None:
        return None
    decoder, device = _decoder(model), head.weight.device
    prefill = prefill_shared_prompts(decoder, [row[:n] for row, n in zip(inputs, shared, strict=True)], pad_id, device)
    if not prefix_grad:
        return _detached_prefix_logprobs(head, decoder, prefill, inputs, targets, shared, pad_id, sampling, chunk_bytes)
    width = prefill.attention.shape[1]  # P: prefixes are left-padded, a row's prefix is its last shared[b] columns
    prefix_hidden = prefill.output.last_hidden_state[prefill.rows]  # (B, P, H)
    rests, rest_mask = (
        t.to(device) for t in right_pad([row[n:] or [pad_id] for row, n in zip(inputs, shared, strict=True)], pad_id)
    )
    rest_mask &= torch.tensor([len(row) > n for row, n in zip(inputs, shared, strict=True)], device=device)[:, None]
    rest_hidden = None
    if bool(rest_mask.any()):
        rest_hidden = _after_prefill(decoder, prefill, rests, rest_mask)  # (B, S, H)
    features = torch.cat(
        [
            part
            for b, (row, n) in enumerate(zip(inputs, shared, strict=True))
            for part in (
                prefix_hidden[b, width - n :],
                rest_hidden[b, : len(row) - n] if rest_hidden is not None and len(row) > n else None,
            )
            if part is not None
        ]
    )  # (N, H): every row's positions in order, which is the order of mask's True entries
    chosen, mask = (t.to(device) for t in right_pad(targets, 0))  # (B, T)
    logprobs, _ = _chunked_logprobs(head, features, chosen[mask], mask, sampling, False, False, chunk_bytes)
    return logprobs, mask


def _detached_prefix_logprobs(
    head, decoder, prefill, inputs, targets, shared, pad_id, sampling: Sampling, chunk_bytes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``prefix_shared_logprobs`` for a loss with no gradient at the prefix positions: ``(logprobs (B, T), mask
    (B, T))``. The prefix positions (t < shared[b]) are scored from the distinct prefixes' hidden states without
    autograd, each distinct (prefix, its targets) once (a GRPO group's K rows share both); the rest's positions
    (t >= shared[b]) in one boolean gather of the rest pass's (B, S, H) states, under autograd. Neither path
    gathers (B, P, H) prefix states to the rows nor slices per row, which is what the backward of the general
    path pays for (one autograd node per row and part)."""
    device = head.weight.device
    width = prefill.attention.shape[1]
    hidden = prefill.output.last_hidden_state  # (U, P, H), U distinct prefixes
    # Distinct (prefix, prefix targets): row b's prefix positions are columns width - n .. width - 1 of its prefix.
    keys = [(int(u), tuple(row[:n])) for u, row, n in zip(prefill.rows.tolist(), targets, shared, strict=True)]
    distinct = list(dict.fromkeys(keys))
    with torch.no_grad():
        features = torch.cat([hidden[u, width - len(t) :] for u, t in distinct])  # (sum of n over distinct, H)
        chosen = torch.tensor([x for _, t in distinct for x in t], device=device)
        every = torch.ones(1, chosen.shape[0], dtype=torch.bool, device=device)  # (1, N): the values as they are
        values = _chunked_logprobs(head, features, chosen, every, sampling, False, False, chunk_bytes)[0][0]
    offsets = dict(zip(distinct, itertools.accumulate((len(t) for _, t in distinct), initial=0), strict=False))
    longest = max(len(row) for row in targets)
    column = torch.arange(longest)[None]  # (1, T)
    # (B, T): where each row's prefix position t finds its value (clamped past the prefix, masked out below)
    index = (torch.tensor([offsets[key] for key in keys])[:, None] + column).clamp(max=values.shape[0] - 1)
    lengths, cut = torch.tensor([len(row) for row in targets]), torch.tensor(shared)
    prefix_mask, mask = (column < cut[:, None]).to(device), (column < lengths[:, None]).to(device)
    logprobs = torch.where(prefix_mask, values[index.to(device)], torch.zeros((), device=device))  # (B, T)
    rest_mask = mask & ~prefix_mask
    if bool(rest_mask.any()):
        rest_tokens = [row[n:] or [pad_id] for row, n in zip(inputs, shared, strict=True)]
        rests, valid = (t.to(device) for t in right_pad(rest_tokens, pad_id))
        valid &= (lengths > cut).to(device)[:, None]
        rest_hidden = _after_prefill(decoder, prefill, rests, valid)  # (B, S, H)
        chosen = torch.tensor([x for row, n in zip(targets, shared, strict=True) for x in row[n:]], device=device)
        rest_values, _ = _chunked_logprobs(
            head, rest_hidden[valid], chosen, rest_mask, sampling, False, False, chunk_bytes
        )
        logprobs = logprobs + rest_values  # valid and rest_mask list the same positions, row-major
    return logprobs, mask


def _after_prefill(decoder, prefill, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The decoder's last hidden states (B, S, H) of ``ids`` (B, S) run on after ``prefill``'s shared prompts:
    attention over the prefix's (B, P) mask then ``valid`` (B, S), positions ``next_position[b] + s``, reading and
    extending the prefill's KV cache (each row's own prefix through ``prefill.rows``)."""
    attention = torch.cat([prefill.attention, valid.long()], dim=1)  # (B, P + S)
    steps = prefill.next_position[:, None] + torch.arange(ids.shape[1], device=ids.device)[None]  # (B, S)
    return decoder(
        input_ids=ids,
        attention_mask=attention,
        position_ids=steps,
        use_cache=True,
        **{cache_kwarg(decoder): prefill.cache},
    ).last_hidden_state


def _chunked_logprobs(
    head, features, chosen, mask, sampling: Sampling, with_entropy, entropy_grad, chunk_bytes, keep_chosen=True,
    extra=None,
):  # fmt: skip
    """Log-probs (and entropies) of ``chosen`` (N,) from ``features`` (N, H) in bounded chunks, placed at
    ``mask`` in ``(B, T)`` tensors, under ``sampling``'s distribution; with ``extra`` (N, K) ids, their log-probs
    too, placed in a third, ``(B, T, K)``."""
    vocab = head.out_features if isinstance(head, torch.nn.Linear) else features.shape[-1]
    # Truncation works on copies of the chunk's logits (sorted values, int64 order, cumulative sums): ~4x.
    copies = 4 if sampling.truncates else 1
    rows = max(1, chunk_bytes // (4 * vocab * copies))
    logprob_chunks, entropy_chunks, extra_chunks = [], [], []
    for start in range(0, features.shape[0], rows):
        args = (features[start : start + rows], chosen[start : start + rows])
        if extra is not None:  # the extra ids ride along in the same call: one log-softmax for all of them
            args = (args[0], torch.cat([args[1][:, None], extra[start : start + rows]], dim=1))  # (n, 1 + K)
        if torch.is_grad_enabled():
            # Keep only the chunk's inputs for backward; its (rows, V) logits are recomputed there.
            # preserve_rng_state=False: the chunk draws no random numbers, and saving/restoring the global RNG
            # would race with an explorer thread sampling from it at the same time (overlap mode).
            logprob, entropy = checkpoint(
                _token_logprobs,
                head,
                *args,
                sampling,
                with_entropy,
                entropy_grad,
                keep_chosen,
                use_reentrant=False,
                preserve_rng_state=False,
            )
        else:
            logprob, entropy = _token_logprobs(head, *args, sampling, with_entropy, entropy_grad, keep_chosen)
        if extra is not None:
            logprob, extra_logprob = logprob[:, 0], logprob[:, 1:]
            extra_chunks.append(extra_logprob)
        logprob_chunks.append(logprob)
        entropy_chunks.append(entropy)
    logprobs = _scatter(torch.cat(logprob_chunks), mask)
    entropy = _scatter(torch.cat(entropy_chunks), mask) if with_entropy else None
    if extra is None:
        return logprobs, entropy
    return logprobs, entropy, _scatter(torch.cat(extra_chunks).reshape(-1, extra.shape[1]), mask)


def _token_logprobs(
    head, features, chosen, sampling: Sampling, with_entropy: bool, entropy_grad: bool, keep_chosen: bool = True
):
    """(log-prob of ``chosen`` (n,), entropy (n,) or an empty tensor) for one chunk of ``n`` tokens, under the
    distribution ``sampling`` samples from; truncated, both are over the kept set plus ``chosen`` (without it
    when not ``keep_chosen``: a dropped ``chosen`` scores -inf; module docstring). ``chosen`` (n, 1 + K): the
    sampled token then K more ids (``extra_ids``), whose log-probs (n, 1 + K) are gathered from the same
    log-softmax; only the sampled one (column 0) joins the kept set."""
    scaled = head(features).float() / sampling.temperature  # (n, V)
    finite = scaled
    sampled = chosen if chosen.dim() == 1 else chosen[:, 0]  # (n,)
    if sampling.truncates:
        kept = sampling.kept(scaled)  # (n, V), no gradient
        dropped = ~(kept.scatter(-1, sampled[:, None], True) if keep_chosen else kept)
        finite = scaled.masked_fill(dropped, 0.0)  # for p * s below: 0 * -inf would be nan
        scaled = scaled.masked_fill(dropped, float("-inf"))  # probability 0, no gradient
    normaliser = torch.logsumexp(scaled, dim=-1)  # (n,)
    if chosen.dim() == 1:
        logprob = scaled.gather(-1, chosen[:, None]).squeeze(-1) - normaliser  # (n,)
    else:
        logprob = scaled.gather(-1, chosen) - normaliser[:, None]  # (n, 1 + K)
    entropy = scaled.new_empty(0)
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = normaliser - (torch.softmax(scaled, dim=-1) * finite).sum(-1)
    return logprob, entropy


def _scatter(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Place per-valid-token ``values`` (N,) or (N, K) into a zero ``(B, T)`` or ``(B, T, K)`` tensor at ``mask``."""
    out = values.new_zeros(mask.shape + values.shape[1:])
    where = mask.to(values.device)
    return out.masked_scatter(where.reshape(where.shape + (1,) * (values.dim() - 1)).expand_as(out), values)


def _plain_head(model):
    """The output projection if logits are exactly ``head(last hidden state)``, else None."""
    config = getattr(model, "config", None)
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return None
    try:
        head = model.get_output_embeddings()
        decoder = _decoder(model)
    except (AttributeError, NotImplementedError):
        return None
    return head if isinstance(head, torch.nn.Linear) and decoder is not None else None


def _decoder(model):
    """The backbone returning ``last_hidden_state`` (unwrapping a peft model; LoRA layers live inside it)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder()
