"""The plumbing shared by the dataset-backed, math-verify-scored tasks (gsm8k, math): loading both splits
through ``load_problems``, serving them, and the lazily started answer-checking process pool.

A mixin of methods only; each task keeps its own section, ``_problem`` row converter (built on
``_row_problem``: a question field, an answer field holding the reference) and ``score``. It needs
``self.config`` (a ``oprl.tasks.section.ReasoningTaskSection``: source, hub_id, hub_config, path, train_file,
test_file, train_size, test_size, verify_workers, verify_timeout; plus the task's answer_field) and the attributes
``name``, ``skipped``, ``_splits``, ``_pool``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from oprl.errors import OprlError
from oprl.tasks.base import Problem
from oprl.tasks.data.files import Row, load_problems, string_field
from oprl.tasks.rewards.verify import VerifierPool


class VerifiedDataTask:
    config: Any  # the task's section, with the fields of ReasoningTaskSection (and answer_field)
    name: str
    skipped: dict[str, dict[int, str]]
    _splits: dict[str, list[Problem]]
    _pool: VerifierPool | None

    def _problem(self, split: str, row: Row) -> tuple[Problem | None, str | None]:
        """``(problem, None)``, or ``(None, why the row is unusable)``: each task converts its own rows."""
        raise NotImplementedError

    def _row_problem(
        self,
        split: str,
        row: Row,
        question_field: str,
        reference: Callable[[str], str | None],
        no_reference: str,
        messages: Callable[[str], tuple[dict[str, str], ...]],
    ) -> tuple[Problem | None, str | None]:
        """What each task's ``_problem`` does with its own fields: the question from ``question_field``, the
        reference ``reference(answer)`` from ``config.answer_field``, the chat ``messages(question)``. A row
        without either string field, or whose answer holds no reference (``no_reference`` says what is
        missing), gives ``(None, why)``."""
        question, reason = string_field(row, question_field)
        if question is None:
            return None, reason
        answer_field = self.config.answer_field
        answer, reason = string_field(row, answer_field)
        if answer is None:
            return None, reason
        ref = reference(answer)
        if not ref:
            return None, f"{no_reference} in {answer_field!r}"
        return Problem(task_id=f"{self.name}/{split}/{row.number:06d}", messages=messages(question), answer=ref), ""

    def _load(self, split: str) -> list[Problem]:
        c = self.config
        problems, self.skipped[split] = load_problems(
            split,
            self._problem,
            limit=c.train_size if split == "train" else c.test_size,
            source=c.source,
            hub_id=c.hub_id,
            hub_config=c.hub_config,
            path=c.path,
            train_file=c.train_file,
            test_file=c.test_file,
        )
        return problems

    @property
    def verifier(self) -> VerifierPool:
        """The answer-checking process pool (started on first use); ``verifier.counts`` tallies verdicts."""
        if self._pool is None:
            self._pool = VerifierPool(self.config.verify_workers, self.config.verify_timeout)
        return self._pool

    def problems(self, split: str) -> Sequence[Problem]:
        if split not in self._splits:
            raise OprlError(f"task {self.name}: unknown split {split!r}; valid: {sorted(self._splits)}")
        return self._splits[split]
