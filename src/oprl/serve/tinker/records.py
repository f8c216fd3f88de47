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


@dataclass
class Sampled:
    """What one sample request answers: its ``num_samples`` sequences, and the prompt's log-probs when asked
    (NaN where there is none: position 0, or before ``prompt_logprobs_last_n``)."""

    sequences: list[Sequence]
    prompt_logprobs: list[float] | None = None
