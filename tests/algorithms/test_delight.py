"""The delightful policy gradient (DG) and the Kondo gate against plain references written from the papers' rules.

DG (arXiv 2603.14608): the reference is the loss written out token by token with Python floats (gate, term, token
mean), independent of ``oprl.algorithms``; its gradient by hand: d/dlogπ of −g·A·logπ with g detached is −g·A.
The Kondo gate (arXiv 2603.20526, price as open-instruct PR 1628): the reference computes χ_i, the window, the
(1 − ρ)-quantile by sorting and interpolating, and the Bernoulli decisions from the same uniform draws. Then the
presets, their bad settings, and two steps of the real trainer on the tiny model (seeded: repeatable).
"""

import copy
import math

import pytest
import torch

from oprl.algorithms import (
    PRESETS,
    LossParams,
    SettingError,
    kondo_gate,
    kondo_price,
    policy_loss,
    resolve_preset,
    trainer_only,
)


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def dg_reference(logprobs, behavior, advantages, mask, eta, clip=None):
    """(loss, d loss / d logprobs) of DG on REINFORCE (or REC-OneSide-IS with ``clip`` = ε), token mean."""
    total = sum(sum(row) for row in mask)
    loss, grad = 0.0, [[0.0] * len(row) for row in logprobs]
    for b, row in enumerate(logprobs):
        for t, lp in enumerate(row):
            if not mask[b][t]:
                continue
            a = advantages[b]
            gate = sigmoid(a * -lp / eta)
            weight = 1.0
            if clip is not None:
                ratio = math.exp(lp - behavior[b][t])
                kept = (a >= 0 and ratio <= 1 + clip) or (a <= 0 and ratio >= 1 - clip)
                weight = ratio * kept
            loss += -weight * gate * a * lp / total
            grad[b][t] = -weight * gate * a / total
    return loss, grad


def tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[1, 2:] = False
    mask[3, 4:] = False
    logprobs = -torch.rand(4, 5, generator=g, dtype=torch.float64) * 4  # rare (-4) to confident (~0) tokens
    behavior = logprobs + 0.4 * torch.randn(4, 5, generator=g, dtype=torch.float64)
    logprobs[~mask], behavior[1, 3] = -math.inf, math.nan  # padding may hold anything
    advantages = torch.tensor([1.5, -1.2, 0.4, -0.7], dtype=torch.float64)
    return logprobs, behavior, advantages, mask


@pytest.mark.parametrize(("preset", "eta", "clip"), [("dg", 1.0, None), ("dg", 0.3, None), ("rec-oneside-is", 2, 0.2)])
def test_dg_loss_and_gradient_equal_the_reference(preset, eta, clip):
    logprobs, behavior, advantages, mask = tensors()
    current = logprobs.clone().requires_grad_()
    params = LossParams.of(resolve_preset(preset, delight_temperature=eta))
    loss, metrics = policy_loss(current, behavior, advantages, mask, params)
    loss.backward()
    as_lists = [logprobs.tolist(), behavior.tolist(), advantages.tolist(), mask.tolist()]
    expected, grad = dg_reference(*as_lists, eta, clip)
    assert float(loss) == pytest.approx(expected, rel=1e-12)
    torch.testing.assert_close(current.grad, torch.tensor(grad, dtype=torch.float64), rtol=1e-12, atol=1e-15)
    chi = [advantages[b].item() * -logprobs[b, t].item() for b in range(4) for t in range(5) if mask[b, t]]
    assert float(metrics["delight_mean"]) == pytest.approx(sum(chi) / len(chi))
    assert float(metrics["delight_gate_mean"]) == pytest.approx(sum(sigmoid(c / eta) for c in chi) / len(chi))


def test_dg_gate_limits():
    """A rare token of a good response keeps nearly its whole term, a rare one of a bad response nearly none; a
    very large η gives every token ½ (half of REINFORCE's gradient); off (None) is REINFORCE."""
    logprobs = torch.tensor([[-8.0, -1e-4], [-8.0, -1e-4]], requires_grad=True)
    behavior, mask, advantages = logprobs.detach().clone(), torch.ones(2, 2), torch.tensor([1.0, -1.0])
    params = LossParams.of(resolve_preset("dg"))
    policy_loss(logprobs, behavior, advantages, mask, params)[0].backward()
    gates = (logprobs.grad / -advantages[:, None] * 4).abs()  # the token mean divides by 4 tokens
    assert gates[0, 0] > 0.999 and gates[1, 0] < 0.001 and gates[:, 1].sub(0.5).abs().max() < 1e-3
    for eta, scale in ((1e9, 0.5), (None, 1.0)):
        current = logprobs.detach().clone().requires_grad_()
        reinforce = LossParams.of(resolve_preset("reinforce", delight_temperature=eta))
        policy_loss(current, behavior, advantages, mask, reinforce)[0].backward()
        torch.testing.assert_close(current.grad, -scale * advantages[:, None].expand(2, 2) / 4)


def quantile(values, q):
    """Linear interpolation between the two order statistics around q·(n − 1)."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def kondo_reference(advantages, logprobs, mask, window, rate, eta, size, draws):
    chi = []
    for a, row, valid in zip(advantages, logprobs, mask, strict=True):
        tokens = [-lp for lp, m in zip(row, valid, strict=True) if m]
        chi.append(a * sum(tokens) / len(tokens) if tokens else 0.0)
    window = (list(window) + chi)[-size:]
    price = quantile(window, 1 - rate)
    passed = [u < sigmoid((c - price) / eta) for c, u in zip(chi, draws, strict=True)]
    return [a if p else 0.0 for a, p in zip(advantages, passed, strict=True)], passed, window, price


KONDO_CASES = [(0.5, 1.0, 1024, 0), (0.2, 0.1, 1024, 7), (1.0, 1.0, 3, 4), (0.5, 2.0, 10, 20)]
"""(ρ, η, window size, earlier delights in the window): an empty start, a short and a full window, ρ = 1."""


@pytest.mark.parametrize(("rate", "eta", "size", "history"), KONDO_CASES)
def test_kondo_gate_equals_the_reference(rate, eta, size, history):
    g = torch.Generator().manual_seed(history)
    n, width = 8, 6
    logprobs = -torch.rand(n, width, generator=g, dtype=torch.float64) * 3
    mask = torch.rand(n, width, generator=g) < 0.8
    mask[5] = False  # a response without loss tokens: χ = 0
    advantages = torch.randn(n, generator=g, dtype=torch.float64)
    window = torch.randn(history, generator=g, dtype=torch.float64)
    gate = kondo_gate(advantages, logprobs, mask, window, rate=rate, temperature=eta, window_size=size,
                      generator=torch.Generator().manual_seed(1))  # fmt: skip
    draws = torch.rand(n, generator=torch.Generator().manual_seed(1)).tolist()  # the same stream, in row order
    lists = (advantages.tolist(), logprobs.tolist(), mask.tolist(), window.tolist())
    advantages_ref, passed, window_ref, price = kondo_reference(*lists, rate, eta, size, draws)
    assert gate.passed.tolist() == passed
    assert gate.advantages.tolist() == pytest.approx(advantages_ref)
    assert gate.window.tolist() == pytest.approx(window_ref) and len(window_ref) == min(size, history + n)
    assert float(gate.metrics["price"]) == pytest.approx(price)
    assert float(gate.metrics["pass_frac"]) == sum(passed) / n


def test_kondo_gate_is_seeded_and_targets_its_rate():
    """Same generator seed, same decisions; another seed, others. Over a long window the share passed is near ρ at a
    small η (the gate is then close to the deterministic top-ρ), and ½-ish at a large one."""
    g = torch.Generator().manual_seed(0)
    advantages, logprobs = torch.randn(4000, generator=g), -torch.rand(4000, 3, generator=g) * 3
    mask = torch.ones(4000, 3, dtype=torch.bool)

    def run(seed, rate=0.25, eta=0.01):
        return kondo_gate(advantages, logprobs, mask, torch.zeros(0), rate=rate, temperature=eta, window_size=4000,
                          generator=torch.Generator().manual_seed(seed))  # fmt: skip

    assert torch.equal(run(3).passed, run(3).passed) and not torch.equal(run(3).passed, run(4).passed)
    assert float(run(3).metrics["pass_frac"]) == pytest.approx(0.25, abs=0.01)
    assert float(run(3, eta=100.0).metrics["pass_frac"]) == pytest.approx(0.5, abs=0.03)
    assert float(kondo_price(torch.zeros(0), 0.5)) == 0.0


def test_the_presets_and_where_they_run():
    assert resolve_preset("dg") == {**PRESETS["reinforce"], "std_normalize": True, "delight_temperature": 1.0}
    assert resolve_preset("dg-kondo") == {**resolve_preset("dg"), "kondo_rate": 0.5}
    assert (PRESETS["dg-kondo"]["kondo_temperature"], PRESETS["dg-kondo"]["kondo_window"]) == (1.0, 1024)
    assert trainer_only(resolve_preset("dg")) == []  # a loss option: TRL and verl run it through oprl's loss
    assert trainer_only(resolve_preset("dg-kondo")) == ["kondo_rate=0.5"]


@pytest.mark.parametrize(
    ("overrides", "key", "message"),
    [
        ({"delight_temperature": 0.0}, "delight_temperature", "must be > 0"),
        ({"objective": "advantage-regression"}, "delight_temperature", "objective=advantage-regression has none"),
        ({"kondo_rate": 0.0}, "kondo_rate", r"in \(0, 1\]"),
        ({"kondo_rate": 1.5}, "kondo_rate", r"in \(0, 1\]"),
        ({"kondo_rate": 0.5, "regularizer": "forward-kl", "regularizer_coef": 0.1}, "kondo_rate", "use one of them"),
        ({"kondo_window": 0}, "kondo_window", "integer >= 1"),
        ({"kondo_window": 2.5}, "kondo_window", "integer >= 1"),
        ({"kondo_temperature": -1.0}, "kondo_temperature", "must be > 0"),
    ],
)
def test_bad_settings_name_the_key(overrides, key, message):
    with pytest.raises(SettingError, match=message) as error:
        resolve_preset("dg", **overrides)
    assert error.value.key == key


@pytest.mark.parametrize("preset", ["dg", "dg-kondo"])
def test_the_presets_train_two_steps_repeatably(preset):
    """Through the real ``Trainer`` on the tiny model: the weights move, the rules log, the Kondo gate's window carries
    over to the next step, and a second trainer with the same seed gives the same metrics (its draws are seeded)."""
    from trainer_helpers import make_batch, make_trainer

    runs = []
    for _ in range(2):
        trainer, tokenizer = make_trainer(preset)
        before = copy.deepcopy(trainer.model.state_dict())
        rows = [trainer.step(make_batch(tokenizer, seed=seed)) for seed in range(2)]
        assert any(not torch.equal(p, before[n]) for n, p in trainer.model.state_dict().items())
        runs.append([{k: v for k, v in row.items() if not k.startswith("perf/")} for row in rows])
    assert runs[0] == runs[1]
    for row in runs[0]:
        assert all(math.isfinite(value) for value in row.values())
        assert 0 < row["loss/delight_gate_mean"] < 1
    if preset == "dg-kondo":
        assert len(trainer.carry.kondo_window) == 24  # two batches of 12 responses, inside the 1024 window
        assert all(0 <= row["kondo/pass_frac"] <= 1 for row in runs[0])
        assert any(0 < row["kondo/pass_frac"] < 1 for row in runs[0])
    else:
        assert not any(key.startswith("kondo/") for key in runs[0][0])


def test_dg_kondo_trains_through_the_config(small_overrides, tmp_path):
    """``oprl train algorithm.preset=dg-kondo algorithm.kondo_window=16``: config -> trainer, two steps."""
    from oprl.cli import main
    from oprl.metrics import read_metrics

    args = [*small_overrides, "steps=2", "eval.interval=0", "tensorboard=false", "run_name=dgk"]
    assert main(["train", *args, "algorithm.preset=dg-kondo", "algorithm.kondo_window=16"]) == 0
    rows = [r for r in read_metrics(tmp_path / "runs" / "dgk" / "metrics.jsonl") if "loss/total" in r]
    assert [r["step"] for r in rows] == [1, 2] and all(math.isfinite(r["loss/total"]) for r in rows)
    assert all(0 <= r["kondo/pass_frac"] <= 1 and 0 < r["loss/delight_gate_mean"] < 1 for r in rows)


def test_a_bad_kondo_setting_is_one_line_and_a_non_zero_exit(small_overrides, capsys):
    from oprl.cli import main

    assert main(["train", *small_overrides, "algorithm.preset=dg-kondo", "algorithm.kondo_rate=2"])
    err = capsys.readouterr().err
    assert "algorithm.kondo_rate" in err and "(0, 1]" in err and "Traceback" not in err


def test_a_resumed_dg_kondo_run_gates_as_the_undisturbed_one(small_overrides, tmp_path):
    """The Kondo gate's window lives in the checkpoint (``trainer/carry.safetensors``): 3 steps straight equal 2
    steps, then ``resume=true steps=3`` (with an empty window after the resume, step 3's price and draws differ)."""
    from oprl.cli import main
    from oprl.metrics import deterministic_view, read_metrics

    args = [*small_overrides, "eval.interval=0", "tensorboard=false", "algorithm.preset=dg-kondo",
            "algorithm.kondo_window=64", "algorithm.kondo_rate=0.1", "checkpoint.interval=1"]  # fmt: skip
    assert main(["train", *args, "steps=3", "run_name=straight"]) == 0
    assert main(["train", *args, "steps=2", "run_name=split"]) == 0
    checkpoints = sorted((tmp_path / "runs" / "split" / "checkpoints").glob("step-*"))
    assert (checkpoints[-1] / "trainer" / "carry.safetensors").is_file()
    assert main(["train", *args, "steps=3", "run_name=split", "resume=true"]) == 0

    def trained(name):  # the training rows' numbers (the split run also evaluates where its first part ends)
        rows = deterministic_view(read_metrics(tmp_path / "runs" / name / "metrics.jsonl"))
        return [{k: v for k, v in r.items() if not k.startswith("eval/")} for r in rows if "kondo/price" in r]

    straight = trained("straight")
    assert len(straight) == 3 and trained("split") == straight


def test_a_carry_of_unknown_tensors_is_one_line(tmp_path):
    from oprl.algorithms.step import Carry
    from oprl.checkpoint.files import load_carry, save_carry
    from oprl.errors import OprlError

    window = torch.tensor([0.1, 0.2])
    save_carry(tmp_path, Carry(kondo_window=window).tensors())
    assert torch.equal(load_carry(tmp_path, Carry.of).kondo_window, window)
    assert load_carry(tmp_path / "none", Carry.of) == Carry() and Carry().tensors() == {}
    save_carry(tmp_path, {"other": window})
    with pytest.raises(OprlError, match=r"carry\.safetensors: ValueError: unknown tensor\(s\) \['other'\]"):
        load_carry(tmp_path, Carry.of)
