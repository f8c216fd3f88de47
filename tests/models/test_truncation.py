"""Truncated scoring (``oprl.models.truncation`` and the trainer's log-probs): the kept set is vLLM's and
transformers' rule, the trainer renormalises over it, and a sampled token outside the current policy's kept set
(stale data) gets a finite log-prob: the one of the kept set with that token added."""

import pytest
import torch

from oprl.models.logprobs import _token_logprobs, grouped_response_logprobs
from oprl.models.truncation import Sampling, kept_tokens


def _scores(rows=64, vocab=50, seed=0, step=None):
    scores = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3
    return scores if step is None else (scores / step).round() * step  # rounded: many exact ties


@pytest.mark.parametrize("top_k, top_p", [(0, 0.9), (20, 1.0), (20, 0.9), (5, 0.5), (1, 1.0), (50, 0.3)])
def test_kept_set_is_transformers_rule(top_k, top_p):
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    # Ties at the top-p boundary after a top-k are broken in sort order, which transformers (re-sorting the
    # top-k survivors) and vLLM (sorting once; oprl's rule) may do differently: tied scores only without both.
    tied = [] if top_k and top_p < 1 else [_scores(step=0.5)]
    for scores in (_scores(), *tied):
        expected = scores.clone()
        if top_k:
            expected = TopKLogitsWarper(top_k)(None, expected)
        if top_p < 1:
            expected = TopPLogitsWarper(top_p)(None, expected)
        assert torch.equal(kept_tokens(scores, top_k, top_p), expected.isfinite())


@pytest.mark.parametrize("top_k, top_p", [(0, 0.9), (20, 1.0), (20, 0.9), (5, 0.5)])
def test_kept_set_is_vllms_rule(top_k, top_p):
    ops = pytest.importorskip("vllm.v1.sample.ops.topk_topp_sampler")
    for scores in (_scores(seed=1), _scores(seed=1, step=0.5)):
        rows = scores.shape[0]
        k = torch.full((rows,), top_k, dtype=torch.long) if top_k else None
        p = torch.full((rows,), top_p) if top_p < 1 else None
        theirs = ops.apply_top_k_top_p_pytorch(scores.clone(), k, p, allow_cpu_sync=True).isfinite()
        assert torch.equal(kept_tokens(scores, top_k, top_p), theirs)


def test_no_truncation_keeps_everything():
    scores = _scores()
    assert kept_tokens(scores).all() and kept_tokens(scores, 50, 1.0).all() and kept_tokens(scores, 500).all()


class Scores(torch.nn.Module):
    """A head that returns its input: the features are the logits."""

    def forward(self, features):
        return features


def test_inside_the_kept_set_the_log_prob_is_the_renormalised_one_outside_it_is_finite():
    # Hand-computed: scores (4, 3, 2, 1, 0) at temperature 1, top_k = 2 keeps {0, 1}.
    scores = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]] * 3, requires_grad=True)
    chosen = torch.tensor([1, 3, 0])  # inside, outside, inside
    logprob, entropy = _token_logprobs(Scores(), scores, chosen, Sampling(top_k=2), True, False)
    values = logprob.detach()
    inside = torch.log_softmax(torch.tensor([4.0, 3.0]), -1)
    assert float(values[0]) == pytest.approx(float(inside[1]), abs=1e-6)
    assert float(values[2]) == pytest.approx(float(inside[0]), abs=1e-6)
    # Token 3 was not kept: it is scored on {0, 1, 3}, the kept set with it added (finite, small).
    assert float(values[1]) == pytest.approx(float(torch.log_softmax(torch.tensor([4.0, 3.0, 1.0]), -1)[2]), abs=1e-6)
    p = torch.softmax(torch.tensor([4.0, 3.0]), -1)
    assert float(entropy[0]) == pytest.approx(float(-(p * p.log()).sum()), abs=1e-6)
    logprob.sum().backward()
    gradient = scores.grad
    assert gradient.isfinite().all()
    # Tokens outside the scored set get no gradient; the scored ones do.
    assert (gradient[0, 2:] == 0).all() and (gradient[0, :2] != 0).all()
    assert gradient[1, 2] == 0 and gradient[1, 4] == 0 and (gradient[1, [0, 1, 3]] != 0).all()


def test_stale_tokens_outside_the_current_kept_set_are_finite_with_finite_gradients():
    """Samples of an old policy at top_p = 0.5, scored under changed weights: some tokens the old policy kept
    lie outside the current kept set; each gets the log-prob of that set plus itself, and backward is finite."""
    from oprl.models.chat import encode_prompt
    from oprl.models.tiny import build_model, build_tokenizer
    from oprl.rollout import LeanEngine

    tokenizer = build_tokenizer()
    old = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, seed=3)
    prompts = [encode_prompt(tokenizer, [{"role": "user", "content": t}]) for t in ["1+2=", "35+47-9="] * 8]
    sampling = Sampling(top_p=0.5)
    rollout = LeanEngine(old, tokenizer, max_new_tokens=8, sampling=sampling).generate(prompts, seed=1)
    new = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, seed=4)  # other weights: "stale"
    logprobs, entropy, mask = grouped_response_logprobs(
        new, prompts, rollout.response_ids, tokenizer.pad_token_id, with_entropy=True, sampling=sampling
    )
    with torch.no_grad():
        full, _, _ = grouped_response_logprobs(new, prompts, rollout.response_ids, tokenizer.pad_token_id)
        # The current kept set at every response position, from the new model's full log-probs' logits.
        logits = _logits(new, prompts, rollout.response_ids, tokenizer.pad_token_id)  # (N, V)
    targets = torch.tensor([t for row in rollout.response_ids for t in row])  # (N,)
    kept = kept_tokens(logits, 0, 0.5)
    outside = ~kept[torch.arange(len(targets)), targets]
    assert outside.sum() > 0  # the test would not test anything otherwise
    expected = logits.masked_fill(~kept.scatter(-1, targets[:, None], True), float("-inf")).log_softmax(-1)
    assert torch.allclose(logprobs[mask], expected[torch.arange(len(targets)), targets], atol=1e-5)
    assert logprobs[mask].isfinite().all() and entropy[mask].isfinite().all()
    assert (logprobs[mask] >= full[mask] - 1e-6).all()  # renormalised over fewer tokens: never below the full
    (logprobs[mask].sum() + entropy[mask].sum()).backward()
    assert all(p.grad.isfinite().all() for p in new.parameters() if p.grad is not None)


def _logits(model, prompts, responses, pad_id):
    """(N, V) logits predicting each response token, the rows in response order."""
    from oprl.models.logprobs import pack

    input_ids, attention, targets, mask = pack(prompts, responses, pad_id)
    from oprl.models.batching import positions

    logits = model(input_ids=input_ids, attention_mask=attention, position_ids=positions(attention)).logits
    return logits[:, -targets.shape[1] - 1 : -1][mask].float()


def test_the_partial_sort_paths_equal_sorting_the_whole_vocabulary():
    """Rows of mixed entropy over 3000 tokens: a nucleus inside the first 16 candidates, inside the next 200,
    or past both (sorted whole); top-k rows with and without ties past the k-th score."""
    from oprl.models.truncation import _kept_sorting_all

    generator = torch.Generator().manual_seed(2)
    spread = torch.tensor([12.0, 4.0, 0.5]).repeat_interleave(20)[:, None]  # peaked, middling, flat rows
    scores = torch.randn(60, 3000, generator=generator) * spread
    scores[:5, :40] = scores[:5, :40].round()  # integer scores: ties at the k-th value in some rows
    for top_k, top_p in [(0, 0.9), (0, 0.5), (20, 0.9), (100, 0.95), (30, 1.0)]:
        whole = _kept_sorting_all(scores, top_k, top_p)
        assert torch.equal(kept_tokens(scores, top_k, top_p, candidates=(16, 200)), whole), (top_k, top_p)
    sizes = kept_tokens(scores, 0, 0.9).sum(-1)
    assert (sizes <= 16).any() and ((sizes > 16) & (sizes <= 200)).any() and (sizes > 200).any()
