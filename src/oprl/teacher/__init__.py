"""The teacher role: a second model that scores the student's sampled tokens (distillation).

- ``teacher``: ``Teacher`` (batched prefill, prompt once per group) and ``TeacherWorker`` (the role a backend hosts).
- ``loading``: ``teacher.path`` -> a frozen model; the same-tokenizer check.
- ``score``: ``oprl teacher-score``, teacher log-probs added once to a stored experience directory.

See docs/runtime.md#teacher and docs/algorithms.md#distillation.
"""

from oprl.teacher.teacher import Teacher, TeacherWorker, build_teacher, group_chunks

__all__ = ["Teacher", "TeacherWorker", "build_teacher", "group_chunks"]
