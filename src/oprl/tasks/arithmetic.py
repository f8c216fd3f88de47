"""Procedurally generated integer arithmetic: the embedded default task.

Problems look like ``"37+58-12="`` and the expected response is the exact integer result (``"83"``).
Generation is seeded, the train and test splits are disjoint by construction (an expression lands in
exactly one split), and checking is exact integer comparison, so rewards carry no verifier noise.

Difficulty knobs: ``max_value`` (operands are drawn from 0..max_value), ``num_operands`` and ``operators``.
Deliberately not here: word problems (see the GSM8k-style generator) or anything needing a parser.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Literal

from oprl.errors import OprlError
from oprl.tasks.base import Problem, Reward
from oprl.tasks.section import ExpressionTaskSection, task_section

_INTEGER = re.compile(r"-?\d+")
MAX_ANSWER_DIGITS = 100
"""A reply with more digits than this is an integer but wrong, without ``int()``: no reference is that long,
and ``int()`` raises past Python's 4,300-digit limit (a model can emit a 20,000-digit reply)."""


class ArithmeticTaskConfig(ExpressionTaskSection):
    """Procedurally generated integer arithmetic (``"37+58-12="`` -> ``83``): the embedded default task."""

    name: Literal["arithmetic"] = "arithmetic"


class ArithmeticTask:
    """Seeded arithmetic problems; reward 1 for the exact integer answer, else 0.

    Built from its section, ``ArithmeticTask(ArithmeticTaskConfig(...))``, or from that section's fields as
    keywords, ``ArithmeticTask(train_size=100)``.
    """

    Config = ArithmeticTaskConfig

    def __init__(self, config: ArithmeticTaskConfig | None = None, **fields) -> None:
        self.config = c = task_section(ArithmeticTaskConfig, config, fields)
        self.name = c.name
        self._splits = expression_task_splits(c, low=0, max_share=0.8)

    def problems(self, split: str) -> Sequence[Problem]:
        if split not in self._splits:
            raise OprlError(f"task {self.name}: unknown split {split!r}; valid: {sorted(self._splits)}")
        return self._splits[split]

    def score(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[Reward]:
        return [score_integer_answer(p.answer, r) for p, r in zip(problems, responses, strict=True)]


def score_integer_answer(answer: str, response: str) -> Reward:
    """Reward 1.0 iff the whole response (stripped) is the reference integer; ``format`` = it is an integer."""
    text = response.strip()
    well_formed = _INTEGER.fullmatch(text) is not None
    correct = well_formed and equals_integer(text, answer)
    return Reward(total=float(correct), components={"correct": float(correct), "format": float(well_formed)})


def equals_integer(text: str, answer: str) -> bool:
    """``int(text) == int(answer)`` for an integer ``text`` of at most ``MAX_ANSWER_DIGITS`` digits, else False."""
    return len(text) <= MAX_ANSWER_DIGITS + 1 and int(text) == int(answer)


def _evaluate(expression: str) -> int:
    """Exact integer value of ``expression`` (digits and + - * only, usual precedence), without ``eval``."""
    tokens = re.findall(r"\d+|[+\-*]", expression)
    terms: list[int] = [int(tokens[0])]
    signs: list[int] = [1]
    for op, number in zip(tokens[1::2], tokens[2::2], strict=True):
        if op == "*":
            terms[-1] *= int(number)
        else:
            terms.append(int(number))
            signs.append(1 if op == "+" else -1)
    return sum(s * t for s, t in zip(signs, terms, strict=True))


def expression_task_splits(c, *, low: int, max_share: float) -> dict[str, list[Problem]]:
    """The splits of an expression task's section ``c`` (name, operators, num_operands, max_value, train_size,
    test_size, seed), operands drawn from [low, max_value]: ``expression_splits`` after checking the section.
    The two splits may take at most ``max_share`` of the S = (max_value - low + 1)^n * |operators|^(n-1)
    distinct expressions of n operands: drawing distinct expressions from a nearly exhausted space would
    reject almost every draw."""
    bad = set(c.operators) - set("+-*")
    if not c.operators or bad:
        raise OprlError(f"task.operators: {c.operators!r} must be a non-empty string of '+', '-', '*'")
    n, wanted = c.num_operands, c.train_size + c.test_size
    space = (c.max_value - low + 1) ** n * len(c.operators) ** (n - 1)
    if wanted > max_share * space:
        raise OprlError(
            f"task: train_size + test_size = {wanted} is too large for operands {low}..{c.max_value}, "
            f"num_operands={n} ({space} distinct expressions); raise max_value or num_operands"
        )
    return expression_splits(
        c.name,
        random.Random(c.seed),
        test_size=c.test_size,
        train_size=c.train_size,
        low=low,
        high=c.max_value,
        operators=c.operators,
        num_operands=n,
    )


def expression_splits(
    name: str,
    rng: random.Random,
    *,
    test_size: int,
    train_size: int,
    low: int,
    high: int,
    operators: str,
    num_operands: int,
) -> dict[str, list[Problem]]:
    """Distinct expressions of ``num_operands`` integers in [low, high] joined by ``operators``, drawn from
    ``rng`` into a test and a train split (no expression in both). Test first, so its content does not depend
    on train_size: growing the train set never moves a problem between splits."""
    seen: set[str] = set()
    splits: dict[str, list[Problem]] = {"test": [], "train": []}
    for split, size in (("test", test_size), ("train", train_size)):
        while len(splits[split]) < size:
            parts = [str(rng.randint(low, high))]
            for _ in range(num_operands - 1):
                parts += [rng.choice(operators), str(rng.randint(low, high))]
            expression = "".join(parts)
            if expression in seen:
                continue
            seen.add(expression)
            splits[split].append(
                Problem(
                    task_id=f"{name}/{split}/{len(splits[split]):06d}",
                    messages=({"role": "user", "content": expression + "="},),
                    answer=str(_evaluate(expression)),
                )
            )
    return splits
