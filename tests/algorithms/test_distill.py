"""distill_advantages: the reverse-KL advantage by hand on a toy vocabulary, teacher = student gives nothing to
learn, per-token advantages through every preset's loss, masked garbage, the mix registry and its checks."""

import math

import pytest
import torch

from oprl.algorithms import (
    DISTILL_MIXES,
    PRESETS,
    LossParams,
    distill_advantages,
    distill_metrics,
    policy_loss,
    resolve_preset,
)
from oprl.algorithms.topk_divergence import TOP_K_MASKS

LOSS_ONLY = [name for name in PRESETS if PRESETS[name]["clip_mode"] not in TOP_K_MASKS]
"""The presets whose loss needs no more than these tests give: the Top-K masks read the sampler's top-K
(tests/algorithms/test_topk_divergence.py)."""

# A toy vocabulary of 3 tokens. Student (behaviour) p = [1/2, 1/4, 1/4], teacher q = [1/4, 1/4, 1/2].
P = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
Q = torch.tensor([0.25, 0.25, 0.5], dtype=torch.float64)
SAMPLED = [[0, 2, 1], [2, 0, 0]]  # two responses of 3 tokens; the second's last token is padding
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
LN2 = math.log(2)


def toy():
    ids = torch.tensor(SAMPLED)
    return P.log()[ids], Q.log()[ids]  # behaviour (B, T), teacher (B, T)


def test_reverse_kl_advantage_by_hand():
    # d_t = log q(y_t) − log p(y_t): token 0 → ln(1/4 ÷ 1/2) = −ln2, token 1 → 0, token 2 → ln(1/2 ÷ 1/4) = +ln2.
    behavior, teacher = toy()
    group = torch.tensor([0.3, -0.3], dtype=torch.float64)
    replaced, metrics = distill_advantages(group, behavior, teacher, MASK, distill_coef=0.5, distill_mix="replace")
    assert replaced.tolist() == [pytest.approx([-0.5 * LN2, 0.5 * LN2, 0.0]), pytest.approx([0.5 * LN2, -0.5 * LN2, 0])]
    added, _ = distill_advantages(group, behavior, teacher, MASK, distill_coef=0.5, distill_mix="add")
    assert added.tolist() == [
        pytest.approx([0.3 - 0.5 * LN2, 0.3 + 0.5 * LN2, 0.3]),
        pytest.approx([-0.3 + 0.5 * LN2, -0.3 - 0.5 * LN2, 0.0]),  # padding: 0, not the group's −0.3
    ]
    # Over the 5 valid tokens: log p − log q = [ln2, −ln2, 0, −ln2, ln2] → mean 0; min(1, q/p) =
    # [1/2, 1, 1, 1, 1/2] → 4/5; log q = [−2ln2, −ln2, −2ln2, −ln2, −2ln2] → −8ln2/5.
    assert metrics["reverse_kl"].item() == pytest.approx(0.0, abs=1e-12)
    assert metrics["agreement"].item() == pytest.approx(4 / 5)
    assert metrics["teacher_logprob"].item() == pytest.approx(-8 * LN2 / 5)


def test_reverse_kl_metric_is_the_exact_kl_when_every_token_is_weighed_by_the_student():
    """E_{y~p}[log p(y) − log q(y)] = KL(p‖q) = ½ln2 + 0 + ¼ln(½) = ¼ln2: the metric is its Monte Carlo
    estimate, here made exact by sampling each token in proportion to p (2 × token 0, 1 × tokens 1 and 2)."""
    ids = torch.tensor([[0, 0, 1, 2]])
    metrics = distill_metrics(P.log()[ids], Q.log()[ids], torch.ones(1, 4, dtype=torch.bool))
    assert metrics["reverse_kl"].item() == pytest.approx(0.25 * LN2)
    assert metrics["agreement"].item() == pytest.approx(1 - 0.25)  # 1 − TV(p, q), TV = ½Σ|p − q| = ¼


@pytest.mark.parametrize("name", LOSS_ONLY)
def test_teacher_equal_to_student_gives_zero_advantage_and_zero_gradient(name):
    settings = {**PRESETS[name], "distill_coef": 1.0, "distill_mix": "replace"}
    loss_settings = settings
    behavior, _ = toy()
    logprobs = (behavior + 0.1 * torch.randn(behavior.shape, dtype=torch.float64)).requires_grad_(True)
    group = torch.tensor([1.0, -1.0], dtype=torch.float64)
    advantages, metrics = distill_advantages(group, behavior, behavior.clone(), MASK, distill_coef=1.0,
                                             distill_mix="replace")  # fmt: skip
    assert (advantages == 0).all()
    assert metrics["reverse_kl"].item() == 0.0 and metrics["agreement"].item() == 1.0
    entropy = torch.rand(behavior.shape, dtype=torch.float64)  # read by aspo-entropy's band only
    loss, _ = policy_loss(logprobs, behavior, advantages, MASK, LossParams.of(loss_settings), entropy=entropy)
    # A regulariser has its own gradient, teacher or not; so has OAPL's regression (β·log(π/π_b))² at A = 0.
    regularised = settings["regularizer"] != "none" or settings["objective"] == "advantage-regression"
    if not regularised:
        (grad,) = torch.autograd.grad(loss, logprobs)
        assert (grad == 0).all()


@pytest.mark.parametrize("name", LOSS_ONLY)
def test_add_with_an_equal_teacher_is_the_group_advantage(name):
    """A (B, T) advantage that repeats A_b equals the (B,) call of every preset: loss and gradient."""
    loss_settings = PRESETS[name]
    behavior, _ = toy()
    group = torch.tensor([0.7, -0.2], dtype=torch.float64)
    per_token, _ = distill_advantages(group, behavior, behavior, MASK, distill_coef=2.0, distill_mix="add")
    outputs = []
    for advantages in (group, per_token):
        logprobs = (behavior + 0.3).requires_grad_(True)
        entropy = torch.arange(behavior.numel(), dtype=torch.float64).view_as(behavior)  # aspo-entropy's band
        loss, _ = policy_loss(logprobs, behavior, advantages, MASK, LossParams.of(loss_settings), entropy=entropy)
        outputs.append((loss.item(), torch.autograd.grad(loss, logprobs)[0]))
    assert outputs[0][0] == pytest.approx(outputs[1][0], abs=1e-12)
    assert torch.allclose(outputs[0][1], outputs[1][1], atol=1e-12)


def test_per_token_advantages_in_the_reinforce_loss_by_hand():
    # loss = −(1/5)·Σ_t A_t·lp_t over the 5 valid tokens with A = c·d (replace), c = 1, lp = log p.
    behavior, teacher = toy()
    advantages, _ = distill_advantages(torch.zeros(2, dtype=torch.float64), behavior, teacher, MASK,
                                       distill_coef=1.0, distill_mix="replace")  # fmt: skip
    logprobs = behavior.clone().requires_grad_(True)
    loss, _ = policy_loss(logprobs, behavior, advantages, MASK, LossParams.of(PRESETS["reinforce"]))
    # tokens (d, lp): (−ln2, ln½) (ln2, ln¼) (0, ln¼) (ln2, ln¼) (−ln2, ln½)
    expected = -(LN2 * LN2 - LN2 * 2 * LN2 + 0 - LN2 * 2 * LN2 + LN2 * LN2) / 5
    assert loss.item() == pytest.approx(expected)
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert grad[0].tolist() == pytest.approx([LN2 / 5, -LN2 / 5, 0.0]) and grad[1, 2] == 0


@pytest.mark.parametrize("garbage", [-math.inf, math.inf, math.nan])
def test_masked_tokens_get_zero_whatever_they_hold(garbage):
    behavior, teacher = toy()
    teacher[1, 2] = garbage
    behavior[1, 2] = garbage
    advantages, metrics = distill_advantages(torch.ones(2), behavior, teacher, MASK, distill_coef=1.0,
                                             distill_mix="add")  # fmt: skip
    assert advantages[1, 2] == 0 and torch.isfinite(advantages).all()
    assert all(torch.isfinite(value) for value in metrics.values())


def test_the_mix_registry_and_its_checks():
    assert set(DISTILL_MIXES) == {"add", "replace"}
    behavior, teacher = toy()
    with pytest.raises(ValueError, match=r"unknown distill_mix 'replac'.*did you mean 'replace'"):
        distill_advantages(torch.zeros(2), behavior, teacher, MASK, distill_mix="replac")
    with pytest.raises(ValueError, match="distill_mix=replace with distill_coef=0"):
        resolve_preset("distill", distill_coef=0.0)
    with pytest.raises(ValueError, match="distill_coef must be >= 0"):
        resolve_preset("grpo", distill_coef=-1.0)
    assert resolve_preset("distill")["distill_mix"] == "replace"


def test_a_teacher_minus_inf_is_floored_and_counted_by_hand():
    # Token 2 of row 0 is outside the teacher's support (−inf): d = f − log p = −3 + ln4 with the floor f = −3.
    behavior, teacher = toy()
    teacher[0, 1] = -math.inf
    advantages, metrics = distill_advantages(torch.zeros(2, dtype=torch.float64), behavior, teacher, MASK,
                                             distill_coef=1.0, distill_mix="replace", logprob_floor=-3.0)  # fmt: skip
    assert advantages[0].tolist() == pytest.approx([-LN2, -3.0 + 2 * LN2, 0.0])
    assert metrics["outside_teacher_support"].item() == pytest.approx(1 / 5)
    # log q over the 5 valid tokens: [−2ln2, −3, −2ln2, −ln2, −2ln2] (the floor, not −inf)
    assert metrics["teacher_logprob"].item() == pytest.approx((-7 * LN2 - 3.0) / 5)
    assert distill_metrics(behavior, toy()[1], MASK)["outside_teacher_support"].item() == 0.0


def test_expected_distillation_gradients_under_truncation_are_reverse_kls():
    """Exact expectations over a 5-token vocabulary whose student samples its top 3 (the kept set S carries no
    gradient, as in the trainer): E_{y~q}[d(y)·∇ log q(y)] = −∇ KL(q‖p) for d = log p − log q, with q the
    student's truncated distribution and p the teacher's full one (``full``), or its truncated one floored at f
    and renormalised (``truncated``); the log kept mass log M in ``full``'s d is a baseline (no expected
    gradient), and a teacher equal to the student gives a zero expected gradient either way."""
    logits = torch.tensor([2.0, 1.0, 0.5, -0.5, -1.0], dtype=torch.float64, requires_grad=True)
    kept = torch.tensor([True, True, True, False, False])  # the student's top 3

    def log_q(theta):  # (V,) log of the student's truncated distribution, −inf off S
        return theta.masked_fill(~kept, -math.inf).log_softmax(-1)

    q = log_q(logits).exp().detach()  # (V,)
    jacobian = torch.stack([torch.autograd.grad(log_q(logits)[y], logits)[0] for y in range(3)])  # (3, V)

    def expected(d):  # E_{y~q}[d(y) ∇ log q(y)], exactly
        return (q[:3, None] * d[:3, None] * jacobian).sum(0)

    def minus_kl_grad(log_p):  # −∇_θ KL(q_θ‖p) with p fixed, over S
        kl = (log_q(logits).exp()[:3] * (log_q(logits)[:3] - log_p[:3])).sum()
        return -torch.autograd.grad(kl, logits)[0]

    teacher = torch.tensor([1.0, 1.5, -1.0, 0.0, 0.5], dtype=torch.float64)
    full = teacher.log_softmax(-1)
    student_full = logits.detach().log_softmax(-1)  # log π_b without truncation: log q − log M on S
    d_full = full - log_q(logits).detach()
    assert torch.allclose(expected(d_full), minus_kl_grad(full))
    assert torch.allclose(expected(full - student_full), expected(d_full))  # log M: a baseline
    floor = -4.0
    truncated = teacher.masked_fill(teacher < teacher.topk(3).values[-1], -math.inf).log_softmax(-1)
    assert truncated[2] == -math.inf  # the student's token 2 is outside the teacher's top 3
    floored = truncated.clamp(min=floor)
    d_truncated = floored - log_q(logits).detach()
    renormalised = floored - floored.logsumexp(-1)  # the floored teacher as a distribution
    assert torch.allclose(expected(d_truncated), minus_kl_grad(renormalised))
    assert not torch.allclose(expected(d_truncated), expected(d_full))
    # Teacher = student: ``full`` scores d = log M ≠ 0 on every token, yet its expected gradient is 0.
    log_mass = student_full.exp()[:3].sum().log()  # log M, M = π(S) < 1
    d_same = student_full - log_q(logits).detach()
    assert torch.allclose(d_same[:3], log_mass.expand(3)) and log_mass < 0
    assert torch.allclose(expected(d_same), torch.zeros(5, dtype=torch.float64), atol=1e-12)
