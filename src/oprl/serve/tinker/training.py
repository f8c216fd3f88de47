"""A training model's two computing requests: ``forward_backward`` (per-datum target log-probs under the served
distribution, the loss of ``losses.py``, its gradient added to ``.grad`` once finite, micro-batched, shared loss-free
prefixes run once) and ``optim_step`` (one AdamW step with the call's ``AdamParams``, refused on a non-finite
gradient). Plain data in and out (``records.py``); they run on the server's compute lane (``futures.py``)."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from typing import Any

import numpy as np
import torch

from oprl.algorithms.losses import BATCH_RULES
from oprl.models.batching import right_pad
from oprl.models.logprobs import pack, prefix_shared_logprobs, response_logprobs
from oprl.serve.tinker.errors import UserError, check_tokens, context_of
from oprl.serve.tinker.finite import CallGradient, checked_adam_params, refusal, suspect_rows
from oprl.serve.tinker.losses import OPTIONAL_INPUTS, LossSpec, compute_loss
from oprl.serve.tinker.models import Policy
from oprl.serve.tinker.records import Datum, ForwardBackward, ForwardOutput
from oprl.serve.tinker.sampling import SERVED

MICRO_BATCH_TOKENS = 2048
"""Padded tokens (rows × the longest row) per forward/backward micro-batch (``--micro-batch-tokens``): the losses
are sums, so micro-batches add up to the call's loss and gradient; what bounds is the activations' memory, about
2 MB a token for SmolLM2-135M in float32 (its 49,152-wide head and 30 layers): 8192 tokens took the server past
15 GB on the SmolLM2 recipe. A preset with a batch rule (M2PO, BAPO: ``losses.BATCH_RULES``) reads the whole
call's tokens, so it runs as one micro-batch."""


def forward_backward(
    policy: Policy,
    request: ForwardBackward,
    spec: LossSpec,
    device: str,
    group_prefixes: bool = True,
    skip_zero_gradient: bool = True,
    micro_batch_tokens: int = MICRO_BATCH_TOKENS,
) -> ForwardOutput:
    """Per-datum target log-probs (and elementwise loss) and the metrics, the loss's gradient added to
    ``.grad`` unless ``forward_only`` (``wire.encode_forward_backward_output`` makes the SDK's
    ``ForwardBackwardOutput`` of it). A call whose loss or gradient is not finite adds nothing and fails
    naming its datums (``finite.py``). ``skip_zero_gradient``: leave out the autograd work whose gradient is 0
    (``target_logprobs``' ``everywhere``; off, every position runs under autograd, as before #68's change)."""
    vocab, limit = len(policy.tokenizer), context_of(policy.model)  # once per call: both cost more than a datum
    rows = [checked_datum(policy, d, spec, f"data[{i}]", vocab, limit) for i, d in enumerate(request.data)]
    outputs: list[dict[str, np.ndarray]] = []
    total, weights, suspects = 0.0, 0, []
    metrics: dict[str, float] = {}
    gradient = None if request.forward_only else CallGradient(list(policy.trainable().values()))
    # A batch rule (M2PO, BAPO) reads the whole call's tokens: one micro-batch then.
    whole = spec.preset is not None and spec.preset["clip_mode"] in BATCH_RULES
    budget = math.inf if whole else micro_batch_tokens
    everywhere = spec.name == "dro" or not skip_zero_gradient  # dro's penalty reaches every position
    try:
        for micro in _micro_batches(rows, budget):
            with torch.set_grad_enabled(gradient is not None):
                logprobs, inputs, mask = target_logprobs(policy, micro, device, group_prefixes, everywhere)
                loss, elementwise, values = compute_loss(spec, logprobs, inputs, mask)
                loss_value = float(loss.detach())
                if gradient is not None and not math.isfinite(loss_value):
                    rows_here = suspect_rows(logprobs, inputs, mask, elementwise, ratio=False)
                    raise refusal("loss", [len(outputs) + i for i in rows_here], loss_value)
                if gradient is not None and loss.requires_grad:  # else every datum ran forward only: gradient 0
                    loss.backward()
            suspects += [len(outputs) + i for i in suspect_rows(logprobs, inputs, mask, elementwise, ratio=True)]
            total += loss_value
            for key, value in values.items():  # token-weighted over micro-batches
                metrics[key] = metrics.get(key, 0.0) + value * int(mask.sum())
            weights += int(mask.sum())
            outputs += _datum_outputs(logprobs, elementwise, mask)
        if gradient is not None and not gradient.finite():
            raise refusal("gradient", suspects)
    except BaseException:
        if gradient is not None:
            gradient.close(keep=False)
        raise
    if gradient is not None:
        gradient.close(keep=True)
        policy.announced |= spec.announcement()
    reported = {"loss:sum": total} | {
        f"{key}:{_reduction(key)}": value / max(weights, 1) for key, value in metrics.items()
    }
    return ForwardOutput(outputs, reported | spec.announcement())


def checked_datum(
    policy: Policy, datum: Datum, spec: LossSpec, where: str, vocab: int | None = None, limit: int | None = -1
) -> dict[str, Any]:
    """The datum's tokens, targets and float inputs, each (N,), after checking lengths and token ranges
    (``vocab`` / ``limit``: the tokenizer's size and the model's context, looked up when not given)."""
    n = len(datum.tokens)
    vocab = len(policy.tokenizer) if vocab is None else vocab
    limit = context_of(policy.model) if limit == -1 else limit
    if n == 0:
        raise UserError(f"{where}.model_input: empty")
    if limit is not None and n > limit:
        raise UserError(f"{where}.model_input: {n} tokens exceed the model's context of {limit}")
    for name in spec.inputs:
        if name not in datum.inputs:
            raise UserError(f"{where}.loss_fn_inputs.{name}: required by {spec.name}")
    for name in datum.inputs:
        if name not in spec.inputs and name not in OPTIONAL_INPUTS:
            raise UserError(f"{where}.loss_fn_inputs.{name}: not an input of {spec.name}")
    for name, values in datum.inputs.items():
        if values.reshape(-1).shape[0] != n:
            raise UserError(f"{where}.loss_fn_inputs.{name}: {values.size} values for {n} model_input tokens")
    check_tokens(datum.tokens, vocab, f"{where}.model_input")
    target_array = datum.inputs["target_tokens"].reshape(-1).astype(np.int64)
    if target_array.size and not (target_array.min() >= 0 and target_array.max() < vocab):  # one pass in numpy
        check_tokens(target_array.tolist(), vocab, f"{where}.loss_fn_inputs.target_tokens")  # names the culprit
    targets = target_array.tolist()
    floats = {k: v.reshape(-1).astype(np.float32) for k, v in datum.inputs.items() if k != "target_tokens"}
    for name, values in floats.items():
        if not np.isfinite(values).all():
            raise UserError(f"{where}.loss_fn_inputs.{name}: holds NaN or infinite values")
    return {"tokens": datum.tokens, "targets": targets, "inputs": floats}


def target_logprobs(
    policy: Policy, rows: list[dict[str, Any]], device: str, group_prefixes: bool = True, everywhere: bool = True
):
    """``(log π(y_t | x_≤t) (B, T), inputs (B, T) each, mask (B, T))`` for rows of tokens x and targets y.

    When datums share a prefix that carries no loss (an RL batch: every reply of a prompt starts with that
    prompt, advantage 0 there), ``oprl.models.logprobs.prefix_shared_logprobs`` runs each such prefix once
    and only the rest per datum, as ``oprl train``'s trainer runs each prompt once for its group. Otherwise
    ``response_logprobs`` scores the last T columns' targets from the positions before them; laying a datum
    out as prompt ``[x_0]`` and response ``[x_1 .. x_{N-1}, pad]`` puts position t's hidden state in front of
    target t, whatever the targets are. Both use the memory-bounded chunked log-softmax, under ``SERVED``,
    the distribution the sampler draws from.

    ``everywhere=False`` says the loss has no gradient where a datum's loss inputs (``LOSS_INPUTS``) are all 0
    (every loss but dro, whose penalty reaches every position): then a datum with no such position at all (a
    group whose replies scored alike: A = 0 everywhere) runs forward only, and the shared prefixes' own
    log-probs are computed without autograd, once per distinct prefix (``prefix_grad=False``). The values are
    the same up to float rounding; only autograd work that would give a zero gradient is left out."""
    if everywhere or not torch.is_grad_enabled():
        grad = everywhere and torch.is_grad_enabled()
        logprobs, mask = _scored(policy, rows, device, group_prefixes, prefix_grad=grad)
    else:
        firsts = loss_starts(rows)
        free = [i for i, (row, first) in enumerate(zip(rows, firsts, strict=True)) if first == len(row["tokens"])]
        carrying = [i for i, (row, first) in enumerate(zip(rows, firsts, strict=True)) if first < len(row["tokens"])]
        parts = []
        if carrying:
            # A shared prefix is at least one token: one whose loss starts at position 0 needs its gradient there.
            grad = any(firsts[i] == 0 for i in carrying)
            parts.append(_scored(policy, [rows[i] for i in carrying], device, group_prefixes, prefix_grad=grad))
        if free:
            with torch.no_grad():
                parts.append(_scored(policy, [rows[i] for i in free], device, group_prefixes, prefix_grad=False))
        if len(parts) == 1:
            logprobs, mask = parts[0]
        else:
            width = max(part[1].shape[1] for part in parts)
            order = torch.argsort(torch.tensor(carrying + free, device=device))  # back to the rows' order
            logprobs = torch.cat([_widened(lp, width) for lp, _ in parts])[order]
            mask = torch.cat([_widened(m, width) for _, m in parts])[order]
    width = mask.shape[1]
    names = set().union(*(r["inputs"] for r in rows))
    inputs = {name: torch.from_numpy(_right_padded(rows, name, width)).to(device) for name in names}
    return logprobs, inputs, mask


def _scored(
    policy: Policy, rows: list[dict[str, Any]], device: str, group_prefixes: bool, prefix_grad: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logprobs (B, T), mask (B, T))`` of ``target_logprobs``: shared prefixes once where rows have them."""
    pad = policy.tokenizer.pad_token_id
    shared = None
    if group_prefixes:
        shared = shared_prefixes(rows) if torch.is_grad_enabled() else common_prefixes(rows)
    if shared is not None:
        tokens, targets = [r["tokens"] for r in rows], [r["targets"] for r in rows]
        scored = prefix_shared_logprobs(
            policy.model, tokens, targets, shared, pad, sampling=SERVED, prefix_grad=prefix_grad
        )
        if scored is not None:
            return scored
    prompts = [r["tokens"][:1] for r in rows]
    responses = [[*r["tokens"][1:], pad] for r in rows]
    input_ids, attention, _, mask = (t.to(device) for t in pack(prompts, responses, pad))
    targets_t, _ = right_pad([r["targets"] for r in rows], 0)
    logprobs, _ = response_logprobs(policy.model, input_ids, attention, targets_t.to(device), sampling=SERVED)
    return logprobs, mask


def _widened(values: torch.Tensor, width: int) -> torch.Tensor:
    """(B, T) -> (B, width), zeros (False) appended."""
    return torch.nn.functional.pad(values, (0, width - values.shape[1]))


def _right_padded(rows: list[dict[str, Any]], name: str, width: int) -> np.ndarray:
    """The rows' float input ``name`` as (B, width) float32, zeros after each row's end (one array filled in place:
    a pad and a stack per row cost more than the forward on the RL batches of a small model). A name missing from
    some rows is refused by ``checked_datum``'s required list."""
    out = np.zeros((len(rows), width), np.float32)
    for i, row in enumerate(rows):
        values = row["inputs"][name]
        out[i, : len(values)] = values
    return out


def optim_step(policy: Policy, params: dict[str, Any]) -> dict[str, Any]:
    """One AdamW step with this call's ``AdamParams`` (learning_rate, beta1, beta2, eps, weight_decay:
    decoupled, as torch.optim.AdamW; grad_clip_norm: global norm, 0 = off), then the gradients are cleared."""
    fields = {"learning_rate": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12, "weight_decay": 0.0}
    values = checked_adam_params(params, {**fields, "grad_clip_norm": 0.0})
    clip = values.pop("grad_clip_norm")
    if values["learning_rate"] < 0 or not 0 <= values["beta1"] < 1 or not 0 <= values["beta2"] < 1:
        raise UserError("adam_params: learning_rate must be >= 0 and beta1, beta2 in [0, 1)")
    trainable = list(policy.trainable().values())
    grads = [p.grad for p in trainable if p.grad is not None]
    norms = [torch.linalg.vector_norm(g) for g in grads]
    norm = float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0  # before clipping
    if not math.isfinite(norm):  # each call's gradient was finite (forward_backward): their sum overflowed
        policy.optimizer.zero_grad(set_to_none=True)
        policy.announced.clear()
        raise UserError(
            f"optim_step: the accumulated gradient's norm is {norm}; the step was not taken and the gradient "
            "was cleared (the weights and optimizer state are untouched)"
        )
    if clip > 0 and grads:
        torch.nn.utils.clip_grad_norm_(trainable, clip)
    for group in policy.optimizer.param_groups:
        group.update(
            lr=values["learning_rate"],
            betas=(values["beta1"], values["beta2"]),
            eps=values["eps"],
            weight_decay=values["weight_decay"],
        )
    policy.optimizer.step()
    policy.optimizer.zero_grad(set_to_none=True)
    policy.version += 1
    announced, policy.announced = policy.announced, {}
    return {"metrics": {"grad_norm:mean": norm, "learning_rate:mean": values["learning_rate"], **announced}}


LOSS_INPUTS = ("advantages", "weights", "mask")
"""The loss inputs that say whether a position carries loss (every built-in loss and preset is 0 where they are)."""


def loss_starts(rows: list[dict[str, Any]]) -> list[int]:
    """Per datum, its first position whose advantage, weight or mask is non-zero (its length when none is)."""
    firsts = []
    for row in rows:
        carrying = [np.flatnonzero(row["inputs"][name]) for name in LOSS_INPUTS if name in row["inputs"]]
        firsts.append(min((int(c[0]) for c in carrying if c.size), default=len(row["tokens"])))
    return firsts


def shared_prefixes(rows: list[dict[str, Any]]) -> list[int] | None:
    """Per datum, how many of its first input tokens to run as a shared prefix: its start before the first
    position whose advantage, weight or mask is non-zero (the prompt of an RL datum; at least 1), or None when
    no two datums start with the same such prefix (nothing to share: the datums run whole). Only where to cut;
    the log-probs and gradients are those of the whole datum either way (a prefix position's loss, e.g. dro's
    penalty, reaches the shared pass through each datum's gathered copy of its hidden state)."""
    lengths = [max(1, first) for first in loss_starts(rows)]
    starts = Counter(tuple(row["tokens"][:n]) for row, n in zip(rows, lengths, strict=True))
    return lengths if any(count > 1 and len(start) > 1 for start, count in starts.items()) else None


def common_prefixes(rows: list[dict[str, Any]]) -> list[int] | None:
    """For a forward without gradient (nothing is loss-free or not): per datum, the longest start it shares with
    another datum (at least 1, at most its length), or None when no two datums share two tokens. The longest
    common prefix of a row with any other is the longer of those with its neighbours in sorted order."""
    tokens = [row["tokens"] for row in rows]
    order = sorted(range(len(rows)), key=lambda i: tokens[i])
    lengths = [1] * len(rows)
    for a, b in itertools.pairwise(order):
        x, y = tokens[a], tokens[b]
        n = next((k for k, (u, v) in enumerate(zip(x, y, strict=False)) if u != v), min(len(x), len(y)))
        lengths[a], lengths[b] = max(lengths[a], n), max(lengths[b], n)
    return lengths if max(lengths) > 1 else None


def _datum_outputs(logprobs: torch.Tensor, elementwise: torch.Tensor | None, mask: torch.Tensor):
    """Per row of a micro-batch, its valid positions' ``logprobs`` (and ``elementwise_loss``) as float32 (N,)."""
    outputs = []
    for i in range(mask.shape[0]):
        valid = mask[i]
        out = {"logprobs": logprobs[i][valid].detach().float().cpu().numpy()}
        if elementwise is not None:
            out["elementwise_loss"] = elementwise[i][valid].float().cpu().numpy()
        outputs.append(out)
    return outputs


def _micro_batches(rows: list[dict[str, Any]], budget: float) -> list[list[dict[str, Any]]]:
    """Consecutive rows grouped so that rows × the longest row stays within ``budget`` tokens."""
    batches: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    longest = 0
    for row in rows:
        width = max(longest, len(row["tokens"]))  # the batch's longest row if this one joins
        if current and (len(current) + 1) * width > budget:
            batches.append(current)
            current, width = [], len(row["tokens"])
        current.append(row)
        longest = width
    return [*batches, current] if current else batches


def _reduction(key: str) -> str:
    return "min" if key.endswith("_min") else "max" if key.endswith("_max") else "mean"
