"""MATH competition problems with the boxed-answer reward (the paper's Llama-3.1-8B-Instruct experiments).

Problems come from the hub (default ``DigitalLearningGmbH/MATH-lighteval``: 7,500 train / 5,000 test) or
local JSONL / JSON / parquet files with ``problem`` and ``solution`` fields. The reference answer is the
content of the solution's last ``\\boxed{...}`` (braces balanced); a single-line field without one is taken
whole, so MATH-500-style ``answer`` columns work with ``task.answer_field=answer``. Rows with neither are
skipped, counted in ``skipped`` and reported with their row numbers; an empty split is an ``OprlError``.

The prompt is the problem followed by ``task.instruction`` (ask for a boxed answer); there is no system
message unless ``task.system_prompt`` sets one. The reward is 1 when the response's last ``\\boxed{}``
matches the reference under math-verify (in reward processes, with a hard timeout), else 0.

Not here: MATH's level / subject metadata (kept out of the problem; filter the files to select them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from oprl.tasks.base import Problem, Reward
from oprl.tasks.data.files import Row
from oprl.tasks.data.verified import VerifiedDataTask
from oprl.tasks.rewards.builtin import boxed_rewards, last_boxed
from oprl.tasks.rewards.verify import require_math_verify
from oprl.tasks.section import ReasoningTaskSection, task_section


class MathTaskConfig(ReasoningTaskSection):
    """MATH competition problems (Hendrycks et al. 2021, arXiv 2103.03874) with the boxed-answer reward:
    1 when the last ``\\boxed{}`` of the response matches the reference under math-verify, else 0."""

    name: Literal["math"] = "math"
    source: Literal["auto", "hub", "files"] = "auto"
    """Where problems come from: ``hub``, ``files`` (task.train_file / task.test_file, or task.path), or
    ``auto`` = files when any file is set, else hub."""
    hub_id: str = "DigitalLearningGmbH/MATH-lighteval"
    """Hugging Face dataset id for source=hub (the 7,500 / 5,000 split of MATH)."""
    problem_field: str = "problem"
    """Row field holding the problem statement."""
    answer_field: str = "solution"
    """Row field holding the reference: the content of its last ``\\boxed{}``; a single-line field without
    one is taken whole (MATH-500's ``answer`` column)."""
    instruction: str = "Please reason step by step, and put your final answer within \\boxed{}."
    """Appended to every problem, on its own line."""


class MathTask(VerifiedDataTask):
    """MATH problems and the boxed-answer reward, built from a ``MathTaskConfig`` (or its fields as keywords)."""

    Config = MathTaskConfig

    def __init__(self, config: MathTaskConfig | None = None, **fields) -> None:
        self.config = task_section(MathTaskConfig, config, fields)
        self.name = self.config.name
        self.skipped: dict[str, dict[int, str]] = {}
        """Per split, the skipped row numbers and why (also reported as one warning per split)."""
        require_math_verify(self.name)
        self._splits = {split: self._load(split) for split in ("train", "test")}
        self._pool = None

    def _problem(self, split: str, row: Row) -> tuple[Problem | None, str | None]:
        c = self.config

        def messages(statement: str) -> tuple[dict[str, str], ...]:
            user = statement.strip() + (f"\n{c.instruction}" if c.instruction else "")
            system = ({"role": "system", "content": c.system_prompt},) if c.system_prompt else ()
            return (*system, {"role": "user", "content": user})

        return self._row_problem(split, row, c.problem_field, math_reference, "no \\boxed{} answer", messages)

    def score(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[Reward]:
        return boxed_rewards(self.verifier, [p.answer for p in problems], responses)


def math_reference(solution: str) -> str | None:
    """The last ``\\boxed{}`` content of ``solution``; a single line without ``\\boxed`` is the answer itself."""
    if "\\boxed" in solution or "\\fbox" in solution:
        return last_boxed(solution)
    text = solution.strip()
    return text if "\n" not in text else None
