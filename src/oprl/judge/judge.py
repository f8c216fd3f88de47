"""``JudgeWorker``: the judge as a role (``oprl.roles.JudgeRole``), one per run, placed by the backend like the
teacher: a thread of the driver, a process of its own (``runtime.workers=processes``), or a Ray actor with
``judge.gpus`` GPUs, with the workers' torch thread count.

The explorers call it, not the driver: each holds a ``oprl.roles.JudgeClient`` and sends the (prompt,
completion, reference) rows of a sampled batch in one call; the judge answers ``Verdicts`` (one score and one
unparsed flag per row, and its seconds). Calls are answered in arrival order, each batch whole, and a
verdict draws no random number, so the rewards do not depend on placement (tests/judge/test_judge_role.py).

Not here: the judge model and its parsers, or how a verdict joins the reward (``oprl.episodes.judge``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from oprl.episodes.judge import build_judge
from oprl.messages import JudgeRow, Verdicts

if TYPE_CHECKING:
    from oprl.config import RunConfig


class JudgeWorker:
    """The judge role: loads ``judge.path`` (resolved as ``teacher.path`` is) and scores the explorers' rows."""

    def __init__(self, config: RunConfig, student_path: str):
        self.scorer = build_judge(config, student_path)

    def ping(self) -> int:
        return 0

    def judge(self, rows: list[JudgeRow]) -> Verdicts:
        """The verdicts of one explorer's batch (``oprl.episodes.judge.Judge.judge``)."""
        return self.scorer.judge(rows)
