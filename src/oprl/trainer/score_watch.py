"""The watch of the score-norm pass: forward hooks on every module that owns a trainable parameter, and from
what they kept, each parameter's per-row gradient terms (``oprl.trainer.score_norms`` runs the pass;
docs/algorithms.md#vcpo).

A hook keeps each call's inputs and output; one ``autograd.grad`` of the summed log-probs gives the gradient at
every kept output (the weight-gradient products themselves are skipped). Each row of the batch is one response, so
row i's gradient of a parameter is built from row i's slices only:

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
  gradient; materialised, in row blocks of at most ``variance.MATERIALISE_FLOATS`` floats (``PerRow``).

The algebra of the terms is ``oprl.algorithms.variance`` (``Outer``, ``squared_norms``), in float32 at least
(bfloat16 activations under autocast are widened). A module the watch cannot follow exactly raises ``Unsupported``
with the reason: a layout whose first dimension is not the batch's rows (an MoE's expert dispatch flattens tokens),
an output that is not a single tensor or is modified in place, a module ``vmap`` cannot run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.utils.hooks import RemovableHandle

from oprl.algorithms.variance import Outer, wide


class Unsupported(Exception):
    """The batched pass cannot compute this model's per-row gradients exactly; the message says why."""


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
