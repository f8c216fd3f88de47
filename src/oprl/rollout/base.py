"""The rollout contract: the ``Rollout`` record every engine returns, the ``Engine`` protocol the explorer and
the evaluator call, and ``TorchEngine``, what the torch samplers (``lean``, ``hf-generate``) share.

An engine samples one response per prompt row from the policy it serves and reports, for each sampled token,
its log-probability under the distribution it was drawn from (its ``Sampling``, ``oprl.models.truncation``:
temperature, top-k and top-p applied, renormalised over the kept set): the behaviour log-prob the off-policy
losses need, recorded once, never recomputed. The explorer hands an engine the
trainer's weights with ``load_weights`` and then calls ``generate``; an engine is registered by its
``rollout.engine`` name in ``oprl.rollout.ENGINES``. What an engine can do beyond that contract (partial
rollouts, prefix reuse, row seeds, exact truncation) it declares as the class attribute ``capabilities``
(``EngineCapabilities``), which the config checks and ``oprl.worker_parts.make_engine`` read, never its name.
``Switch`` is what an engine may call on the partial-rollout switcher between decode steps.
Deliberately not here: prompts, rewards, scheduling.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from oprl.errors import OprlError
from oprl.lazy import lazy_import
from oprl.models.truncation import PLAIN, Sampling

if TYPE_CHECKING:
    import torch

    from oprl.rollout.prefixes import PrefixStore
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
    top_k_ids: list[list[list[int]]] | None = None
    """``record_top_k=K > 0``: per row, per response token, the ids of the K most likely tokens of the
    distribution that token was drawn from (``top_logprobs``), most likely first; None = not recorded."""
    top_k_logprobs: list[list[list[float]]] | None = None
    """Their log-probs under that distribution (the one ``behavior_logprobs`` is read from: temperature, top-k
    and top-p applied, renormalised over the kept set, so a token outside it is ``-inf``), aligned with
    ``top_k_ids``."""


@dataclass(frozen=True)
class EngineCapabilities:
    """What an engine class can do beyond the ``Engine`` contract, declared as its class attribute
    ``capabilities`` (the default, ``EngineCapabilities()``: none of it). Read from the class, before anything
    is built: by the config checks (``oprl.rollout.capabilities(name)``) and by ``oprl.worker_parts.make_engine``."""

    partial_kv: tuple[str, ...] = ()
    """The ``sync.partial_kv`` modes (``oprl.explorer.switcher.KV_SETTINGS``: ``keep``, ``recompute``) the engine
    supports when a ``switch`` loads other weights between two decode steps of a ``generate`` call; empty = no partial
    rollouts (``sync.partial=true`` is refused, and so is a ``switch``)."""
    prefix_reuse: bool = False
    """The engine is built with ``prefix_reuse=`` and ``kv_cache_gb=`` (``rollout.prefix_reuse``,
    ``rollout.kv_cache_gb``) and keeps prompt caches between calls when asked; other engines get neither."""
    row_seeds: bool = False
    """``generate`` seeds each row with its entry of ``row_seeds`` (a row's sample does not depend on the other
    rows of its call); without it one generator seeded ``seed`` samples the whole call."""
    exact_truncation: bool = False
    """With a truncating ``Sampling`` the engine samples from ``oprl.models.truncation``'s kept set and records
    log-probs renormalised over it, so the trainer rebuilds the behaviour distribution exactly (training with
    truncation is refused for an engine that does not declare it)."""
    engine_process: bool = False
    """The engine is built with ``engine_process=`` (``rollout.engine_process``) and can run its model in a process
    of its own; an engine whose process died raises an error whose type (or a base's) is named ``EngineDeadError``
    (vLLM's), which the driver heals as a lost worker (``oprl.backends.failure.engine_died``)."""

    top_logprobs: bool = False
    """The engine is built with ``record_top_k=`` (``rollout.record_top_k``) and ``generate`` takes
    ``record_top_k=``: it records the K most likely tokens of each sampled position's distribution
    (``Rollout.top_k_ids``, ``Rollout.top_k_logprobs``; ``top_logprobs`` says which distribution)."""

    lora_sync: tuple[str, ...] = ("adapter",)
    """The ``model.lora_sync`` modes the engine serves a LoRA policy in: ``adapter`` (what ``load_weights`` hands
    every engine under LoRA: the adapters alone, applied at each forward, as the torch engines do through peft) and
    ``merged`` (the base with each adapter folded in). An engine declaring both is built with ``lora_sync=`` and
    ``lora_slots=`` (the policy versions it holds at once: ``oprl.worker_parts.lora_serving``). Unset
    (``model.lora_sync=None``), a LoRA policy is served in the first of them, or in ``lora_sync_cpu`` on a CPU."""
    lora_sync_cpu: str = ""
    """The ``lora_sync`` mode an unset ``model.lora_sync`` resolves to when the sampler's model is on a CPU device
    ("" = the first of ``lora_sync``, as on CUDA), and why, in ``lora_sync_cpu_why``: the run logs both once
    (``oprl.config.sections.ModelConfig.lora_sync_notice``). vLLM: ``merged`` (its CPU LoRA kernels)."""
    lora_sync_cpu_why: str = ""
    """Why ``lora_sync_cpu`` is the CPU default, with the measurement's file (the run's log line quotes it)."""
    lora_versions: int = 0
    """Most LoRA policy versions the engine holds at once under ``model.lora_sync=adapter`` (vLLM: its
    ``max_loras``, allocated at start-up); 0 = no bound. An adapter-synced run whose lag keeps more live is refused
    at config load (``oprl.config.sections.ModelConfig.check_lora_serving``)."""

    @property
    def partial(self) -> bool:
        """Whether the engine offers partial rollouts at all."""
        return bool(self.partial_kv)


NO_CAPABILITIES = EngineCapabilities()


def capabilities_of(engine: object) -> EngineCapabilities:
    """The ``capabilities`` an engine class (or factory, or instance) declares; ``NO_CAPABILITIES`` when it
    declares none. Anything else under that name is one ``OprlError`` line naming ``rollout.engine``."""
    declared = getattr(engine, "capabilities", NO_CAPABILITIES)
    if not isinstance(declared, EngineCapabilities):
        name = getattr(engine, "__name__", type(engine).__name__)
        raise OprlError(
            f"rollout.engine: {name}.capabilities is a {type(declared).__name__}, not an "
            "oprl.rollout.EngineCapabilities"
        )
    return declared


@runtime_checkable
class Switch(Protocol):
    """The in-flight weight update of one batch (``oprl.explorer.switcher.Switcher``), as an engine sees it: it counts
    decode steps over the batch's ``generate`` calls and may load other weights into the engine between two.
    Token t of a call was drawn at global decode step ``start() + t``."""

    kv: str
    """What the cache of the tokens sampled before a switch does: ``keep`` or ``recompute`` (``sync.partial_kv``)."""

    def start(self) -> int:
        """A ``generate`` call begins: the global step of its token 0 (a switch due there happens now)."""
        ...

    def before(self, step: int) -> bool:
        """Before the distribution of global decode step ``step`` is computed: True when other weights were
        just loaded into the engine."""
        ...

    def next_point(self, step: int) -> int | None:
        """The first global step after ``step`` at which ``before`` may switch, None when none can come (for
        engines that sample in segments)."""
        ...

    def version_at(self, step: int) -> int:
        """The policy version that sampled global decode step ``step``."""
        ...

    def finish(self, steps: int) -> None:
        """The call ran ``steps`` decode steps (its longest row)."""
        ...


def check_switch(engine: object, switch: Switch) -> None:
    """Refuse a ``switch`` that ``engine`` cannot follow, in one line: it declares no partial rollouts, or not
    the switch's ``kv`` mode (the config checks refuse such runs first; this guards direct calls)."""
    modes = capabilities_of(engine).partial_kv
    name = type(engine).__name__
    if not modes:
        raise OprlError(
            f"rollout.engine: {name} declares no partial rollouts (its capabilities.partial_kv is empty), so it "
            "cannot switch weights between decode steps: sync.partial=true needs an engine that declares them"
        )
    if switch.kv not in modes:
        raise OprlError(
            f"sync.partial_kv={switch.kv}: {name} supports {' or '.join(modes)} at a switch: it needs "
            f"sync.partial_kv={' or '.join(modes)}"
        )


def check_top_k(engine: object, k: int) -> None:
    """Refuse, in one line, recording the top ``k`` with an engine that does not declare
    ``capabilities.top_logprobs`` (the config refuses such runs first; this guards direct calls)."""
    if not capabilities_of(engine).top_logprobs:
        raise OprlError(
            f"rollout.record_top_k={k}: {type(engine).__name__} declares no top log-probs "
            "(its capabilities.top_logprobs is False); use rollout.engine=lean, hf-generate or vllm"
        )


@runtime_checkable
class Engine(Protocol):
    """A sampler serving one policy: what ``rollout.engine`` names (lean, hf-generate, vllm). Built as
    ``Engine(model, tokenizer, sampling=, max_new_tokens=)``; it keeps that ``Sampling`` as its attribute
    ``sampling`` (the agent endpoint serves it) and samples with it unless a call names another."""

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
        """One response per prompt row (token ids, no padding). The same ``seed`` and inputs give the same
        samples; ``sampling``, whole, replaces the engine's own for this call (evaluation samples with
        ``eval.*``; None = the engine's ``sampling``);
        ``batch_size`` bounds the rows sampled at once where the engine batches itself. ``row_seeds``: a seed
        per row, for engines that seed rows (vLLM; the agent endpoint passes them); the torch engines draw a
        whole call from one generator seeded ``seed`` and ignore them (``EngineCapabilities.row_seeds``).
        ``switch``: a ``Switch`` (``oprl.explorer.switcher.Switcher``) that may load newer weights between decode steps
        (partial rollouts); the rollout then records each token's version in ``behavior_versions``. Engines
        that declare no ``capabilities.partial_kv`` refuse one (``check_switch``). ``record_top_k``: K > 0 records
        each sampled position's K most likely tokens (``Rollout.top_k_ids``/``top_k_logprobs``), 0 none, None the
        engine's own ``record_top_k`` (``rollout.record_top_k``); passed only to engines that declare
        ``capabilities.top_logprobs``."""
        ...

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Serve ``weights`` from now on: the trainer's snapshot (trainable parameters, its names)."""
        ...

    def weights_changed(self) -> None:
        """The served model was changed in place other than by ``load_weights`` (an optimizer step, a checkpoint
        loaded into it): serve its current weights from the next ``generate`` on. A no-op for engines that read
        the model directly; the vllm engine keeps a copy of its own and reloads it only when told."""
        ...


Sample = Callable[..., "tuple[torch.Tensor, ...]"]  # a string: torch is bound lazily
"""``sample(model, tokenizer, prompt_ids, sampling, max_new_tokens)``: ``(tokens (B, T), behaviour log-probs
(B, T))`` drawn from ``sampling`` (a ``Sampling``), on the CPU; anything after a row's first EOS is ignored.
Called with ``top_k=K`` (K > 0, engines declaring ``capabilities.top_logprobs``), it also returns
``top_logprobs`` of each position's distribution: ``(tokens, log-probs, top ids (B, T, K) int64, top log-probs
(B, T, K) float32)``."""


def top_logprobs(logp: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampler's top-K, the one rule every engine records: for the log-probs ``logp`` (..., V) of the
    distribution a token is drawn from (``Sampling``'s: ``log_softmax`` of ``logits / temperature`` with the
    tokens outside top-k/top-p's kept set at ``-inf``; the distribution ``behavior_logprobs`` is read from, NOT
    the model's raw one), ``(ids (..., k) int64, log-probs (..., k) float32)`` of its ``k`` largest entries,
    largest first (``torch.topk``; ties in torch's order). When the kept set holds fewer than ``k`` tokens, the
    rest are ``-inf`` with arbitrary ids: they carry no mass. vLLM's ``SamplingParams(logprobs=k)`` under
    ``logprobs_mode="processed_logprobs"`` is the same rule (``oprl.rollout.vllm_engine``)."""
    values, ids = logp.float().topk(k, dim=-1)
    return ids, values


def sampling_logprobs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """(..., V) float32: ``log pi`` of ``sampling``'s distribution over the next token for ``logits`` (..., V):
    ``log_softmax(logits / temperature)`` over the kept set, ``-inf`` outside it (``Sampling``). What the lean
    engine draws from and ``top_logprobs`` reads."""
    scores = logits.float() / sampling.temperature  # (..., V)
    if sampling.truncates:
        scores = scores.masked_fill(~sampling.kept(scores), float("-inf"))
    return torch.log_softmax(scores, dim=-1)


def sequence_top_logprobs(
    model, token_ids: list[int], k: int, *, sampling: Sampling = PLAIN, start: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampler's top-K at each position of a sequence given whole (a prompt plus a completion: what the agent
    endpoint's ``top_logprobs`` and the Tinker server's ``topk_*`` requests ask for): ``(ids (T, k) int64,
    log-probs (T, k) float32)`` for positions ``start .. len(token_ids) - 1`` (T of them), position i's
    distribution being the one token i was (or would be) drawn from after ``token_ids[:i]``, under ``sampling``
    (``sampling_logprobs``, then ``top_logprobs``). One forward of ``model`` over the row, no cache, no grad;
    ``start = len(prompt)`` gives what an engine records for the completion."""
    if not 1 <= start <= len(token_ids):
        raise ValueError(f"start={start} must be in [1, {len(token_ids)}] (position 0 has no prefix)")
    device = next(model.parameters()).device
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([token_ids], device=device)).logits[0]  # (L, V)
    ids, values = top_logprobs(sampling_logprobs(logits[start - 1 : -1], sampling), k)  # (T, k) each
    return ids.cpu(), values.cpu()


class TorchEngine:
    """An ``Engine`` over a torch model in this process, given its decoding strategy ``sample``: seeds torch's
    global generator per call (restored after), samples in batches of ``batch_size`` rows in eval mode, cuts
    each row after its first EOS (kept, so the policy also learns when to stop) and decodes it. A subclass
    declares its ``capabilities``; a ``switch`` reaches ``sample`` (as ``switch=``, ``offset=``) only when they
    include partial rollouts."""

    capabilities = NO_CAPABILITIES

    def __init__(
        self,
        sample: Sample,
        model,
        tokenizer,
        *,
        sampling: Sampling = PLAIN,
        max_new_tokens: int = 16,
        record_top_k: int = 0,
    ):
        self.sample = sample
        self.record_top_k = record_top_k
        """K: each call (that names none) records the K most likely tokens of every sampled position (0 = none:
        nothing extra computed or returned; ``capabilities.top_logprobs``)."""
        self.model = model
        self.tokenizer = tokenizer
        self.sampling = sampling
        """The distribution of every call that names none (the training rollouts': ``rollout.*``)."""
        self.max_new_tokens = max_new_tokens
        self.prefixes: PrefixStore | None = None
        """The sampler's ``oprl.rollout.prefixes.PrefixStore`` (lean engine): kept caches and prefill counts."""
        self.context = context_of(model)
        if self.context is not None and max_new_tokens >= self.context:
            raise OprlError(
                f"rollout.max_new_tokens={max_new_tokens} does not fit the model's context of {self.context} "
                "positions (its max_position_embeddings, prompt included); lower it"
            )

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            self.model.load_state_dict(weights, strict=False)
        self.weights_changed()

    def weights_changed(self) -> None:
        """Every call samples from the model itself; only caches kept between calls are dropped."""
        if self.prefixes is not None:
            self.prefixes.clear()

    @property
    def prompt_tokens(self) -> int:
        """Context tokens handed to the sampler so far (lean engine; 0 for the others)."""
        return self.prefixes.prompt_tokens if self.prefixes is not None else 0

    @property
    def prefill_tokens(self) -> int:
        """Of ``prompt_tokens``, those run through the model in a prefill (lean engine; 0 for the others)."""
        return self.prefixes.prefill_tokens if self.prefixes is not None else 0

    def generate(
        self,
        prompt_ids: list[list[int]],
        *,
        seed: int,
        sampling: Sampling | None = None,
        batch_size: int | None = None,
        row_seeds: list[int] | None = None,  # one generator per call (see Engine.generate)
        switch: Switch | None = None,
        record_top_k: int | None = None,
    ) -> Rollout:
        """``switch``: a ``Switch`` that may load other weights between decode steps (partial rollouts; only
        for a class that declares them, whose ``sample`` takes one); the rollout then records each token's
        version. ``record_top_k``: see ``Engine.generate`` (None = ``self.record_top_k``)."""
        if switch is not None:
            check_switch(self, switch)
        sampling = self.sampling if sampling is None else sampling
        top_k = self.record_top_k if record_top_k is None else record_top_k
        if top_k:
            check_top_k(self, top_k)
        batch_size = batch_size or len(prompt_ids)
        self.check_fits(prompt_ids, batch_size)
        parts = []
        # inference_mode is cheaper than no_grad: no version counters or view tracking on any tensor.
        with torch.inference_mode(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for start in range(0, len(prompt_ids), batch_size):
                chunk = prompt_ids[start : start + batch_size]
                parts.append(self._generate_batch(chunk, sampling, switch, top_k))

        def joined(name: str) -> list:  # one field's rows over the batches, in order
            return [row for p in parts for row in (getattr(p, name) or [])]

        rollout = Rollout(joined("response_ids"), joined("behavior_logprobs"), joined("texts"), joined("truncated"))
        if switch is not None:
            rollout.behavior_versions = joined("behavior_versions")
        if top_k:
            rollout.top_k_ids, rollout.top_k_logprobs = joined("top_k_ids"), joined("top_k_logprobs")
        return rollout

    def check_fits(self, prompt_ids: list[list[int]], batch_size: int) -> None:
        """Refuse, before any tensor is built, a prompt whose tokens plus ``max_new_tokens`` exceed the
        model's context (positions past it have no embedding: the model would run on garbage, silently), and
        a batch whose working set is larger than the memory available: per row, the key/value cache
        ``2 x layers x (prompt + new) x kv width``, one layer's prefill activations ``prompt x (4 x hidden +
        2 x intermediate)`` (elements of the model's size), and four float32 copies of the vocabulary's logits
        (logits, log-softmax, probabilities, the top-p sort). The cache alone under-counts: 400,000 rows of the
        tiny model grew past 11 GiB within 30 s of sampling."""
        longest = max((len(p) for p in prompt_ids), default=0)
        if self.context is not None and longest + self.max_new_tokens > self.context:
            raise OprlError(
                f"a prompt of {longest} tokens + rollout.max_new_tokens={self.max_new_tokens} exceeds the model's "
                f"context of {self.context} positions: shorten the task's prompts or lower rollout.max_new_tokens"
            )
        config = getattr(self.model, "config", None)
        layers = getattr(config, "num_hidden_layers", None)
        heads = getattr(config, "num_key_value_heads", None) or getattr(config, "num_attention_heads", None)
        hidden, attention = getattr(config, "hidden_size", None), getattr(config, "num_attention_heads", None)
        if not (isinstance(layers, int) and isinstance(heads, int) and isinstance(hidden, int)):
            return
        if not isinstance(attention, int):
            return
        width = heads * (getattr(config, "head_dim", None) or hidden // attention)
        element = next(self.model.parameters()).element_size()
        rows = min(batch_size, len(prompt_ids))
        intermediate = getattr(config, "intermediate_size", None)
        intermediate = intermediate if isinstance(intermediate, int) else 4 * hidden
        vocab = getattr(config, "vocab_size", None)
        vocab = vocab if isinstance(vocab, int) else 0
        per_row = (
            2 * layers * (longest + self.max_new_tokens) * width * element  # key/value cache
            + longest * (4 * hidden + 2 * intermediate) * element  # one layer's prefill activations
            + 4 * vocab * 4  # float32 logits and their three working copies
        )
        needed = rows * per_row
        available = available_memory(next(self.model.parameters()).device)
        if available is not None and needed > available:
            raise OprlError(
                f"rollout: sampling {rows} rows of up to {longest + self.max_new_tokens} positions needs "
                f"{needed / 2**30:.1f} GiB (key/value cache, prefill activations, logits), "
                f"more than the {available / 2**30:.1f} GiB available; "
                "lower rollout.group_size, rollout.prompts_per_step or rollout.max_new_tokens"
            )

    def _generate_batch(
        self, prompt_ids: list[list[int]], sampling: Sampling, switch: Switch | None, top_k: int
    ) -> Rollout:
        was_training = self.model.training
        self.model.eval()
        extra: dict[str, Any] = {"top_k": top_k} if top_k else {}  # a Sample without top-K never sees the key
        if switch is not None:
            extra |= {"switch": switch, "offset": switch.start()}
        if self.prefixes is not None:  # a switch loads weights mid-call: nothing kept from before or after it
            self.prefixes.check_weights(self.model)
            if switch is not None:
                self.prefixes.clear()
            else:
                extra["prefixes"] = self.prefixes
        try:
            tokens, logprobs, *top = self.sample(
                self.model, self.tokenizer, prompt_ids, sampling, self.max_new_tokens, **extra
            )  # (B, T), (B, T), and with top_k: (B, T, K), (B, T, K)
        finally:
            self.model.train(was_training)
        rollout = cut_at_eos(tokens, logprobs, self.tokenizer, *top)
        if switch is not None:  # token t of every row was drawn at global decode step offset + t
            offset = extra["offset"]
            rollout.behavior_versions = [
                [switch.version_at(offset + t) for t in range(len(r))] for r in rollout.response_ids
            ]
            switch.finish(max(len(r) for r in rollout.response_ids))
        return rollout


def context_of(model) -> int | None:
    """The model's context length (``max_position_embeddings``), None when its config does not say."""
    value = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None


def available_memory(device) -> int | None:
    """Bytes free for new tensors on ``device``: the GPU's free memory, or the machine's available memory."""
    if getattr(device, "type", "cpu") == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def cut_at_eos(
    tokens: torch.Tensor,
    logprobs: torch.Tensor,
    tokenizer,
    top_ids: torch.Tensor | None = None,
    top_logprobs: torch.Tensor | None = None,
) -> Rollout:
    """The ``Rollout`` of sampled ``tokens`` (B, T) and their ``logprobs`` (B, T) (and, recording top-K, each
    position's ``top_ids``, ``top_logprobs`` (B, T, K)): each row up to and including its first EOS; rows
    without EOS ran to the limit (truncated)."""
    is_eos = tokens == tokenizer.eos_token_id
    has_eos = is_eos.any(dim=1)
    limit = torch.full_like(has_eos, tokens.shape[1], dtype=torch.long)
    first_eos = torch.where(has_eos, is_eos.int().argmax(dim=1), limit)
    lengths = torch.where(has_eos, first_eos + 1, first_eos).tolist()
    token_rows, logprob_rows = tokens.tolist(), logprobs.tolist()  # one conversion each, then list slices
    response_ids = [row[:n] for row, n in zip(token_rows, lengths, strict=True)]
    rollout = Rollout(
        response_ids=response_ids,
        behavior_logprobs=[row[:n] for row, n in zip(logprob_rows, lengths, strict=True)],
        texts=tokenizer.batch_decode(response_ids, skip_special_tokens=True),
        truncated=[not bool(h) for h in has_eos],
    )
    if top_ids is not None and top_logprobs is not None:
        id_rows, value_rows = top_ids.tolist(), top_logprobs.float().tolist()
        rollout.top_k_ids = [row[:n] for row, n in zip(id_rows, lengths, strict=True)]
        rollout.top_k_logprobs = [row[:n] for row, n in zip(value_rows, lengths, strict=True)]
    return rollout
