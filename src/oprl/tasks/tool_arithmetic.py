"""Arithmetic with a calculator tool: the procedural multi-turn task the embedded tiny model learns in minutes.

The problems (``37*48+5=``) are out of reach of a 0.34 M-parameter model's mental arithmetic, but a
calculator solves them; the model must call it, read the result, and state it. An episode, in the compact
format the character-level tiny model can afford (about 40 tokens in all)::

    user       37*48+5=
    assistant  [37*48+5]          a calculator call: the expression in square brackets
    tool       1781               the environment's answer (the chat template's ``tool`` turn)
    assistant  1781               the final answer: an integer, ending the episode

A call is ``[`` expression ``]`` with digits and ``+ - *`` only (at most ``MAX_EXPRESSION_CHARS``), evaluated
exactly without ``eval``; anything else in square brackets gets the observation ``error``. Any other reply
ends the episode. Reward: 1 when the final reply is the problem's value, else 0; components ``correct``,
``format`` (the episode called the calculator, then answered with an integer) and ``tool_calls``. An
episode that runs out of turns or tokens is truncated and scores 0 (``rollout.max_turns``,
``rollout.max_episode_tokens``). This is the tool-call pattern of ``oprl.tasks.bfcl.toolcall`` in miniature: real
models use ``<tool_call>{json}</tool_call>`` (``task.name=bfcl``), the tiny model a two-character call.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from oprl.errors import OprlError
from oprl.tasks.arithmetic import _evaluate, equals_integer, expression_task_splits
from oprl.tasks.base import Problem, Reward, Step
from oprl.tasks.section import ExpressionTaskSection, task_section

MAX_EXPRESSION_CHARS = 40
_CALL = re.compile(rf"\[([0-9+\-*]{{1,{MAX_EXPRESSION_CHARS}}})\]")
_INTEGER = re.compile(r"-?\d+")
_EXPRESSION = re.compile(r"\d+(?:[+\-*]\d+)*")


class CalculatorEnvironment:
    """One episode: answers ``[expression]`` calls with the value, ends at the first other reply."""

    def __init__(self, problem: Problem):
        self.problem = problem
        self.calls = 0

    def reset(self, problem: Problem) -> tuple[dict, ...]:
        self.problem, self.calls = problem, 0
        return problem.messages

    def step(self, reply: str) -> Step:
        text = reply.strip()
        if text.startswith("["):
            self.calls += 1
            call = _CALL.fullmatch(text)
            expression = call.group(1) if call is not None else ""
            answer = str(_evaluate(expression)) if _EXPRESSION.fullmatch(expression) else "error"
            return Step(observation=({"role": "tool", "content": answer},))
        return Step(done=True, reward=self.final_reward(text))

    def final_reward(self, text: str) -> Reward:
        well_formed = _INTEGER.fullmatch(text) is not None
        correct = well_formed and equals_integer(text, self.problem.answer)
        return Reward(
            total=float(correct),
            components={
                "correct": float(correct),
                "format": float(well_formed and self.calls > 0),
                "tool_calls": float(self.calls),
            },
        )


class ToolArithmeticTaskConfig(ExpressionTaskSection):
    """Arithmetic through a calculator tool, multi-turn (call, tool answer, final answer): the embedded tiny
    model's agent task (oprl.tasks.tool_arithmetic documents the compact format)."""

    name: Literal["tool-arithmetic"] = "tool-arithmetic"
    max_value: int = Field(99, gt=0)
    num_operands: int = Field(2, ge=2)
    operators: str = "+-*"
    min_value: int = Field(10, ge=0)
    """Smallest operand (two-digit operands by default: beyond the tiny model's mental arithmetic)."""


class ToolArithmeticTask:
    """Seeded ``a*b+c``-style problems solved through a calculator, built from a ``ToolArithmeticTaskConfig``."""

    Config = ToolArithmeticTaskConfig

    def __init__(self, config: ToolArithmeticTaskConfig | None = None, **fields) -> None:
        self.config = c = task_section(ToolArithmeticTaskConfig, config, fields)
        self.name = c.name
        self._splits = expression_task_splits(c, low=c.min_value, max_share=0.5)

    def problems(self, split: str) -> Sequence[Problem]:
        if split not in self._splits:
            raise OprlError(f"task {self.name}: unknown split {split!r}; valid: {sorted(self._splits)}")
        return self._splits[split]

    def environment(self, problem: Problem) -> CalculatorEnvironment:
        return CalculatorEnvironment(problem)

    def demonstration(self, problem: Problem) -> list[str]:
        """Call the calculator on the whole expression, then state its answer."""
        return [f"[{problem.messages[-1]['content'].rstrip('=')}]", problem.answer]

    def score(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[Reward]:
        """Single-reply scoring (no calculator): the final-answer reward of an episode without calls."""
        return [CalculatorEnvironment(p).final_reward(r.strip()) for p, r in zip(problems, responses, strict=True)]
