"""Per-response squared score norms ‖∇θ Σ_t log π_θ(y_it)‖² of a batch in one forward and one backward pass
(VCPO's off-policy optimal baseline, ``Inputs.score_statistics`` in ``oprl.trainer.inputs``; docs/algorithms.md#vcpo).

The gradient of a loss summed over responses is the sum of the responses' gradients; their norms need each
response's own. Instead of one backward pass per response, the batch runs once and every module that owns
trainable parameters is watched: a forward hook keeps its inputs and its output, and one ``autograd.grad`` of
the summed log-probs gives the gradient at every watched output (the weight-gradient products themselves are
skipped). Each row of the batch is one response (prompt and response packed, no prompt shared between rows, so
the prompt runs once per response), so row i's gradient of a parameter is built from row i's slices only:

- ``nn.Linear`` y_t = W a_t + b:  G_i = Σ_t g_t a_tᵀ (bias: Σ_t g_t). Its squared norm without forming G_i is the
  "ghost norm" identity (Li et al. 2022, arXiv 2110.05679; Opacus' ghost clipping):

      ‖Σ_t g_t a_tᵀ‖²_F = Σ_{t,s} (a_t·a_s)(g_t·g_s)

  O(n²·(d_in + d_out)) per row for n positions instead of O(n·d_in·d_out); the cheaper of the two is used per
  layer (Opacus' mixed rule), both exact.
- ``nn.Embedding``: G_i = Σ_s e_{id_s} g_sᵀ, the same identity with a_t·a_s = [id_t = id_s] (the padding row,
  which ``F.embedding`` never updates, excluded).
- A parameter used by several modules (tied input embedding and output head) sums its terms before the norm:
  ‖Σ_k G_ik‖² = Σ_{k,l} ⟨G_ik, G_il⟩, each pair by the same identity (a one-hot side is a gather).
- Any other module (RMSNorm, LayerNorm, DoRA magnitudes...): its per-row gradients from ``torch.func``,
  ``vmap`` over rows of the ``vjp`` of the module alone (``functional_call``) at the kept input and output
  gradient; materialised, in row blocks of at most ``variance.MATERIALISE_FLOATS`` floats.

The algebra is ``oprl.algorithms.variance`` (``Outer``, ``squared_norms``), in float32 at least (bfloat16
activations under autocast are widened). The pass is refused (``Unsupported``; the trainer then runs the
per-response loop and says why in a debug log) when a watched module sees a layout whose first dimension is not
the batch's rows (an MoE's expert dispatch flattens tokens), returns no single tensor, has its output modified in
place, or cannot be ``vmap``-ed, and when the parameters are FSDP shards. The first batch of a trainer is
also checked whole: per parameter, the rows' gradients must add up to the batch gradient autograd computes in the
same backward pass (a parameter used outside its module's forward would not), else refused.

Memory, per chunk of ``rows`` responses of padded length L (prompt + response) and T (response): the forward's
activations of the chunk (a training micro-batch without prompt sharing) plus, per watched module, its output
gradient (as large as its output); float32 logits, their gradient and log-softmax, (rows, T, V) each; per
ghost-norm pair, two (rows, n, n) Gram matrices; per materialised layer rows·d_in·d_out floats (chosen only where
that is smaller than the Gram matrices). The trainer's chunk is ``optim.micro_batch_size`` rows, lowered so that
the logits stay under ``LOGIT_BYTES``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.utils.hooks import RemovableHandle

from oprl.algorithms.variance import Outer, sequence_log_ratios, squared_norms, wide
from oprl.models.batching import right_pad_values
from oprl.models.logprobs import pack, row_logprobs
from oprl.models.truncation import Sampling

log = logging.getLogger("oprl.trainer")

LOGIT_BYTES = 512 * 2**20
"""Budget of one chunk's float32 logits (rows·T·V·4 bytes, held ~3 times: logits, log-softmax, gradient)."""


class Unsupported(Exception):
    """The batched pass cannot compute this model's per-row gradients exactly; the message says why."""


# ---------------------------------------------------------------------------------------------------------------
# A module's per-row gradients computed on demand (the algebra of the others: oprl.algorithms.variance).


@dataclass
class PerRow:
    """Per-row gradients computed on demand for a block of rows (``torch.func`` on one module)."""

    compute: Callable[[slice], torch.Tensor]  # (block: slice) -> (b, *shape)
    batch_total: Callable[[], torch.Tensor]  # () -> shape
    shape: torch.Size

    def rows(self, block: slice) -> torch.Tensor:
        return self.compute(block)

    def total(self) -> torch.Tensor:
        return self.batch_total()


# ---------------------------------------------------------------------------------------------------------------
# The watch: hooks on every module owning trainable parameters.


def _plain(module: torch.nn.Module, kind: type[torch.nn.Module]) -> bool:
    """``module`` computes exactly ``kind``'s forward (no subclass or instance override)."""
    return isinstance(module, kind) and type(module).forward is kind.forward and "forward" not in vars(module)


@dataclass
class _Call:
    args: tuple
    kwargs: dict
    output: torch.Tensor
    version: int  # the output's version counter when it was returned: in-place changes are refused


@dataclass
class _Watched:
    module: torch.nn.Module
    params: dict[str, torch.nn.Parameter]  # the trainable parameters it owns directly
    calls: list[_Call] = field(default_factory=list)


class Watch:
    """Forward hooks on every module that directly owns a trainable parameter of ``model``, registered while the
    ``with`` block runs; while ``active``, each call's inputs and output are kept (``outputs``: the tensors to
    differentiate the loss by; ``terms``: the parameters' per-row gradient terms from those gradients)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.active = False
        self.batch = 0
        self.watched: list[_Watched] = []
        self.handles: list[RemovableHandle] = []
        for module in model.modules():
            params = {name: p for name, p in module.named_parameters(recurse=False) if p.requires_grad}
            if params:
                self.watched.append(_Watched(module, params))

    def __enter__(self) -> Watch:
        for entry in self.watched:
            self.handles.append(entry.module.register_forward_hook(self._hook(entry), with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        self.active = False
        for entry in self.watched:
            entry.calls.clear()
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    def _hook(self, entry: _Watched):
        def hook(module, args, kwargs, output):
            # Not while computing per-row gradients (the vmap calls modules again), and not inside backward:
            # activation checkpointing recomputes forwards there, whose outputs no gradient flows through.
            if not self.active or not torch.is_grad_enabled() or torch._C._current_graph_task_id() != -1:
                return
            if not isinstance(output, torch.Tensor):
                raise Unsupported(f"{type(module).__name__} returns {type(output).__name__}, not one tensor")
            if output.requires_grad:
                entry.calls.append(_Call(args, kwargs, output, output._version))

        return hook

    def outputs(self) -> list[torch.Tensor]:
        """Every kept call's output, in ``calls`` order (the tensors to differentiate the loss by)."""
        for entry in self.watched:
            for call in entry.calls:
                if call.output._version != call.version:
                    raise Unsupported(f"the output of {type(entry.module).__name__} is modified in place")
        return [call.output for entry in self.watched for call in entry.calls]

    def terms(self, grads: list[torch.Tensor | None], autocast: dict) -> dict[torch.nn.Parameter, list[Outer | PerRow]]:
        """Every trainable parameter's per-row gradient terms, from the kept calls and ``grads``, the loss's
        gradients at their ``outputs()``."""
        out: dict[torch.nn.Parameter, list[Outer | PerRow]] = {}
        calls = [(entry, call) for entry in self.watched for call in entry.calls]
        self.prepared: dict = {}
        for (entry, call), grad in zip(calls, grads, strict=True):
            if grad is None:  # the output reached no response's log-prob: no gradient
                continue
            for param, term in self._module_terms(entry, call.args, call.kwargs, call.output, grad, autocast):
                out.setdefault(param, []).append(term)
        return out

    def _activation(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` as (B, n, d), float32 at least, once per tensor (q, k and v projections share their input)."""
        key = id(tensor)
        if key not in self.prepared:
            self.prepared[key] = (tensor, wide(tensor.detach()).reshape(self.batch, -1, tensor.shape[-1]))
        return self.prepared[key][1]

    def _rows_first(self, module, tensor: torch.Tensor, ndim: int = 3) -> None:
        if tensor.dim() < ndim or tensor.shape[0] != self.batch:
            raise Unsupported(
                f"{type(module).__name__} sees a {tuple(tensor.shape)} tensor whose first dimension is not the "
                f"batch's {self.batch} rows"
            )

    def _module_terms(self, entry: _Watched, args, kwargs, output, grad, autocast):
        module, batch = entry.module, self.batch
        grad = wide(grad)
        self._rows_first(module, grad)
        if _plain(module, torch.nn.Linear) and len(args) == 1 and not kwargs:
            self._rows_first(module, args[0])
            activation = self._activation(args[0])
            grad = grad.reshape(batch, -1, grad.shape[-1])
            for name, param in entry.params.items():
                right = activation if name == "weight" else activation.new_ones(batch, activation.shape[1], 1)
                yield param, Outer(grad, right, param.shape)
            return
        if (
            _plain(module, torch.nn.Embedding)
            and len(args) == 1
            and not kwargs
            and module.max_norm is None
            and not module.scale_grad_by_freq
        ):
            (ids,) = args
            self._rows_first(module, ids, ndim=2)
            ids = ids.reshape(batch, -1)
            grad = grad.reshape(batch, ids.shape[1], -1)
            if module.padding_idx is not None:  # F.embedding leaves the padding row's gradient 0
                grad = grad.masked_fill((ids == module.padding_idx)[..., None], 0.0)
            yield module.weight, Outer(ids, grad, module.weight.shape, width=module.num_embeddings)
            return
        yield from self._functional_terms(entry, args, kwargs, output, grad, autocast)

    def _functional_terms(self, entry: _Watched, args, kwargs, output, grad, autocast):
        """Per-row gradients of any other module: vmap over rows of the vjp of the module alone."""
        from torch.func import functional_call, vjp, vmap

        module = entry.module
        tensors = [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        if not tensors or any(isinstance(v, torch.Tensor) for v in kwargs.values()):
            raise Unsupported(f"{type(module).__name__} takes tensor keyword arguments or no tensor input")
        for _, tensor in tensors:
            self._rows_first(module, tensor, ndim=2)
        self._rows_first(module, output, ndim=2)
        names = list(entry.params)
        values = {name: p.detach() for name, p in entry.params.items()}
        grad = grad.to(output.dtype)

        def pullback(params, inputs, out_grad):
            def run(p):
                call_args = list(args)
                for (index, _), value in zip(tensors, inputs, strict=True):
                    call_args[index] = value
                with torch.autocast(**autocast):
                    return functional_call(module, p, tuple(call_args), kwargs)

            pull = vjp(run, params)[1]
            return pull(out_grad)[0]

        def one_row(inputs, out_grad):
            grads = pullback(values, [x[None] for x in inputs], out_grad[None])
            return tuple(wide(grads[name]) for name in names)

        inputs = [t.detach() for _, t in tensors]

        def compute(block: slice, position: int):
            try:
                per_row = vmap(one_row)([x[block] for x in inputs], grad[block])
            except (RuntimeError, NotImplementedError) as exc:  # torch.func: no batching rule, data-dependent flow
                raise Unsupported(f"torch.func.vmap cannot run {type(module).__name__}: {exc}") from exc
            return per_row[position]

        def total(position: int):
            grads = pullback(values, inputs, grad)
            return wide(grads[names[position]])

        for position, name in enumerate(names):
            param = entry.params[name]
            yield (
                param,
                PerRow(functools.partial(compute, position=position), functools.partial(total, position), param.shape),
            )


# ---------------------------------------------------------------------------------------------------------------
# The pass.


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
