"""KL estimators, entropy, the consistency surrogate's algebra, and the purity of oprl.algorithms."""

import ast
import math
from pathlib import Path

import pytest
import torch

import oprl.algorithms as algorithms
from oprl.algorithms import KL_ESTIMATORS, aggregate, consistency_surrogate, kl_penalty

PACKAGE = Path(algorithms.__file__).parent


def test_kl_estimators_by_hand():
    logprobs = torch.tensor([[math.log(0.5), math.log(0.2)]], dtype=torch.float64)
    ref_logprobs = torch.tensor([[math.log(0.25), math.log(0.2)]], dtype=torch.float64)
    log_r = math.log(0.25 / 0.5)  # r = π_ref/π
    assert kl_penalty(logprobs, ref_logprobs, "k1")[0].tolist() == pytest.approx([-log_r, 0.0])
    assert kl_penalty(logprobs, ref_logprobs, "k2")[0].tolist() == pytest.approx([0.5 * log_r**2, 0.0])
    assert kl_penalty(logprobs, ref_logprobs, "k3")[0].tolist() == pytest.approx([(0.5 - 1) - log_r, 0.0])
    assert set(KL_ESTIMATORS) == {"k1", "k2", "k3"}
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_penalty(logprobs, ref_logprobs, "k4")


def test_kl_estimators_are_unbiased_or_nonnegative():
    # Sample from π over 5 tokens; k1 and k3 average to KL(π‖π_ref), k3 and k2 are never negative.
    generator = torch.Generator().manual_seed(0)
    policy = torch.log_softmax(torch.randn(5, generator=generator, dtype=torch.float64), -1)
    reference = torch.log_softmax(torch.randn(5, generator=generator, dtype=torch.float64), -1)
    exact = (policy.exp() * (policy - reference)).sum()
    tokens = torch.multinomial(policy.exp(), 200_000, replacement=True, generator=generator)
    logprobs, ref_logprobs = policy[tokens][None], reference[tokens][None]
    for kind in ("k1", "k3"):
        assert kl_penalty(logprobs, ref_logprobs, kind).mean().item() == pytest.approx(exact.item(), abs=0.02)
    for kind in ("k2", "k3"):
        assert (kl_penalty(logprobs, ref_logprobs, kind) >= 0).all()


def test_k3_stays_finite_for_huge_log_ratios():
    logprobs = torch.tensor([[-200.0, 0.0]], requires_grad=True)
    value = kl_penalty(logprobs, torch.tensor([[0.0, -200.0]]), "k3")
    value.sum().backward()
    assert torch.isfinite(value).all() and torch.isfinite(logprobs.grad).all()


def test_surrogate_is_the_population_variance_of_the_consistency():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.2], dtype=torch.float64)
    seq = torch.tensor([-3.0, -2.0, -4.0, -1.0], dtype=torch.float64)
    anchor = seq - torch.tensor([0.1, -0.2, 0.0, 0.3], dtype=torch.float64)
    tau = 0.7
    a = rewards - tau * (seq - anchor)
    pairs = sum((a[i] - a[j]) ** 2 for i in range(4) for j in range(i + 1, 4)) / 16
    value = consistency_surrogate(seq, anchor, rewards, tau)
    assert value.item() == pytest.approx(pairs.item()) and value.item() == pytest.approx(a.var(unbiased=False).item())
    ones = consistency_surrogate(seq, anchor, rewards, tau, weights=torch.ones(4, dtype=torch.float64))
    assert ones.item() == pytest.approx(value.item())
    weights = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    subset = consistency_surrogate(seq[[0, 2, 3]], anchor[[0, 2, 3]], rewards[[0, 2, 3]], tau)
    assert consistency_surrogate(seq, anchor, rewards, tau, weights).item() == pytest.approx(subset.item())
    zero = consistency_surrogate(seq, anchor, rewards, tau, torch.zeros(4, dtype=torch.float64))
    assert zero.item() == 0.0


def test_public_names():
    expected = {
        "group_advantages", "GroupAdvantages", "policy_loss", "aggregate", "aggregation_count", "PRESETS",
        "ALGORITHM_DEFAULTS", "ADVANTAGE_KEYS", "LossParams", "resolve_preset", "consistency_surrogate",
        "kl_penalty",
    }  # fmt: skip
    assert expected <= set(algorithms.__all__)
    assert all(hasattr(algorithms, name) for name in algorithms.__all__)


ALLOWED_IMPORTS = {"torch", "typing", "collections", "dataclasses", "math", "difflib", "__future__", "functools"}


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_algorithms_is_pure(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots = {alias.name.split(".")[0] for alias in node.names}
            assert roots <= ALLOWED_IMPORTS, f"{path.name} imports {roots}"
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            # oprl.lazy binds torch on first use (``oprl config`` never loads it): still torch only.
            allowed = module.split(".")[0] in ALLOWED_IMPORTS or module.startswith(("oprl.algorithms", "oprl.lazy"))
            assert allowed, module
        elif isinstance(node, ast.Attribute):
            assert node.attr not in {"item", "numpy", "tolist"}, f"{path.name}:{node.lineno} calls .{node.attr}"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in {"print", "open"}, f"{path.name}:{node.lineno} calls {node.func.id}"


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_kl_and_aggregate_ignore_infinite_masked_values(kind, loss_agg):
    """−inf trainer log-probs and NaN reference log-probs on padding: the aggregated KL and its gradient are
    those of the valid tokens alone, finite, with a zero gradient on the padding."""
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    clean = torch.tensor([[-0.5, -1.0, -0.3], [-0.2, -0.4, -0.9]], dtype=torch.float64)
    ref = torch.tensor([[-0.7, -0.8, -0.1], [-0.3, -0.6, -0.2]], dtype=torch.float64)
    logprobs = torch.where(mask, clean, torch.full_like(clean, -math.inf)).requires_grad_(True)
    garbage_ref = torch.where(mask, ref, torch.full_like(ref, math.nan))
    kl = aggregate(kl_penalty(logprobs, garbage_ref, kind, mask), mask, loss_agg)
    kl.backward()
    expected = clean.clone().requires_grad_(True)
    aggregate(kl_penalty(expected, ref, kind), mask, loss_agg).backward()
    assert torch.isfinite(kl) and torch.isfinite(logprobs.grad).all()
    assert (logprobs.grad[~mask] == 0).all()
    assert torch.allclose(logprobs.grad, expected.grad)
