"""What an algorithm asks the trainer to compute before its update, gathered once per step as ``Algorithm.needs``
says (``oprl.algorithms.spec``): the rewards, group ids and loss-token counts of the rows, and where asked

- π_prox, every row's log-probs under the weights before the step's first update (decoupled PPO; the same
  forward screens the rows for the Kondo gate);
- the score statistics, every row's log importance weight and squared score norm ‖∇θ Σ_t log π_θ(y_t)‖² under
  those weights (VCPO's off-policy optimal baseline; one batched pass, ``score_norms``, or one per row);
- the reference log-probs of every row (a KL penalty every step, or ``kl/ref`` every ``log_ref_kl_every``);
- the teacher's: every row must carry them (``Experience.teacher_logprobs``, scored by the explorer's teacher).

Every rank computes every row in the same order (data-parallel ranks run the same forwards; FSDP gathers parameters
in each), in chunks of ``optim.micro_batch_size`` rows, the loss's forward without grad; a run's ``Algorithm`` is
``oprl.config.algorithm_of(config)``. Not here: the policy's own log-probs (per micro-batch,
``Trainer._micro_loss``), the formulas (``oprl.algorithms``).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from oprl.algorithms.algorithm import Algorithm, Needs
from oprl.algorithms.step import BatchInputs, TokenInputs, loss_units
from oprl.algorithms.top_k import TopKTokens
from oprl.algorithms.variance import sequence_log_ratios
from oprl.errors import OprlError
from oprl.messages import Experience
from oprl.models.batching import right_pad, right_pad_values
from oprl.models.truncation import Sampling
from oprl.trainer import score_norms


def loss_mask_of(rows: list[Experience], width: int) -> torch.Tensor:
    """(B, width) bool: True at the response tokens the model produced (all of them for single-turn rows)."""
    masks = [e.loss_mask if e.loss_mask is not None else [1] * len(e.response_ids) for e in rows]
    return right_pad_values(masks, width) > 0


@dataclass
class RowInputs:
    """The per-token inputs of some rows (lists of each row's valid tokens' values), None where not computed."""

    proximal: list[list[float]] | None = None
    reference: list[list[float]] | None = None
    picked: list[int] | None = None
    """The rows of the lists a micro-batch holds (None: all of them, in order)."""
    top_k: TopK | None = None
    """The step's sampler top-K (N, T, K), where the method reads it (``needs.top_k``)."""

    def forward_keywords(self, rows: list[Experience]) -> dict[str, Any]:
        """The policy forward's extra keywords for the micro-batch ``rows``: ``extra_ids`` (B, T, K), the sampler's
        top-K ids at its rows and tokens, where the method reads them (``oprl.models.logprobs``); else none."""
        if self.top_k is None:
            return {}
        width = max(len(e.response_ids) for e in rows)
        return {"extra_ids": self._mine_top_k(self.top_k.ids)[:, :width]}

    def _mine_top_k(self, values: torch.Tensor) -> torch.Tensor:
        return values if self.picked is None else values[self.picked]

    def padded(self, rows: list[Experience], mask: torch.Tensor, extra: torch.Tensor | None = None) -> TokenInputs:
        """``loss_terms``' (B, T) inputs for ``rows`` whose forward gave the valid-token ``mask`` (B, T): the loss's
        tokens (multi-turn episodes: environment tokens are context only, every term sees model tokens only), the
        behaviour log-probs, π_prox, the reference's and, when every row carries them, the teacher's log-probs;
        with ``extra`` (B, T, K), the forward's log-probs of ``forward_keywords``' ids, the top-K view."""
        width, device = mask.shape[1], mask.device

        def pad(values):  # (B, width) on the mask's device
            return right_pad_values(values, width).to(device)

        def mine(values):  # this micro-batch's rows of the step's per-row lists
            return None if values is None else pad(values if self.picked is None else [values[i] for i in self.picked])

        if any(e.loss_mask is not None for e in rows):
            mask = mask & loss_mask_of(rows, width).to(device)
        teacher = [e.teacher_logprobs for e in rows]
        top_k = None
        if extra is not None and self.top_k is not None:
            ids = self._mine_top_k(self.top_k.ids)[:, :width].to(device)  # (B, T, K)
            targets = right_pad([e.response_ids for e in rows], -1)[0][:, :width].to(device)  # (B, T); -1: padding
            sampled = ids == targets[..., None]  # (B, T, K)
            top_k = TopKTokens(self._mine_top_k(self.top_k.logprobs)[:, :width].to(device), extra, sampled)
        return TokenInputs(pad([e.behavior_logprobs for e in rows]), mask, mine(self.proximal), mine(self.reference),
                           pad(teacher) if all(t is not None for t in teacher) else None, top_k)  # fmt: skip


@dataclass(frozen=True)
class TopK:
    """The sampler's top-K of a batch (``rollout.record_top_k``, ``Experience.top_k_ids``/``top_k_logprobs``): at
    response token t of row b, the ids and log-probs of the K most likely tokens of the distribution that token
    was drawn from (temperature, top-k, top-p applied; ``oprl.rollout.base.top_logprobs``), most likely first.
    Right-padded past each row's length with id 0 and log-prob ``-inf`` (no mass, like a token outside the kept
    set), so ``logprobs.exp()`` is the sampler's probability q of each id, 0 at padding."""

    ids: torch.Tensor
    """(B, T, K) int64."""
    logprobs: torch.Tensor
    """(B, T, K) float32."""


def top_k_of(rows: list[Experience], width: int) -> TopK | None:
    """``TopK`` of ``rows`` padded to ``width`` tokens; None when no row recorded them (``rollout.record_top_k=0``:
    nothing is built). Rows recorded with another K, or some rows without them (a store mixing runs), are one
    ``OprlError`` line: a loss over the sampler's top-K needs every row's."""
    recorded = [e.top_k_ids is not None for e in rows]
    if not any(recorded):
        return None
    ks = {len(p) for e in rows if e.top_k_ids is not None for p in e.top_k_ids[:1]}
    if not all(recorded) or len(ks) > 1:
        raise OprlError(
            f"rollout.record_top_k: {sum(recorded)} of {len(rows)} rows carry the sampler's top-K "
            f"(K = {sorted(ks)}); a batch needs every row's, with one K (do not mix stores of other runs)"
        )
    k = ks.pop() if ks else 0
    ids = torch.zeros((len(rows), width, k), dtype=torch.long)  # (B, T, K)
    logprobs = torch.full((len(rows), width, k), float("-inf"), dtype=torch.float32)  # (B, T, K)
    for b, e in enumerate(rows):
        n = len(e.top_k_ids or ())
        if n:
            ids[b, :n] = torch.tensor(e.top_k_ids, dtype=torch.long)
            logprobs[b, :n] = torch.tensor(e.top_k_logprobs, dtype=torch.float32)
    return TopK(ids, logprobs)


@dataclass
class StepInputs:
    """One step's inputs for every row of its batch."""

    batch: BatchInputs
    """Rewards, group ids, loss-token counts and, where asked, score statistics and the screening log-probs."""
    units: torch.Tensor
    """(N,) each row's part of the loss's count (``loss_units``): the micro-batches' exact weights."""
    rows: RowInputs = field(default_factory=RowInputs)
    seconds: dict[str, float] = field(default_factory=dict)
    """``perf/*`` seconds spent computing them."""
    top_k: TopK | None = None
    """The sampler's top-K of every row, (N, T, K) with T the batch's longest response (a micro-batch takes its
    rows and first columns); None when the rows recorded none (``rollout.record_top_k=0``)."""


class Inputs:
    """The forwards that compute a step's inputs: the trainer's ``policy`` over ``model`` (set by the trainer once it
    wrapped the model) and, where the method asks for it, the frozen initial policy's (``reference_forward``, copied
    here, before the trainer wraps the model: FSDP shards it in place)."""

    def __init__(self, model, parallel, method: Algorithm, *, pad_id: int, sampling: Sampling, chunk: int,
                 autocast: torch.dtype | None = None):  # fmt: skip
        self.model, self.parallel, self.method, self.needs = model, parallel, method, method.needs
        self.pad_id, self.sampling, self.chunk = pad_id, sampling, chunk
        self.reference = reference_forward(model, parallel, self.needs, autocast)
        self.policy: Any = None
        self.scores = score_norms.ScorePass(autocast)  # score_statistics' batched pass

    def compute(self, batch: list[Experience], step: int) -> StepInputs:
        """The inputs of trainer step ``step`` (the version its update produces) for ``batch``."""
        if self.needs.teacher and any(e.teacher_logprobs is None for e in batch):
            raise OprlError(
                "algorithm.distill_coef > 0 but the batch has rows without teacher log-probs: set teacher.path, "
                "or score the stored experiences once with `oprl teacher-score`"
            )
        width = max(len(e.response_ids) for e in batch)
        covered = loss_mask_of(batch, width)  # (N, T): the tokens the loss covers
        top_k = top_k_of(batch, width)  # before any forward: a method that needs them and has none stops at once
        if self.needs.top_k and top_k is None:
            raise OprlError(
                "the algorithm reads the sampler's top-K (score_centering or a *-topk clip_mode) but the batch's "
                "rows carry none: sample with rollout.record_top_k > 0 (an offline store must have recorded them)"
            )
        current = self.proximal_logprobs(batch) if self.needs.proximal or self.needs.screen else None  # one forward
        rows = RowInputs(current if self.needs.proximal else None, top_k=top_k if self.needs.top_k else None)
        if self.needs.reference(step):
            rows.reference = self._logprobs(self.reference, batch)
        statistics, seconds = None, {}
        if self.needs.score_statistics:
            tick = time.perf_counter()
            statistics = self.score_statistics(batch)  # (N,), (N,)
            seconds["perf/train_score_s"] = time.perf_counter() - tick
        screen = (right_pad_values(current, width), covered) if current and self.needs.screen else None  # (N, T) x2
        rewards = torch.tensor([e.reward for e in batch], dtype=torch.float32)  # (N,)
        group_ids = torch.tensor([e.group_id for e in batch], dtype=torch.long)  # (N,)
        given = BatchInputs(rewards, group_ids, covered.sum(-1), statistics, screen)
        return StepInputs(given, loss_units(covered, self.method), rows, seconds, top_k)

    def proximal_logprobs(self, rows: list[Experience]) -> list[list[float]]:
        """log π_prox of every response token of ``rows`` under the current (pre-update) weights: the loss's
        computation (train mode, chunks of ``optim.micro_batch_size`` rows) without grad."""
        self.model.train()
        return self._logprobs(self.policy, rows)

    @torch.no_grad()
    def _logprobs(self, forward, rows: list[Experience]) -> list[list[float]]:
        out: list[list[float]] = []
        for start in range(0, len(rows), self.chunk):
            micro = rows[start : start + self.chunk]
            logprobs, _, mask = forward(
                [e.prompt_ids for e in micro], [e.response_ids for e in micro], self.pad_id, sampling=self.sampling
            )  # (B, T), _, (B, T)
            out += [values[valid.bool()].tolist() for values, valid in zip(logprobs.cpu(), mask.cpu(), strict=True)]
        return out

    def score_statistics(self, rows: list[Experience]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log w (N,), ‖∇θ Σ_t log π_θ(y_t)‖² (N,))`` of every row under the current (pre-update) weights: each
        response's log importance weight Σ_t log(π_θ/π_b) and the squared norm of the gradient of its summed
        log-probs over the trainable parameters (VCPO's off-policy optimal baseline, oprl.algorithms.variance),
        train mode, the loss's tokens (multi-turn environment and stale-masked tokens excluded). Batched, chunks of
        ``optim.micro_batch_size`` rows (``score_norms.ScorePass``); a model it refuses takes
        ``looped_score_statistics``. Gradients are None afterwards."""
        self.model.train()
        out = self.scores.run(self.model, rows, self.pad_id, self.sampling, loss_mask_of, self.chunk)
        out = out or self.looped_score_statistics(rows)
        self.model.zero_grad(set_to_none=True)
        return out

    def looped_score_statistics(self, rows: list[Experience]) -> tuple[torch.Tensor, torch.Tensor]:
        """``score_statistics`` with one forward and backward per row through the trainer's own forward (the
        fallback, and the batched pass's test reference). Every data-parallel rank computes every row in the same
        order, so the reduction averages equal gradients: each rank gets the row's own."""
        self.model.train()
        params = [p for p in self.model.parameters() if p.requires_grad]
        log_ratios, sq_norms = [], []
        for row in rows:
            self.model.zero_grad(set_to_none=True)
            with self.parallel.gradient_sync(True):
                logprobs, _, mask = self.policy(
                    [row.prompt_ids], [row.response_ids], self.pad_id, sampling=self.sampling
                )  # (1, T), _, (1, T)
                mask = mask & loss_mask_of([row], mask.shape[1]).to(mask.device)
                torch.where(mask, logprobs, torch.zeros_like(logprobs)).sum().backward()
            behavior = right_pad_values([row.behavior_logprobs], mask.shape[1]).to(logprobs.device)  # (1, T)
            log_ratios.append(sequence_log_ratios(logprobs, behavior, mask).float().cpu())
            sq_norms.append(self.parallel.grad_norm(params) ** 2)
        self.model.zero_grad(set_to_none=True)
        return torch.cat(log_ratios), torch.tensor(sq_norms, dtype=torch.float32)


def reference_forward(model, parallel, needs: Needs, autocast: torch.dtype | None = None):
    """The frozen initial policy's forward (a copy of ``model`` before any update or wrapping), or None where the
    method never asks for the reference's log-probs."""
    if needs.reference_every <= 0:
        return None
    frozen = copy.deepcopy(model).eval().requires_grad_(False)
    return parallel.wrap(frozen, trainable=False, autocast=autocast)
