"""Truncated sampling (top-k, top-p): the one rule every sampler and the trainer apply to a distribution, and
``Sampling``, the value that carries its settings (temperature, top-k, top-p) from the config to every sampler
and scorer.

For temperature-scaled scores ``s = logits / temperature`` (..., V), the kept set ``S(s)`` is built in two
steps, in this order (vLLM's ``apply_top_k_top_p``, transformers' ``TopKLogitsWarper`` then
``TopPLogitsWarper``):

- **top-k** (``top_k > 0``): keep every token whose score is >= the k-th largest score (ties at the k-th value
  are all kept);
- **top-p** (``top_p < 1``): on the top-k survivors, renormalised, sort ascending and drop the tokens whose
  cumulative probability is <= 1 - top_p; the most likely token always stays.

The sampler draws from, and records the log-prob of, ``softmax`` over ``S(s)``; the trainer rebuilds ``S`` from
its own scores with this function (``oprl.models.logprobs``), so on-policy both sides renormalise over the same
set and rho = 1 up to float rounding. Deliberately not here: min-p, repetition penalties, any sampling.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from oprl.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch", globals())  # imported on first use (oprl.lazy): the config needs only names


@dataclass(frozen=True)
class Sampling:
    """The distribution a sampler draws each token from, for logits ``z`` (V,) of the next token:

        s = z / temperature          pi(y) = exp(s_y) / sum_{i in S(s)} exp(s_i)  for y in S(s), 0 outside

    with ``S(s)`` the kept set of the module docstring (every token when neither top-k nor top-p truncates).
    Every engine samples from this ``pi`` and records ``log pi(y)`` as the behaviour log-prob; the trainer (and a
    teacher scoring with ``teacher.support=truncated``) scores under the same ``pi`` rebuilt from its own logits
    (``oprl.models.logprobs``), so on-policy rho = 1 up to float rounding. That guarantee holds only while both
    sides read the one value: an option added here is applied by ``kept`` (lean engine, trainer) and mapped by
    the engines that sample elsewhere (docs/architecture.md, "How to add a sampling option").

    Built once from the config (``Sampling.of(config.rollout)``: ``rollout.temperature``, ``rollout.top_k``,
    ``rollout.top_p``), handed to an engine when it is built (its default) and to ``generate`` where a call
    samples otherwise (evaluation: ``Sampling.of(config.eval)``)."""

    temperature: float = 1.0
    """T > 0: the logits are divided by it before anything else (T < 1 sharpens, T > 1 flattens)."""
    top_k: int = 0
    """k >= 0: only tokens scoring >= the k-th largest score can be drawn (ties kept); 0 = off."""
    top_p: float = 1.0
    """0 < p <= 1: of the top-k survivors, the least likely tokens holding at most 1 - p of their mass are
    dropped, the most likely always kept; 1 = off."""

    @classmethod
    def of(cls, section: Any) -> Sampling:
        """The ``Sampling`` of a config section, each field read from the key of its name: ``rollout``
        (``rollout.temperature``, ``rollout.top_k``, ``rollout.top_p``) or ``eval`` (``eval.temperature``,
        ``eval.top_p``); a field the section has no key for stays off (evaluation has no top-k)."""
        values: dict[str, Any] = {f.name: getattr(section, f.name, f.default) for f in fields(cls)}
        return cls(**values)

    @property
    def truncates(self) -> bool:
        """Whether ``S(s)`` can drop a token: ``top_k > 0`` or ``top_p < 1``."""
        return self.top_k > 0 or self.top_p < 1.0

    def kept(self, scores: torch.Tensor) -> torch.Tensor:
        """(..., V) bool: ``S(s)`` of temperature-scaled ``scores`` (..., V), True where a token can be drawn
        (``kept_tokens``). The lean engine samples through it and the trainer scores through it."""
        return kept_tokens(scores, self.top_k, self.top_p)


PLAIN = Sampling()
"""Temperature 1, nothing truncated: the model's own distribution (the default of every sampler and scorer)."""


CANDIDATES = (64, 1024)
"""top_p alone: each row's nucleus is looked for among its 64, then its 1024 most likely tokens (partial sorts:
0.15 s and 0.7 s against 5.4 s for sorting 512 rows of a 49k vocabulary on 2 cores); rows whose nucleus may reach
past them are sorted whole."""


def kept_tokens(
    scores: torch.Tensor, top_k: int = 0, top_p: float = 1.0, candidates: tuple[int, ...] = CANDIDATES
) -> torch.Tensor:
    """(..., V) bool: True where a token of ``scores`` (..., V), temperature-scaled logits, survives top-k then
    top-p (see the module docstring). ``top_k = 0`` and ``top_p = 1`` keep everything. No gradient: the set is
    a step function of the scores."""
    scores = scores.detach()
    vocab = scores.shape[-1]
    top_k = top_k if 0 < top_k < vocab else 0
    if top_p >= 1.0:
        if not top_k:
            return torch.ones_like(scores, dtype=torch.bool)
        return scores >= scores.topk(top_k, dim=-1).values[..., -1:]  # (..., V): no sort needed
    rows = scores.reshape(-1, vocab)  # (R, V)
    kept = torch.zeros_like(rows, dtype=torch.bool)
    left = torch.arange(len(rows), device=rows.device)  # rows not settled yet
    for width in [w for w in ((top_k,) if top_k else candidates) if w < vocab]:
        found, unsure = _kept_among_largest(rows[left], width, bool(top_k), top_p)  # (L, V), (L,)
        kept[left[~unsure]] = found[~unsure]
        left = left[unsure]  # ties past the k-th score, or a nucleus that may reach past the candidates
        if len(left) == 0:
            return kept.reshape(scores.shape)
    kept[left] = _kept_sorting_all(rows[left], top_k, top_p)
    return kept.reshape(scores.shape)


def _kept_sorting_all(scores: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """``kept_tokens`` as vLLM's ``apply_top_k_top_p`` computes it: one ascending sort of the whole vocabulary,
    top-k then top-p in sorted order. Only where scores tie at the top-p boundary does the order of equal values
    matter; transformers re-sorts after top-k and may break such a tie the other way."""
    vocab = scores.shape[-1]
    ascending, order = scores.sort(dim=-1)  # (..., V)
    if top_k:
        ascending = ascending.masked_fill(ascending < ascending[..., vocab - top_k, None], float("-inf"))
    outside = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1.0 - top_p
    outside[..., -1] = False  # the most likely token always stays
    kept = ascending.isfinite() & ~outside  # (..., V), in sorted order
    return torch.empty_like(kept).scatter_(-1, order, kept)


def _kept_among_largest(rows: torch.Tensor, width: int, is_top_k: bool, top_p: float):
    """``(kept (R, V), rows to sort whole (R,))`` from the ``width`` largest scores of each row only: the top-k
    survivors (``is_top_k``; a row with more than k scores tied at the k-th needs the whole sort), or the
    candidates of a nucleus (a row whose candidates hold less than top_p of the mass needs the whole sort), and
    rows with tied candidates need it too. The cumulative sum runs over the same ascending values as the whole
    sort, from the mass below the candidates."""
    values, indices = rows.topk(width, dim=-1)  # (R, W), descending
    ascending = values.flip(-1)  # (R, W)
    # Equal candidates: which of them a cumulative sum reaches first is the whole sort's order, not topk's.
    tied = (values[:, 1:] == values[:, :-1]).any(dim=-1)  # (R,)
    if is_top_k:
        whole = tied | ((rows >= values[:, -1:]).sum(-1) != width)
        probs = ascending.softmax(dim=-1)  # renormalised over the survivors: nothing below them
        below = torch.zeros_like(values[:, :1])  # (R, 1)
    else:
        probs = (ascending - rows.logsumexp(dim=-1, keepdim=True)).exp()  # (R, W) full-softmax probabilities
        below = (1.0 - probs.sum(dim=-1, keepdim=True)).clamp(min=0.0)  # (R, 1) the mass of the other tokens
        whole = tied | (below.squeeze(-1) > 1.0 - top_p)  # or some token below the candidates might be kept
    outside = below + probs.cumsum(dim=-1) <= 1.0 - top_p  # (R, W)
    outside[:, -1] = False  # the most likely token always stays
    kept = torch.zeros_like(rows, dtype=torch.bool)
    return kept.scatter_(-1, indices, ~outside.flip(-1)), whole
