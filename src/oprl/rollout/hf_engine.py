"""Rollout engine on Hugging Face ``generate``: sampled responses plus the behaviour log-prob of each token.

The behaviour log-prob is read from the very scores ``generate`` sampled from (after temperature and top-p),
so it is the log-probability under the true sampling distribution: the number the off-policy losses need
(docs/paper.md#losses: it is recorded, never recomputed). Prompts are left-padded, responses stop at EOS
(kept, so the policy also learns when to stop) or at ``max_new_tokens`` (marked truncated).

Deliberately not here: batching across engines, paged KV caches, vLLM. Those are other engines.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oprl.models.batching import left_pad


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


class HFGenerateEngine:
    """Samples with ``model.generate`` (multinomial, temperature, top-p; no top-k)."""

    def __init__(self, model, tokenizer, *, temperature: float = 1.0, top_p: float = 1.0, max_new_tokens: int = 16):
        self.model = model
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.top_p = top_p
        self.max_new_tokens = max_new_tokens

    @torch.inference_mode()  # cheaper than no_grad: no version counters or view tracking on any tensor
    def generate(
        self,
        prompt_ids: list[list[int]],
        *,
        seed: int,
        temperature: float | None = None,
        top_p: float | None = None,
        batch_size: int | None = None,
    ) -> Rollout:
        """Sample one response per prompt row; the same ``seed`` and inputs give the same samples.
        ``temperature`` / ``top_p`` override the engine's own (evaluation samples differently from training)."""
        temperature = self.temperature if temperature is None else temperature
        top_p = self.top_p if top_p is None else top_p
        batch_size = batch_size or len(prompt_ids)
        parts = []
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for start in range(0, len(prompt_ids), batch_size):
                parts.append(self._generate_batch(prompt_ids[start : start + batch_size], temperature, top_p))
        return Rollout(*[sum((getattr(p, f) for p in parts), []) for f in Rollout.__dataclass_fields__])

    def _generate_batch(self, prompt_ids: list[list[int]], temperature: float, top_p: float) -> Rollout:
        was_training = self.model.training
        self.model.eval()
        try:
            tokens, logprobs = self._sample(prompt_ids, temperature, top_p)  # (B, T), (B, T)
        finally:
            self.model.train(was_training)
        is_eos = tokens == self.tokenizer.eos_token_id
        # Length = up to and including the first EOS; rows without EOS ran to the limit.
        has_eos = is_eos.any(dim=1)
        first_eos = torch.where(has_eos, is_eos.int().argmax(dim=1), torch.full_like(has_eos, tokens.shape[1], dtype=torch.long))
        lengths = torch.where(has_eos, first_eos + 1, first_eos).tolist()
        token_rows, logprob_rows = tokens.tolist(), logprobs.tolist()  # one conversion each, then list slices
        response_ids = [row[:n] for row, n in zip(token_rows, lengths)]
        return Rollout(
            response_ids=response_ids,
            behavior_logprobs=[row[:n] for row, n in zip(logprob_rows, lengths)],
            texts=self.tokenizer.batch_decode(response_ids, skip_special_tokens=True),
            truncated=[not bool(h) for h in has_eos],
        )

    def _sample(self, prompt_ids: list[list[int]], temperature: float, top_p: float):
        """``(tokens (B, T), behaviour log-probs (B, T))`` on the CPU; anything after a row's first EOS is ignored."""
        pad_id = self.tokenizer.pad_token_id
        inputs, attention = left_pad(prompt_ids, pad_id)  # (B, P)
        out = self.model.generate(
            input_ids=inputs.to(self.model.device),
            attention_mask=attention.to(self.model.device),
            do_sample=True,
            temperature=temperature,
            top_p=top_p,
            top_k=0,
            max_new_tokens=self.max_new_tokens,
            pad_token_id=pad_id,
            eos_token_id=self.tokenizer.eos_token_id,
            output_scores=True,
            return_dict_in_generate=True,
        )
        tokens = out.sequences[:, inputs.shape[1] :].cpu()  # (B, T)
        scores = torch.stack(out.scores, dim=1).float().cpu()  # (B, T, V), processed = what was sampled from
        return tokens, torch.log_softmax(scores, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
