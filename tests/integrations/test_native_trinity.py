"""oprl's presets against Trinity-RFT's own code (#70), the authors' framework for REC / RED.

Trinity-RFT 0.6.0 does not install next to oprl's pins with its dependencies (it declares transformers>=5.12.1
and verl>=0.7.1, and pip resolves that to verl 0.8.0, numpy 1.26.4 and omegaconf 2.3.1 in place of the pinned
verl 0.9.1, numpy 2 and omegaconf 2.4.0), so ``make test`` installs it ``--no-deps`` (its policy-loss and
advantage modules import only torch and its own code). On identical tensors:

- REC (every clip mode and weight), OPMD's and AsymRE's regularisers and RED-Weight: Trinity's
  ``RECPolicyLossFn`` and ``oprl.algorithms.policy_loss`` give the same loss and gradient;
- group advantages and RED-Drop: Trinity's ``RECGroupedAdvantage`` and ``group_advantages`` give the same
  advantages, with Trinity's random choice of dropped negatives replaced by oprl's (the one difference: two RNGs);
- M2PO and adaptive RED-Weight are not in 0.6.0: M2PO is checked against a transcription of Trinity-RFT's
  ``m2po_policy_loss.py`` (below), adaptive RED-Weight in tests/algorithms/test_red_weight.py (``reference`` is
  the bisection of Trinity-RFT's ``cod_advantage.py``, loop for loop).

The table is docs/algorithms.md#native-cross-checks.
"""

import sys
from pathlib import Path

import pytest
import torch

# `make test` installs Trinity-RFT into a folder of its own without its dist-info (Makefile: its vLLM plugin entry
# point breaks every vLLM engine), so it is importable only from here.
VENDORED = Path(sys.prefix) / "trinity-rft"
if VENDORED.is_dir() and str(VENDORED) not in sys.path:
    sys.path.append(str(VENDORED))
trinity = pytest.importorskip("trinity", reason="trinity-rft 0.6.0 is installed by `make test` into .venv/trinity-rft")

from trinity.algorithm.advantage_fn.rec_advantage import RECGroupedAdvantage  # noqa: E402
from trinity.algorithm.policy_loss_fn.rec_policy_loss import RECPolicyLossFn  # noqa: E402
from trinity.common.experience import EID, Experience  # noqa: E402

from oprl.algorithms import (  # noqa: E402
    LossParams,
    advantage_settings,
    group_advantages,
    policy_loss,
    resolve_preset,
)

B, T = 6, 5


def batch(seed=0):
    """(old, new with grad, advantages (B,), mask): ρ on both sides of the paper's bands and of the ring's extremes."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(B, T)
    mask[1, 3:] = 0
    mask[4, 1:] = 0
    old = -torch.rand(B, T, generator=g) * 2 - 1.3
    new = (old + 0.8 * torch.randn(B, T, generator=g)).clamp(max=-1e-3).requires_grad_()
    return old, new, torch.randn(B, generator=g), mask


_WIDE = {"epsilon_low": 0.6, "epsilon_high": 2.0}
# oprl preset -> Trinity-RFT's RECPolicyLossFn arguments (its names: importance_sampling, k2).
REC_CASES = {
    "reinforce": {},
    "rec-oneside-nois": {"clip_mode": "one-side"},
    "rec-oneside-is": {"clip_mode": "one-side", "weight": "importance_sampling"},
    "rec-twoside-nois": {"clip_mode": "two-side"},
    "rec-twoside-is": {"clip_mode": "two-side", "weight": "importance_sampling"},
    "rec-ring-nois": {"clip_mode": "ring"},
    "rec-ring-is": {"clip_mode": "ring", "weight": "importance_sampling"},
    "rec-oneside-is-wide": {"clip_mode": "one-side", "weight": "importance_sampling", **_WIDE},
    "rec-ring-nois-wide": {"clip_mode": "ring", **_WIDE},
    "opmd": {"regularizer": "k2", "regularizer_coef": 0.1},
    "asymre": {"regularizer": "forward-kl", "regularizer_coef": 0.1},
    "red-weight": {"weight": "advantage", "temp": 1.0},
}


@pytest.mark.parametrize("preset", list(REC_CASES))
def test_trinitys_rec_loss_is_oprls(preset):
    old, new, advantages, mask = batch()
    loss_fn = RECPolicyLossFn(**{**RECPolicyLossFn.default_args(), **REC_CASES[preset]})
    theirs, metrics = loss_fn(logprob=new, old_logprob=old, action_mask=mask, advantages=advantages[:, None] * mask)
    mine_new = new.detach().clone().requires_grad_()
    mine, mine_metrics = policy_loss(mine_new, old, advantages, mask, LossParams.of(resolve_preset(preset)))
    theirs.backward()
    mine.backward()
    torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-7)  # Trinity's token mean adds 1e-8 to Σ mask
    torch.testing.assert_close(mine_new.grad, new.grad, rtol=1e-6, atol=1e-8)
    assert metrics["pg_clipfrac"] == pytest.approx(float(mine_metrics["clip_frac"]), abs=1e-6)


def experiences(rewards, groups):
    return [
        Experience(eid=EID(task=str(g), run=i), tokens=torch.arange(4), prompt_length=1, reward=float(r))
        for i, (r, g) in enumerate(zip(rewards, groups, strict=True))
    ]


# Groups of 4 to 8 (sorted, as Trinity-RFT's group_by returns them): binary with more negatives (RED-Drop drops),
# more positives, all equal, graded rewards.
REWARDS = [1.0, 0, 0, 0, 0, 1, 1, 1, 0, 0.5, 0.5, 0.5, 0.5, 0.2, 0.9, 0.4, 0.1, 0.1, 1, 0, 0, 0, 0, 0]
GROUPS = [0] * 4 + [1] * 4 + [2] * 4 + [3] * 6 + [4] * 6


@pytest.mark.parametrize("std_normalize", [False, True])
@pytest.mark.parametrize(("preset", "drop"), [("reinforce", None), ("red-drop-keep", "balance")])
def test_trinitys_rec_advantages_are_oprls(monkeypatch, preset, drop, std_normalize):
    """Trinity-RFT's RED-Drop keeps every response (A = 0 for the dropped) and re-centres (and with std_normalize
    re-scales by the population std) over the kept: oprl's red-drop-keep. Which negatives it drops is its own
    torch.randperm; it is made to drop the ones oprl's generator dropped."""
    rewards, groups = torch.tensor(REWARDS), torch.tensor(GROUPS)
    settings = advantage_settings(resolve_preset(preset, std_normalize=std_normalize))
    mine = group_advantages(rewards, groups, generator=torch.Generator().manual_seed(0), **settings)
    perms = []  # one per group that drops, in group order: oprl's dropped negatives first
    for g in groups.unique():
        rows = (groups == g).nonzero().squeeze(-1)
        negatives = rows[rewards[rows] < rewards[rows].mean()]
        dropped = [k for k, row in enumerate(negatives.tolist()) if mine.dropped[row]]
        if drop and len(negatives) > len(rows) - len(negatives):
            perms.append(torch.tensor(dropped + [k for k in range(len(negatives)) if k not in dropped]))
    assert not drop or (len(perms) == 2 and mine.dropped.sum() == 6)  # groups 0 and 4 drop 2 and 4 negatives
    monkeypatch.setattr(torch, "randperm", lambda n, **kwargs: perms.pop(0))
    advantage_fn = RECGroupedAdvantage(std_normalize=std_normalize, drop=drop)
    out, _ = advantage_fn(experiences(REWARDS, GROUPS))
    theirs = torch.stack([e.advantages[0] for e in out])
    assert not perms  # Trinity drew exactly once per dropping group
    torch.testing.assert_close(theirs, mine.advantages, rtol=1e-5, atol=1e-6)
    assert mine.keep.all()  # kept in the batch with A = 0, as Trinity keeps them


def test_trinity_fails_on_a_one_response_group():
    """Trinity-RFT 0.6.0's RECGroupedAdvantage reads ``rewards`` before assigning it when a group has one response
    (it sets mean 0, std 1 only in that branch); oprl gives such a response A = 0."""
    with pytest.raises(UnboundLocalError):
        RECGroupedAdvantage()(experiences([1.0], [0]))
    assert group_advantages(torch.tensor([1.0]), torch.tensor([0])).advantages.item() == 0


def m2po_trinity(logprobs, old, mask, advantages, threshold):
    """Trinity-RFT's M2PO (``trinity/algorithm/policy_loss_fn/m2po_policy_loss.py``: ``_compute_m2po_mask`` and
    ``M2POPolicyLossFn.__call__``, transcribed): the trust region is the valid tokens with A > 0 ∧ log ρ > 0 or
    A < 0 ∧ log ρ < 0; if their mean (log ρ)² exceeds τ, the tokens beyond the longest ascending prefix whose mean
    is ≤ τ are masked; loss = Σ −A·ρ over the kept tokens / valid tokens, ρ with gradient (log ρ clamped at ±20)."""
    log_ratio = logprobs - old
    valid = mask.bool()
    detached = log_ratio.detach()
    trust = valid & (((advantages > 0) & (detached > 0)) | ((advantages < 0) & (detached < 0)))
    values = detached.square()[trust]  # in the flattened order of the trust-region tokens
    kept = torch.ones(len(values), dtype=torch.bool)
    m2_before = values.mean().item() if len(values) else 0.0
    if len(values) and m2_before > threshold:
        ordered, order = torch.sort(values, stable=True)
        prefix = torch.cumsum(ordered, 0) / torch.arange(1, len(values) + 1)
        kept[order[int((prefix <= threshold).sum()) :]] = False
    final = valid.clone()
    final[trust] = kept
    ratio = torch.exp(log_ratio + (log_ratio.clamp(-20, 20) - log_ratio).detach())
    loss = torch.where(final, -advantages * ratio, torch.zeros_like(ratio)).sum() / mask.sum()
    return loss, final, m2_before, values[kept].mean().item() if kept.any() else 0.0


def test_m2po_equals_trinitys_mask_and_gradient():
    """M2PO over one mini-batch in one call: oprl's m2po (the paper's mask, w = ρ, token mean) has Trinity-RFT's
    mask, M̂₂ before and after, and gradient (Trinity's −A·ρ, ρ with gradient, is the same ∇ as oprl's −ρ·A·log π)."""
    old, new, advantages, mask = batch(3)
    token_advantages = advantages[:, None] * mask
    theirs, kept, m2_before, m2_after = m2po_trinity(new, old, mask, token_advantages, 0.04)
    assert m2_before > 0.04 and (mask.bool() & ~kept).any()  # the rule masked something
    mine_new = new.detach().clone().requires_grad_()
    mine, metrics = policy_loss(mine_new, old, advantages, mask, LossParams.of(resolve_preset("m2po")))
    theirs.backward()
    mine.backward()
    torch.testing.assert_close(mine_new.grad, new.grad, rtol=1e-5, atol=1e-7)
    assert float(metrics["m2"]) == pytest.approx(m2_before, rel=1e-5)
    assert float(metrics["m2_kept"]) == pytest.approx(m2_after, rel=1e-5)
    assert float(metrics["clip_frac"]) == pytest.approx(float((mask.bool() & ~kept).sum() / mask.sum()), abs=1e-6)


def test_no_installed_vllm_plugin_fails_to_load():
    """vLLM runs every ``vllm.general_plugins`` entry point in each engine it starts: Trinity-RFT 0.6.0's (when
    installed with its dist-info) imported a parser vLLM 0.32 lacks, and every vLLM engine failed to start."""
    from importlib.metadata import entry_points

    for point in entry_points(group="vllm.general_plugins"):
        assert not point.value.startswith("trinity"), f"{point}: Trinity-RFT's vLLM plugin is installed"
        point.load()  # raises where the plugin's module cannot be imported
