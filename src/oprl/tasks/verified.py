"""The plumbing shared by the dataset-backed, math-verify-scored tasks (gsm8k, math): loading both splits
through ``load_problems``, serving them, and the lazily started answer-checking process pool.

A mixin of methods only; each task (a dataclass) keeps its own fields, ``_problem`` row converter and
``score``. It needs the fields source, hub_id, hub_config, path, train_file, test_file, train_size,
test_size, verify_workers, verify_timeout, name, and the attributes ``skipped``, ``_splits``, ``_pool``.
"""

from __future__ import annotations

from typing import Sequence

from oprl.errors import OprlError
from oprl.tasks.base import Problem
from oprl.tasks.datafiles import load_problems
from oprl.tasks.verify import VerifierPool


class VerifiedDataTask:
    def _load(self, split: str) -> list[Problem]:
        problems, self.skipped[split] = load_problems(
            split, self._problem, limit=self.train_size if split == "train" else self.test_size,
            source=self.source, hub_id=self.hub_id, hub_config=self.hub_config, path=self.path,
            train_file=self.train_file, test_file=self.test_file,
        )
        return problems

    @property
    def verifier(self) -> VerifierPool:
        """The answer-checking process pool (started on first use); ``verifier.counts`` tallies verdicts."""
        if self._pool is None:
            self._pool = VerifierPool(self.verify_workers, self.verify_timeout)
        return self._pool

    def problems(self, split: str) -> Sequence[Problem]:
        if split not in self._splits:
            raise OprlError(f"task {self.name}: unknown split {split!r}; valid: {sorted(self._splits)}")
        return self._splits[split]
