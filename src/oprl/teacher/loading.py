"""Loading the teacher of ``teacher.path`` and checking that it speaks the student's tokens.

``teacher.path`` may be a run directory (its ``final/`` model, else its newest checkpoint), a checkpoint
directory (its trainer weights loaded into the architecture of the student's model: an embedded-model run's
checkpoint is a teacher for the same embedded model), ``tiny`` (the student's own starting model), or anything
``model.path`` accepts (a Hugging Face directory, ``smollm2-135m-instruct``, a ``.gguf`` file, a hub id).

Distillation compares log-probs of the same token ids, so the teacher's vocabulary must be the student's: any
difference is one ``OprlError`` line naming both. Not here: LoRA teachers (a run trained with adapters is a
teacher through a merged ``final/`` only), a teacher on another tokenizer (no byte-level alignment).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from oprl.checkpoint.store import ExperienceStore, read_parquet
from oprl.errors import OprlError
from oprl.models.loading import dequantised_gguf, resolve_model_path, vocabulary_mismatch
from oprl.worker_parts import load_frozen

if TYPE_CHECKING:
    from oprl.config import RunConfig


def load_teacher(config: RunConfig, student_path: str):
    """``(model, tokenizer)`` of ``config.teacher.path`` on ``model.device`` in ``teacher.dtype``, frozen."""
    path = config.teacher.path
    assert path is not None, "a teacher worker is started only with teacher.path"
    model, tokenizer, source = load_frozen(path, "teacher.path", config.teacher.dtype, config, student_path)
    if source != student_path:
        check_same_tokens(tokenizer, student_tokenizer(student_path), path, config.model.path)
    return model, tokenizer


def student_tokenizer(student_path: str):
    """The tokenizer at ``student_path`` (a model directory, a .gguf file, the SmolLM2 alias or a hub id)."""
    from transformers import AutoTokenizer

    location, extra = resolve_model_path(student_path)
    if "gguf_file" in extra:
        location, extra = str(dequantised_gguf(Path(location) / extra["gguf_file"])), {}
    return AutoTokenizer.from_pretrained(location, **extra)


def check_same_tokens(teacher, student, teacher_name: str, student_name: str) -> None:
    """One ``OprlError`` line naming both vocabularies when the two tokenizers map any token to another id."""
    problem = vocabulary_mismatch(teacher.get_vocab(), student.get_vocab(), teacher_name, student_name)
    if problem:
        raise OprlError(problem)


def check_teacher_store(config: RunConfig) -> None:
    """Distillation in mode=offline without a teacher reads the store's teacher log-probs: one line unless its
    first batch file carries them (a file read, so the runtime's check; the rules without one are validators
    of ``RunConfig``)."""
    coef = config.algorithm.distill_coef or 0.0
    if coef == 0 or config.teacher.path is not None or config.mode != "offline" or not config.buffer.path:
        return
    store = ExperienceStore.locate(config.buffer.path)
    first = store.path_of(store.batches()[0])
    if not _scored(first):
        raise OprlError(
            f"algorithm.distill_coef={coef:g}: {first} has no teacher log-probs; score the store once with "
            f"`oprl teacher-score {config.buffer.path} teacher.path=...`, or set teacher.path"
        )


def _scored(path: Path) -> bool:
    """Whether the batch file at ``path`` carries teacher log-probs (schema 4, a scored row)."""
    import pyarrow.parquet as pq

    if "teacher_logprobs" not in pq.read_schema(path).names:
        return False
    return read_parquet(path, columns=["teacher_logprobs"]).column("teacher_logprobs").null_count == 0
