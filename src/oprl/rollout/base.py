"""The rollout contract: the ``Rollout`` record every engine returns, the ``Engine`` protocol the explorer and
the evaluator call, and ``TorchEngine``, what the torch samplers (``lean``, ``hf-generate``) share.

An engine samples one response per prompt row from the policy it serves and reports, for each sampled token,
its log-probability under the distribution it was drawn from (temperature and top-p applied): the behaviour
log-prob the off-policy losses need, recorded once, never recomputed. The explorer hands an engine the
trainer's weights with ``load_weights`` and then calls ``generate``; an engine is registered by its
``rollout.engine`` name in ``oprl.rollout.ENGINES``. Deliberately not here: prompts, rewards, scheduling.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from oprl.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch", globals())  # imported on first use (oprl.lazy): the config needs only names


@dataclass
class Rollout:
    """Responses for a batch of prompts, unpadded, one list entry per prompt row."""

    response_ids: list[list[int]]
    """Sampled token ids, EOS included when generated, padding removed."""
    behavior_logprobs: list[list[float]]
    """log pi_behaviour(token) under the sampling distribution, aligned with ``response_ids``."""
    texts: list[str]
    """Decoded responses without special tokens."""
    truncated: list[bool]
    """True where generation hit ``max_new_tokens`` before EOS."""
    behavior_versions: list[list[int]] | None = None
    """Partial rollouts (a ``switch`` given): the policy version that sampled each token; None = one policy."""


@runtime_checkable
class Engine(Protocol):
    """A sampler serving one policy: what ``rollout.engine`` names (lean, hf-generate, vllm)."""

    def generate(
        self,
        prompt_ids: list[list[int]],
        *,
        seed: int,
        temperature: float | None = None,
        top_p: float | None = None,
        batch_size: int | None = None,
        row_seeds: list[int] | None = None,
    ) -> Rollout:
        """One response per prompt row (token ids, no padding). The same ``seed`` and inputs give the same
        samples; ``temperature`` / ``top_p`` override the engine's own (evaluation samples differently);
        ``batch_size`` bounds the rows sampled at once where the engine batches itself. ``row_seeds``: a seed
        per row, for engines that seed rows (vLLM; the agent endpoint passes them); the torch engines draw a
        whole call from one generator seeded ``seed`` and ignore them."""
        ...

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Serve ``weights`` from now on: the trainer's snapshot (trainable parameters, its names)."""
        ...

    def weights_changed(self) -> None:
        """The served model was changed in place other than by ``load_weights`` (an optimizer step, a checkpoint
        loaded into it): serve its current weights from the next ``generate`` on. A no-op for engines that read
        the model directly; the vllm engine keeps a copy of its own and reloads it only when told."""
        ...


Sample = Callable[..., "tuple[torch.Tensor, torch.Tensor]"]  # a string: torch is bound lazily
"""``sample(model, tokenizer, prompt_ids, temperature, top_p, max_new_tokens)``: ``(tokens (B, T), behaviour
log-probs (B, T))`` on the CPU; anything after a row's first EOS is ignored."""


class TorchEngine:
    """An ``Engine`` over a torch model in this process, given its decoding strategy ``sample``: seeds torch's
    global generator per call (restored after), samples in batches of ``batch_size`` rows in eval mode, cuts
    each row after its first EOS (kept, so the policy also learns when to stop) and decodes it."""

    def __init__(
        self,
        sample: Sample,
        model,
        tokenizer,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 16,
    ):
        self.sample = sample
        self.model = model
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.top_p = top_p
        self.max_new_tokens = max_new_tokens

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            self.model.load_state_dict(weights, strict=False)

    def weights_changed(self) -> None:
        pass  # every call samples from the model itself

    def generate(
        self,
        prompt_ids: list[list[int]],
        *,
        seed: int,
        temperature: float | None = None,
        top_p: float | None = None,
        batch_size: int | None = None,
        row_seeds: list[int] | None = None,  # one generator per call (see Engine.generate)
        switch=None,
    ) -> Rollout:
        """``switch``: an ``oprl.partial.Switcher`` that may load other weights between decode steps (partial
        rollouts; samplers whose ``sample`` takes one); the rollout then records each token's version."""
        temperature = self.temperature if temperature is None else temperature
        top_p = self.top_p if top_p is None else top_p
        batch_size = batch_size or len(prompt_ids)
        parts = []
        # inference_mode is cheaper than no_grad: no version counters or view tracking on any tensor.
        with torch.inference_mode(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for start in range(0, len(prompt_ids), batch_size):
                chunk = prompt_ids[start : start + batch_size]
                parts.append(self._generate_batch(chunk, temperature, top_p, switch))
        joined = [[row for p in parts for row in (getattr(p, f) or [])] for f in Rollout.__dataclass_fields__]
        rollout = Rollout(*joined[:4])
        rollout.behavior_versions = joined[4] if switch is not None else None
        return rollout

    def _generate_batch(self, prompt_ids: list[list[int]], temperature: float, top_p: float, switch=None) -> Rollout:
        was_training = self.model.training
        self.model.eval()
        extra = {} if switch is None else {"switch": switch, "offset": switch.start()}
        try:
            tokens, logprobs = self.sample(
                self.model, self.tokenizer, prompt_ids, temperature, top_p, self.max_new_tokens, **extra
            )  # (B, T), (B, T)
        finally:
            self.model.train(was_training)
        rollout = cut_at_eos(tokens, logprobs, self.tokenizer)
        if switch is not None:  # token t of every row was drawn at global decode step offset + t
            offset = extra["offset"]
            rollout.behavior_versions = [
                [switch.version_at(offset + t) for t in range(len(r))] for r in rollout.response_ids
            ]
            switch.finish(max(len(r) for r in rollout.response_ids))
        return rollout


def cut_at_eos(tokens: torch.Tensor, logprobs: torch.Tensor, tokenizer) -> Rollout:
    """The ``Rollout`` of sampled ``tokens`` (B, T) and their ``logprobs`` (B, T): each row up to and including
    its first EOS; rows without EOS ran to the limit (truncated)."""
    is_eos = tokens == tokenizer.eos_token_id
    has_eos = is_eos.any(dim=1)
    limit = torch.full_like(has_eos, tokens.shape[1], dtype=torch.long)
    first_eos = torch.where(has_eos, is_eos.int().argmax(dim=1), limit)
    lengths = torch.where(has_eos, first_eos + 1, first_eos).tolist()
    token_rows, logprob_rows = tokens.tolist(), logprobs.tolist()  # one conversion each, then list slices
    response_ids = [row[:n] for row, n in zip(token_rows, lengths, strict=True)]
    return Rollout(
        response_ids=response_ids,
        behavior_logprobs=[row[:n] for row, n in zip(logprob_rows, lengths, strict=True)],
        texts=tokenizer.batch_decode(response_ids, skip_special_tokens=True),
        truncated=[not bool(h) for h in has_eos],
    )
