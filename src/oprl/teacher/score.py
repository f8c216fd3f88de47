"""``oprl teacher-score``: add the teacher's log-probs to a stored experience directory, once.

Off-policy distillation from stored samples: explore once with the student (``oprl explore``), score the store
with the teacher here, then train offline on it as often as wanted (``oprl train mode=offline buffer.path=...
algorithm.preset=distill``) without loading the teacher again. Each batch file is rewritten atomically with
``teacher_logprobs`` filled (store schema 4); rows that already carry them are kept, so an interrupted pass is
continued by running it again, and a file written by ``oprl explore`` with a teacher is left as it is.

Run it: ``oprl teacher-score runs/<explored run> teacher.path=runs/<teacher run>`` (a run directory as first
argument brings its own config, so model.path and the warm start match the run that sampled the store), or
``oprl teacher-score [CONFIG.yaml] buffer.path=DIR teacher.path=...``.

Not here: sampling (the store's samples are kept as they are), advantages (the trainer's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from oprl.checkpoint.store import ExperienceStore
from oprl.errors import OprlError
from oprl.teacher.teacher import build_teacher

if TYPE_CHECKING:
    from oprl.config import RunConfig


def score_store(config: RunConfig, student_path: str, log=print) -> tuple[int, int]:
    """Score every batch file of ``buffer.path`` with ``teacher.path``; returns (batches scored, already scored)."""
    if config.teacher.path is None:
        raise OprlError("teacher-score: set teacher.path (the model whose log-probs to add)")
    if config.buffer.path is None:
        raise OprlError("teacher-score: set buffer.path (an experience store or a run directory holding one)")
    store = ExperienceStore.locate(config.buffer.path)
    teacher = build_teacher(config, student_path)
    scored = kept = 0
    for batch in store.batches():
        rows = store.read(batch)
        todo = [i for i, e in enumerate(rows) if e.teacher_logprobs is None]
        if not todo:
            kept += 1
            continue
        for i, row in zip(todo, teacher.score([rows[i] for i in todo]), strict=True):
            rows[i] = row
        store.write(batch, rows)
        scored += 1
    log(f"teacher-score: {scored} batch files scored, {kept} already scored, in {store.root}")
    return scored, kept
