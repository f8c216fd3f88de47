"""The plain data the Tinker server's backend computes on and answers with: a decoded ``forward_backward`` request
(``ForwardBackward`` of ``Datum`` rows) and its result (``ForwardOutput``), a sample request's result (``Sampled``
of ``Sequence`` rows), and ``target_of``: a request's ``target_prompt_logprobs`` read into a ``Target``.
``wire.py`` turns the SDK's protobuf bodies into these and these into protobuf bodies, at the HTTP boundary
(``app.py``, ``futures.py``); the backend (``backend.py``, ``sampling.py``, ``losses.py``) and a placed model's
worker (``placement.ModelHost``) see only these, so they import neither the SDK nor protobuf, fastapi or pydantic
(a bare GPU image runs them: ``benchmarks/gpu_check.py --tinker``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from oprl.serve.tinker.errors import UserError


@dataclass
class Datum:
    """One training row: ``tokens`` (N,) the model input, ``inputs`` the named per-position loss inputs."""

    tokens: list[int]
    inputs: dict[str, np.ndarray]


@dataclass
class ForwardBackward:
    model_id: str
    seq_id: int
    loss_fn: str
    config: dict[str, float | str]
    forward_only: bool
    data: list[Datum] = field(default_factory=list)


@dataclass
class ForwardOutput:
    """What ``forward_backward`` answers: per datum its 1-D float32 arrays (``logprobs``, and ``elementwise_loss``
    where the loss has one), and the metrics, keyed ``name:reduction`` (the SDK folds chunks by the reduction)."""

    outputs: list[dict[str, np.ndarray]]
    metrics: dict[str, float]


@dataclass
class Sequence:
    tokens: list[int]
    logprobs: list[float]
    stopped: bool
    """True: a stop token or string ended it; False: ``max_tokens`` did."""
    versions: list[int] = field(default_factory=list)
    """Per token, the optimizer-step version of the weights it was drawn under (in-flight samplers: they change
    during a sequence; otherwise all the snapshot's)."""
    top_ids: list[list[int]] | None = None
    """``topk_sample_logprobs`` = K > 0: per token, the ids of the K most likely tokens of the distribution it was
    drawn from (``oprl.rollout.base.top_logprobs``), most likely first; None when not asked."""
    top_logprobs: list[list[float]] | None = None
    """Their log-probs under that distribution (``-inf`` for tokens outside top-k/top-p's kept set)."""


@dataclass
class Sampled:
    """What one sample request answers: its ``num_samples`` sequences, and the prompt's log-probs when asked
    (NaN where there is none: position 0, or before ``prompt_logprobs_last_n``)."""

    sequences: list[Sequence]
    prompt_logprobs: list[float] | None = None
    topk_prompt: tuple[np.ndarray, np.ndarray] | None = None
    """``topk_prompt_logprobs`` = K > 0: ``(ids (P, K) int64, log-probs (P, K) float32)``, row t the top-K of
    the distribution prompt token t would be drawn from (the request's sampling); row 0, and the rows before
    ``prompt_logprobs_last_n``, hold no entry (``-inf``)."""
    target: Target | None = None
    """``target_prompt_logprobs``: the log-prob of each id it names, in its layout."""


@dataclass
class Target:
    """``target_prompt_logprobs``: the ids a request names (``ids`` (cells,) int64, -1 = none, at ``rows``
    (cells,): row i scores prompt position i + 1) in the request's layout (``shape`` [P - 1, K]; ``crow``/
    ``col`` its CSR indices when sent sparse), and, once scored, ``logprobs`` (cells,) float32 (0.0 at -1)."""

    ids: np.ndarray
    rows: np.ndarray
    shape: list[int]
    crow: list[int] | None = None
    col: list[int] | None = None
    logprobs: np.ndarray | None = None


def target_of(tensor: Any, prompt_length: int, vocab: int) -> Target | None:
    """``target_prompt_logprobs`` (the SDK's JSON ``TensorData``: int64, shape [P - 1, K], dense or CSR) as a
    ``Target``, or a ``UserError`` naming the field."""
    if tensor is None:
        return None
    name = "target_prompt_logprobs"
    if not isinstance(tensor, dict):
        raise UserError(f"{name}: a TensorData object, got a {type(tensor).__name__}")
    if tensor.get("dtype") != "int64":
        raise UserError(f"{name}: an int64 tensor of token ids, got dtype {tensor.get('dtype')!r}")
    shape = list(tensor.get("shape") or [])
    if len(shape) != 2 or shape[0] != prompt_length - 1 or shape[1] < 1:
        raise UserError(f"{name}: shape must be [len(prompt) - 1, K] = [{prompt_length - 1}, K >= 1], got {shape}")
    try:
        ids = np.asarray(tensor.get("data") or [], dtype=np.int64).reshape(-1)
        crow, col = tensor.get("sparse_crow_indices"), tensor.get("sparse_col_indices")
        if (crow is None) != (col is None):
            raise UserError(f"{name}: sparse_crow_indices and sparse_col_indices go together")
        if crow is None:
            if ids.size != shape[0] * shape[1]:
                raise UserError(f"{name}: shape {shape} does not hold its {ids.size} values")
            rows = np.repeat(np.arange(shape[0]), shape[1])
        else:
            crow_a, col_a = np.asarray(crow, dtype=np.int64), np.asarray(col, dtype=np.int64)
            valid = (
                crow_a.size == shape[0] + 1 and crow_a[0] == 0 and (np.diff(crow_a) >= 0).all()
                and crow_a[-1] == ids.size == col_a.size and ((col_a >= 0) & (col_a < shape[1])).all()
            )  # fmt: skip
            if not valid:
                raise UserError(f"{name}: its CSR indices do not describe {ids.size} values of shape {shape}")
            rows = np.repeat(np.arange(shape[0]), np.diff(crow_a))
    except (TypeError, ValueError) as exc:
        raise UserError(f"{name}: {exc}") from None
    if ids.size and not ((ids >= -1) & (ids < vocab)).all():
        bad = int(ids[(ids < -1) | (ids >= vocab)][0])
        raise UserError(f"{name}: token ids must be -1 (none) or in [0, {vocab}), got {bad}")
    if not (ids >= 0).any():
        raise UserError(f"{name}: names no token id (every cell is -1)")
    csr = (None, None) if crow is None or col is None else (list(map(int, crow)), list(map(int, col)))
    return Target(ids, rows, shape, *csr)
