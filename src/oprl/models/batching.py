"""Token lists to tensors, laid out the way both the sampler and the trainer need them.

Prompts are left-padded (so every row's next token is at the last column) and responses right-padded;
positions come from the attention mask, so padding never shifts a token's rotary position. Sampler and
trainer share these so that the trainer recomputes exactly what the sampler computed.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from oprl.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch", globals())  # imported on first use (oprl.lazy): the config needs only names


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists into ``(ids, attention_mask)``, both ``(B, max_len)`` long tensors."""
    width = max(len(r) for r in rows)
    # One tensor from nested lists: a tensor per row costs more than the model on tiny batches.
    ids = torch.tensor([[pad_id] * (width - len(r)) + list(r) for r in rows], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
    return ids, mask


def right_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token lists into ``(ids (B, T) long, mask (B, T) bool)``: the layout of responses."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([list(r) + [pad_id] * (width - len(r)) for r in rows], dtype=torch.long)
    mask = torch.tensor([[True] * len(r) + [False] * (width - len(r)) for r in rows], dtype=torch.bool)
    return ids, mask


def right_pad_values(rows: Sequence[Sequence[float]], width: int) -> torch.Tensor:
    """Float lists right-padded with 0 to ``(B, width)`` float32 (per-token values aligned with responses)."""
    return torch.tensor([list(r) + [0.0] * (width - len(r)) for r in rows], dtype=torch.float32)


def prompt_groups(prompt_ids: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """``(distinct prompts in first-seen order, index of each row's prompt among them)``: a GRPO batch holds
    every prompt once per group member, and the prompt's forward pass needs to run only once."""
    distinct: dict[tuple[int, ...], int] = {}
    rows = [distinct.setdefault(tuple(p), len(distinct)) for p in prompt_ids]
    return [list(p) for p in distinct], rows


def positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Rotary position of each column: the count of attended tokens before it (``generate``'s rule)."""
    return (attention_mask.cumsum(dim=1) - 1).clamp(min=0)


def cache_kwarg(module) -> str:
    """The name under which ``module.forward`` takes a key/value cache: transformers 5 renamed
    ``past_key_values`` to ``cache``; accept either (a peft wrapper passes it through to its base model)."""
    base = module.get_base_model() if hasattr(module, "get_base_model") else module
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def output_cache(output):
    """The key/value cache of a model output, under either name (see ``cache_kwarg``)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


@dataclass
class SharedPrefill:
    """Distinct prompts run once, their key/value cache gathered to the batch's rows."""

    output: Any
    """The module's output on the U distinct prompts (index its last position with ``rows``)."""
    cache: Any
    """The key/value cache, already gathered to the B rows (``(U, ...) -> (B, ...)`` per layer)."""
    rows: torch.Tensor
    """(B,) index of each row's prompt among the distinct ones."""
    attention: torch.Tensor
    """(B, P) each row's left-padded prompt mask: the prefix of the row's attention mask."""
    next_position: torch.Tensor
    """(B,) rotary position of each row's first response token (its prompt's length)."""


def prefill_shared_prompts(module, prompt_ids: list[list[int]], pad_id: int, device, **forward_kwargs) -> SharedPrefill:
    """Run each distinct prompt of ``prompt_ids`` through ``module`` once (``use_cache``) and gather the cache
    to every row holding it. A GRPO batch holds each prompt K times; the sampler and the trainer both start
    here. The gather is ``index_select``, so under autograd a prompt's gradient sums over its rows."""
    distinct, row_prompt = prompt_groups(prompt_ids)
    prompts, mask = (t.to(device) for t in left_pad(distinct, pad_id))  # (U, P)
    rows = torch.tensor(row_prompt, device=device)  # (B,)
    output = module(
        input_ids=prompts, attention_mask=mask, position_ids=positions(mask), use_cache=True, **forward_kwargs
    )
    cache = output_cache(output)
    cache.reorder_cache(rows)
    return SharedPrefill(output, cache, rows, mask[rows], mask.sum(1)[rows])
