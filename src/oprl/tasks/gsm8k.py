"""GSM8k with the paper's reward (docs/paper.md#reward): grade-school word problems, answer after ``####``.

Problems come from the hub (``openai/gsm8k`` through ``datasets``), from local JSONL / JSON / parquet files
with ``question`` and ``answer`` fields (``task.train_file`` / ``task.test_file`` or a directory
``task.path``), or from the seeded GSM8k-format generator (``task.source=synthetic``, offline). Whatever the
source, rows go through the same conversion: the reference is the number after the last ``####`` of the
answer field; rows without one (or without a question) are skipped, counted in ``skipped`` and reported in
one warning naming the file and row numbers. A split left with no usable row is an ``OprlError``.

Each prompt is the DeepSeek-R1 system message plus the question; the reward is ``oprl.tasks.rewards.builtin``'s R1
reward, checked by math-verify in reward processes with a hard timeout. ``reward="last-number"`` swaps in
a plain prompt and the last-number reward, for models too small to follow the R1 format.

Run offline: ``oprl train task.name=gsm8k task.source=synthetic model.path=smollm2-135m-instruct ...``
(see ``configs/examples/smollm2-arithmetic-cpu.yaml``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from oprl.tasks.base import Problem, Reward
from oprl.tasks.data.files import Row
from oprl.tasks.data.verified import VerifiedDataTask
from oprl.tasks.rewards.builtin import (
    NUMBER_SYSTEM_PROMPT,
    R1_SYSTEM_PROMPT,
    gsm8k_reference,
    last_number_rewards,
    r1_rewards,
)
from oprl.tasks.rewards.verify import require_math_verify
from oprl.tasks.section import ReasoningTaskSection, task_section
from oprl.tasks.word_problems import generate_rows

SYNTHETIC_SIZES = {"train": 2000, "test": 500}
SYSTEM_PROMPTS = {"r1": R1_SYSTEM_PROMPT, "last-number": NUMBER_SYSTEM_PROMPT}


class GSM8kTaskConfig(ReasoningTaskSection):
    """GSM8k (Cobbe et al. 2021, arXiv 2110.14168) with the paper's reward: math-verify accuracy of the
    ``<answer>`` content plus +-format_bonus for the ``<think>...</think> <answer>...</answer>`` form, under
    the DeepSeek-R1 system prompt (docs/paper.md#reward)."""

    name: Literal["gsm8k"] = "gsm8k"
    source: Literal["auto", "hub", "files", "synthetic"] = "auto"
    """Where problems come from: ``hub`` (openai/gsm8k through ``datasets``; needs the network or the HF
    cache), ``files`` (task.train_file / task.test_file, or task.path; rows with question/answer fields),
    ``synthetic`` (seeded GSM8k-format word problems, offline), ``auto`` = files when any file is set, else hub."""
    hub_id: str = "openai/gsm8k"
    hub_config: str | None = "main"
    question_field: str = "question"
    """Row field holding the question."""
    answer_field: str = "answer"
    """Row field holding the worked answer; the reference is the number after its last ``####``."""
    reward: Literal["r1", "last-number"] = "r1"
    """``r1`` = the paper's reward under the DeepSeek-R1 system prompt; ``last-number`` = the same shape for
    models too small to follow the R1 format (SmolLM2-135M never does): correct when the response's last
    number is the reference, and the format term rewards ending the response with a number."""
    format_bonus: float = Field(0.1, ge=0.0)
    """+format_bonus when the response has the reward's format, -format_bonus otherwise (paper: 0.1)."""
    synthetic_min_steps: int = Field(2, gt=0)
    """source=synthetic: fewest changes to the count after the opening sentence."""
    synthetic_max_steps: int = Field(3, gt=0)
    """source=synthetic: most changes to the count (1 = easy one-step problems)."""
    synthetic_max_value: int = Field(20, ge=2)
    """source=synthetic: largest number drawn for a quantity."""
    synthetic_operations: str = "+-*/"
    """source=synthetic: kinds of change to draw from: + (buy more), - (give away), * (k times as many, and
    the "packs of" opening), / (split into equal piles); must contain + or *."""
    seed: int = 1234
    """source=synthetic: seed of problem generation; fixes both splits."""


class GSM8kTask(VerifiedDataTask):
    """GSM8k problems and the R1 reward, built from a ``GSM8kTaskConfig`` (or its fields as keywords)."""

    Config = GSM8kTaskConfig

    def __init__(self, config: GSM8kTaskConfig | None = None, **fields) -> None:
        self.config = c = task_section(GSM8kTaskConfig, config, fields)
        self.name = c.name
        self.skipped: dict[str, dict[int, str]] = {}
        """Per split, the skipped row numbers and why (also reported as one warning per split)."""
        if c.reward == "r1":
            require_math_verify(self.name)
        if c.source == "synthetic":
            self._splits = self._synthetic()
        else:
            self._splits = {split: self._load(split) for split in ("train", "test")}
        self._pool = None

    def _problem(self, split: str, row: Row) -> tuple[Problem | None, str | None]:
        c = self.config

        def messages(question: str) -> tuple[dict[str, str], ...]:
            return (
                {"role": "system", "content": c.system_prompt or SYSTEM_PROMPTS[c.reward]},
                {"role": "user", "content": question.strip()},
            )

        return self._row_problem(split, row, c.question_field, gsm8k_reference, "no number after '####'", messages)

    def _synthetic(self) -> dict[str, list[Problem]]:
        """Generated splits, test first and train excluding every test question: disjoint, and the test
        split does not depend on the train size."""
        c = self.config
        seen: set[str] = set()
        splits = {}
        for offset, split in enumerate(("test", "train")):
            limit = c.train_size if split == "train" else c.test_size
            rows = generate_rows(
                limit or SYNTHETIC_SIZES[split],
                seed=c.seed * 2 + offset,
                min_steps=c.synthetic_min_steps,
                max_steps=c.synthetic_max_steps,
                max_value=c.synthetic_max_value,
                operations=c.synthetic_operations,
                exclude=seen,
            )
            converted = [self._problem(split, Row(i, r))[0] for i, r in enumerate(rows, start=1)]
            splits[split] = [p for p in converted if p is not None]  # every generated row converts (tested)
            self.skipped[split] = {}
        return splits

    def score(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[Reward]:
        bonus = self.config.format_bonus
        if self.config.reward == "last-number":
            return last_number_rewards([p.answer for p in problems], responses, format_bonus=bonus)
        return r1_rewards(self.verifier, [p.answer for p in problems], responses, format_bonus=bonus)
