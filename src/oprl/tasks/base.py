"""The Task protocol: what every task plug-in (arithmetic, GSM8k, MATH, ...) provides.

A task hands out problems (chat messages plus a reference answer) from named splits and scores a model's
response with a reward made of named components. It knows nothing about models, tokenizers or training.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Problem:
    """One prompt with its reference answer."""

    task_id: str
    """Stable identifier, unique within the task (e.g. ``arithmetic/train/000123``)."""
    messages: tuple[dict, ...]
    """Chat messages (``{"role": ..., "content": ...}``) rendered with the tokenizer's chat template."""
    answer: str
    """Reference answer, compared by the task's reward function."""
    tools: tuple[dict, ...] = ()
    """Tools the model may call (OpenAI-style function schemas), rendered by ``oprl.models.chat``; none for
    plain question-answer tasks."""


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


@dataclass(frozen=True)
class Step:
    """What an environment answers to one model turn."""

    observation: tuple[dict, ...] = ()
    """Messages appended to the conversation (``{"role": "tool" | "user", "content": ...}``) before the model's
    next turn; rendered by the chat template, never trained on. Empty when ``done``."""
    done: bool = False
    """The episode is over: ``reward`` is final."""
    reward: Reward | None = None
    """The episode's reward, given when ``done`` (None before)."""


@runtime_checkable
class Environment(Protocol):
    """One episode of a multi-turn task: the conversation's other side (tools, simulated APIs, a user).

    ``reset`` gives the first messages (the prompt); each model turn (its decoded text) goes to ``step``,
    which answers with observation messages, or ends the episode with its reward. An environment holds the
    state of one episode only; the explorer makes one per episode (``EpisodicTask.environment``).
    """

    def reset(self, problem: Problem) -> tuple[dict, ...]:
        """The messages the model sees first (usually ``problem.messages``)."""
        ...

    def step(self, reply: str) -> Step:
        """React to the model's turn ``reply``: observation messages, or ``done`` with the reward."""
        ...


@runtime_checkable
class EpisodicTask(Task, Protocol):
    """A task whose problems are multi-turn episodes: the explorer runs them through ``environment``.

    ``score`` is not used by the runtime for such tasks (the environment rewards); ``demonstration`` gives
    reference model turns for supervised warm starts (the tiny model's), or None when the task has none.
    """

    def environment(self, problem: Problem) -> Environment:
        """A fresh environment for one episode of ``problem``."""
        ...

    def demonstration(self, problem: Problem) -> list[str] | None:
        """Reference model turns of a successful episode (in order), or None."""
        ...
