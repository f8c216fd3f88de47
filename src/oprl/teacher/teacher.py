"""The teacher: a second model that scores every token the student sampled, and ``TeacherWorker``, its role.

``Teacher.logprobs`` is prefill only: for each row, log π_teacher(y_t | prompt, y_<t) of the response tokens
under the sampling temperature (the scaling of ``behavior_logprobs``, so a teacher equal to the student gives
exactly the behaviour log-probs), in batches of whole groups. ``teacher.engine=lean`` prefills each distinct
prompt once and shares its key/value cache with the group's responses (``grouped_response_logprobs``, the
trainer's own computation); ``hf`` runs each row's prompt + response in one plain forward (the reference);
``vllm`` prefills prompt + response in vLLM (``oprl.teacher.vllm_prefill``: the rollout's in-process engine,
its prefix cache sharing a group's prompt, the temperature applied as vLLM's logits scale).

The driver hands each explored batch to the teacher between the explorer and the buffer (``explore -> score ->
put``), so the store, replay, checkpoints and resume carry ``teacher_logprobs`` like any column; mode=offline
scores the batch the buffer hands out when the stored rows have none (``oprl teacher-score`` adds them to a
store once, ``oprl.teacher.score``).

Top-k / top-p (``teacher.support``, docs/algorithms.md#distillation-under-top-p--top-k): ``full`` scores the
teacher's whole distribution while the student's behaviour log-probs are of its truncated one; ``truncated``
renormalises the teacher's over its own kept set under the rollouts' ``Sampling`` (``rollout.top_k`` /
``rollout.top_p``: the sampler's rule, ``oprl.models.truncation``, through the torch engines), a token outside
that set scoring -inf (the trainer floors it at ``teacher.logprob_floor``). So a teacher equal to the student
gives exactly the behaviour log-probs under either truncation.

Not here: sampling (the teacher never generates), the distillation math (``oprl.algorithms.distill``).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from oprl.messages import Experience, ScoreResult
from oprl.models.logprobs import grouped_response_logprobs, packed_response_logprobs
from oprl.models.truncation import PLAIN, Sampling
from oprl.teacher.loading import load_teacher
from oprl.worker_parts import Clock

if TYPE_CHECKING:
    from oprl.config import RunConfig

ENGINES = {
    "lean": grouped_response_logprobs,  # each distinct prompt once per micro-batch (shared key/value cache)
    "hf": packed_response_logprobs,  # prompt + response per row, one plain forward
}
"""The torch engines; ``vllm`` (``oprl.teacher.vllm_prefill.VLLMPrefill``) is built only when asked for."""


class Teacher:
    """A frozen model that returns its per-token log-probs of given responses."""

    def __init__(
        self,
        model,
        pad_id: int,
        *,
        sampling: Sampling = PLAIN,
        engine: str = "lean",
        micro_batch_size: int = 64,
        kv_cache_gb: float = 1.0,
    ):
        """``sampling``: the distribution the teacher's log-probs are of, at its temperature; when it truncates
        (``teacher.support=truncated``; torch engines only) renormalised over the teacher's own kept set, -inf
        outside it."""
        self.model = model.eval().requires_grad_(False)
        self.pad_id = pad_id
        self.sampling = sampling
        self.micro_batch_size = micro_batch_size
        self.prefill: Callable[[list[list[int]], list[list[int]], Sampling], list[list[float]]]
        """``prefill(prompt_ids, response_ids, sampling)``: one micro-batch's log-probs, one list per row."""
        if engine == "vllm":  # kv_cache_gb: the vLLM engine's key/value cache (rollout.kv_cache_gb)
            from oprl.teacher.vllm_prefill import VLLMPrefill

            if sampling.truncates:  # the config refuses it in one line (TeacherConfig)
                raise ValueError("teacher.engine=vllm scores the full distribution only (teacher.support=full)")
            self.prefill = VLLMPrefill(self.model, kv_cache_gb=kv_cache_gb)
        else:
            self.prefill = functools.partial(torch_prefill, ENGINES[engine], self.model, pad_id)

    def logprobs(self, prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[list[float]]:
        """log π_teacher of every response token, one list per row (the response's length)."""
        out: list[list[float]] = []
        for rows in group_chunks(prompt_ids, self.micro_batch_size):
            out += self.prefill([prompt_ids[i] for i in rows], [response_ids[i] for i in rows], self.sampling)
        return out

    def score(self, experiences: list[Experience]) -> list[Experience]:
        """Copies of ``experiences`` with ``teacher_logprobs`` set (the inputs are left unchanged)."""
        values = self.logprobs([e.prompt_ids for e in experiences], [e.response_ids for e in experiences])
        return [dataclasses.replace(e, teacher_logprobs=v) for e, v in zip(experiences, values, strict=True)]


@torch.no_grad()
def torch_prefill(forward, model, pad_id: int, prompt_ids, response_ids, sampling: Sampling) -> list[list[float]]:
    """One micro-batch through a torch engine of ``ENGINES`` under ``sampling``: its (B, T) values cut to each
    row's response."""
    # keep_chosen=False: the teacher's truncated distribution is fixed, a token it drops has probability 0.
    values, _, mask = forward(
        model, prompt_ids, response_ids, pad_id, sampling=sampling, keep_chosen=False
    )  # (B, T), _, (B, T)
    return [row[valid].tolist() for row, valid in zip(values.float().cpu(), mask.cpu(), strict=True)]


def group_chunks(prompt_ids: list[list[int]], size: int) -> list[list[int]]:
    """Row indices in chunks of at most ``size`` rows that never split a run of equal consecutive prompts (a
    group) unless the group alone exceeds ``size``: each group's prompt is prefilled once."""
    runs: list[list[int]] = []
    for index, prompt in enumerate(prompt_ids):
        if runs and prompt_ids[runs[-1][0]] == prompt and len(runs[-1]) < size:
            runs[-1].append(index)
        else:
            runs.append([index])
    chunks: list[list[int]] = []
    for run in runs:
        if chunks and len(chunks[-1]) + len(run) <= size:
            chunks[-1] += run
        else:
            chunks.append(list(run))
    return chunks


def build_teacher(config: RunConfig, student_path: str) -> Teacher:
    """The ``Teacher`` of ``config.teacher`` (its tokenizer checked against the student's at ``student_path``),
    scoring under the rollouts' ``Sampling``: its temperature always, its top-k / top-p (its own kept set) only
    with ``teacher.support=truncated``."""
    model, tokenizer = load_teacher(config, student_path)
    sampling = Sampling.of(config.rollout)
    if config.teacher.support == "full":
        sampling = dataclasses.replace(sampling, top_k=0, top_p=1.0)
    return Teacher(
        model,
        tokenizer.pad_token_id,
        sampling=sampling,
        engine=config.teacher.engine,
        micro_batch_size=config.teacher.micro_batch_size,
        kv_cache_gb=config.rollout.kv_cache_gb,
    )


class TeacherWorker:
    """The teacher role: loads ``teacher.path`` (checking its tokenizer is the student's) and scores batches."""

    def __init__(self, config: RunConfig, student_path: str):
        self.clock = Clock()
        self.teacher = build_teacher(config, student_path)

    def ping(self) -> int:
        return 0

    def score(self, batch: int, experiences: list[Experience]) -> tuple[list[Experience], ScoreResult]:
        """Batch ``batch``'s experiences with ``teacher_logprobs`` (rows already scored keep theirs), and the
        report: the prefill's seconds and the clock (the ``perf/teacher_*`` columns)."""
        with self.clock.work():
            start = time.perf_counter()
            todo = [i for i, e in enumerate(experiences) if e.teacher_logprobs is None]
            scored = self.teacher.score([experiences[i] for i in todo])
            out = list(experiences)
            for i, row in zip(todo, scored, strict=True):
                out[i] = row
            score_s = time.perf_counter() - start
        return out, ScoreResult(batch, score_s, self.clock.busy, self.clock.idle)
