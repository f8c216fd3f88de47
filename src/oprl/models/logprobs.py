"""Trainer-side log-probs of response tokens, computed the way the sampler computed them.

Layout matches generation: ``[left-padded prompt | response | right padding]`` with position ids from the
attention mask, and logits divided by the sampling temperature, so that on-policy the recomputed log-probs
equal the recorded behaviour log-probs up to float error. Only the response positions are projected to the
vocabulary (``logits_to_keep``), and the log-softmax is never materialised for the whole batch: log-probs are
``logit[target] - logsumexp(logits)`` computed row-chunk by row-chunk.
"""

from __future__ import annotations

import torch

from oprl.rollout.hf_engine import left_pad


def pack(prompt_ids: list[list[int]], response_ids: list[list[int]], pad_id: int):
    """Build model inputs: ``input_ids`` / ``attention_mask`` ``(B, P+T)``, ``targets`` / ``mask`` ``(B, T)``."""
    prompts, prompt_mask = left_pad(prompt_ids, pad_id)  # (B, P)
    width = max(len(r) for r in response_ids)
    targets = torch.full((len(response_ids), width), pad_id, dtype=torch.long)  # (B, T)
    mask = torch.zeros((len(response_ids), width), dtype=torch.bool)  # (B, T)
    for i, row in enumerate(response_ids):
        targets[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = True
    input_ids = torch.cat([prompts, targets], dim=1)  # (B, P+T)
    attention_mask = torch.cat([prompt_mask, mask.long()], dim=1)  # (B, P+T)
    return input_ids, attention_mask, targets, mask


def response_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_rows: int = 16,
    with_entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(target_t | prefix) under the temperature-scaled distribution, for the ``T`` response positions.

    Returns ``(logprobs (B, T), entropy (B, T) or None)``. Entropy (of the temperature-scaled distribution) is
    computed only when ``with_entropy``, and carries gradient only when ``entropy_grad`` (an entropy bonus);
    as a pure metric it is computed without building a graph.
    """
    num_targets = targets.shape[1]
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)  # (B, L), as generate builds them
    # Logits at positions L-T-1 .. L-2 predict the T response tokens; the last position predicts nothing.
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        logits_to_keep=num_targets + 1,
        use_cache=False,
    ).logits[:, :-1]  # (B, T, V)
    logprob_chunks, entropy_chunks = [], []
    for start in range(0, logits.shape[0], chunk_rows):
        scaled = logits[start : start + chunk_rows].float() / temperature  # (b, T, V)
        normaliser = torch.logsumexp(scaled, dim=-1)  # (b, T)
        chosen = scaled.gather(-1, targets[start : start + chunk_rows, :, None].to(scaled.device)).squeeze(-1)
        logprob_chunks.append(chosen - normaliser)  # (b, T)
        if with_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                probs = torch.softmax(scaled, dim=-1)  # (b, T, V), one chunk at a time
                entropy_chunks.append(normaliser - (probs * scaled).sum(-1))
    logprobs = torch.cat(logprob_chunks)
    entropy = torch.cat(entropy_chunks) if with_entropy else None
    return logprobs, entropy
