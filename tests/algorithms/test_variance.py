"""VCPO's two controls (arXiv 2602.17616; mit-han-lab/vcpo) against plain-Python references written from the
formulas of docs/algorithms.md#vcpo, not from the implementation:

    w_i = Π_t ρ_it over the response's valid tokens      ESS = (Σ w_i)² / (N·Σ w_i²)
    lr_step = lr · g(min(1, ESS / base)),  g = sqrt | identity | 1
    b*_g = Σ_{i∈g} w_i²·‖∇log π(y_i)‖²·r_i / Σ_{i∈g} w_i²·‖∇log π(y_i)‖²,   A_i = (r_i − b*_g) [/ (std_g(r) + 1e-6)]

Both signs of the advantage, ratios far from 1, ±inf/NaN at masked positions, and the limits (on-policy ρ = 1:
ESS = 1 and the configured step; equal weights: the group mean; one dominant weight: ESS → 1/N, b* → its reward).
The per-response score norms' algebra (``squared_norms`` of ``Outer`` terms) against the matrices formed one row
at a time.
"""

import math

import pytest
import torch

from oprl.algorithms import (
    ESS_LR_RULES,
    baseline_gap,
    ess_lr_scale,
    group_advantages,
    off_policy_baseline_log_weights,
    resolve_preset,
    sequence_log_ratios,
)
from oprl.algorithms.variance import Outer, squared_norms

# Three responses of up to 4 tokens; row 2 has one valid token. Log-ratios far from 0 (ρ from e^-3 to e^4).
LOG_RATIOS = [[1.5, -0.5, 4.0, 0.0], [-3.0, 0.25, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0]]
MASK = [[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]]


def reference_ess(log_ratios, mask):
    """(Σw)²/(N·Σw²) over the rows with a valid token, w_i = exp(Σ_t log ρ_t), in float64 Python."""
    rows = [(row, keep) for row, keep in zip(log_ratios, mask, strict=True) if any(keep)]
    weights = [math.exp(sum(lr for lr, m in zip(row, keep, strict=True) if m)) for row, keep in rows]
    if not weights:
        return 1.0
    return sum(weights) ** 2 / (len(weights) * sum(w * w for w in weights))


def tensors(masked_value=0.0):
    """(logprobs, behavior, mask) whose valid log-ratios are LOG_RATIOS; masked positions hold ``masked_value``."""
    mask = torch.tensor(MASK, dtype=torch.bool)
    logprobs = torch.full((3, 4), -1.0, dtype=torch.float64)
    behavior = logprobs - torch.tensor(LOG_RATIOS, dtype=torch.float64)
    logprobs = torch.where(mask, logprobs, torch.full_like(logprobs, masked_value))
    behavior = torch.where(mask, behavior, torch.full_like(behavior, masked_value))
    return logprobs, behavior, mask


@pytest.mark.parametrize("masked_value", [0.0, math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("rule", ["sqrt", "linear", "none"])
@pytest.mark.parametrize("base", [1.0, 0.3, 1e-3])
def test_ess_and_the_step_scale_match_the_formula(masked_value, rule, base):
    logprobs, behavior, mask = tensors(masked_value)
    log_weights = sequence_log_ratios(logprobs, behavior, mask)
    assert log_weights.tolist() == pytest.approx([sum(r[: sum(m)]) for r, m in zip(LOG_RATIOS, MASK, strict=True)])
    scale, ess = ess_lr_scale(log_weights, rule, base)
    expected_ess = reference_ess(LOG_RATIOS, MASK)
    ratio = min(1.0, expected_ess / base)
    expected_scale = {"sqrt": math.sqrt(ratio), "linear": ratio, "none": 1.0}[rule]
    assert ess.item() == pytest.approx(expected_ess, rel=1e-12)
    assert scale.item() == pytest.approx(expected_scale, rel=1e-12)
    assert 0 < expected_ess < 0.4  # the weights are far from equal: w = e^5, e^-2.75, e^2
    assert not scale.requires_grad and scale.dim() == 0


def test_on_policy_is_ess_one_and_the_configured_step():
    logprobs = torch.randn(4, 6, dtype=torch.float64)
    mask = torch.rand(4, 6) > 0.3
    scale, ess = ess_lr_scale(sequence_log_ratios(logprobs, logprobs.clone(), mask), "sqrt")
    assert ess.item() == pytest.approx(1.0, abs=1e-12) and scale.item() == pytest.approx(1.0, abs=1e-12)


def test_one_dominant_weight_gives_ess_one_over_n():
    # w = (e^20, 1, 1, 1): ESS = (e^20 + 3)² / (4·(e^40 + 3)) → 1/4, the step → lr·√(1/4) = lr/2.
    scale, ess = ess_lr_scale(torch.tensor([20.0, 0.0, 0.0, 0.0], dtype=torch.float64), "sqrt")
    assert ess.item() == pytest.approx(0.25, rel=1e-7) and scale.item() == pytest.approx(0.5, rel=1e-7)
    # A response's ratio that overflows float32 (Π_t ρ_t = e^200) still gives a finite ESS.
    scale, ess = ess_lr_scale(torch.tensor([200.0, -50.0, 0.0]), "linear")
    assert ess.item() == pytest.approx(1 / 3, rel=1e-5) and scale.item() == pytest.approx(1 / 3, rel=1e-5)


def test_no_response_leaves_the_step_unscaled_and_bad_settings_are_refused():
    scale, ess = ess_lr_scale(torch.zeros(0), "sqrt")
    assert (scale.item(), ess.item()) == (1.0, 1.0)
    with pytest.raises(ValueError, match="did you mean 'sqrt'"):
        ess_lr_scale(torch.zeros(2), "sqr")
    with pytest.raises(ValueError, match="ess_lr_base must be > 0"):
        ess_lr_scale(torch.zeros(2), "sqrt", 0.0)
    assert set(ESS_LR_RULES) == {"none", "sqrt", "linear"}


# Two groups of four and one of three; rewards give both signs of A; log w far from 0; score norms unequal.
REWARDS = [1.0, 0.0, 0.0, 1.0, 0.5, 1.0, 0.0, 0.2, 1.0, 0.0, 0.0]
GROUPS = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2]
LOG_W = [3.0, -2.0, 0.5, -6.0, 1.0, 8.0, -1.0, 0.0, -4.0, 2.5, 0.0]
SQ_NORMS = [4.0, 0.25, 9.0, 1.0, 2.0, 0.5, 16.0, 1.0, 3.0, 1.0, 0.1]


def reference_advantages(rewards, groups, log_w, sq_norms, std_normalize):
    """A_i = (r_i − b*_g) [/ (population std_g(r) + 1e-6)], b*_g = Σ w²g²r / Σ w²g² (the group mean if Σ = 0)."""
    out = []
    for i, group in enumerate(groups):
        rows = [j for j, other in enumerate(groups) if other == group]
        u = [math.exp(2 * log_w[j]) * sq_norms[j] for j in rows]
        values = [rewards[j] for j in rows]
        mean = sum(values) / len(values)
        baseline = sum(a * r for a, r in zip(u, values, strict=True)) / sum(u) if sum(u) > 0 else mean
        advantage = rewards[i] - baseline if max(values) > min(values) else 0.0
        if std_normalize:
            advantage /= math.sqrt(sum((r - mean) ** 2 for r in values) / len(values)) + 1e-6
        out.append(advantage)
    return out


def opob(rewards=REWARDS, log_w=LOG_W, sq_norms=SQ_NORMS, **settings):
    log_weights = off_policy_baseline_log_weights(
        torch.tensor(log_w, dtype=torch.float64), torch.tensor(sq_norms, dtype=torch.float64)
    )
    return group_advantages(
        torch.tensor(rewards, dtype=torch.float64),
        torch.tensor(GROUPS),
        baseline="off-policy-optimal",
        log_weights=log_weights,
        **settings,
    )


@pytest.mark.parametrize("std_normalize", [False, True])
def test_off_policy_optimal_baseline_matches_the_formula(std_normalize):
    result = opob(std_normalize=std_normalize)
    expected = reference_advantages(REWARDS, GROUPS, LOG_W, SQ_NORMS, std_normalize)
    assert result.advantages.tolist() == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert (result.advantages > 0).any() and (result.advantages < 0).any()
    # The weights moved the baseline: group 1's b* is nearly the reward of its heaviest response (w = e^8).
    assert result.baseline[4].item() == pytest.approx(1.0, abs=1e-5)


def test_equal_weights_give_the_group_mean():
    ones = [1.0] * len(REWARDS)
    weighted = opob(log_w=[0.0] * len(REWARDS), sq_norms=ones, std_normalize=True)
    plain = group_advantages(torch.tensor(REWARDS, dtype=torch.float64), torch.tensor(GROUPS), std_normalize=True)
    assert weighted.advantages.tolist() == pytest.approx(plain.advantages.tolist(), abs=1e-12)


def test_extreme_and_zero_weights():
    # log u = 2·log w + log g² far beyond float64's exp range: the largest weight of the group decides, finite.
    result = opob(log_w=[400.0, 0.0, 0.0, -400.0, 0, 0, 0, 0, 0, 0, 0])
    assert torch.isfinite(result.advantages).all()
    assert result.baseline[0].item() == pytest.approx(1.0) and result.advantages[1].item() == pytest.approx(-1.0)
    # A group whose score norms are all 0 (no valid token) falls back to its mean; a single zero drops out.
    result = opob(sq_norms=[0.0] * 4 + [0.0, 1.0, 1.0, 1.0] + [1.0] * 3, log_w=[0.0] * len(REWARDS))
    assert result.baseline[:4].tolist() == pytest.approx([0.5] * 4)
    assert result.baseline[4].item() == pytest.approx((1.0 + 0.0 + 0.2) / 3)


def test_equal_rewards_give_zero_and_the_baseline_needs_weights():
    result = opob(rewards=[1.0] * 4 + REWARDS[4:])
    assert result.advantages[:4].tolist() == [0.0] * 4
    with pytest.raises(ValueError, match="needs log_weights"):
        group_advantages(torch.tensor(REWARDS), torch.tensor(GROUPS), baseline="off-policy-optimal")


def test_baseline_gap_by_hand():
    # Group 0: rewards (1, 0), baseline 0.9 for both: |0.9 − 0.5| = 0.4; group 1: baseline = its mean: 0.
    gap = baseline_gap(torch.tensor([1.0, 0.0, 2.0]), torch.tensor([0, 0, 1]), torch.tensor([0.9, 0.9, 2.0]))
    assert gap.item() == pytest.approx(0.8 / 3)


def test_the_vcpo_preset_is_the_authors_script():
    settings = resolve_preset("vcpo")
    assert settings["ess_lr"] == "sqrt" and settings["ess_lr_base"] == 1.0  # ess_scaling: sqrt, base_ess_ratio 1
    assert settings["baseline"] == "off-policy-optimal" and settings["std_normalize"]  # OPOB, norm_by_std
    assert (settings["clip_mode"], settings["weight"]) == ("none", "importance-sampling")  # clip [0, 1e9]: −ρ·A
    assert settings["loss_agg"] == "seq-mean-token-mean" and settings["ratio_level"] == "token"
    with pytest.raises(ValueError, match="ess_lr_base must be > 0"):
        resolve_preset("vcpo", ess_lr_base=0.0)
    with pytest.raises(ValueError, match="unknown ess_lr"):
        resolve_preset("vcpo", ess_lr="cubic")


def per_row(term: Outer, batch: int) -> torch.Tensor:
    """The per-row matrices of ``term`` formed explicitly, one row at a time (one-hot sides as rows of eye)."""
    out = []
    for b in range(batch):
        left = term.left[b] if term.left.dim() == 3 else torch.eye(term.width, dtype=torch.float64)[term.left[b]]
        right = term.right[b]
        out.append((left.T @ right).reshape(term.shape))
    return torch.stack(out)


def test_ghost_norms_equal_the_formed_gradients():
    """‖Σ_k G_ik‖² from Gram matrices equals the norm of the per-row matrices formed explicitly: a dense term,
    a one-hot (embedding) term, and both on one tied parameter; float64."""
    torch.manual_seed(0)
    batch, n, m, vocab, width = 3, 5, 4, 7, 6
    head = Outer(torch.randn(batch, m, vocab, dtype=torch.float64), torch.randn(batch, m, width, dtype=torch.float64),
                 torch.Size([vocab, width]))  # fmt: skip
    embedding = Outer(torch.randint(0, vocab, (batch, n)), torch.randn(batch, n, width, dtype=torch.float64),
                      torch.Size([vocab, width]), width=vocab)  # fmt: skip
    for terms in ([head], [embedding], [head, embedding], [embedding, head]):
        formed = sum(per_row(t, batch) for t in terms)
        expected = formed.reshape(batch, -1).pow(2).sum(1)
        assert torch.allclose(squared_norms(terms, batch), expected, rtol=1e-12)
        assert torch.allclose(sum(t.total() for t in terms), formed.sum(0), rtol=1e-12)
        for term in terms:
            assert torch.allclose(term.rows(slice(0, batch)), per_row(term, batch), rtol=1e-12)
