"""The trainer: one batch of whole groups in, one (or more) optimizer steps out, a new policy version; and
``TrainerWorker``, the role a backend hosts (train, weights snapshots, evaluation, its part of a checkpoint).

It moves data and calls ``oprl.algorithms`` for every formula; it never re-derives the math and does not
know which preset runs. A step reads top to bottom: advantages -> (per mini-batch) log-probs -> loss ->
backward -> clip -> optimizer step -> metrics. Micro-batching accumulates gradients with exact weights
(token shares for token-mean, row shares for the seq-mean modes), so it trades memory only.

Data parallelism (``oprl.trainer.distributed``) plugs in as ``parallel``: every rank sees the whole batch
(advantages, permutation and the global normaliser are the same everywhere), trains on its share of whole
groups, and the micro-batch weights use the mini-batch's global count, so N ranks compute the single-process
loss and gradient.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import time
from collections import defaultdict
from typing import TYPE_CHECKING

import torch

from oprl.algorithms import (
    DISTILL_KEYS,
    WEIGHTED_BASELINES,
    LossParams,
    advantage_settings,
    aggregate,
    aggregation_count,
    baseline_gap,
    distill_advantages,
    distill_metrics,
    effective_sample_size,
    ess_lr_scale,
    group_advantages,
    kl_penalty,
    kondo_gate,
    off_policy_baseline_log_weights,
    policy_loss,
    ratio_stats,
    sequence_log_ratios,
)
from oprl.algorithms.distill import LOGPROB_FLOOR
from oprl.checkpoint.files import load_trainer_state, save_trainer_state
from oprl.errors import OprlError
from oprl.messages import Experience, TrainResult, batch_metrics
from oprl.models.batching import right_pad_values
from oprl.models.truncation import Sampling
from oprl.schedule import stream_seed
from oprl.trainer import score_norms
from oprl.trainer.distributed import SingleProcess
from oprl.trainer.staleness import mask_stale_tokens, token_lag_metrics
from oprl.worker_parts import Clock, load_model, make_engine, trainable_weights

if TYPE_CHECKING:
    from oprl.config import RunConfig

# ``Trainer`` imports no config, task or evaluation module (they need pydantic): benchmarks/gpu_check.py runs it
# on a machine without pydantic. ``TrainerWorker`` imports them where it uses them.

log = logging.getLogger("oprl.trainer")

SKIPPED = "optim/skipped_updates"
"""The optimizer updates of a step skipped for a non-finite loss or gradient norm (``Trainer._skip_nonfinite``)."""

AGGREGATED_METRICS = ("loss/pg_loss", "loss/reg_loss", "loss/total", "kl/ref")
"""Micro-batch metrics aggregated like the loss (``loss_agg``), so averaged with the loss's micro-batch shares."""


class Trainer:
    def __init__(
        self,
        model,
        *,
        pad_id: int,
        settings: dict,
        optim,
        sampling: Sampling,
        max_response_tokens: int,
        kl_coef: float = 0.0,
        kl_estimator: str = "k3",
        entropy_coef: float = 0.0,
        seed: int = 0,
        log_ref_kl_every: int = 0,
        parallel: SingleProcess | None = None,
        activation_checkpointing: bool = False,
        autocast: torch.dtype | None = None,
        max_token_lag: int | None = None,
        teacher_logprob_floor: float = LOGPROB_FLOOR,
    ):
        self.model = model
        self.max_token_lag = max_token_lag
        """Tokens sampled more than this many versions ago leave the loss (``staleness.mask_stale_tokens``)."""
        self.pad_id = pad_id
        self.advantage_kwargs = advantage_settings(settings)
        # The loss's settings, typed, once (a fixed normaliser for Dr.GRPO: the padded width varies per
        # micro-batch and would bias it).
        fixed = settings["loss_agg"] == "seq-mean-token-sum-norm"
        self.loss_params = LossParams.of(settings, normalizer=float(max_response_tokens) if fixed else None)
        self.recompute_proximal = settings["recompute_proximal"]  # the loss asks for π_prox (decoupled PPO)
        # VCPO (oprl.algorithms.variance): each step's learning rate scaled by the mini-batch's ESS, and the
        # off-policy optimal baseline, whose per-response weights need each response's score norm.
        self.ess_lr, self.ess_lr_base = settings["ess_lr"], settings["ess_lr_base"]
        self.weighted_baseline = settings["baseline"] in WEIGHTED_BASELINES
        # The Kondo gate (oprl.algorithms.delight): its settings and the recent responses' delights, across steps.
        self.kondo = {key: settings[key] for key in ("kondo_rate", "kondo_temperature", "kondo_window")}
        self.kondo_delights = torch.zeros(0)
        self.scores = score_norms.ScorePass(autocast)  # score_statistics' batched pass
        # Distillation: per-token advantages from the rows' teacher log-probs (oprl.algorithms.distill).
        self.distill_kwargs = {key: settings[key] for key in DISTILL_KEYS}
        self.teacher_logprob_floor = teacher_logprob_floor  # teacher.logprob_floor: −inf (outside its support) -> it
        self.optim = optim
        self.sampling = sampling
        """The rollouts' ``Sampling``: every log-prob is scored under the distribution the sampler drew from,
        temperature, then its kept set rebuilt from the current logits (oprl.models.logprobs; rho = 1 on-policy)."""
        self.kl_coef, self.kl_estimator, self.entropy_coef = kl_coef, kl_estimator, entropy_coef
        self.seed = seed
        self.version = 0
        self.parallel = parallel or SingleProcess()
        self.ref_model: torch.nn.Module | None = None
        self.reference: torch.nn.Module | None = None
        self.log_ref_kl_every = log_ref_kl_every
        if kl_coef > 0 or log_ref_kl_every > 0:
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
            self.reference = self.parallel.wrap(self.ref_model, trainable=False, autocast=autocast)
        # The module computing (logprobs, entropy, mask); wrapping (FSDP/DDP) happens before the optimizer exists.
        # Under ``autocast`` it computes in bfloat16; the parameters and the optimizer below stay float32.
        self.policy = self.parallel.wrap(model, activation_checkpointing=activation_checkpointing, autocast=autocast)
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
        sampled, masked_frac = batch, None
        if self.max_token_lag is not None:  # data shaping before the loss; the loss itself is unchanged
            batch, masked_frac = mask_stale_tokens(batch, self.version, self.max_token_lag)
        generator = torch.Generator().manual_seed(stream_seed(self.seed, self.version))
        rewards = torch.tensor([e.reward for e in batch], dtype=torch.float32)  # (N,)
        group_ids = torch.tensor([e.group_id for e in batch], dtype=torch.long)  # (N,)
        totals: dict[str, float] = defaultdict(float)
        extremes: dict[str, float] = {}
        log_weights, baseline_metrics = None, {}
        if self.weighted_baseline:  # the baseline's per-response weights, from the weights before this step
            tick = time.perf_counter()
            log_ratios, score_sq_norms = self.score_statistics(batch)  # (N,), (N,)
            log_weights = off_policy_baseline_log_weights(log_ratios, score_sq_norms)
            totals["perf/train_score_s"] = time.perf_counter() - tick
            baseline_metrics["vcpo/score_norm_mean"] = float(score_sq_norms.sqrt().mean())
        lengths = loss_mask_of(batch, max(len(e.response_ids) for e in batch)).sum(-1)  # (N,) red_weight's L_i
        adv = group_advantages(
            rewards,
            group_ids,
            generator=generator,
            log_weights=log_weights,
            response_lengths=lengths,
            **self.advantage_kwargs,
        )
        if log_weights is not None:  # how far the weighted baseline moved from the group mean, in reward units
            baseline_metrics["vcpo/baseline_gap"] = float(baseline_gap(rewards, group_ids, adv.baseline))
        if self.kondo["kondo_rate"] is not None:  # rows the gate skips train with A = 0
            adv, kondo_metrics = self._kondo_gate(batch, adv, generator)
            baseline_metrics |= kondo_metrics
        kept = adv.keep.nonzero().squeeze(-1)
        # π_prox: the weights before this step's first update, for every row, whatever the mini-batch order.
        proximal = self.proximal_logprobs(batch) if self.recompute_proximal else None
        updates = 0
        for _ in range(self.optim.epochs):
            order = kept[torch.randperm(len(kept), generator=generator)] if self.optim.mini_batches > 1 else kept
            for rows in order.tensor_split(self.optim.mini_batches):
                if len(rows) == 0:
                    continue
                picked = rows.tolist()
                metrics = self._update(
                    [batch[i] for i in picked],
                    adv.advantages[rows],
                    [proximal[i] for i in picked] if proximal else None,
                )
                updates += 1
                merge_metrics(totals, extremes, metrics)
        # Metrics are averaged over the optimizer updates of this step; seconds and skipped updates add up.
        out = {key: value if key.startswith("perf/") or key == SKIPPED else value / max(updates, 1)
               for key, value in totals.items()}  # fmt: skip
        out |= extremes | baseline_metrics
        out.update(self._batch_metrics(sampled, adv, self.version))
        out |= {f"adv/{key}": float(value) for key, value in adv.metrics.items()}  # adaptive RED-Weight's
        if masked_frac is not None:
            out["batch/stale_token_masked_frac"] = masked_frac
        self.version += 1
        out["perf/train_s"] = time.perf_counter() - start
        out["perf/train_tokens_per_s"] = out["response/tokens"] * self.optim.epochs / out["perf/train_s"]
        return out

    def _kondo_gate(self, batch: list[Experience], adv, generator: torch.Generator):
        """``(adv with the skipped rows' advantages 0, kondo/* metrics)``: ``kondo_gate`` on the current policy's
        log-probs of ``batch`` (one forward without grad, ``proximal_logprobs``); the window is kept for the next
        step."""
        width = max(len(e.response_ids) for e in batch)
        screen = right_pad_values(self.proximal_logprobs(batch), width)  # (N, T)
        rate, temperature, window = (self.kondo[key] for key in ("kondo_rate", "kondo_temperature", "kondo_window"))
        gate = kondo_gate(
            adv.advantages,
            screen,
            loss_mask_of(batch, width),
            self.kondo_delights,
            rate=rate,
            temperature=temperature,
            window_size=window,
            generator=generator,
        )
        self.kondo_delights = gate.window
        metrics = {f"kondo/{key}": float(value) for key, value in gate.metrics.items()}
        return dataclasses.replace(adv, advantages=gate.advantages), metrics

    @torch.no_grad()
    def proximal_logprobs(self, rows: list[Experience]) -> list[list[float]]:
        """log π_prox of every response token of ``rows`` under the current (pre-update) weights: the loss's
        computation (train mode, micro-batches of ``micro_batch_size``) without grad. Every rank computes every
        row, so data-parallel ranks run the same forwards (FSDP gathers parameters in each)."""
        self.model.train()
        out: list[list[float]] = []
        size = self.optim.micro_batch_size
        for start in range(0, len(rows), size):
            micro = rows[start : start + size]
            logprobs, _, mask = self.policy(
                [e.prompt_ids for e in micro],
                [e.response_ids for e in micro],
                self.pad_id,
                sampling=self.sampling,
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
        out = self.scores.run(self.model, rows, self.pad_id, self.sampling, loss_mask_of, self.optim.micro_batch_size)
        out = out or self.looped_score_statistics(rows)
        self.optimizer.zero_grad(set_to_none=True)
        return out

    def looped_score_statistics(self, rows: list[Experience]) -> tuple[torch.Tensor, torch.Tensor]:
        """``score_statistics`` with one forward and backward per row through the trainer's own forward (the
        fallback, and the batched pass's test reference). Every data-parallel rank computes every row in the same
        order, so the reduction averages equal gradients: each rank gets the row's own."""
        self.model.train()
        params = [p for p in self.model.parameters() if p.requires_grad]
        log_ratios, sq_norms = [], []
        for row in rows:
            self.optimizer.zero_grad(set_to_none=True)
            with self.parallel.gradient_sync(True):
                logprobs, _, mask = self.policy(
                    [row.prompt_ids], [row.response_ids], self.pad_id, sampling=self.sampling
                )  # (1, T), _, (1, T)
                mask = mask & loss_mask_of([row], mask.shape[1]).to(mask.device)
                torch.where(mask, logprobs, torch.zeros_like(logprobs)).sum().backward()
            behavior = right_pad_values([row.behavior_logprobs], mask.shape[1]).to(logprobs.device)  # (1, T)
            log_ratios.append(sequence_log_ratios(logprobs, behavior, mask).float().cpu())
            sq_norms.append(self.parallel.grad_norm(params) ** 2)
        self.optimizer.zero_grad(set_to_none=True)
        return torch.cat(log_ratios), torch.tensor(sq_norms, dtype=torch.float32)

    def _update(
        self, rows: list[Experience], advantages: torch.Tensor, proximal: list[list[float]] | None = None
    ) -> dict[str, float]:
        """One optimizer step on ``rows`` (the whole mini-batch, on every rank) with gradient accumulation over
        this rank's micro-batches; the shares use the mini-batch's global count, whatever rank holds a row."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        # Exact accumulation: each micro-batch's mean is re-weighted by its share of the mini-batch's count
        # (oprl.algorithms.aggregation_count: tokens for token-mean, sequences otherwise).
        covered = loss_mask_of(rows, max(len(e.response_ids) for e in rows))  # (B, T): the tokens the loss covers
        loss_agg = self.loss_params.loss_agg
        total, total_tokens = (max(float(aggregation_count(covered, agg)), 1.0) for agg in (loss_agg, "token-mean"))
        sums: dict[str, float] = defaultdict(float)
        extremes: dict[str, float] = {}
        chunks = self.parallel.micro_batches(rows, self.optim.micro_batch_size)
        row_log_ratios: list[float] = []  # this rank's responses' log w_i, for the ESS of the step's size
        for index, chunk in enumerate(chunks):
            # An empty chunk (this rank holds fewer micro-batches) still runs forward/backward on one row with
            # weight 0: FSDP gathers parameters in every rank's forward and reduces gradients after the last one.
            micro = [rows[i] for i in chunk] if chunk else rows[:1]
            tokens = float(aggregation_count(covered[chunk], "token-mean")) if chunk else 0.0
            share = float(aggregation_count(covered[chunk], loss_agg)) / total if chunk else 0.0
            tick = time.perf_counter()
            with self.parallel.gradient_sync(index == len(chunks) - 1):
                picked = chunk if chunk else [0]
                micro_proximal = [proximal[i] for i in picked] if proximal is not None else None
                collect = row_log_ratios if chunk and self.ess_lr != "none" else None
                loss, metrics = self._micro_loss(micro, advantages[picked], micro_proximal, collect)
                tock = time.perf_counter()
                # grad_scale undoes the data-parallel average over ranks (1 on one process).
                (loss * (share * self.parallel.grad_scale)).backward()
            sums["perf/train_forward_s"] += tock - tick  # log-probs (+ reference forward) and the loss
            sums["perf/train_backward_s"] += time.perf_counter() - tock
            if not chunk:
                continue
            # Loss values are means in the loss's own aggregation (its share); the rest are token means.
            merge_metrics(sums, extremes, metrics, tokens / total_tokens, dict.fromkeys(AGGREGATED_METRICS, share))
        tick = time.perf_counter()
        grad_norm = self.parallel.clip_grad_norm(self.model.parameters(), self.optim.grad_clip)
        configured = [group["lr"] for group in self.optimizer.param_groups]
        scaled: dict[str, float] = {}
        if self.ess_lr != "none":  # VCPO: this step's learning rate times g(ESS of the mini-batch's responses)
            every = torch.tensor(self.parallel.gather(row_log_ratios), dtype=torch.float64)
            scale, ess = ess_lr_scale(every, self.ess_lr, self.ess_lr_base)
            for group, lr in zip(self.optimizer.param_groups, configured, strict=True):
                group["lr"] = lr * float(scale)
            scaled = {"vcpo/lr_scale": float(scale), "vcpo/ess": float(ess)}
        lr_used = self.optimizer.param_groups[0]["lr"]
        # Reduced before the step: every rank then sees the same loss and norm, so all of them skip or none.
        sums, extremes = self.parallel.reduce_metrics(dict(sums), extremes)
        skipped = self._skip_nonfinite(sums.get("loss/total", 0.0), grad_norm)
        if not skipped:
            self.optimizer.step()
        for group, lr in zip(self.optimizer.param_groups, configured, strict=True):
            group["lr"] = lr  # the scale is this step's only
        sums["perf/train_optimizer_s"] = time.perf_counter() - tick
        sums["optim/grad_norm"] = float(grad_norm)
        sums["optim/lr"] = lr_used
        sums[SKIPPED] = float(skipped)
        return sums | extremes | scaled

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

    def _micro_loss(
        self,
        rows: list[Experience],
        advantages: torch.Tensor,
        proximal: list[list[float]] | None,
        log_ratios: list[float] | None = None,
    ):
        """``(loss, metrics)`` of one micro-batch; with ``log_ratios`` (a list) each response's log w_i = Σ_t log ρ_t
        (rows with a valid token) is appended to it, for the ESS of VCPO's step size."""
        prompts, responses = [e.prompt_ids for e in rows], [e.response_ids for e in rows]
        # Each distinct prompt runs once per micro-batch, shared by its group (see grouped_response_logprobs).
        logprobs, entropy, mask = self.policy(
            prompts,
            responses,
            self.pad_id,
            sampling=self.sampling,
            with_entropy=True,
            entropy_grad=self.entropy_coef > 0,
        )  # (B, T), (B, T), (B, T)
        device = logprobs.device
        if any(e.loss_mask is not None for e in rows):
            # Multi-turn episodes: environment tokens are context only; every term below sees model tokens only.
            mask = mask & loss_mask_of(rows, mask.shape[1]).to(device)
        behavior = right_pad_values([e.behavior_logprobs for e in rows], mask.shape[1]).to(device)  # (B, T)
        advantages, distilled = self._distill(rows, advantages.to(device), behavior, mask)
        out = {f"distill/{k}": float(v) for k, v in distilled.items()}
        # Only decoupled PPO passes π_prox.
        proximal_logprobs = right_pad_values(proximal, mask.shape[1]).to(device) if proximal is not None else None
        params, band = self.loss_params, entropy.detach() if self.loss_params.entropy_eps is not None else None
        loss, metrics = policy_loss(
            logprobs, behavior, advantages.to(device), mask, params, proximal_logprobs=proximal_logprobs, entropy=band
        )
        out |= {f"loss/{k}": float(v) for k, v in metrics.items()}
        out["entropy/mean"] = float(aggregate(entropy.detach(), mask, "token-mean"))
        behavior_kl = kl_penalty(logprobs.detach(), behavior, "k3", mask)  # (B, T)
        out["kl/behavior_k3"] = float(aggregate(behavior_kl, mask, "token-mean"))
        # ρ = π_θ/π_behaviour whatever the loss uses: mismatch (rollout.dtype) and staleness, every step.
        out |= {f"rho/behavior_{k}": float(v) for k, v in ratio_stats(logprobs.detach(), behavior, mask).items()}
        ess = effective_sample_size(logprobs.detach(), behavior, mask)  # per micro-batch, averaged like the rest
        out |= {"rho/ess": float(ess["token"]), "rho/ess_seq": float(ess["sequence"])}
        if log_ratios is not None:
            log_ratios += sequence_log_ratios(logprobs, behavior, mask)[mask.any(dim=-1)].tolist()
        if self.entropy_coef > 0:
            loss = loss - self.entropy_coef * aggregate(entropy, mask, params.loss_agg, params.normalizer)
        if self.reference is not None and self._ref_kl_due():
            with torch.no_grad():
                ref_logprobs, _, _ = self.reference(prompts, responses, self.pad_id, sampling=self.sampling)
            kl_tokens = kl_penalty(logprobs, ref_logprobs, self.kl_estimator, mask)  # (B, T)
            kl = aggregate(kl_tokens, mask, params.loss_agg, params.normalizer)
            if self.kl_coef > 0:
                loss = loss + self.kl_coef * kl
            out["kl/ref"] = float(kl.detach())
        out["loss/total"] = float(loss.detach())
        return loss, out

    def _distill(self, rows: list[Experience], advantages: torch.Tensor, behavior: torch.Tensor, mask: torch.Tensor):
        """(advantages (B,) or (B, T), ``distill/*`` metrics): with ``distill_coef`` > 0 the teacher's per-token
        term enters the advantage; rows that all carry teacher log-probs are measured whatever the coefficient."""
        scored = all(e.teacher_logprobs is not None for e in rows)
        if self.distill_kwargs["distill_coef"] > 0 and not scored:
            raise OprlError(
                "algorithm.distill_coef > 0 but the batch has rows without teacher log-probs: set teacher.path, "
                "or score the stored experiences once with `oprl teacher-score`"
            )
        if not scored:
            return advantages, {}
        teacher = right_pad_values([e.teacher_logprobs or [] for e in rows], mask.shape[1]).to(
            behavior.device
        )  # (B, T)
        floor = self.teacher_logprob_floor
        if self.distill_kwargs["distill_coef"] == 0:
            return advantages, distill_metrics(behavior, teacher, mask, logprob_floor=floor)
        return distill_advantages(
            advantages, behavior, teacher, mask, **self.distill_kwargs, logprob_floor=floor
        )  # (B, T)

    def _ref_kl_due(self) -> bool:
        """Whether the step being trained (version + 1) computes the KL to the reference policy: always under
        a KL penalty, else every ``log_ref_kl_every`` steps as a metric."""
        every = self.log_ref_kl_every
        return self.kl_coef > 0 or (every > 0 and (self.version + 1) % every == 0)

    @staticmethod
    def _batch_metrics(batch: list[Experience], adv, version: int) -> dict[str, float]:
        versions = [e.policy_version for e in batch]  # each row's oldest token (the version it started with)
        lags = [version - v for v in versions]  # how many updates the weights made since each sample
        group_rewards: dict[int, set[float]] = defaultdict(set)
        for e in batch:
            group_rewards[e.group_id].add(e.reward)
        return (
            batch_metrics(batch)
            | {
                # Groups whose rewards are all equal: A = r - baseline = 0 for each of their responses.
                "adv/zero_groups_frac": sum(len(r) == 1 for r in group_rewards.values()) / len(group_rewards),
                "lag/min": float(min(lags)),
                "lag/mean": sum(lags) / len(lags),
                "lag/max": float(max(lags)),
                "adv/keep_frac": 1 - float(adv.dropped.float().mean()),
                "adv/abs_mean": float(adv.advantages[~adv.dropped].abs().mean()) if not adv.dropped.all() else 0.0,
                "batch/start_version_max": float(max(versions)),
                "batch/use_count_mean": sum(e.use_count for e in batch) / len(batch),
            }
            | token_lag_metrics(batch, version)
        )  # batch/version_min|max over tokens, lag/token_*


def merge_metrics(sums: dict, extremes: dict, metrics: dict, weight: float = 1.0, weights: dict | None = None) -> None:
    """Accumulate one update's (or micro-batch's) ``metrics``: ``*_min`` / ``*_max`` keys keep their extreme, the
    others add into ``sums`` times their weight (``weights[key]``, else ``weight``)."""
    for key, value in metrics.items():
        if key.endswith("_min") or key.endswith("_max"):
            pick = min if key.endswith("_min") else max
            extremes[key] = pick(extremes.get(key, value), value)
        else:
            sums[key] += value * (weights or {}).get(key, weight)


def train_result(metrics: dict[str, float], version: int, batch: list[Experience], clock: Clock) -> TrainResult:
    """The worker's report of a step: ``metrics`` (columns only), the version reached, the newest version a
    response started with, the worker's clock totals."""
    totals = clock.totals()
    start_version = max(e.policy_version for e in batch)
    return TrainResult(metrics, version, start_version, busy_s=totals["busy_s"], idle_s=totals["idle_s"])


def loss_mask_of(rows: list[Experience], width: int) -> torch.Tensor:
    """(B, width) bool: True at the response tokens the model produced (all of them for single-turn rows)."""
    masks = [e.loss_mask if e.loss_mask is not None else [1] * len(e.response_ids) for e in rows]
    return right_pad_values(masks, width) > 0


def build_trainer(config: RunConfig, model, pad_id: int, parallel: SingleProcess | None = None) -> Trainer:
    """The ``Trainer`` of ``config`` around ``model`` (one process, or one rank of ``parallel``)."""
    from oprl.config import algorithm_settings
    from oprl.models.loading import resolve_device
    from oprl.models.precision import autocast_dtype

    algo = config.algorithm
    return Trainer(
        model,
        pad_id=pad_id,
        settings=algorithm_settings(config),
        optim=config.optim,
        sampling=Sampling.of(config.rollout),
        max_response_tokens=config.rollout.max_new_tokens,
        kl_coef=algo.kl_coef,
        kl_estimator=algo.kl_estimator,
        entropy_coef=algo.entropy_coef,
        seed=config.seed,
        log_ref_kl_every=algo.log_ref_kl_every,
        parallel=parallel,
        activation_checkpointing=config.trainer.activation_checkpointing,
        autocast=autocast_dtype(config.trainer.autocast, resolve_device(config.model.device)),
        max_token_lag=config.sync.max_token_lag,
        teacher_logprob_floor=config.teacher.logprob_floor,
    )


class TrainerWorker:
    """The trainer role: owns the policy being trained, its optimizer and version; evaluates that policy."""

    def __init__(self, config: RunConfig, model_path: str, cpu_snapshots: bool = False):
        from oprl.tasks import build_task

        self.clock = Clock()
        self.config = config
        self.cpu_snapshots = cpu_snapshots
        self.task = build_task(config.task)
        self.model, self.tokenizer = load_model(config, model_path)
        self.engine = make_engine(config, self.model, self.tokenizer)
        self.trainer = build_trainer(config, self.model, self.tokenizer.pad_token_id)

    def ping(self) -> int:
        return self.trainer.version

    def train(self, step: int, batch: list[Experience]) -> TrainResult:
        if self.trainer.version != step - 1:
            raise RuntimeError(f"trainer holds version {self.trainer.version}, asked to train step {step}")
        with self.clock.work():
            metrics = self.trainer.step(batch)
        return train_result(metrics, self.trainer.version, batch, self.clock)

    def weights(self) -> dict[str, torch.Tensor]:
        with self.clock.work():
            return trainable_weights(self.model, to_cpu=self.cpu_snapshots)

    def evaluate(self, step: int) -> dict[str, float]:
        with self.clock.work():
            from oprl.episodes.evaluation import evaluation_row

            return evaluation_row(self.config, self.engine, self.task, self.tokenizer, step)

    def save(self, directory: str) -> int:
        """Model, optimizer, RNG and version into ``directory`` (part of a checkpoint)."""
        with self.clock.work():
            save_trainer_state(directory, self.model, self.trainer.optimizer, self.trainer.version)
        return self.trainer.version

    def restore(self, directory: str) -> int:
        self.trainer.version = load_trainer_state(directory, self.model, self.trainer.optimizer)
        return self.trainer.version

    def save_final(self, directory: str) -> None:
        """The trained model as a Hugging Face directory (``from_pretrained`` loads it)."""
        with self.clock.work():
            self.model.save_pretrained(directory)
            self.tokenizer.save_pretrained(directory)
