"""Per-response squared score norms ‖∇θ Σ_t log π_θ(y_it)‖² of a batch in one forward and one backward pass
(VCPO's off-policy optimal baseline, ``Inputs.score_statistics`` in ``oprl.trainer.inputs``; docs/algorithms.md#vcpo).

The gradient of a loss summed over responses is the sum of the responses' gradients; their norms need each
response's own. Instead of one backward pass per response, the batch runs once (the models' forward,
``oprl.models.logprobs.row_logprobs``, every row kept apart) while every module that owns trainable parameters
is watched (``oprl.trainer.score_watch``: the hooks, and each parameter's per-row gradient terms by the ghost-norm
identity, one-hot gathers or ``torch.func``); the terms' squared norms sum per row (``oprl.algorithms.variance``).
Each row of the batch is one response (prompt and response packed, no prompt shared between rows, so the prompt
runs once per response).

The pass is refused (``Unsupported``; the trainer then runs the per-response loop and says why in a debug log)
where the watch cannot follow a module exactly (``score_watch``) and when the parameters are FSDP shards. The
first batch of a trainer is also checked whole: per parameter, the rows' gradients must add up to the batch
gradient autograd computes in the same backward pass (a parameter used outside its module's forward would not),
else refused.

Memory, per chunk of ``rows`` responses of padded length L (prompt + response) and T (response): the forward's
activations of the chunk (a training micro-batch without prompt sharing) plus, per watched module, its output
gradient (as large as its output); float32 logits, their gradient and log-softmax, (rows, T, V) each; per
ghost-norm pair, two (rows, n, n) Gram matrices; per materialised layer rows·d_in·d_out floats (chosen only where
that is smaller than the Gram matrices). The trainer's chunk is ``optim.micro_batch_size`` rows, lowered so that
the logits stay under ``LOGIT_BYTES``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from oprl.algorithms.variance import sequence_log_ratios, squared_norms, wide
from oprl.models.batching import right_pad_values
from oprl.models.logprobs import pack, row_logprobs
from oprl.models.truncation import Sampling
from oprl.trainer.score_watch import Unsupported, Watch

log = logging.getLogger("oprl.trainer")

LOGIT_BYTES = 512 * 2**20
"""Budget of one chunk's float32 logits (rows·T·V·4 bytes, held ~3 times: logits, log-softmax, gradient)."""


@dataclass
class ScoreBatch:
    logprobs: torch.Tensor  # (B, T) detached, 0 outside ``mask``
    mask: torch.Tensor  # (B, T) bool: the tokens whose log-probs are summed
    sq_norms: torch.Tensor  # (B,) float32


def batched_score_norms(
    model,
    prompt_ids: list[list[int]],
    response_ids: list[list[int]],
    loss_mask: torch.Tensor,
    pad_id: int,
    *,
    sampling: Sampling,
    autocast: torch.dtype | None = None,
    verify: bool = False,
) -> ScoreBatch:
    """Per-row log-probs and ‖∇θ Σ_t mask·log π_θ(y_t)‖² over ``model``'s trainable parameters for the rows
    ``(prompt_ids, response_ids)``, ``loss_mask`` (B, T) selecting the tokens summed, in one forward and one
    backward pass (module docstring). ``verify``: also check that the rows' gradients add up to the batch's.
    Parameters' ``.grad`` are left untouched. Raises ``Unsupported``."""
    params = [p for p in model.parameters() if p.requires_grad]
    if any(_is_dtensor(p) for p in params):
        raise Unsupported("the parameters are FSDP shards (DTensor)")
    device = params[0].device
    input_ids, attention_mask, targets, mask = (t.to(device) for t in pack(prompt_ids, response_ids, pad_id))
    mask = mask & loss_mask.to(device)
    settings = {"device_type": device.type, "dtype": autocast or torch.bfloat16, "enabled": autocast is not None}
    with Watch(model) as watch:
        watch.batch, watch.active = len(prompt_ids), True
        with torch.autocast(**settings):
            logprobs = row_logprobs(model, input_ids, attention_mask, targets, sampling)  # (B, T)
        watch.active = False
        total = torch.where(mask, logprobs, torch.zeros_like(logprobs)).sum()
        outputs = watch.outputs()
        # The gradients at the watched modules' outputs; the parameters' own only to verify (else autograd
        # skips every weight-gradient product).
        wanted = outputs + (params if verify else [])
        found = torch.autograd.grad(total, wanted, allow_unused=True) if wanted and total.requires_grad else ()
        grads: list[torch.Tensor | None] = list(found) if found else [None] * len(wanted)
        with torch.no_grad():
            terms = watch.terms(grads[: len(outputs)], settings)
            if verify:
                _verify(params, grads[len(outputs) :], terms, loose=autocast is not None)
            sq_norms = torch.zeros(len(prompt_ids), device=device, dtype=wide(params[0]).dtype)
            cache: dict = {}
            for param_terms in terms.values():
                sq_norms += squared_norms(param_terms, len(prompt_ids), cache)
        return ScoreBatch(logprobs.detach().float(), mask, sq_norms.clamp(min=0).float())


def _verify(params, batch_grads, terms, loose: bool) -> None:
    """Per parameter, Σ_i G_i from the terms must equal autograd's gradient of the batch (module docstring)."""
    tolerance = 2e-2 if loose else 1e-4
    for param, expected in zip(params, batch_grads, strict=True):
        if expected is None:
            expected = torch.zeros_like(param)
        with torch.no_grad():
            got = sum((t.total() for t in terms.get(param, [])), torch.zeros_like(param, dtype=torch.float32))
            error = float((got - expected.float()).norm())
            scale = float(expected.float().norm())
        if not error <= tolerance * scale + 1e-6:
            shape = tuple(param.shape)
            raise Unsupported(
                f"the per-row gradients of a {shape} parameter do not add up to its batch gradient "
                f"(|difference| {error:.3g}, |gradient| {scale:.3g}): it is used outside the forward of the module "
                "that owns it"
            )


class ScorePass:
    """The trainer's batched score pass and what it learnt about the model: ``batched`` until the model is refused
    (then the trainer loops over rows from then on), ``verified`` once a first batch was checked."""

    def __init__(self, autocast: torch.dtype | None = None):
        self.autocast = autocast
        self.batched, self.verified = True, False

    def run(self, model, rows: list, pad_id: int, sampling: Sampling, loss_mask, chunk: int):
        """``score_statistics`` of ``rows``, or None where the batched pass is refused (once, with a debug log
        saying why: the caller runs the per-response loop)."""
        if not self.batched:
            return None
        try:
            out = score_statistics(
                model, rows, pad_id, sampling, loss_mask, chunk=chunk, autocast=self.autocast, verify=not self.verified
            )
        except Unsupported as exc:
            self.batched = False
            log.debug("VCPO score norms: one forward and backward per response from now on: %s", exc)
            return None
        self.verified = True
        return out


def score_statistics(
    model,
    rows: list,
    pad_id: int,
    sampling: Sampling,
    loss_mask,
    *,
    chunk: int,
    autocast: torch.dtype | None = None,
    verify: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log w (N,), ‖∇θ Σ_t log π_θ(y_t)‖² (N,))`` of ``rows`` (``Experience``) in chunks of at most ``chunk`` rows
    (fewer where the logits would pass ``LOGIT_BYTES``), one ``batched_score_norms`` each, the first verified when
    ``verify``; ``loss_mask(rows, width) -> (B, width) bool``, the tokens summed. Raises ``Unsupported``."""
    size = chunk_rows(chunk, max(len(e.response_ids) for e in rows), vocab_size(model))
    log_ratios, sq_norms = [], []
    for start in range(0, len(rows), size):
        part = rows[start : start + size]
        width = max(len(e.response_ids) for e in part)
        scores = batched_score_norms(
            model, [e.prompt_ids for e in part], [e.response_ids for e in part], loss_mask(part, width), pad_id,
            sampling=sampling, autocast=autocast, verify=verify and start == 0,
        )  # fmt: skip
        behavior = right_pad_values([e.behavior_logprobs for e in part], width).to(scores.logprobs.device)
        log_ratios.append(sequence_log_ratios(scores.logprobs, behavior, scores.mask).float().cpu())
        sq_norms.append(scores.sq_norms.float().cpu())
    return torch.cat(log_ratios), torch.cat(sq_norms)


def _is_dtensor(tensor: torch.Tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a build without torch.distributed
        return False
    return isinstance(tensor, DTensor)


def vocab_size(model) -> int:
    """The output head's width (for the logits budget)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(head, torch.nn.Linear):
        return head.out_features
    return int(getattr(getattr(model, "config", None), "vocab_size", 1) or 1)


def chunk_rows(micro_batch_size: int, response_width: int, vocab: int) -> int:
    """Rows per chunk: ``micro_batch_size``, fewer if their float32 logits would pass ``LOGIT_BYTES``."""
    return max(1, min(micro_batch_size, LOGIT_BYTES // max(1, 3 * 4 * response_width * vocab)))
