"""docs/paper.md#derivation, numerically: one gradient step on the consistency surrogate is group-relative REINFORCE.

A tiny real transformer (LlamaForCausalLM, float64), one prompt and K = 4 fixed responses that the model
did NOT sample. At θ = θ_t (anchor = detached log-probs at θ_t) autograd must give, over all parameters,
  ∇L̂   = −(2τ/K)·Σ_i (r_i − r̄)·∇log π(y_i|x)
  ∇L̂_w = −(2τ/W)·Σ_i w_i·(r_i − r̄_w)·∇log π(y_i|x),   W = Σ w_i, r̄_w = Σ w_j r_j / W
and the first equals 2τ × the gradient of the REINFORCE ``policy_loss`` with seq-mean-token-sum.
"""

import pytest
import torch
import transformers

from oprl.algorithms import LossParams, consistency_surrogate, group_advantages, policy_loss

TAU = 0.3
REWARDS = torch.tensor([1.0, 0.0, 0.5, 0.2], dtype=torch.float64)
PROMPT = [1, 5, 7]
RESPONSES = [[3, 9, 2, 11], [4, 4, 15, 0], [8, 1, 6, 12], [14, 10, 13, 5]]  # hand-picked, not sampled


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).double().eval()


def token_logprobs(model):
    """log π(y_t | x, y_<t) for every response token: (K, T)."""
    ids = torch.tensor([PROMPT + response for response in RESPONSES])  # (K, P + T)
    logits = model(input_ids=ids).logits[:, len(PROMPT) - 1 : -1]  # (K, T, V)
    targets = ids[:, len(PROMPT) :]  # (K, T)
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None]).squeeze(-1)  # (K, T)


def flat_grad(model, loss):
    grads = torch.autograd.grad(loss, list(model.parameters()), retain_graph=True, allow_unused=True)
    return torch.cat(
        [
            (g if g is not None else torch.zeros_like(p)).flatten()
            for g, p in zip(grads, model.parameters(), strict=True)
        ]
    )


def relative_error(a, b):
    return ((a - b).norm() / b.norm()).item()


def test_surrogate_gradient_is_group_relative_reinforce(model):
    seq_logprobs = token_logprobs(model).sum(dim=-1)  # (K,)
    surrogate = consistency_surrogate(seq_logprobs, seq_logprobs.detach(), REWARDS, TAU)
    k = len(REWARDS)
    reinforce = -(2 * TAU / k) * ((REWARDS - REWARDS.mean()) * seq_logprobs).sum()
    surrogate_grad = flat_grad(model, surrogate)
    assert surrogate_grad.norm() > 1e-3  # a real, non-trivial gradient
    assert relative_error(surrogate_grad, flat_grad(model, reinforce)) < 1e-5


def test_surrogate_gradient_is_twice_tau_times_the_policy_loss_gradient(model):
    logprobs = token_logprobs(model)  # (K, T)
    advantages = group_advantages(REWARDS, torch.zeros(4, dtype=torch.long)).advantages
    behavior = logprobs.detach() + 0.7  # any behaviour policy: it plays no role without clipping
    loss, _ = policy_loss(
        logprobs, behavior, advantages, torch.ones_like(logprobs), LossParams(loss_agg="seq-mean-token-sum")
    )
    seq_logprobs = logprobs.sum(dim=-1)
    surrogate = consistency_surrogate(seq_logprobs, seq_logprobs.detach(), REWARDS, TAU)
    assert relative_error(flat_grad(model, surrogate), 2 * TAU * flat_grad(model, loss)) < 1e-5


@pytest.mark.parametrize("weights", [[0.5, 2.0, 1.0, 0.25], [1.0, 0.0, 1.0, 1.0]])
def test_weighted_surrogate_gives_the_weighted_baseline(model, weights):
    weights = torch.tensor(weights, dtype=torch.float64)
    seq_logprobs = token_logprobs(model).sum(dim=-1)
    surrogate = consistency_surrogate(seq_logprobs, seq_logprobs.detach(), REWARDS, TAU, weights)
    total = weights.sum()
    weighted_mean = (weights * REWARDS).sum() / total
    reinforce = -(2 * TAU / total) * (weights * (REWARDS - weighted_mean) * seq_logprobs).sum()
    assert relative_error(flat_grad(model, surrogate), flat_grad(model, reinforce)) < 1e-5


def test_identity_holds_only_at_the_anchor(model):
    """Away from θ_t the surrogate's gradient differs from REINFORCE: the identity is a statement at θ_t."""
    seq_logprobs = token_logprobs(model).sum(dim=-1)
    stale_anchor = seq_logprobs.detach() + torch.tensor([0.5, -0.5, 0.2, 0.0], dtype=torch.float64)
    surrogate = consistency_surrogate(seq_logprobs, stale_anchor, REWARDS, TAU)
    reinforce = -(2 * TAU / 4) * ((REWARDS - REWARDS.mean()) * seq_logprobs).sum()
    assert relative_error(flat_grad(model, surrogate), flat_grad(model, reinforce)) > 1e-2
