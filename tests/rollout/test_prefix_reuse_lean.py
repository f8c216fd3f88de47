"""Key/value reuse across turns on the lean engine (``rollout.prefix_reuse``): each turn prefills only what
follows the row's cache from the turn before, the samples equal those without reuse (log-probs to float
rounding: the reused keys were computed in another batch shape), and nothing survives a change of weights."""

import torch

from oprl.models.tiny import build_model, build_tokenizer
from oprl.rollout import Sampling
from oprl.rollout.lean_engine import LeanEngine

TURNS = 4


def episodes(engine, contexts):
    """Four turns; each appends the reply and an observation (of a different length per row)."""
    out, prompts = [], sum(len(c) for c in {tuple(c): 0 for c in contexts})  # identical prompts prefill once
    observations = 0
    for turn in range(TURNS):
        rollout = engine.generate(contexts, seed=turn)
        out.append((rollout.response_ids, rollout.behavior_logprobs, rollout.truncated))
        added = [[12 + turn] * (3 + row) for row in range(len(contexts))]
        contexts = [c + ids + obs for c, ids, obs in zip(contexts, rollout.response_ids, added, strict=True)]
        observations += 0 if turn == TURNS - 1 else sum(map(len, added))
    return out, prompts + observations


def test_reuse_prefills_only_new_tokens_and_samples_the_same():
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    model = build_model(tokenizer, max_positions=512)
    # Two copies of each prompt (a group), prompts of different lengths (left padding of stored prefixes).
    prompts = [[4] + [10 + (i * 7 + r) % 80 for i in range(40 + 13 * r)] for r in range(4)] * 2
    # Temperature 2: some rows emit EOS early and leave the batch (their caches are kept before compaction).
    fresh = LeanEngine(model, tokenizer, max_new_tokens=24, sampling=Sampling(2.0))
    reused = LeanEngine(model, tokenizer, max_new_tokens=24, sampling=Sampling(2.0), prefix_reuse=True)
    without, _ = episodes(fresh, prompts)
    with_reuse, needed = episodes(reused, prompts)
    assert sum(not cut for _, _, truncated in without for cut in truncated) >= 2
    for (ids_a, lp_a, _), (ids_b, lp_b, _) in zip(without, with_reuse, strict=True):
        assert ids_a == ids_b
        for a, b in zip(lp_a, lp_b, strict=True):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)
    assert reused.prompt_tokens == fresh.prompt_tokens
    # Without reuse every turn prefills its whole context; with it the prompts once, then the observations and
    # at most each reply's last token (sampled, never fed) per row and turn.
    assert fresh.prefill_tokens > 4 * reused.prefill_tokens
    assert needed <= reused.prefill_tokens <= needed + len(prompts) * (TURNS - 1)


def test_nothing_is_reused_after_the_weights_change():
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    model = build_model(tokenizer, max_positions=256)
    engine = LeanEngine(model, tokenizer, max_new_tokens=6, prefix_reuse=True)
    context = [4, *range(10, 60)]

    def prefilled(ids):
        before = engine.prefill_tokens
        reply = engine.generate([ids], seed=0).response_ids[0]
        return engine.prefill_tokens - before, ids + reply + [13, 14]

    assert prefilled(context)[0] == len(context)
    cost, longer = prefilled([*context, 11])  # extends the stored prompt: only the new token and the rest
    assert cost < 4
    engine.load_weights({k: v.detach().clone() for k, v in model.named_parameters()})
    assert prefilled(longer)[0] == len(longer)  # a weight load drops every kept cache
    with torch.no_grad():  # changed in place without telling the engine (an optimizer step): still dropped
        next(model.parameters()).mul_(1.0)
    assert prefilled(longer)[0] == len(longer)
    small = LeanEngine(model, tokenizer, max_new_tokens=6, prefix_reuse=True, kv_cache_gb=1e-9)
    small.generate([context], seed=0)
    assert not small.prefixes.entries  # past the memory budget: nothing kept


def test_the_store_finds_the_longest_shared_prefix_and_orders_by_use():
    from oprl.rollout.prefixes import Entry, PrefixStore

    def entry(ids):
        kv = torch.zeros(1, len(ids), 2)
        return Entry(torch.tensor(ids), [(kv, kv)])

    store = PrefixStore(reuse=True, budget_bytes=1 << 20)
    short, long = entry([1, 2, 3]), entry([1, 2, 9, 9, 9])
    store.add(short)
    store.add(long)
    assert store.longest([1, 2, 9, 9, 7]) == (long, 4)
    assert store.longest([1, 2, 3, 4]) == (short, 3)
    assert store.longest([1, 2, 3]) == (short, 2)  # the last token always runs: its logits are the first reply's
    store.touch(short)  # entries of different lengths compare by identity
    assert store.entries == [long, short]
    store.add(entry([1, 2, 3, 4, 5]))  # extends short: short is dropped
    assert [len(e.tokens) for e in store.entries] == [5, 5] and short not in store.entries


def test_the_setting_reaches_the_lean_engine():
    from oprl.config import load_config
    from oprl.worker_parts import make_engine

    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    for value in (False, True):
        config = load_config(None, [f"rollout.prefix_reuse={str(value).lower()}", "rollout.kv_cache_gb=0.5"])
        engine = make_engine(config, model, tokenizer).engine
        assert engine.prefixes.reuse is value and engine.prefixes.budget == 2**29
