"""The trainer: one batch of whole groups in, one (or more) optimizer steps out, a new policy version. The role a
backend hosts around it (train, weights snapshots, evaluation, its part of a checkpoint) is ``role.py``'s.

It runs an algorithm without knowing which: an ``Algorithm`` (``oprl.algorithms.algorithm``) whose pure stages
(``oprl.algorithms.step``) it calls around its own forwards, backward, clipping and optimizer step, top to bottom:

    batch metrics -> stale mask -> inputs the method needs (trainer/inputs.py) -> advantages -> per mini-batch:
        [a mask from a statistic of the whole mini-batch: its no-grad forwards -> the mask (``_batch_rule``)]
        per micro-batch: log-probs -> loss terms -> backward;  clip -> step size -> guard -> optimizer step
    -> metrics (trainer/step_metrics.py)

Micro-batching accumulates gradients with exact weights (each micro-batch's share of the loss's count: tokens or
sequences, ``loss_units``). An update whose loss or gradient norm is not finite is skipped (``_skip_nonfinite``).

Data parallelism (``oprl.trainer.distributed``) plugs in as ``parallel``: every rank sees the whole batch
(advantages, permutation and the global normaliser are the same everywhere), trains on its share of whole
groups, and the micro-batch weights use the mini-batch's global count, so N ranks compute the single-process
loss and gradient.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple

import torch

from oprl.algorithms.algorithm import Algorithm
from oprl.algorithms.losses import BatchKeep
from oprl.algorithms.lr_schedule import LrSchedule
from oprl.algorithms.step import (
    Carry,
    LossTerms,
    TokenInputs,
    batch_rule_keeps,
    loss_terms,
    step_advantages,
    step_scale,
)
from oprl.messages import Experience
from oprl.models.truncation import Sampling
from oprl.schedule import stream_seed
from oprl.trainer.distributed import SingleProcess
from oprl.trainer.inputs import Inputs, RowInputs, StepInputs
from oprl.trainer.staleness import mask_stale_tokens
from oprl.trainer.step_metrics import SKIPPED, StepMetrics, advantage_metrics, batch_step_metrics, floats, step_means

if TYPE_CHECKING:
    pass

# ``Trainer`` imports no config, task or evaluation module (they need pydantic): benchmarks/gpu_check.py runs it
# on a machine without pydantic. The role around it (``role.py``: ``TrainerWorker``) imports them where it uses them.

log = logging.getLogger("oprl.trainer")


class Micro(NamedTuple):
    """One micro-batch of a mini-batch on this rank, with its exact weights."""

    rows: list[int]  # indices into the mini-batch; [0] with weight 0 where this rank has no micro-batch left
    share: float  # of the mini-batch's count in the loss's aggregation: the loss's weight
    tokens: float  # of the mini-batch's tokens: the token metrics' weight
    last: bool  # gradients are reduced over ranks after this one's backward
    real: bool = True  # False: the weight-0 stand-in, whose metrics do not count


class Trainer:
    def __init__(
        self,
        model,
        *,
        pad_id: int,
        method: Algorithm,
        optim,
        sampling: Sampling,
        seed: int = 0,
        parallel: SingleProcess | None = None,
        activation_checkpointing: bool = False,
        autocast: torch.dtype | None = None,
        max_token_lag: int | None = None,
        schedule: LrSchedule | None = None,
    ):
        self.model, self.pad_id, self.optim, self.seed = model, pad_id, optim, seed
        self.schedule = schedule or LrSchedule()
        """The learning rate of every update slot (``oprl.algorithms.lr_schedule``; constant by default)."""
        self.lr_slot = 0
        """The schedule's position: update slots run so far (``version * epochs * mini_batches`` after a step)."""
        self.method = method
        """The algorithm: its settings by stage and what a step computes for it (``Algorithm.needs``)."""
        self.sampling = sampling
        """The rollouts' ``Sampling``: every log-prob is scored under the distribution the sampler drew from,
        temperature, then its kept set rebuilt from the current logits (oprl.models.logprobs; rho = 1 on-policy)."""
        self.max_token_lag = max_token_lag
        """Tokens sampled more than this many versions ago leave the loss (``staleness.mask_stale_tokens``)."""
        self.version = 0
        self.carry = Carry()
        """What the method carries from one step to the next (``oprl.algorithms.step.Carry``)."""
        self.parallel = parallel or SingleProcess()
        self.inputs = Inputs(model, self.parallel, method, pad_id=pad_id, sampling=sampling,
                             chunk=optim.micro_batch_size, autocast=autocast)  # fmt: skip
        # The module computing (logprobs, entropy, mask); wrapping (FSDP/DDP) happens before the optimizer exists.
        # Under ``autocast`` it computes in bfloat16; the parameters and the optimizer below stay float32.
        self.policy = self.inputs.policy = self.parallel.wrap(
            model, activation_checkpointing=activation_checkpointing, autocast=autocast
        )
        params = list(model.parameters())
        # The fused kernel updates all tensors in one pass (half the optimizer time of the per-tensor loop on CPU).
        fused = all(p.device.type in ("cpu", "cuda") for p in params)
        self.optimizer = torch.optim.AdamW(
            params, lr=optim.lr, betas=tuple(optim.betas), weight_decay=optim.weight_decay, fused=fused
        )

    def step(self, batch: list[Experience]) -> dict[str, float]:
        """Train on ``batch`` (whole groups); returns metrics; bumps ``version`` by one. The batch is not
        modified (use counts belong to the buffer)."""
        start = time.perf_counter()
        out = batch_step_metrics(batch, self.version)  # the batch as sampled: rewards, lengths, lags
        if self.max_token_lag is not None:  # data shaping before the loss; the loss itself is unchanged
            batch, out["batch/stale_token_masked_frac"] = mask_stale_tokens(batch, self.version, self.max_token_lag)
        generator = torch.Generator().manual_seed(stream_seed(self.seed, self.version))
        inputs = self.inputs.compute(batch, step=self.version + 1)
        adv, adv_metrics, self.carry = step_advantages(inputs.batch, self.method, generator=generator, carry=self.carry)
        kept, updates = adv.keep.nonzero().squeeze(-1), []
        for _ in range(self.optim.epochs):
            order = kept[torch.randperm(len(kept), generator=generator)] if self.optim.mini_batches > 1 else kept
            for rows in order.tensor_split(self.optim.mini_batches):
                self._schedule_lr()
                if len(rows):
                    updates.append(self._update(batch, rows.tolist(), adv.advantages, inputs))
                self.lr_slot += 1  # every slot, run or not: the rate is a function of (step, slot) alone
        out |= step_means(updates, inputs.seconds) | advantage_metrics(batch, adv) | floats(adv_metrics)
        self.version += 1
        out["perf/train_s"] = time.perf_counter() - start
        out["perf/train_tokens_per_s"] = out["response/tokens"] * self.optim.epochs / out["perf/train_s"]
        return out

    def _update(
        self, batch: list[Experience], picked: list[int], advantages: torch.Tensor, inputs: StepInputs
    ) -> dict[str, float]:
        """One optimizer update on the rows ``picked`` of ``batch`` (the whole mini-batch, on every rank) with
        gradient accumulation over this rank's micro-batches."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        rows = [batch[i] for i in picked]
        update, log_weights = StepMetrics(), []
        micros = self._micro_batches(rows, inputs.units[picked], inputs.batch.lengths[picked])
        masks: list[BatchKeep | None] = [None] * len(micros)  # the loss's own mask over each micro-batch's rows
        if self.method.needs.batch_rule and (len(micros) > 1 or self.parallel.world_size > 1):  # whole mini-batch
            masks = update.timed("perf/train_batch_rule_s", self._batch_rule, batch, picked, micros, advantages,
                                 inputs)  # fmt: skip
        for micro, batch_keep in zip(micros, masks, strict=True):
            chosen = [picked[i] for i in micro.rows]
            given = replace(inputs.rows, picked=chosen)  # the step's per-row inputs at this micro-batch's rows
            with self.parallel.gradient_sync(micro.last):
                terms = update.timed("perf/train_forward_s", self._micro_loss,
                                     [batch[i] for i in chosen], advantages[chosen], given, batch_keep)  # fmt: skip
                # grad_scale undoes the data-parallel average over ranks (1 on one process).
                update.timed("perf/train_backward_s", (terms.loss * (micro.share * self.parallel.grad_scale)).backward)
            if micro.real:
                update.add_micro(terms.metrics, micro.tokens, micro.share)
                log_weights += terms.log_weights.tolist()
        tick = time.perf_counter()
        grad_norm = self.parallel.clip_grad_norm(self.model.parameters(), self.optim.grad_clip)
        scale, scaled = torch.ones(()), dict[str, torch.Tensor]()
        if self.method.needs.log_weights:  # the step-size rule reads every rank's responses' log weights
            scale, scaled = step_scale(torch.tensor(self.parallel.gather(log_weights), dtype=torch.float64),
                                       self.method)  # fmt: skip
        # Reduced before the step: every rank then sees the same loss and norm, so all of them skip or none.
        out = update.reduced(self.parallel) | floats(scaled) | {"optim/grad_norm": grad_norm}
        skipped = self._skip_nonfinite(out.get("loss/total", 0.0), grad_norm)
        out["optim/lr"] = self._optimizer_step(float(scale), skipped)
        return out | {SKIPPED: float(skipped), "perf/train_optimizer_s": time.perf_counter() - tick}

    def _micro_batches(self, rows: list[Experience], units: torch.Tensor, tokens: torch.Tensor) -> list[Micro]:
        """This rank's micro-batches of the mini-batch ``rows`` with their exact weights: each micro-batch's mean is
        re-weighted by its share of the mini-batch's count in the loss's aggregation (``units`` (B,), each row's part;
        ``tokens`` (B,), each row's loss tokens), whatever rank holds a row. An empty chunk (this rank holds fewer
        micro-batches) still runs forward and backward on one row with weight 0: FSDP gathers parameters in every
        rank's forward and reduces gradients after the last one."""
        chunks = self.parallel.micro_batches(rows, self.optim.micro_batch_size)
        total, total_tokens = (max(float(values.float().sum()), 1.0) for values in (units, tokens))
        return [
            Micro(chunk, float(units[chunk].float().sum()) / total, float(tokens[chunk].float().sum()) / total_tokens,
                  index == len(chunks) - 1) if chunk else Micro([0], 0.0, 0.0, index == len(chunks) - 1, real=False)
            for index, chunk in enumerate(chunks)
        ]  # fmt: skip

    @torch.no_grad()
    def _batch_rule(
        self, batch: list[Experience], picked: list[int], micros: list[Micro], advantages: torch.Tensor,
        inputs: StepInputs,
    ) -> list[BatchKeep | None]:  # fmt: skip
        """Each micro-batch's part of the loss's mask where that mask is a statistic of the whole batch
        (``needs.batch_rule``) and the mini-batch spans several micro-batches or data-parallel ranks (else ``_update``
        runs nothing extra and the loss computes its mask over its own rows): one forward without grad per
        micro-batch, the same as its own forward in the update (the weights do not change within an update), then
        the mask over all of them (``batch_rule_keeps``); None for a weight-0 stand-in. With data parallelism every
        rank's rows join it (``parallel.gather_objects``), so the statistic is the whole mini-batch's, as on one
        process (docs/algorithms.md#batch-rules-scope)."""
        forwards = []
        for micro in micros:  # every rank runs as many forwards (FSDP gathers parameters in each)
            chosen = [picked[i] for i in micro.rows]
            given = replace(inputs.rows, picked=chosen)
            logprobs, entropy, tensors = self._micro_forward([batch[i] for i in chosen], given)
            if micro.real:
                forwards.append((logprobs, entropy, advantages[chosen].to(logprobs.device), tensors))
        positions = [i for micro in micros if micro.real for i in micro.rows]  # this rank's rows in the mini-batch
        masks = iter(batch_rule_keeps(forwards, self.method, positions=positions, gather=self.parallel.gather_objects))
        return [next(masks) if micro.real else None for micro in micros]

    def _micro_forward(
        self, rows: list[Experience], given: RowInputs
    ) -> tuple[torch.Tensor, torch.Tensor, TokenInputs]:
        """The policy's log-probs and entropies of one micro-batch (each distinct prompt runs once, shared by its
        group: ``grouped_response_logprobs``), (B, T) each, and the loss's (B, T) inputs (``TokenInputs``)."""
        logprobs, entropy, mask, *extra = self.policy(
            [e.prompt_ids for e in rows], [e.response_ids for e in rows], self.pad_id, sampling=self.sampling,
            with_entropy=True, entropy_grad=self.method.needs.entropy_grad, **given.forward_keywords(rows),
        )  # (B, T) x3, and the log-probs (B, T, K) of the sampler's top-K ids where the method reads them  # fmt: skip
        return logprobs, entropy, given.padded(rows, mask, *extra)  # the loss's tokens and its other (B, T) inputs

    def _micro_loss(
        self,
        rows: list[Experience],
        advantages: torch.Tensor,
        given: RowInputs | None = None,
        batch_keep: BatchKeep | None = None,
    ) -> LossTerms:
        """``LossTerms`` of one micro-batch: its forward (``_micro_forward``), then the method's loss terms, with
        ``batch_keep`` its part of a batch rule's mask over the mini-batch (``_batch_rule``) where there is one."""
        logprobs, entropy, tensors = self._micro_forward(rows, given or RowInputs())
        return loss_terms(logprobs, entropy, advantages.to(logprobs.device), tensors, self.method,
                          batch_keep=batch_keep)  # fmt: skip

    def _schedule_lr(self) -> None:
        """Every parameter group at ``optim.lr`` times the schedule's factor at slot ``lr_slot``."""
        rate = self.optim.lr * self.schedule.factor(self.lr_slot)
        for group in self.optimizer.param_groups:
            group["lr"] = rate

    def _optimizer_step(self, scale: float, skipped: bool) -> float:
        """AdamW's step at the learning rate times ``scale`` (this update only), unless ``skipped``; the rate used."""
        configured = [group["lr"] for group in self.optimizer.param_groups]
        for group, lr in zip(self.optimizer.param_groups, configured, strict=True):
            group["lr"] = lr * scale
        used = self.optimizer.param_groups[0]["lr"]
        if not skipped:
            self.optimizer.step()
        for group, lr in zip(self.optimizer.param_groups, configured, strict=True):
            group["lr"] = lr
        return used

    def _skip_nonfinite(self, loss: float, grad_norm: float) -> bool:
        """Whether this update is skipped: a non-finite loss or gradient norm (a NaN reward or log-prob upstream)
        would write NaN into every weight and the AdamW moments. Then the gradients are dropped and the weights
        and optimizer state stay as they are; one warning line names the step and what was non-finite."""
        values = (("loss", loss), ("gradient norm", grad_norm))
        bad = [f"{name} {value}" for name, value in values if not math.isfinite(value)]
        if not bad:
            return False
        self.optimizer.zero_grad(set_to_none=True)
        if self.parallel.rank == 0:
            log.warning(
                "train step %d: non-finite %s: optimizer update skipped, weights and optimizer state unchanged",
                self.version + 1,
                " and ".join(bad),
            )
        return True
