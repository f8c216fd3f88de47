"""The judge role: the run's one judge model, which the explorers ask for the verdicts of their batches.

- ``role``: ``JudgeWorker``, the worker a backend hosts (a thread, a process, a Ray actor with ``judge.gpus``).

What a verdict is, and how it joins a task's reward, is ``oprl.episodes.judge`` (the explorers' side). See
docs/tasks.md#a-model-as-the-judge and docs/runtime.md#judge.
"""

from oprl.judge.judge import JudgeWorker

__all__ = ["JudgeWorker"]
