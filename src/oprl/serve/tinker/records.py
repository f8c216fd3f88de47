"""The plain data the Tinker server's backend computes on and answers with: a decoded ``forward_backward`` request
(``ForwardBackward`` of ``Datum`` rows) and its result (``ForwardOutput``), a sample request's result (``Sampled``
of ``Sequence`` rows). ``wire.py`` turns the SDK's protobuf bodies into these and these into protobuf bodies, at
the HTTP boundary (``app.py``, ``futures.py``); the backend (``backend.py``, ``sampling.py``, ``losses.py``) and a
placed model's worker (``placement.ModelHost``) see only these, so they import neither the SDK nor protobuf,
fastapi or pydantic (a bare GPU image runs them: ``benchmarks/gpu_check.py --tinker``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


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
