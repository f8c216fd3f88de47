"""The batch rules' scope (#70): M2PO's three forms and BAPO compute their statistic over the whole mini-batch
whatever ``optim.micro_batch_size`` is. A mini-batch cut into micro-batches (the whole, halves, quarters, an uneven
cut), each part's loss given its rows of ``batch_keeps``' mask and weighted by its exact share, accumulates the loss
and gradient of one ``policy_loss`` call over the mini-batch and of the plain-Python reference (``arena_reference``),
ties in M2PO's ranking included; the same parts without the mini-batch's mask (each part's own statistic, the old
scope) do not.

Tolerances, measured on these float64 batches: the accumulated parts' loss differs from the one call's by at most
3.3e-16 and their gradient by at most 6.9e-18 (the order of the sums; one part of the mini-batch's width is bit-equal),
the masks are equal; 1e-12 leaves a margin of > 10^3."""

import pytest
import torch
from arena_reference import reference_loss

from oprl.algorithms import resolve_preset
from oprl.algorithms.aggregation import aggregation_count
from oprl.algorithms.algorithm import Algorithm
from oprl.algorithms.losses import BATCH_RULES, RuleInputs, batch_keeps, policy_loss

RULES = {"m2po": "m2-mask", "m2po-areal": "m2-mask-areal", "m2po-clip": "m2-clip", "bapo": "bapo"}
CUTS = {  # rows of an 8-row mini-batch: micro_batch_size = 8, 4, 2, and an uneven cut
    "whole": [range(0, 8)],
    "halves": [range(0, 4), range(4, 8)],
    "quarters": [range(0, 2), range(2, 4), range(4, 6), range(6, 8)],
    "uneven": [range(0, 3), range(3, 8)],
}
TOLERANCE = 1e-12
SPREADS = (0.2, 0.4)
"""std of log ρ: at 0.2 m2-clip's bound leaves its minimum band [0.7, 1.5] on some seeds, at 0.4 M2PO masks more."""


def mini_batch(seed, rows=8, width=7, spread=0.4):
    """Off-policy log-probs (log ρ ≈ N(0, spread²)), both signs of A, ragged rows, and ties: rows 2 and 5 are row
    1's tokens again (the same ρ and A, as a group's responses that sampled the same first tokens), so M2PO's
    ranking meets equal (log ρ)² in different micro-batches."""
    generator = torch.Generator().manual_seed(seed)
    logprobs = -3 * torch.rand(rows, width, generator=generator, dtype=torch.float64)
    log_ratios = spread * torch.randn(rows, width, generator=generator, dtype=torch.float64)
    lengths = torch.randint(2, width + 1, (rows,), generator=generator)
    advantages = torch.randn(rows, generator=generator, dtype=torch.float64)
    for copy in (2, 5):
        logprobs[copy], log_ratios[copy], lengths[copy], advantages[copy] = (
            logprobs[1], log_ratios[1], lengths[1], advantages[1])  # fmt: skip
    advantages[0], advantages[3] = 1.0, -1.0  # both signs always present
    mask = torch.arange(width)[None, :] < lengths[:, None]
    return logprobs, logprobs - log_ratios, advantages, mask


def accumulated(preset, batch, cut, *, whole_batch_rule=True):
    """(loss, d loss / d logprobs (B, T), the rule's metrics) of the parts of ``cut``, each part's loss times its
    share of the mini-batch's count, as the trainer accumulates micro-batches (each part padded to its own width)."""
    logprobs, behavior, advantages, mask = batch
    params = Algorithm.of(preset).loss
    parts = []
    for rows in cut:
        rows = list(rows)
        width = int(mask[rows].sum(-1).max())  # a micro-batch's forward pads to its longest row
        parts.append(RuleInputs(logprobs[rows, :width].clone().requires_grad_(True), behavior[rows, :width],
                                advantages[rows], mask[rows, :width]))  # fmt: skip
    keeps = batch_keeps(parts, params) if whole_batch_rule else [None] * len(parts)
    total = aggregation_count(mask, params.loss_agg)
    loss, metrics = 0, []
    for part, keep in zip(parts, keeps, strict=True):
        micro, reported = policy_loss(part.logprobs, part.behavior_logprobs, part.advantages, part.mask, params,
                                      batch_keep=keep)  # fmt: skip
        loss = loss + micro * aggregation_count(part.mask, params.loss_agg) / total
        metrics.append(reported)
    loss.backward()
    grad = torch.zeros_like(logprobs)
    for rows, part in zip(cut, parts, strict=True):
        grad[list(rows), : part.logprobs.shape[1]] = part.logprobs.grad
    return loss.detach(), grad, metrics


def one_call(preset, batch):
    logprobs, behavior, advantages, mask = batch
    logprobs = logprobs.clone().requires_grad_(True)
    loss, metrics = policy_loss(logprobs, behavior, advantages, mask, Algorithm.of(preset).loss)
    loss.backward()
    return loss.detach(), logprobs.grad, metrics


def test_the_batch_rules_are_the_four_clip_modes():
    assert set(RULES.values()) == BATCH_RULES
    assert all(Algorithm.of(preset).needs.batch_rule for preset in RULES)
    assert not any(Algorithm.of(preset).needs.batch_rule for preset in ("grpo", "dppo-tv", "reinforce"))


@pytest.mark.parametrize("cut", list(CUTS))
@pytest.mark.parametrize("preset", list(RULES))
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_micro_batches_give_the_mini_batchs_loss_and_gradient(preset, cut, seed):
    batch = mini_batch(seed, spread=SPREADS[seed % 2])
    logprobs, behavior, advantages, mask = batch
    loss, grad, metrics = accumulated(preset, batch, CUTS[cut])
    whole_loss, whole_grad, whole_metrics = one_call(preset, batch)
    assert abs(loss.item() - whole_loss.item()) <= TOLERANCE
    assert (grad - whole_grad).abs().max().item() <= TOLERANCE
    assert ((grad == 0) == (whole_grad == 0)).all()  # the same tokens masked
    rule_keys = [key for key in whole_metrics if key.startswith(("m2", "bapo"))]
    assert rule_keys and all(abs(m[key].item() - whole_metrics[key].item()) <= TOLERANCE
                             for m in metrics for key in rule_keys)  # fmt: skip
    # The plain-Python reference of the rule over the whole mini-batch at once.
    expected, expected_grad, _ = reference_loss(
        resolve_preset(preset), logprobs.tolist(), (logprobs - behavior).tolist(), advantages.tolist(), mask.tolist()
    )
    assert loss.item() == pytest.approx(expected, rel=1e-9, abs=TOLERANCE)
    assert grad.tolist() == [pytest.approx(row, rel=1e-9, abs=TOLERANCE) for row in expected_grad]


@pytest.mark.parametrize("preset", list(RULES))
def test_the_whole_mini_batch_in_one_part_is_the_plain_call_bit_for_bit(preset):
    """micro == mini: ``batch_keeps`` over one part is ``policy_loss``'s own mask, so the numbers are equal."""
    batch = mini_batch(3)
    loss, grad, _ = accumulated(preset, batch, CUTS["whole"])
    plain, plain_grad, _ = accumulated(preset, batch, CUTS["whole"], whole_batch_rule=False)
    assert torch.equal(loss, plain) and torch.equal(grad, plain_grad)


@pytest.mark.parametrize("preset", list(RULES))
def test_each_micro_batchs_own_statistic_would_change_the_result(preset):
    """The check above can fail: with each quarter's own statistic (the scope before #70) the gradient moves."""
    moved = []
    for seed in range(4):
        batch = mini_batch(seed, spread=SPREADS[seed % 2])
        _, grad, _ = accumulated(preset, batch, CUTS["quarters"], whole_batch_rule=False)
        _, whole_grad, _ = one_call(preset, batch)
        moved.append((grad - whole_grad).abs().max().item())
    assert max(moved) > 1e-3, moved


def test_ties_at_the_m2po_cutoff_across_micro_batches_follow_the_mini_batchs_order():
    """Equal (log ρ)² on both sides of a cut: the paper's rule drops the first of them in the mini-batch's
    (row, token) order, exactly as one call over the mini-batch does. Harmful (log ρ)² = 0.01, 0.09, 0.01, 0.09,
    0.01 (A > 0, ρ > 1): M̂₂ = 0.042 > 0.04, dropping one 0.09 gives 0.03: row 1 leaves, row 3 (its tie) stays."""
    logprobs = torch.full((5, 1), -1.0, dtype=torch.float64)
    log_ratios = torch.tensor([[0.1], [0.3], [0.1], [0.3], [0.1]], dtype=torch.float64)
    batch = (logprobs, logprobs - log_ratios, torch.ones(5, dtype=torch.float64), torch.ones(5, 1, dtype=torch.bool))
    _, whole_grad, _ = one_call("m2po", batch)
    assert (whole_grad[:, 0] == 0).tolist() == [False, True, False, False, False]
    for cut in ([range(0, 2), range(2, 5)], [range(0, 3), range(3, 5)], [range(0, 1), range(1, 2), range(2, 5)]):
        _, grad, _ = accumulated("m2po", batch, cut)
        assert torch.equal(grad == 0, whole_grad == 0)
        assert (grad - whole_grad).abs().max().item() <= TOLERANCE
