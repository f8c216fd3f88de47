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
from dataclasses import dataclass
from typing import Sequence

from oprl.errors import OprlError
from oprl.tasks.base import Problem, Reward

_INTEGER = re.compile(r"-?\d+")


@dataclass
class ArithmeticTask:
    """Seeded arithmetic problems; reward 1 for the exact integer answer, else 0."""

    train_size: int = 2500
    test_size: int = 500
    max_value: int = 9
    num_operands: int = 3
    operators: str = "+-"
    seed: int = 1234
    name: str = "arithmetic"

    def __post_init__(self) -> None:
        if self.train_size < 1 or self.test_size < 1:
            raise OprlError(
                f"task: empty dataset (train_size={self.train_size}, test_size={self.test_size}); both must be >= 1"
            )
        if self.num_operands < 2 or self.max_value < 1:
            raise OprlError("task: need num_operands >= 2 and max_value >= 1")
        bad = set(self.operators) - set("+-*")
        if not self.operators or bad:
            raise OprlError(f"task.operators: {self.operators!r} must be a non-empty string of '+', '-', '*'")
        space = (self.max_value + 1) ** self.num_operands * len(self.operators) ** (self.num_operands - 1)
        if self.train_size + self.test_size > 0.8 * space:
            raise OprlError(
                f"task: train_size + test_size = {self.train_size + self.test_size} is too large for "
                f"max_value={self.max_value}, num_operands={self.num_operands} ({space} distinct expressions); "
                "raise max_value or num_operands"
            )
        self._splits = self._generate()

    def _generate(self) -> dict[str, list[Problem]]:
        rng = random.Random(self.seed)
        seen: set[str] = set()
        splits: dict[str, list[Problem]] = {"test": [], "train": []}
        # Test first so its content does not depend on train_size: growing the train set never moves a
        # problem between splits.
        for split, size in (("test", self.test_size), ("train", self.train_size)):
            while len(splits[split]) < size:
                expression = self._sample_expression(rng)
                if expression in seen:
                    continue
                seen.add(expression)
                index = len(splits[split])
                splits[split].append(
                    Problem(
                        task_id=f"{self.name}/{split}/{index:06d}",
                        messages=({"role": "user", "content": expression + "="},),
                        answer=str(_evaluate(expression)),
                    )
                )
        return splits

    def _sample_expression(self, rng: random.Random) -> str:
        parts = [str(rng.randint(0, self.max_value))]
        for _ in range(self.num_operands - 1):
            parts.append(rng.choice(self.operators))
            parts.append(str(rng.randint(0, self.max_value)))
        return "".join(parts)

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
    correct = well_formed and int(text) == int(answer)
    return Reward(total=float(correct), components={"correct": float(correct), "format": float(well_formed)})


def _evaluate(expression: str) -> int:
    """Exact integer value of ``expression`` (digits and + - * only, usual precedence), without ``eval``."""
    tokens = re.findall(r"\d+|[+\-*]", expression)
    terms: list[int] = [int(tokens[0])]
    signs: list[int] = [1]
    for op, number in zip(tokens[1::2], tokens[2::2]):
        if op == "*":
            terms[-1] *= int(number)
        else:
            terms.append(int(number))
            signs.append(1 if op == "+" else -1)
    return sum(s * t for s, t in zip(signs, terms))
