"""Key/value caches kept between a torch engine's calls (``rollout.prefix_reuse`` on the lean engine).

A multi-turn episode hands the engine its whole context at every turn: the prompt, every earlier reply and
every observation. Without reuse each turn prefills all of it again. With reuse the lean engine keeps, after a
call, each row's cache (its context and the reply tokens its decode steps fed), and the next call prefills
only what follows the longest stored prefix of each context: the observation, the next generation prompt
and the reply's last token (sampled, never fed). Per row r with ``m_r`` reused and ``n_r`` new tokens the
prefill batch is laid out, per layer, as

    keys (U, H, S + N, D) = [ pad (S - m_r) | stored prefix (m_r) | pad (N - n_r) | new (n_r) ]

with ``S = max m_r`` and ``N = max n_r``: the attention mask is 0 on the pads and the rotary positions come from
it (``positions``), so each new token sits at the position it has in the whole context.

Nothing computed by other weights is reused: the store is emptied by ``load_weights``, ``weights_changed``
and a partial switch, and also whenever the parameters' in-place version counters moved since the last call
(an optimizer step or a ``load_state_dict`` into the model the engine was not told about).

Memory: a row's entry is ``2 x layers x tokens x kv width`` elements; the store holds at most
``rollout.kv_cache_gb`` and drops the least recently used entries past it. An entry that a later call extended
is dropped at once (the longer one holds it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from oprl.lazy import lazy_import
from oprl.models.batching import (
    SharedPrefill,
    cache_kwarg,
    left_pad,
    output_cache,
    positions,
    prefill_shared_prompts,
    prompt_groups,
)

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch", globals())  # imported on first use (oprl.lazy): the config needs only names


@dataclass(eq=False)  # entries are compared by identity (the store's list operations)
class Entry:
    """The cache of one token prefix: ``tokens`` (n,) and per layer ``(keys, values)``, each (H, n, D)."""

    tokens: torch.Tensor
    layers: list[tuple[torch.Tensor, torch.Tensor]]

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)


class PrefixStore:
    """Prefixes cached between calls, and the prefill counts of every call (kept when reuse is off too).

    ``prompt_tokens``: context tokens handed to the engine (every row); ``prefill_tokens``: those run through
    the model in a prefill (identical contexts of one call once; with reuse, only what follows a stored prefix).
    """

    def __init__(self, reuse: bool, budget_bytes: int):
        self.reuse = reuse
        self.budget = budget_bytes
        self.entries: list[Entry] = []  # least recently used first
        self.fingerprint: tuple[int, ...] | None = None
        self.prompt_tokens = 0
        self.prefill_tokens = 0

    def clear(self) -> None:
        self.entries = []

    def check_weights(self, model) -> None:
        """Empty the store if the model's parameters changed in place since the last call."""
        fingerprint = tuple(p._version for p in model.parameters())
        if fingerprint != self.fingerprint:
            self.clear()
        self.fingerprint = fingerprint

    def longest(self, context: list[int]) -> tuple[Entry | None, int]:
        """The entry sharing the longest prefix with ``context`` and that length, at most ``len(context) - 1``
        (the last token must run: its logits give the first reply token); ``(None, 0)`` when none shares one."""
        best, length = None, 0
        if not self.entries or len(context) < 2:
            return best, length
        ids = torch.tensor(context[:-1], dtype=torch.long)
        for entry in self.entries:
            n = min(len(entry.tokens), len(ids))
            if n <= length:
                continue
            differ = (entry.tokens[:n] != ids[:n]).nonzero()
            common = int(differ[0]) if len(differ) else n
            if common > length:
                best, length = entry, common
        return best, length

    def add(self, entry: Entry) -> None:
        """Keep ``entry`` (most recently used), dropping entries it extends and the oldest past the budget."""
        if entry.nbytes > self.budget:
            return
        kept = []
        for old in self.entries:
            n = len(old.tokens)
            if not (n <= len(entry.tokens) and torch.equal(old.tokens, entry.tokens[:n])):
                kept.append(old)
        kept.append(entry)
        total = sum(e.nbytes for e in kept)
        while total > self.budget:
            total -= kept.pop(0).nbytes
        self.entries = kept

    def touch(self, entry: Entry) -> None:
        """Mark ``entry`` as the most recently used."""
        kept = [e for e in self.entries if e is not entry]
        if len(kept) < len(self.entries):
            self.entries = [*kept, entry]

    def save_rows(self, cache, attention: torch.Tensor, rows: list[int], contexts: list[list[int]], fed) -> None:
        """Keep cache rows ``rows`` of a call: row ``rows[j]`` holds ``contexts[j] + fed[j]`` at the columns where
        its ``attention`` (L, C) row is 1, in order (tokens fed after those, past the row's end, are not kept)."""
        if not self.reuse:
            return
        for i, context, tokens in zip(rows, contexts, fed, strict=True):
            ids = list(context) + list(tokens)
            columns = attention[i].nonzero().squeeze(-1)[: len(ids)]
            layers = [
                (layer.keys[i].index_select(1, columns), layer.values[i].index_select(1, columns))
                for layer in cache.layers
            ]
            self.add(Entry(torch.tensor(ids, dtype=torch.long), layers))


def prefill(module, prompt_ids: list[list[int]], pad_id: int, device, store: PrefixStore | None) -> SharedPrefill:
    """``prefill_shared_prompts`` (each distinct prompt once, the cache gathered to its rows), resuming each
    distinct prompt from the longest prefix ``store`` holds (module docstring for the layout). Counts the
    tokens into ``store``. Without a stored prefix for any row the batch is exactly the fresh one."""
    distinct, row_prompt = prompt_groups(prompt_ids)
    found = [store.longest(p) if store is not None and store.reuse else (None, 0) for p in distinct]
    if store is not None:
        store.prompt_tokens += sum(len(p) for p in prompt_ids)
        store.prefill_tokens += sum(len(p) - m for p, (_, m) in zip(distinct, found, strict=True))
    if not any(m for _, m in found):
        return prefill_shared_prompts(module, prompt_ids, pad_id, device, logits_to_keep=1)
    assert store is not None  # found something
    for entry, _ in found:
        if entry is not None:
            store.touch(entry)
    reused = max(m for _, m in found)
    new_ids, new_mask = (
        t.to(device) for t in left_pad([p[m:] for p, (_, m) in zip(distinct, found, strict=True)], pad_id)
    )
    old_mask = torch.tensor([[0] * (reused - m) + [1] * m for _, m in found], dtype=torch.long, device=device)
    mask = torch.cat([old_mask, new_mask], dim=1)  # (U, S + N)
    out = module(
        input_ids=new_ids,
        attention_mask=mask,
        position_ids=positions(mask)[:, reused:],
        use_cache=True,
        logits_to_keep=1,
        **{cache_kwarg(module): _stored_cache(module, found, reused, device)},
    )
    rows = torch.tensor(row_prompt, device=device)  # (B,)
    cache = output_cache(out)
    cache.reorder_cache(rows)
    return SharedPrefill(out, cache, rows, mask[rows], mask.sum(1)[rows])


def _stored_cache(module, found: list[tuple[Entry | None, int]], width: int, device):
    """A ``DynamicCache`` of the U distinct prompts' stored prefixes, each left-padded with zeros to ``width``."""
    from transformers.cache_utils import DynamicCache

    template = next(e for e, _ in found if e is not None)
    layers = []
    for index, (keys, _) in enumerate(template.layers):
        heads, _, dim = keys.shape
        shape = (len(found), heads, width, dim)
        k, v = (torch.zeros(shape, dtype=keys.dtype, device=device) for _ in range(2))
        for row, (entry, m) in enumerate(found):
            if entry is not None and m:
                k[row, :, width - m :], v[row, :, width - m :] = (t[:, :m] for t in entry.layers[index])
        layers.append((k, v))
    config = getattr(module, "config", None)
    return DynamicCache(ddp_cache_data=layers, config=config)
