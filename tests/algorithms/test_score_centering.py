"""Score centering (``oprl.algorithms.score_centering``) against a position-by-position Python reference written
here from the formula (arXiv 2609.20807 as the issue and vime's derivation state it), both forms (NoIS, TIS),
padded tokens and slots, K = 1, and its gradient against the analytic one, A·Σ_H c_v·(e_v − p) per position."""

import math

import pytest
import torch

from oprl.algorithms.score_centering import score_centering_tokens, weight_band
from oprl.algorithms.top_k import TopKTokens


def _case(seed=0, batch=3, width=5, vocab=11, k=4, pad_slots=True):
    """Random trainer logits (with grad), a sampler distribution near them, its top-K; row 2 ends at token 3."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, width, vocab, generator=g, requires_grad=True)
    sampler = torch.log_softmax(logits.detach() + 0.7 * torch.randn(batch, width, vocab, generator=g), dim=-1)
    behavior, ids = sampler.topk(k, dim=-1)  # (B, T, K)
    if pad_slots:  # the sampler recorded fewer ids at one token; padding holds id 0 and −inf
        behavior[0, 1, k - 1 :] = float("-inf")
        ids[0, 1, k - 1 :] = 0
    mask = torch.ones(batch, width, dtype=torch.bool)
    mask[2, 3:] = False
    behavior[2, 3:] = float("-inf")
    ids[2, 3:] = 0
    advantages = torch.tensor([0.8, -1.3, 0.5])
    return logits, ids, behavior, mask, advantages


def _current(logits, ids):
    return torch.log_softmax(logits, dim=-1).gather(-1, ids)  # (B, T, K) with grad


def _reference(current, behavior, mask, advantages, band):
    """(terms (B, T), coefficients (B, T, K)) by loops over positions and slots, plain floats."""
    batch, width, k = behavior.shape
    terms, coefs = torch.zeros(batch, width, dtype=torch.float64), torch.zeros(batch, width, k, dtype=torch.float64)
    for b in range(batch):
        for t in range(width):
            if not mask[b, t]:
                continue
            head = [v for v in range(k) if math.isfinite(float(behavior[b, t, v]))]
            p = {v: math.exp(float(current[b, t, v])) for v in head}
            q = {v: math.exp(float(behavior[b, t, v])) for v in head}
            rho = max(1 - sum(q.values()), 0.0) / max(1 - sum(p.values()), 1e-6)
            for v in head:
                if band is None:
                    m, alpha = q[v], rho
                else:
                    lo, hi = band
                    m, alpha = min(max(p[v], lo * q[v]), hi * q[v]), min(max(1.0, lo * rho), hi * rho)
                coefs[b, t, v] = m - alpha * p[v]
                terms[b, t] += float(advantages[b]) * coefs[b, t, v] * float(current[b, t, v])
    return terms, coefs


@pytest.mark.parametrize("weight", ["none", "truncated-is"])
@pytest.mark.parametrize("k", [1, 4])
def test_terms_and_gradient_equal_the_reference(weight, k):
    logits, ids, behavior, mask, advantages = _case(k=k, pad_slots=k > 1)
    current = _current(logits, ids)
    sampled = torch.zeros_like(ids, dtype=torch.bool)
    tokens, metrics = score_centering_tokens(
        TopKTokens(behavior, current, sampled), advantages, mask, weight=weight, is_cap=1.5
    )
    expected, coefs = _reference(current.detach(), behavior, mask, advantages, weight_band(weight, 1.5))
    assert torch.allclose(tokens.double(), expected, atol=1e-6)
    assert torch.all(tokens[~mask] == 0)
    tokens.sum().backward()
    # The intended gradient: d/dlogits of A·Σ_H c_v·log p_v with c held fixed = A·Σ_H c_v·(e_v − p).
    probs = torch.softmax(logits.detach(), dim=-1).double()  # (B, T, V)
    onehot = torch.nn.functional.one_hot(ids, logits.shape[-1]).double()  # (B, T, K, V)
    analytic = advantages.double()[:, None, None] * (coefs[..., None] * (onehot - probs[..., None, :])).sum(2)
    assert torch.allclose(logits.grad.double(), analytic, atol=1e-6)
    assert torch.all(logits.grad[~mask] == 0)
    assert set(metrics) == {"score_centering_rho_mean", "score_centering_head_q", "score_centering_coef_abs"}


def test_on_policy_the_term_vanishes_and_full_support_centres_the_sampled_score():
    """q = p: ρ = 1 and m = q = p, so nothing is subtracted. Full support with a constant advantage: the sampled
    token's expected gradient under q, −A·Σ q ∇log p, is cancelled exactly (ρ's numerator is 0)."""
    logits = torch.randn(1, 2, 6, requires_grad=True)
    logp = torch.log_softmax(logits, dim=-1)
    values, ids = logp.detach().topk(3, dim=-1)
    on_policy = TopKTokens(values, logp.gather(-1, ids), torch.zeros_like(ids, dtype=torch.bool))
    tokens, _ = score_centering_tokens(on_policy, torch.tensor([1.0]), torch.ones(1, 2, dtype=torch.bool))
    assert torch.allclose(tokens, torch.zeros_like(tokens), atol=1e-6)

    q = torch.log_softmax(torch.randn(1, 2, 6), dim=-1)
    ids = torch.arange(6).expand(1, 2, 6)
    full = TopKTokens(q, logp.gather(-1, ids), torch.zeros_like(ids, dtype=torch.bool))
    tokens, _ = score_centering_tokens(full, torch.tensor([2.0]), torch.ones(1, 2, dtype=torch.bool))
    (centering,) = torch.autograd.grad(tokens.sum(), logits)
    expected_sampled = -2.0 * (q.exp() - logp.detach().exp())  # E_q[−A ∇log p_y] = −A·(q − p) per position
    assert torch.allclose(expected_sampled + centering, torch.zeros(1, 2, 6), atol=1e-5)


def test_tis_without_truncation_is_exact_importance_sampling():
    """w = clamp(p/q, 0, C) with C above every ratio is exact IS: m = p, α = 1, nothing left to centre."""
    logits, ids, behavior, mask, advantages = _case(seed=3)
    current = _current(logits, ids)
    view = TopKTokens(behavior, current, torch.zeros_like(ids, dtype=torch.bool))
    tokens, _ = score_centering_tokens(view, advantages, mask, weight="truncated-is", is_cap=1e9)
    assert torch.allclose(tokens, torch.zeros_like(tokens), atol=1e-6)


def test_an_id_outside_the_trainers_kept_set_and_nan_padding_add_nothing():
    logits, ids, behavior, mask, advantages = _case(seed=4)
    current = _current(logits, ids)
    current = torch.where(torch.isfinite(behavior), current, torch.full_like(current, float("nan")))  # padded slots
    dropped = current.clone()
    dropped[1, 0, 2] = float("-inf")  # a top-p trainer dropped this id: p = 0
    view = TopKTokens(behavior, dropped, torch.zeros_like(ids, dtype=torch.bool))
    tokens, _ = score_centering_tokens(view, advantages, mask)
    assert torch.isfinite(tokens).all()
    tokens.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_other_weights_have_no_form():
    with pytest.raises(ValueError, match="weight=none or truncated-is"):
        weight_band("importance-sampling", 2.0)
