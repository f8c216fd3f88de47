"""The batch rules' scope under data parallelism (#70): with two gloo ranks, each holding its share of whole groups of
a mini-batch (``DataParallel.share``) in micro-batches of 2 rows, M2PO's three forms and BAPO give the mask, the
loss and the gradient of one process over the whole mini-batch, because ``batch_keeps`` gathers every rank's rows
(``DataParallel.gather_objects``) and runs the rule on them in the mini-batch's row order. The same ranks with
their own statistic (``gather=alone``: the scope before, "per rank") move the gradient, so the check can fail.

Each rank is this file run as a script (``python test_batch_rules_ranks.py RANK WORLD INIT OUT``): it joins a gloo
group through a file, computes every case and saves its rows' results; the test puts the ranks' rows together.
Tolerance: float64 batches; the ranks' summed loss and assembled gradient differ from one call's only by the order
of the sums (the same bound as ``test_batch_rules.py``, 1e-12); masks and the rule's metrics are compared exactly
(the same function on the same tensors)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from oprl.algorithms.aggregation import aggregation_count
from oprl.algorithms.algorithm import Algorithm
from oprl.algorithms.losses import RuleInputs, alone, batch_keeps, policy_loss

RULES = ("m2po", "m2po-areal", "m2po-clip", "bapo")
BANDS = {"m2po-clip": {"eps_low": 0.0, "eps_high": 0.0}}
"""m2-clip's band is never narrower than [1 − ε_low, 1 + ε_high]: the preset's [0.7, 1.5] holds every ratio a half of
these batches needs, so ε = 0 lets M2PO's own bound decide (as ``tests/trainer/test_trainer_batch_rules.py``)."""
SEEDS = (0, 1, 2, 3)
GROUPS = (0, 0, 0, 1, 1, 2, 2, 3)
"""The group of each of the 8 rows: rank 0 holds groups 0 and 2 (rows 0, 1, 2, 5, 6), rank 1 groups 1 and 3 (rows
3, 4, 7): an uneven share whose rows interleave in the mini-batch, and the tied rows 1, 2 and 5 (``mini_batch``)
on both ranks."""
MICRO = 2
TOLERANCE = 1e-12


def loss_params(preset):
    return dataclasses.replace(Algorithm.of(preset).loss, **BANDS.get(preset, {}))


def tie_batch():
    """5 rows of one token, harmful (A > 0, ρ > 1), (log ρ)² = 0.01, 0.09, 0.09, 0.01, 0.01: M̂₂ = 0.042 > 0.04 and
    dropping one 0.09 gives 0.03. One process drops row 1 (first in the mini-batch's order); with one row per
    group rank 0 holds rows 0, 2, 4 and rank 1 rows 1, 3, so ranks joined in rank order would drop row 2."""
    logprobs = torch.full((5, 1), -1.0, dtype=torch.float64)
    log_ratios = torch.tensor([[0.1], [0.3], [0.3], [0.1], [0.1]], dtype=torch.float64)
    return logprobs, logprobs - log_ratios, torch.ones(5, dtype=torch.float64), torch.ones(5, 1, dtype=torch.bool)


def cases():
    """``{name: (preset, batch, groups)}``: each rule on four seeds, the tie at M2PO's cut across ranks, and a
    mini-batch of one group (rank 1 holds no row and still joins the gather)."""
    from test_batch_rules import SPREADS, mini_batch

    out = {f"{preset}-{seed}": (preset, mini_batch(seed, spread=SPREADS[seed % 2]), GROUPS)
           for preset in RULES for seed in SEEDS}  # fmt: skip
    out["tie"] = ("m2po", tie_batch(), tuple(range(5)))
    out["one-group"] = ("m2po", mini_batch(0), (0,) * 8)
    return out


def ranked(preset, batch, groups, parallel, *, gather):
    """This rank's part of a mini-batch: ``(rows, loss, grad (n, T), keep (n, T), rule metrics)``, its rows in
    micro-batches of ``MICRO``, each loss weighted by its share of the mini-batch's count as the trainer does."""
    logprobs, behavior, advantages, mask = batch
    params = loss_params(preset)
    rows = parallel.share([SimpleNamespace(group_id=g) for g in groups])
    parts = []
    for start in range(0, len(rows), MICRO):
        chunk = rows[start : start + MICRO]
        width = int(mask[chunk].sum(-1).max())  # a micro-batch's forward pads to its longest row
        parts.append(RuleInputs(logprobs[chunk, :width].clone().requires_grad_(True), behavior[chunk, :width],
                                advantages[chunk], mask[chunk, :width]))  # fmt: skip
    keeps = batch_keeps(parts, params, positions=rows, gather=gather)
    total = aggregation_count(mask, params.loss_agg)
    loss, metrics = torch.zeros((), dtype=torch.float64), {}
    grad, keep = torch.zeros_like(logprobs[rows]), torch.zeros_like(mask[rows])
    for part, part_keep in zip(parts, keeps, strict=True):
        micro, reported = policy_loss(part.logprobs, part.behavior_logprobs, part.advantages, part.mask, params,
                                      batch_keep=part_keep)  # fmt: skip
        loss = loss + micro * aggregation_count(part.mask, params.loss_agg) / total
        metrics = {key: value for key, value in reported.items() if key.startswith(("m2", "bapo"))}
    if parts:
        loss.backward()
    start = 0
    for part, part_keep in zip(parts, keeps, strict=True):
        rows_, width = part.logprobs.shape
        grad[start : start + rows_, :width] = part.logprobs.grad
        keep[start : start + rows_, :width] = part_keep.keep & part.mask
        start += rows_
    return rows, loss.detach(), grad, keep, metrics


def rank_main(rank: int, world: int, init: str, out: str) -> None:
    """One rank: every case with the gathered statistic (``global``) and with its own (``rank``)."""
    import torch.distributed as dist

    from oprl.trainer.distributed import DataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    parallel = DataParallel("ddp", device=torch.device("cpu"))
    results = {}
    for name, (preset, batch, groups) in cases().items():
        results[name, "global"] = ranked(preset, batch, groups, parallel, gather=parallel.gather_objects)
        results[name, "rank"] = ranked(preset, batch, groups, parallel, gather=alone)
    dist.barrier()
    dist.destroy_process_group()
    torch.save(results, out)


def one_process(preset, batch):
    """(loss, grad (B, T), keep (B, T), rule metrics) of one ``policy_loss`` call over the whole mini-batch."""
    logprobs, behavior, advantages, mask = batch
    params = loss_params(preset)
    logprobs = logprobs.clone().requires_grad_(True)
    loss, metrics = policy_loss(logprobs, behavior, advantages, mask, params)
    loss.backward()
    (whole,) = batch_keeps([RuleInputs(logprobs, behavior, advantages, mask)], params)
    rules = {key: value for key, value in metrics.items() if key.startswith(("m2", "bapo"))}
    return loss.detach(), logprobs.grad, whole.keep & mask, rules


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Each rank's results, from two processes of this file joined in one gloo group."""
    root = tmp_path_factory.mktemp("ranks")
    here = Path(__file__).resolve()
    environment = dict(os.environ, OMP_NUM_THREADS="1")
    commands = [
        [sys.executable, str(here), str(rank), "2", str(root / "init"), str(root / f"{rank}.pt")] for rank in (0, 1)
    ]
    processes = [
        subprocess.Popen(command, cwd=here.parent, env=environment, stderr=subprocess.PIPE, text=True)
        for command in commands
    ]
    for process in processes:
        _, error = process.communicate(timeout=300)
        assert process.returncode == 0, error[-3000:]
    return [torch.load(root / f"{rank}.pt", weights_only=False) for rank in range(2)]


def assembled(results, name, scope, shape_of):
    """The ranks' rows put back together: (summed loss, grad (B, T), keep (B, T), each rank's metrics)."""
    grad = torch.zeros(shape_of, dtype=torch.float64)
    keep = torch.zeros(shape_of, dtype=torch.bool)
    loss, metrics = 0.0, []
    for rank_results in results:
        rows, rank_loss, rank_grad, rank_keep, rank_metrics = rank_results[name, scope]
        loss += rank_loss.item()
        if rows:
            grad[rows] = rank_grad
            keep[rows] = rank_keep
            metrics.append(rank_metrics)
    return loss, grad, keep, metrics


@pytest.mark.parametrize("name", [*(f"{p}-{s}" for p in RULES for s in SEEDS), "tie", "one-group"])
def test_two_ranks_give_one_processs_mask_loss_and_gradient(two_ranks, name):
    preset, batch, _ = cases()[name]
    loss, grad, keep, rules = one_process(preset, batch)
    ranks_loss, ranks_grad, ranks_keep, ranks_metrics = assembled(two_ranks, name, "global", grad.shape)
    assert torch.equal(ranks_keep, keep)
    assert abs(ranks_loss - loss.item()) <= TOLERANCE
    assert (ranks_grad - grad).abs().max().item() <= TOLERANCE
    assert rules and all(torch.equal(metrics[key], value) for metrics in ranks_metrics for key, value in rules.items())


def test_the_tie_at_m2pos_cut_follows_the_mini_batchs_order_across_ranks(two_ranks):
    _, _, keep, _ = assembled(two_ranks, "tie", "global", (5, 1))
    assert keep.flatten().tolist() == [True, False, True, True, True]  # row 1 leaves, its tie (row 2, rank 0) stays


@pytest.mark.parametrize("preset", RULES)
def test_each_ranks_own_statistic_would_change_the_result(two_ranks, preset):
    """The check above can fail: with each rank's own statistic (the scope before) the gradient moves."""
    moved = []
    for seed in SEEDS:
        name = f"{preset}-{seed}"
        _, grad, _, _ = one_process(preset, cases()[name][1])
        _, ranks_grad, _, _ = assembled(two_ranks, name, "rank", grad.shape)
        moved.append((ranks_grad - grad).abs().max().item())
    assert max(moved) > 1e-3, moved


if __name__ == "__main__":  # one rank of ``two_ranks``
    rank_main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
