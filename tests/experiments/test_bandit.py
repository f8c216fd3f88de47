"""The 3-armed bandit of docs/paper.md#bandit (oprl.experiments.bandit): only what the mathematics guarantees.

Arms are 0-based: a0 (r=0), a1 (r=0.8, the paper's sub-optimal "arm 2"), a2 (r=1). Data always from
π_b = [0.3, 0.6, 0.1]; the policy starts at π_b. Group size K = 8, SGD step 1 on the logits.
"""

import json

import pytest
import torch

from oprl.experiments import bandit
from oprl.experiments.bandit import BEHAVIOR, expected_gradient, run_exact, run_sampled

K = 8
LR = 1.0
PI_B = torch.tensor(BEHAVIOR, dtype=torch.float64)
PAPER_GRADIENT = torch.tensor([-0.174, 0.132, 0.042], dtype=torch.float64)  # π_b(a)(r_a − E_b[r])


def test_reinforce_drifts_along_the_spec_vector_to_the_suboptimal_arm():
    # With the group mean as baseline, Σ_i A_i = 0 kills the softmax's −π term, so the expected logit
    # update is θ-independent: (K−1)/K · π_b(a)(r_a − E_b[r]). The logits move on a straight line.
    exact = run_exact("reinforce", steps=60, lr=LR, group_size=K)
    steps = exact.logits.diff(dim=0)  # (S, 3)
    assert torch.allclose(steps, LR * (K - 1) / K * PAPER_GRADIENT.expand_as(steps), atol=1e-9)
    assert exact.probs[-1, 1] > 0.9
    sampled = run_sampled("reinforce", steps=150, lr=LR, group_size=K, seed=0)
    assert sampled.probs[-1, 1] > 0.9


def test_red_drop_also_moves_on_a_straight_line():
    # Over the kept set Σ A_i = 0 as well, so RED-Drop's expected update is θ-independent too; the arm
    # with the largest component wins. Dropping only reshapes the constant direction here.
    exact = run_exact("red-drop", steps=40, lr=LR, group_size=K)
    steps = exact.logits.diff(dim=0)
    assert torch.allclose(steps, steps[0].expand_as(steps), atol=1e-9)
    assert int(steps[0].argmax()) == 1
    assert not torch.allclose(steps[0], LR * (K - 1) / K * PAPER_GRADIENT, atol=1e-4)


def test_one_side_clipping_stops_pushing_arm_1_past_the_band():
    # a1 is pushed up by its own positive-advantage tokens only while ρ1 ≤ 1 + ε_high = 1.2, and by a0's
    # negative ones only while ρ0 ≥ 0.8; so π1 stays near 1.2·π_b(1) = 0.72 where REINFORCE takes it to 1.
    for method in ("rec-oneside-nois", "rec-oneside-is"):
        exact = run_exact(method, steps=150, lr=LR, group_size=K)
        assert (exact.probs[:, 1] / PI_B[1]).max() < 1.25
        sampled = run_sampled(method, steps=150, lr=LR, group_size=K, seed=0)
        assert sampled.probs[:, 1].max() < 0.8


def test_opmd_converges_to_the_stationary_point_of_its_penalised_objective():
    # E[loss] = −Σ_a g_a log π(a) + c Σ_a π_b(a) d_a², d = log π − log π_b, g = (K−1)/K·PAPER_GRADIENT.
    # Its gradient vanishes where g = 2c·(π_b ⊙ d − π·Σ_a π_b(a) d_a); the penalty keeps π interior.
    exact = run_exact("opmd", steps=300, lr=LR, group_size=K)
    assert exact.logits.diff(dim=0)[-1].norm() < 1e-6
    pi = exact.probs[-1]
    d = pi.log() - PI_B.log()
    c = 0.1
    assert torch.allclose((K - 1) / K * PAPER_GRADIENT, 2 * c * (PI_B * d - pi * (PI_B * d).sum()), atol=1e-6)
    assert pi.min() > 0.01 and pi[1] < 0.9


def test_red_weight_keeps_the_best_arm_alive():
    # With w = exp(A) the weighted advantages no longer sum to zero: E[update] = h − s·π with h, s
    # independent of θ and s = E[mean w·A] > 0. a0 (h0 < 0) dies; a1 and a2 settle where
    # π1 − π2 = (h1 − h2)/s instead of a2 vanishing as under REINFORCE.
    at_behavior = -expected_gradient("red-weight", PI_B.log(), K)
    elsewhere_logits = torch.tensor([0.0, 1.0, -1.0], dtype=torch.float64)
    elsewhere = -expected_gradient("red-weight", elsewhere_logits, K)
    pi_elsewhere = torch.softmax(elsewhere_logits, 0)
    s = ((at_behavior - elsewhere) @ (pi_elsewhere - PI_B)) / (pi_elsewhere - PI_B).square().sum()
    h = at_behavior + s * PI_B
    third_logits = torch.tensor([2.0, -1.0, 0.5], dtype=torch.float64)
    third = -expected_gradient("red-weight", third_logits, K)
    assert torch.allclose(third, h - s * torch.softmax(third_logits, 0), atol=1e-9)
    assert s > 0 and h[0] < 0
    predicted_a2 = (1 - (h[1] - h[2]) / s) / 2
    exact = run_exact("red-weight", steps=300, lr=LR, group_size=K)
    assert exact.probs[-1, 0] < 0.01
    assert exact.probs[-1, 2].item() == pytest.approx(predicted_a2.item(), abs=0.01)
    assert predicted_a2 > 0.05


def test_cli_writes_the_table_files(tmp_path, capsys):
    assert bandit.main(["--steps", "3", "--samples", "4", "--seed", "1", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bandit.json").read_text())
    assert set(report["methods"]) == set(bandit.METHODS)
    run = report["methods"]["reinforce"]["exact"]
    assert len(run["probs"]) == 4 and {"final_probs", "dominant_arm", "expected_reward", "max_ratio"} <= set(run)
    assert (tmp_path / "bandit.png").stat().st_size > 0
    assert "reinforce" in capsys.readouterr().out
