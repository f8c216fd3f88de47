"""The three-armed bandit of docs/paper.md#bandit: what off-policy data does to REINFORCE and its relatives.

Run: ``oprl bandit --steps 300 --lr 1.0 --samples 8 --seed 0 --out runs/bandit`` (those are the defaults).
It prints a table, and writes ``bandit.json`` and ``bandit.png`` (arm probabilities vs step) in ``--out``.

Setup. A softmax policy π_θ over 3 logits, initialised at the behaviour logits log π_b, so the first step
is on-policy and every later one is off-policy. Data always comes from the fixed behaviour policy
π_b = [0.3, 0.6, 0.1] with rewards r = [0, 0.8, 1] (the offline setting). A response is a single token
(the arm); its behaviour log-prob is log π_b(arm). Every method is a preset of ``oprl.algorithms``.

Two dynamics per method, both plain gradient descent on the logits with step ``--lr``:
- exact: descent on the expected loss E[loss] over a group of K = ``--samples`` arms drawn from π_b.
  All compositions of the group are enumerated with their multinomial probabilities (and, for RED-Drop,
  every outcome of the random drop with its hypergeometric probability); the expected loss is computed by
  the real ``policy_loss``, with each row's mask set to its probability / (kept group size).
- sampled: one group of K arms per step from a seeded ``torch.Generator``, through the real
  ``group_advantages`` and ``policy_loss``, then an SGD step on the autograd gradient.

Simplifications: one group (prompt) per step; responses are one token, so ``loss_agg`` is token-mean.
Not here: anything about language models; the trainer is not involved.
"""

import argparse
import itertools
import json
import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import torch

from oprl.algorithms import PRESETS, LossParams, advantage_settings, group_advantages, policy_loss

BEHAVIOR = (0.3, 0.6, 0.1)
"""π_b, the fixed behaviour policy that produces all data."""
REWARDS = (Fraction(0), Fraction(4, 5), Fraction(1))
"""r per arm, exact so the enumeration decides ties (r = group mean) without rounding."""
METHODS = ("reinforce", "rec-oneside-nois", "rec-oneside-is", "opmd", "asymre", "red-drop", "red-weight")
"""Presets compared; their settings come from ``oprl.algorithms.PRESETS`` unchanged."""


@dataclass(frozen=True)
class Rows:
    """A batch of single-token responses: the arm of each row, its group and its mask weight."""

    arms: torch.Tensor  # (R,) long
    group_ids: torch.Tensor  # (R,) long
    weights: torch.Tensor  # (R,) float64; 1 for sampled rows, probability / kept size for exact ones


@dataclass(frozen=True)
class Trajectory:
    """Logits and arm probabilities after each step (row 0 = the start)."""

    logits: torch.Tensor  # (S + 1, 3)
    probs: torch.Tensor  # (S + 1, 3)


def _method_loss(logits: torch.Tensor, rows: Rows, settings: dict, generator=None) -> torch.Tensor:
    """The method's loss on ``rows`` through the real ``group_advantages`` and ``policy_loss``."""
    logprobs = torch.log_softmax(logits, dim=-1)[rows.arms][:, None]  # (R, 1)
    behavior_logprobs = torch.tensor(BEHAVIOR, dtype=logits.dtype).log()[rows.arms][:, None]  # (R, 1)
    rewards = torch.tensor([float(r) for r in REWARDS], dtype=logits.dtype)[rows.arms]  # (R,)
    grouped = group_advantages(rewards, rows.group_ids, generator=generator, **advantage_settings(settings))
    mask = (rows.weights * grouped.keep)[:, None]  # (R, 1)
    params = LossParams.of(settings, loss_agg="token-mean")
    loss, _ = policy_loss(logprobs, behavior_logprobs, grouped.advantages, mask, params)
    return loss


def _multinomial_probability(counts: tuple[int, ...]) -> float:
    log_coef = math.lgamma(sum(counts) + 1) - sum(math.lgamma(n + 1) for n in counts)
    return math.exp(log_coef + sum(n * math.log(p) for n, p in zip(counts, BEHAVIOR, strict=True)))


def _balance_outcomes(counts: tuple[int, ...]) -> list[tuple[tuple[int, ...], float]]:
    """RED-Drop on a group with arm ``counts``: every possible kept composition and its probability."""
    mean = sum(n * r for n, r in zip(counts, REWARDS, strict=True)) / sum(counts)
    positive = [r >= mean for r in REWARDS]
    num_positive = sum(n for n, pos in zip(counts, positive, strict=True) if pos)
    negatives = [0 if pos else n for n, pos in zip(counts, positive, strict=True)]
    if sum(negatives) <= num_positive:
        return [(counts, 1.0)]
    # Keeping num_positive of the negatives uniformly at random: a multivariate hypergeometric draw.
    outcomes: list[tuple[tuple[int, ...], float]] = []
    for kept in itertools.product(*(range(n + 1) for n in negatives)):
        if sum(kept) == num_positive:
            ways = math.prod(math.comb(n, k) for n, k in zip(negatives, kept, strict=True))
            probability = ways / math.comb(sum(negatives), num_positive)
            kept_counts = tuple(n if pos else k for n, pos, k in zip(counts, positive, kept, strict=True))
            outcomes.append((kept_counts, probability))
    return outcomes


def exact_rows(group_size: int, drop: str | None) -> Rows:
    """Every composition (and drop outcome) of a group of ``group_size`` arms, weighted so Σ weights = 1."""
    arms: list[int] = []
    group_ids: list[int] = []
    weights: list[float] = []
    for n0, n1 in itertools.product(range(group_size + 1), repeat=2):
        if n0 + n1 > group_size:
            continue
        counts = (n0, n1, group_size - n0 - n1)
        outcomes = _balance_outcomes(counts) if drop == "balance" else [(counts, 1.0)]
        for kept_counts, drop_probability in outcomes:
            weight = _multinomial_probability(counts) * drop_probability / sum(kept_counts)
            group_id = group_ids[-1] + 1 if group_ids else 0
            for arm, n in enumerate(kept_counts):
                arms += [arm] * n
                group_ids += [group_id] * n
                weights += [weight] * n
    return Rows(torch.tensor(arms), torch.tensor(group_ids), torch.tensor(weights, dtype=torch.float64))


def _descend(loss_at, steps: int, lr: float) -> Trajectory:
    """Plain SGD on the logits from log π_b; ``loss_at(logits)`` gives the loss of one step."""
    logits = torch.tensor(BEHAVIOR, dtype=torch.float64).log().requires_grad_(True)
    history = [logits.detach().clone()]
    for _ in range(steps):
        (gradient,) = torch.autograd.grad(loss_at(logits), logits)
        with torch.no_grad():
            logits -= lr * gradient  # plain SGD (torch.optim would import torch._dynamo: seconds)
        history.append(logits.detach().clone())
    stacked = torch.stack(history)  # (S + 1, 3)
    return Trajectory(logits=stacked, probs=torch.softmax(stacked, dim=-1))


def expected_loss_fn(method: str, group_size: int):
    """``logits -> E[loss]`` of ``method`` over groups of ``group_size`` arms from π_b, exactly."""
    settings = PRESETS[method]
    rows = exact_rows(group_size, settings["drop"])
    # The drop is already enumerated in ``rows``; the advantages are then those of the kept set.
    settings = settings | {"drop": "none"}
    return lambda logits: _method_loss(logits, rows, settings)


def expected_gradient(method: str, logits: torch.Tensor, group_size: int) -> torch.Tensor:
    """∇ E[loss] (3,) of ``method`` at ``logits`` (3,); one descent step moves the logits by −lr times it."""
    logits = logits.detach().to(torch.float64).requires_grad_(True)
    return torch.autograd.grad(expected_loss_fn(method, group_size)(logits), logits)[0]


def run_exact(method: str, steps: int, lr: float, group_size: int) -> Trajectory:
    """Gradient descent on the exact expected loss of ``method`` under data from π_b."""
    return _descend(expected_loss_fn(method, group_size), steps, lr)


def run_sampled(method: str, steps: int, lr: float, group_size: int, seed: int) -> Trajectory:
    """SGD with one sampled group of ``group_size`` arms from π_b per step."""
    settings = PRESETS[method]
    generator = torch.Generator().manual_seed(seed)
    behavior = torch.tensor(BEHAVIOR, dtype=torch.float64)
    ones = torch.ones(group_size, dtype=torch.float64)
    zeros = torch.zeros(group_size, dtype=torch.long)

    def loss_at(logits):
        arms = torch.multinomial(behavior, group_size, replacement=True, generator=generator)  # (K,)
        return _method_loss(logits, Rows(arms, zeros, ones), settings, generator)

    return _descend(loss_at, steps, lr)


def summarize(trajectory: Trajectory) -> dict:
    """Final policy, its dominant arm, expected reward and the largest ratio π_θ/π_b seen on the way."""
    final = trajectory.probs[-1]
    behavior = torch.tensor(BEHAVIOR, dtype=final.dtype)
    rewards = torch.tensor([float(r) for r in REWARDS], dtype=final.dtype)
    return {
        "final_probs": [round(p, 4) for p in final.tolist()],
        "dominant_arm": int(final.argmax()),
        "expected_reward": round(float(final @ rewards), 4),
        "max_ratio": round(float((trajectory.probs / behavior).max()), 4),
    }


def run_all(steps: int, lr: float, group_size: int, seed: int) -> dict[str, dict[str, Trajectory]]:
    """Exact and sampled trajectories of every method in ``METHODS``."""
    return {
        method: {
            "exact": run_exact(method, steps, lr, group_size),
            "sampled": run_sampled(method, steps, lr, group_size, seed),
        }
        for method in METHODS
    }


def _print_table(results: dict[str, dict[str, Trajectory]]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="3-armed bandit, data from π_b = [0.3, 0.6, 0.1], r = [0, 0.8, 1]")
    for column in ("method", "dynamics", "π(a0) r=0", "π(a1) r=0.8", "π(a2) r=1", "dominant", "E_π[r]", "max ρ"):
        table.add_column(escape(column), no_wrap=True)
    for method, runs in results.items():
        for dynamics, trajectory in runs.items():
            row = summarize(trajectory)
            probs = [f"{p:.3f}" for p in row["final_probs"]]
            summary = (f"a{row['dominant_arm']}", f"{row['expected_reward']:.3f}", f"{row['max_ratio']:.2f}")
            table.add_row(method, dynamics, *probs, *summary)
    Console(width=max(Console().width, 110)).print(table)


def _plot(results: dict[str, dict[str, Trajectory]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 4
    rows = math.ceil(len(results) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4 * columns, 3 * rows), sharey=True, squeeze=False)
    for axis, (method, runs) in zip(axes.flat, results.items(), strict=False):  # the grid may have spare cells
        for arm, color in enumerate(("tab:red", "tab:blue", "tab:green")):
            label = f"a{arm} (r={float(REWARDS[arm]):g})"
            axis.plot(runs["exact"].probs[:, arm], color=color, label=f"{label} exact")
            axis.plot(runs["sampled"].probs[:, arm], color=color, linestyle="--", label=f"{label} sampled")
        axis.set_title(method)
        axis.set_xlabel("step")
    for axis in axes.flat[len(results) :]:
        axis.axis("off")
    axes[0, 0].set_ylabel("π_θ(arm)")
    axes[0, 0].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _report(results: dict[str, dict[str, Trajectory]], config: dict) -> dict:
    """The JSON document: the run's config, π_b, r, and per method both runs and its expected first step."""
    start = torch.tensor(BEHAVIOR, dtype=torch.float64).log()
    methods: dict[str, dict] = {}
    for method, runs in results.items():
        methods[method] = {name: summarize(run) | {"probs": run.probs.tolist()} for name, run in runs.items()}
        # E[Δθ]/lr at θ = log π_b; for reinforce it is (K−1)/K·π_b(a)(r_a − E_b[r]), the paper's vector.
        first_step = -expected_gradient(method, start, config["samples"])
        methods[method]["expected_logit_step_at_start"] = [round(x, 6) for x in first_step.tolist()]
    rewards = [float(r) for r in REWARDS]
    return {"config": config, "behavior": list(BEHAVIOR), "rewards": rewards, "methods": methods}


def main(argv: list[str] | None = None) -> int:
    """``oprl bandit``: run every method, print the table, write bandit.json and bandit.png."""
    parser = argparse.ArgumentParser(prog="oprl bandit", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="gradient steps per run")
    parser.add_argument("--lr", type=float, default=1.0, help="SGD step size on the logits")
    parser.add_argument("--samples", type=int, default=8, help="group size K: arms drawn from π_b per step")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampled runs")
    parser.add_argument("--out", type=Path, default=Path("runs/bandit"), help="output directory")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.samples < 1 or not args.lr > 0:
        parser.error("--steps and --samples must be >= 1 and --lr > 0")

    results = run_all(args.steps, args.lr, args.samples, args.seed)
    _print_table(results)
    args.out.mkdir(parents=True, exist_ok=True)
    report = _report(results, vars(args) | {"out": str(args.out)})
    (args.out / "bandit.json").write_text(json.dumps(report, indent=1))
    _plot(results, args.out / "bandit.png")
    print(f"wrote {args.out / 'bandit.json'} and {args.out / 'bandit.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
