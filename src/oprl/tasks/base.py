"""The Task protocol: what every task plug-in (arithmetic, GSM8k, MATH, ...) provides.

A task hands out problems (chat messages plus a reference answer) from named splits and scores a model's
response with a reward made of named components. It knows nothing about models, tokenizers or training.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable


@dataclass(frozen=True)
class Problem:
    """One prompt with its reference answer."""

    task_id: str
    """Stable identifier, unique within the task (e.g. ``arithmetic/train/000123``)."""
    messages: tuple[dict, ...]
    """Chat messages (``{"role": ..., "content": ...}``) rendered with the tokenizer's chat template."""
    answer: str
    """Reference answer, compared by the task's reward function."""


@dataclass(frozen=True)
class Reward:
    """A scalar reward and the named components it was summed from."""

    total: float
    components: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class Task(Protocol):
    """A source of problems and a verifier of responses."""

    name: str

    def problems(self, split: str) -> Sequence[Problem]:
        """All problems of ``split`` ("train" or "test"), in a fixed order."""
        ...

    def score(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[Reward]:
        """Rewards for ``responses[i]`` answering ``problems[i]``."""
        ...
