"""The sampler's top-K at each response token beside the trainer's log-probs of the same ids: the one input of the
rules that read more of the two distributions than the sampled token (score centering, ``score_centering.py``;
DPPO's Top-K divergence, ``topk_divergence.py``).

At response token t of row b, H_bt is the set of the sampler's K most likely ids (``rollout.record_top_k=K``,
``oprl.trainer.inputs.TopK``); q_v = π_b(v) is the sampler's probability of id v as recorded (temperature, top-k,
top-p applied), p_v = π_θ(v) the trainer's, from the same forward as the sampled token's (``oprl.models.logprobs``,
``extra_ids``). A slot the sampler padded (fewer than K ids, or past the row's end) holds log q = −inf: it is not
in H and every rule here gives it no weight and no gradient.

Not here: where the ids come from (``oprl.trainer.inputs``), the rules themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from oprl.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch", globals())  # imported on first use (oprl.lazy): the config needs only names


class TopKTokens(NamedTuple):
    """A micro-batch's top-K view, (B, T, K) each."""

    behavior: torch.Tensor
    """log q_v: the sampler's log-probs of its top-K ids, −inf at padded slots."""
    current: torch.Tensor
    """log p_v: the trainer's log-probs of the same ids, with grad where the loss differentiates them (−inf for an
    id outside the trainer's kept set under top-k/top-p; any value at padded slots)."""
    sampled: torch.Tensor
    """bool: the slot's id is the token the sampler drew at that position."""

    def detached(self) -> TopKTokens:
        """The same without the graph (the masks read numbers only)."""
        return self._replace(current=self.current.detach())


class HeadMasses(NamedTuple):
    """The two distributions on H at every position, detached, (B, T, K) and (B, T)."""

    slots: torch.Tensor
    """(B, T, K) bool: a real slot of H at a valid token (``mask``)."""
    p: torch.Tensor
    """(B, T, K) p_v on the slots, 0 elsewhere."""
    q: torch.Tensor
    """(B, T, K) q_v on the slots, 0 elsewhere."""
    p_head: torch.Tensor
    """(B, T) Σ_H p."""
    q_head: torch.Tensor
    """(B, T) Σ_H q."""


def head_masses(top_k: TopKTokens, mask: torch.Tensor) -> HeadMasses:
    """``HeadMasses`` of ``top_k`` at the tokens of ``mask`` (B, T) (bool or float), without grad."""
    with torch.no_grad():
        slots = torch.isfinite(top_k.behavior) & (mask > 0)[..., None]  # (B, T, K)
        zero = torch.zeros((), dtype=torch.float32, device=top_k.behavior.device)
        p = torch.where(slots, top_k.current.float().clamp(max=0).exp(), zero)  # −inf (outside kept set) -> 0
        q = torch.where(slots, top_k.behavior.float().clamp(max=0).exp(), zero)
        return HeadMasses(slots, p, q, p.sum(-1), q.sum(-1))
