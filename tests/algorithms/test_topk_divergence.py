"""DPPO's Top-K divergence (``oprl.algorithms.topk_divergence``) against a position-by-position Python reference
written here: TV and KL(μ‖π) on the sampler's top-K ∪ {sampled token} plus the remaining mass as one bucket, the
harmful-direction mask, padded tokens and slots, K = 1 (the binary rules exactly), and never below the binary
divergence; the presets train through ``policy_loss``."""

import math
from dataclasses import replace

import pytest
import torch

from oprl.algorithms import corrections, topk_divergence
from oprl.algorithms.algorithm import Algorithm
from oprl.algorithms.losses import policy_loss
from oprl.algorithms.spec import LossParams
from oprl.algorithms.top_k import TopKTokens


def _case(seed=0, batch=3, width=6, vocab=9, k=3):
    g = torch.Generator().manual_seed(seed)
    current = torch.log_softmax(torch.randn(batch, width, vocab, generator=g), dim=-1)
    sampler = torch.log_softmax(current + 0.8 * torch.randn(batch, width, vocab, generator=g), dim=-1)
    sampled_ids = torch.distributions.Categorical(logits=sampler).sample()  # (B, T)
    behavior, ids = sampler.topk(k, dim=-1)
    behavior[0, 2, k - 1 :], ids[0, 2, k - 1 :] = float("-inf"), 0  # a token with fewer ids recorded
    mask = torch.ones(batch, width, dtype=torch.bool)
    mask[1, 4:] = False
    view = TopKTokens(behavior, current.gather(-1, ids), ids == sampled_ids[..., None])
    y_current = current.gather(-1, sampled_ids[..., None]).squeeze(-1)
    y_behavior = sampler.gather(-1, sampled_ids[..., None]).squeeze(-1)
    return view, ids, sampled_ids, y_current, y_behavior, mask


def _reference_divergence(view, ids, sampled_ids, y_current, y_behavior, mask, kind):
    batch, width, k = ids.shape
    out = torch.zeros(batch, width, dtype=torch.float64)
    for b in range(batch):
        for t in range(width):
            if not mask[b, t]:
                continue
            cells = {}  # id -> (π, μ)
            for j in range(k):
                if math.isfinite(float(view.behavior[b, t, j])):
                    cells[int(ids[b, t, j])] = (
                        math.exp(float(view.current[b, t, j])),
                        math.exp(float(view.behavior[b, t, j])),
                    )
            y = int(sampled_ids[b, t])
            cells.setdefault(y, (math.exp(float(y_current[b, t])), math.exp(float(y_behavior[b, t]))))
            pi_r = max(1 - sum(p for p, _ in cells.values()), 0.0)
            mu_r = max(1 - sum(m for _, m in cells.values()), 0.0)
            if kind == "tv":
                out[b, t] = 0.5 * (sum(abs(p - m) for p, m in cells.values()) + abs(pi_r - mu_r))
            else:
                out[b, t] = sum(m * math.log(m / p) for p, m in cells.values() if m > 0)
                out[b, t] += mu_r * math.log((mu_r + 1e-8) / (pi_r + 1e-8))
    return out


def _params(view, y_current, y_behavior, mask, clip_mode, eps):
    return replace(LossParams(clip_mode=clip_mode, eps_low=eps, eps_high=eps), mask=mask.float(),
                   logprobs=y_current, anchor_logprobs=y_behavior, top_k=view)  # fmt: skip


@pytest.mark.parametrize("kind", ["tv", "kl"])
def test_divergence_and_mask_equal_the_reference(kind):
    view, ids, sampled_ids, y_current, y_behavior, mask = _case()
    pi, mu = topk_divergence.partition(view, y_current, y_behavior, mask)
    divergence = (topk_divergence.topk_tv if kind == "tv" else topk_divergence.topk_kl)(pi, mu)
    expected = _reference_divergence(view, ids, sampled_ids, y_current, y_behavior, mask, kind)
    assert torch.allclose(divergence.double()[mask], expected[mask], atol=1e-5)
    assert bool(((~view.sampled).all(-1) & mask).any())  # some positions' sampled token is outside the top-K
    eps = float(expected[mask].median())  # a threshold that splits the tokens
    advantages = torch.tensor([1.0, -1.0, 0.5])[:, None].expand_as(y_current)
    rule = topk_divergence.TOP_K_MASKS[f"dppo-{kind}-topk"]
    keep, metrics = rule(None, advantages, _params(view, y_current, y_behavior, mask, f"dppo-{kind}-topk", eps))
    up, down = y_current.exp() > y_behavior.exp(), y_current.exp() < y_behavior.exp()
    harmful = torch.where(advantages > 0, (expected > eps) & up, (expected > eps) & down)
    assert torch.equal(keep[mask], ~harmful[mask])
    assert 0 < int(harmful[mask].sum()) < int(mask.sum())
    assert torch.isclose(metrics["dppo_divergence_mean"].double(), expected[mask].mean(), atol=1e-5)


@pytest.mark.parametrize("kind", ["tv", "kl"])
def test_with_the_sampled_token_alone_it_is_the_binary_rule(kind):
    """K = 1 and H = {y}: the partition is {y, rest}, DPPO's binary divergence, so the masks coincide."""
    _view, ids, _sampled_ids, y_current, y_behavior, mask = _case(k=1, seed=5)
    single = TopKTokens(y_behavior[..., None], y_current[..., None], torch.ones_like(ids, dtype=torch.bool))
    advantages = torch.tensor([1.0, -1.0, 0.0])[:, None].expand_as(y_current)
    for eps in (0.01, 0.05, 0.2):
        params = _params(single, y_current, y_behavior, mask, f"dppo-{kind}-topk", eps)
        keep, topk_metrics = topk_divergence.TOP_K_MASKS[f"dppo-{kind}-topk"](None, advantages, params)
        binary = corrections._dppo_binary_tv if kind == "tv" else corrections._dppo_binary_kl
        expected, binary_metrics = binary(None, advantages, params)
        assert torch.equal(keep[mask], expected[mask])
        assert torch.isclose(topk_metrics["dppo_divergence_mean"], binary_metrics["dppo_divergence_mean"], atol=1e-6)


@pytest.mark.parametrize("kind", ["tv", "kl"])
def test_never_below_the_binary_divergence(kind):
    for seed in range(5):
        view, _ids, _sampled_ids, y_current, y_behavior, mask = _case(seed=seed, k=4)
        pi, mu = topk_divergence.partition(view, y_current, y_behavior, mask)
        ones = torch.ones_like(y_current, dtype=torch.bool)[..., None]
        binary_view = TopKTokens(y_behavior[..., None], y_current[..., None], ones)
        pb, mb = topk_divergence.partition(binary_view, y_current, y_behavior, mask)
        fn = topk_divergence.topk_tv if kind == "tv" else topk_divergence.topk_kl
        assert torch.all(fn(pi, mu)[mask] >= fn(pb, mb)[mask] - 1e-6)


def test_the_presets_train_through_the_policy_loss_and_refuse_without_top_k():
    view, _ids, _sampled_ids, y_current, y_behavior, mask = _case()
    logprobs = y_current.clone().requires_grad_(True)
    advantages = torch.tensor([1.0, -1.0, 0.5])
    for preset in ("dppo-tv-topk", "dppo-kl-topk"):
        params = replace(Algorithm.of(preset).loss, top_k=view)
        loss, metrics = policy_loss(logprobs, y_behavior, advantages, mask, params)
        assert torch.isfinite(loss) and "dppo_divergence_mean" in metrics
        with pytest.raises(ValueError, match=r"rollout\.record_top_k=0"):
            policy_loss(logprobs, y_behavior, advantages, mask, Algorithm.of(preset).loss)
