"""One RL step of a Qwen2.5-1.5B-shaped model on one GPU: trainer MFU, generation tokens/s, peak memory, step time.

Built for a bare GPU machine (torch with CUDA and transformers; no pydantic, no model hub, no vLLM): the model is
a randomly initialised Llama with Qwen2.5-1.5B-Instruct's shape (built from a config dict, q/k/v biases, tied
embeddings), and the script imports only the oprl modules that need neither pydantic nor the network (the
trainer, FSDP wrapping, the lean engine; it checks this at the end). What it runs is oprl's real step:

1. generation: the lean engine samples ``--groups`` x ``--group-size`` responses of up to ``--response`` tokens
   (random weights rarely emit EOS, so nearly every row runs to the limit) from the explorer's bfloat16 copy;
2. training: ``Trainer.step`` on those rows under ``trainer.sharding=fsdp`` at world size 1 (``fully_shard`` per
   decoder layer and root; float32 master weights, bfloat16 compute, float32 gradient reduction), GRPO loss;
3. weight sync: the trainer's weights gathered into a ``FlatWeights`` (bfloat16, CPU) and loaded by the explorer;
4. with ``--tinker`` (off by default; ``--steps 0 --tinker`` runs it alone), then, in this process, the Tinker
   server's step (``tinker_section``) through its backend directly (no HTTP: the image has no fastapi, SDK or
   protobuf, and the backend needs none of them): the shape's random weights saved as a model directory (in
   ``--dtype``) with a word-level tokenizer of exactly the shape's vocabulary (``<pad>`` 0, ``<eos>`` 1, ...; the
   embedded tiny model's tokenizer has fewer ids than any shape, and the backend refuses token ids past the
   tokenizer's), a LoRA policy of ``--tinker-rank`` (0: full fine-tuning) loaded by the backend in float32 as it
   always is; a saved sampler samples ``--groups`` prompts x ``--group-size`` (``TinkerModels.sample``: one
   engine call), ``forward_backward`` with ``--tinker-loss`` on tinker-cookbook's RL datums whose behaviour
   log-probs are the sampled ones (on-policy: max |ratio - 1| ~ 0 in float32, reported), ``optim_step`` with Adam
   params. Each phase's seconds, tokens/s and peak GPU memory go under ``"tinker"`` in the result;
5. with ``--adapter-sync`` (``--steps 0 --adapter-sync`` alone), then, in this process, one weight sync of a LoRA
   policy both ways (``model.lora_sync``, ``adapter_sync_section``), per rank of ``--adapter-ranks``: the trainer's
   float32 LoRA policy and the sampler's ``--dtype`` copy on the device; ``adapter``: the trainer's snapshot (its
   adapters, to the CPU), the sampler's ``load_state_dict`` (back onto the device), the adapter directory vLLM
   reads (``write_adapter``: device to CPU to file); ``merged``: each adapted weight as ``W + (alpha/r) B A`` on the
   device, then the whole model to the CPU (what an engine process receives as bytes). Seconds (median of
   ``--syncs``) and bytes of each part, and what vLLM allocates for the adapter slots at start-up (``max_loras``
   = ``--adapter-slots`` = sync.offset + 1, at vLLM's padded rank: ``lora_slot_bytes``). The image has no vLLM, so
   vLLM's own part (``add_lora`` into a GPU slot against ``reload_weights`` of the whole model) runs only with
   ``--adapter-vllm``, on an image that has it (vLLM then does not count against ``GPU_IMAGE``).

Trainer MFU = model FLOPs / seconds / ``--peak-tflops`` (default 790: bf16 dense matmul measured on an H200).
Model FLOPs per step = 3 x forward (backward = 2 forwards; the head's checkpointed recomputation is not
credited), counting the work the trainer needs: each group's prompt once (it is prefilled once per group),
  forward = 2 N_dense (G P + sum_b T_b) + 2 L d (G P^2 + sum_b ((P + T_b)^2 - P^2)) + 2 d V sum_b T_b,
with G groups, P prompt tokens, T_b response tokens of row b, N_dense the weights inside decoder layers, L layers,
d width, V vocabulary (causal attention: 4 d i FLOPs for a token at position i, per layer).

    python3 benchmarks/gpu_check.py                     # the H200 check (< 8 min), from the repository root
    python3 benchmarks/gpu_check.py --steps 0 --tinker  # the Tinker server's step alone
    python3 benchmarks/gpu_check.py --steps 0 --adapter-sync   # LoRA weight sync, merged vs adapter, alone
    python benchmarks/gpu_check.py --shape tiny --device cpu --groups 2 --group-size 2 --response 8   # CPU smoke

oprl need not be installed: the script imports it from the ``src/`` next to it. Each finished step prints a JSON
line to stderr at once (so a run cut short still reports), the result is one JSON object on stdout; it exits
non-zero if it imported a package the GPU image lacks (``GPU_IMAGE``: pydantic, vLLM, ...). Ranks other than 0
build the policy on the meta device and receive rank 0's weights in ``fully_shard``'s wrapping, as oprl's
sharded trainer does. Docs: docs/runtime.md ("Scaling out", "Memory plan"); results go to docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # this checkout's oprl, installed or not

import torch

GPU_IMAGE = {
    # Import names of packages the H200 machine's image holds (the device tool's package list, read 2026-11-17)
    # that an oprl module may import at module level; pydantic, vLLM, Ray, datasets are not among them.
    "torch", "transformers", "numpy", "safetensors", "tokenizers", "huggingface_hub", "yaml", "pyarrow", "peft",
    "packaging", "tqdm", "typing_extensions",
}  # fmt: skip
ABSENT = {
    "pydantic", "pydantic_core", "vllm", "ray", "datasets", "math_verify",
    "fastapi", "starlette", "uvicorn", "tinker", "google.protobuf",  # the Tinker server's HTTP side (wire.py, app.py)
}  # fmt: skip
"""Packages not on the GPU image (or not sure to be: protobuf) that some oprl module imports inside a function or
on a path this script does not take: it must not reach them."""

SHAPES = {
    # Qwen2.5-1.5B-Instruct's config.json, as a Llama (Qwen2 = Llama + q/k/v biases).
    "1.5b": {
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "rope_theta": 1e6,
        "rms_norm_eps": 1e-6,
    },
    "0.5b": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "rope_theta": 1e6,
        "rms_norm_eps": 1e-6,
    },
    "tiny": {  # head_dim 32: vLLM's CPU attention has no kernel for 16 (--adapter-vllm's CPU smoke)
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "vocab_size": 512,
        "rope_theta": 1e6,
        "rms_norm_eps": 1e-6,
    },
}
EOS, PAD = 1, 0


class IdTokenizer:
    """The three things the engine and trainer read from a tokenizer; texts are not needed here."""

    eos_token_id, pad_token_id = EOS, PAD

    def batch_decode(self, rows, skip_special_tokens=True):
        return [""] * len(rows)


def build_model(shape: str, device: torch.device, dtype: torch.dtype, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        **SHAPES[shape],
        attention_bias=True,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
        bos_token_id=EOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )
    torch.manual_seed(seed)
    with torch.device(device):  # "meta": shapes only
        model = LlamaForCausalLM(config).to(dtype)
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = PAD, EOS
    return model


def train_flops(model, groups: int, prompt: int, response_lens: list[int]) -> float:
    """Model FLOPs of one trainer pass (forward + backward), the formula of the module docstring."""
    c = model.config
    dense = sum(p.numel() for n, p in model.named_parameters() if ".layers." in n and p.dim() == 2)
    tokens = groups * prompt + sum(response_lens)
    context = groups * prompt**2 + sum((prompt + t) ** 2 - prompt**2 for t in response_lens)
    attention = 2 * c.num_hidden_layers * c.hidden_size * context
    head = 2 * c.hidden_size * c.vocab_size * sum(response_lens)
    return 3 * (2 * dense * tokens + attention + head)


def start_group(device: torch.device, rank: int, world_size: int, port: int) -> None:
    import torch.distributed as dist

    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
    )


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_rss_gib() -> float:
    """This process's peak resident memory (``VmHWM``; exec resets it, unlike ``ru_maxrss``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20  # kB
    return float("nan")


def oprl_imports() -> list[str]:
    """Third-party packages imported at module level by the oprl modules loaded so far (what those packages import
    in turn depends on their installed versions, not on oprl; imports inside functions show in ``sys.modules``
    when they run, which ``ABSENT`` checks)."""
    import ast

    names: set[str] = set()
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] != "oprl" or not getattr(module, "__file__", None):
            continue
        for node in ast.parse(Path(module.__file__).read_text()).body:
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return sorted(n for n in names if n not in sys.stdlib_module_names and n != "oprl")


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1.5b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--world-size", type=int, default=1, help="trainer ranks (processes; GPUs on CUDA)")
    parser.add_argument(
        "--dtype",
        choices=["bfloat16", "float32"],
        default="bfloat16",
        help="compute and explorer dtype (master weights stay float32)",
    )
    parser.add_argument("--groups", type=int, default=8, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens")
    parser.add_argument("--response", type=int, default=512, help="max new tokens")
    parser.add_argument("--micro-batch", type=int, default=16, help="optim.micro_batch_size")
    parser.add_argument("--steps", type=int, default=2, help="RL steps (the last one is reported; 0: none)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per rank (CPU)")
    parser.add_argument("--peak-tflops", type=float, default=790.0, help="the chip's dense bf16 peak")
    parser.add_argument("--tinker", action="store_true", help="then the Tinker server's step (module docstring)")
    parser.add_argument("--tinker-rank", type=int, default=32, help="its LoRA rank (0: full fine-tuning)")
    parser.add_argument("--tinker-loss", choices=["ppo", "importance_sampling"], default="ppo")
    parser.add_argument("--adapter-sync", action="store_true", help="then a LoRA weight sync both ways (docstring)")
    parser.add_argument("--adapter-ranks", type=int, nargs="+", default=[16, 64], help="its LoRA ranks")
    parser.add_argument("--adapter-slots", type=int, default=2, help="vLLM's max_loras (sync.offset + 1)")
    parser.add_argument("--syncs", type=int, default=3, help="syncs per rank and mode (the median is reported)")
    parser.add_argument("--adapter-vllm", action="store_true", help="and vLLM's part (an image with vLLM only)")
    return parser.parse_args(argv)


def rank_main(rank: int, args, port: int, results) -> None:
    """One trainer rank; rank 0 is also the explorer (generates, then loads the gathered weights)."""
    import torch.distributed as dist

    from oprl.algorithms import PRESETS
    from oprl.algorithms.method import Method
    from oprl.messages import Experience
    from oprl.models.truncation import Sampling
    from oprl.rollout.lean_engine import LeanEngine
    from oprl.trainer.distributed import DataParallel, gather_weights
    from oprl.trainer.trainer import Trainer

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", rank)
    start_group(device, rank, args.world_size, port)
    dtype = getattr(torch, args.dtype)
    built = time.perf_counter()
    # float32 master weights built on rank 0's CPU (as rank 0 loads them; the others only the shapes, on meta);
    # fully_shard moves each shard to the device and broadcasts rank 0's values.
    policy = build_model(args.shape, torch.device("cpu" if rank == 0 else "meta"), torch.float32)
    parallel = DataParallel("fsdp", device=device, compute_dtype=None if dtype == torch.float32 else dtype)
    optim = SimpleNamespace(
        lr=1e-6,
        betas=(0.9, 0.999),
        weight_decay=0.01,
        grad_clip=1.0,
        mini_batches=1,
        epochs=1,
        micro_batch_size=args.micro_batch,
    )
    trainer = Trainer(
        policy,
        pad_id=PAD,
        method=Method.of(PRESETS["grpo"], max_response_tokens=args.response),
        optim=optim,
        sampling=Sampling(),
        parallel=parallel,
    )
    trainer_rss = peak_rss_gib()
    engine = None
    if rank == 0:
        explorer_model = build_model(args.shape, device, dtype)  # the explorer's own copy
        engine = LeanEngine(explorer_model, IdTokenizer(), max_new_tokens=args.response)  # temperature 1
    setup_s = time.perf_counter() - built
    generator = torch.Generator().manual_seed(0)
    vocab = SHAPES[args.shape]["vocab_size"]
    result: dict = {
        "shape": args.shape,
        "device": str(device),
        "world_size": args.world_size,
        "dtype": args.dtype,
        "torch": torch.__version__,
        "setup_s": setup_s,
        "params": sum(p.numel() for p in build_model(args.shape, "meta", dtype).parameters()),
    }
    for step in range(1, args.steps + 1):
        prompts = [torch.randint(2, vocab, (args.prompt,), generator=generator).tolist() for _ in range(args.groups)]
        rows = [p for p in prompts for _ in range(args.group_size)]
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        synchronize(device)
        tick = time.perf_counter()
        sampled = [engine.generate(rows, seed=step) if rank == 0 else None]
        dist.broadcast_object_list(sampled, src=0)  # the explorer's batch reaches every rank
        rollout = sampled[0]
        synchronize(device)
        generate_s = time.perf_counter() - tick
        batch = [
            Experience(
                prompt_ids=p,
                response_ids=r,
                behavior_logprobs=lp,
                reward=float(i % 3 == 0),
                reward_components={},
                group_id=i // args.group_size,
                task_id="x",
                policy_version=step - 1,
                response_text="",
            )
            for i, (p, r, lp) in enumerate(zip(rows, rollout.response_ids, rollout.behavior_logprobs, strict=True))
        ]
        tick = time.perf_counter()
        metrics = trainer.step(batch)
        synchronize(device)
        train_s = time.perf_counter() - tick
        tick = time.perf_counter()
        weights = gather_weights(policy, dtype, rank=rank)
        if rank == 0:
            explorer_model.load_state_dict(weights, strict=False)
        del weights
        synchronize(device)
        sync_s = time.perf_counter() - tick
        lengths = [len(r) for r in rollout.response_ids]
        flops = train_flops(policy, args.groups, args.prompt, lengths) / args.world_size  # per rank
        result |= {
            "step": step,
            "rows": len(rows),
            "response_tokens": sum(lengths),
            "generate_s": generate_s,
            "generate_tokens_per_s": sum(lengths) / generate_s,
            "train_s": train_s,
            "train_tflops_per_s_per_rank": flops / train_s / 1e12,
            "trainer_mfu": flops / train_s / (args.peak_tflops * 1e12),
            "weight_sync_s": sync_s,
            "rl_step_s": generate_s + train_s + sync_s,
            "loss": metrics["loss/total"],
            "grad_norm": metrics["optim/grad_norm"],
        }
        if device.type == "cuda":
            result["peak_gpu_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        result["elapsed_s"] = time.perf_counter() - args.started
        if rank == 0:
            print(json.dumps(result), file=sys.stderr, flush=True)  # what a run cut short still reports
    memory = [None] * args.world_size
    dist.all_gather_object(memory, {"peak_rss_gib": peak_rss_gib(), "rss_after_setup_gib": trainer_rss})
    result["per_rank"] = memory
    result["pydantic_imported"] = "pydantic" in sys.modules
    result["oprl_imports"] = oprl_imports()
    result["not_on_gpu_image"] = not_on_gpu_image(result["oprl_imports"])
    dist.destroy_process_group()
    if rank == 0:
        results.put(result)


def not_on_gpu_image(imports: list[str]) -> list[str]:
    """What this process imported that the GPU image lacks: module-level imports of oprl modules, and ``ABSENT``."""
    return sorted({name for name in imports if name not in GPU_IMAGE} | (ABSENT & set(sys.modules)))


def vocabulary_tokenizer(vocab: int):
    """A word-level tokenizer of exactly ``vocab`` ids (``<pad>`` = PAD, ``<eos>`` = EOS, ``<unk>``, then ``t3``
    ...) with a chat template (the backend's ``load_pretrained`` refuses a tokenizer without one)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"<pad>": PAD, "<eos>": EOS, "<unk>": 2} | {f"t{i}": i for i in range(3, vocab)}
    core = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    assert len(tokenizer) == vocab
    return tokenizer


def tinker_section(args) -> dict:
    """The Tinker server's RL step through its backend (module docstring, 4.): seconds, tokens/s, peak memory."""
    import tempfile

    import numpy as np

    from oprl.models.loading import quiet_transformers
    from oprl.serve.tinker.backend import ModelTable, TinkerModels
    from oprl.serve.tinker.losses import loss_spec
    from oprl.serve.tinker.records import Datum, ForwardBackward

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    vocab = SHAPES[args.shape]["vocab_size"]
    out: dict = {"shape": args.shape, "device": str(device), "lora_rank": args.tinker_rank, "loss_fn": args.tinker_loss}
    peaks: dict[str, float] = {}
    quiet_transformers()  # no progress bars from save_pretrained

    def timed(phase: str, work):
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        synchronize(device)
        tick = time.perf_counter()
        value = work()
        synchronize(device)
        out[f"{phase}_s"] = time.perf_counter() - tick
        if cuda:
            peaks[phase] = torch.cuda.max_memory_allocated(device) / 2**30
        return value

    with tempfile.TemporaryDirectory(prefix="gpu-check-tinker-") as root:
        directory = str(Path(root) / "model")

        def save() -> None:
            model = build_model(args.shape, device, getattr(torch, args.dtype))
            model.save_pretrained(directory)
            vocabulary_tokenizer(vocab).save_pretrained(directory)
            del model

        timed("save_model", save)
        table = ModelTable({"gpu-check": directory}, [], str(device))
        table.directories["gpu-check"] = directory  # resolved: nothing looks it up
        models = TinkerModels(table, Path(root) / "state", str(device))
        lora = {"rank": args.tinker_rank, "seed": 0}
        policy = timed("create_model", lambda: models.create_policy("gpu-check:train:0", "owner", "gpu-check", lora))
        out["trainable_params"] = sum(p.numel() for p in policy.trainable().values())
        sampler = models.snapshot_sampler(policy, "gpu-check:sample:0")
        generator = torch.Generator().manual_seed(1)
        prompts = [torch.randint(3, vocab, (args.prompt,), generator=generator).tolist() for _ in range(args.groups)]
        requests = [
            {
                "prompt": {"chunks": [{"tokens": prompt}]},
                "num_samples": args.group_size,
                "sampling_params": {"max_tokens": args.response, "seed": g},
            }
            for g, prompt in enumerate(prompts)
        ]
        outcomes = timed("sample", lambda: models.sample(sampler, requests))
        data, behaviour = [], []
        for prompt, sampled in zip(prompts, outcomes, strict=True):
            assert not isinstance(sampled, Exception), sampled
            for k, sequence in enumerate(sampled.sequences):  # tinker-cookbook's RL datum: loss on the reply only
                full, pad = prompt + sequence.tokens, len(prompt) - 1
                advantage = 1.0 if k % 2 else -1.0
                inputs = {
                    "target_tokens": np.array(full[1:], np.int64),
                    "logprobs": np.array([0.0] * pad + sequence.logprobs, np.float32),
                    "advantages": np.array([0.0] * pad + [advantage] * len(sequence.tokens), np.float32),
                }
                data.append(Datum(full[:-1], inputs))
                behaviour.append((pad, np.array(sequence.logprobs, np.float32)))
        sampled_tokens = sum(len(b) for _, b in behaviour)
        out |= {
            "rows": len(data),
            "sampled_tokens": sampled_tokens,
            "sample_tokens_per_s": sampled_tokens / out["sample_s"],
        }
        request = ForwardBackward(policy.model_id, 1, args.tinker_loss, {}, False, data)
        spec = loss_spec(args.tinker_loss, {})
        result = timed("forward_backward", lambda: models.forward_backward(policy, request, spec))
        ratios = [
            np.abs(np.exp(o["logprobs"][pad:].astype(np.float64) - lp) - 1).max(initial=0.0)
            for o, (pad, lp) in zip(result.outputs, behaviour, strict=True)
        ]
        trained_tokens = sum(len(d.tokens) for d in data)
        out |= {
            "forward_backward_tokens": trained_tokens,
            "forward_backward_tokens_per_s": trained_tokens / out["forward_backward_s"],
            "loss": result.metrics["loss:sum"],
            "max_abs_ratio_minus_1": float(max(ratios)),
        }
        adam = {"learning_rate": 1e-5, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "grad_clip_norm": 1.0}
        step = timed("optim_step", lambda: models.optim_step(policy, adam))
        out["grad_norm"] = step["metrics"]["grad_norm:mean"]
        out["version"] = policy.version
    if cuda:
        out["peak_gpu_memory_gib"] = peaks
    out["peak_rss_gib"] = peak_rss_gib()  # the whole process's (with --steps on one rank, the RL step's too)
    out["elapsed_s"] = time.perf_counter() - args.started
    return out


def adapter_sync_section(args) -> dict:
    """One LoRA weight sync, merged vs adapter, per rank (module docstring, 5.): seconds, bytes, slot memory."""
    device = torch.device(args.device)
    out: dict = {"shape": args.shape, "device": str(device), "sampler_dtype": args.dtype, "ranks": {}}
    for rank in args.adapter_ranks:
        out["ranks"][rank] = adapter_sync_at(rank, args, device)
        print(json.dumps({"adapter_sync_rank": rank} | out["ranks"][rank]), file=sys.stderr, flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def adapter_sync_at(rank: int, args, device: torch.device) -> dict:
    """``adapter_sync_section``'s numbers at LoRA rank ``rank``."""
    import statistics
    import tempfile

    from peft import LoraConfig, get_peft_model

    from oprl.models.adapters import merged_weights, write_adapter
    from oprl.rollout.vllm_shared import lora_slot_bytes, lora_slots_for
    from oprl.worker_parts import trainable_weights

    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear")
    trainer = get_peft_model(build_model(args.shape, device, torch.float32), config)
    sampler = get_peft_model(build_model(args.shape, device, getattr(torch, args.dtype)), config)
    slots = lora_slots_for(rank, args.adapter_slots)
    seconds: dict[str, list[float]] = {}
    sizes: dict[str, int] = {}

    def timed(part: str, work):
        synchronize(device)
        tick = time.perf_counter()
        value = work()
        synchronize(device)
        seconds.setdefault(part, []).append(time.perf_counter() - tick)
        return value

    with tempfile.TemporaryDirectory(prefix="gpu-check-lora-") as root:
        for sync in range(args.syncs):
            with torch.no_grad():  # a stand-in for an optimizer step: every adapter tensor moves
                for name, param in trainer.named_parameters():
                    if "lora_" in name:
                        param.add_(torch.randn_like(param) * 0.01)
            snapshot = timed("adapter_snapshot", lambda: trainable_weights(trainer, to_cpu=True))
            timed("adapter_load", lambda: sampler.load_state_dict(snapshot, strict=False))  # noqa: B023
            directory = Path(root) / f"v{sync}"
            sizes["adapter"] = timed("adapter_file", lambda: write_adapter(sampler, directory))  # noqa: B023
            merged = timed("merged_merge", lambda: merged_weights(sampler))
            host = timed("merged_to_cpu", lambda: {k: v.to("cpu") for k, v in merged.items()})  # noqa: B023
            sizes["merged"] = sum(t.numel() * t.element_size() for t in host.values())
            merged = host = {}  # the next sync's merge starts with the memory free
    medians = {part: statistics.median(values) for part, values in seconds.items()}
    adapter_s = medians["adapter_snapshot"] + medians["adapter_load"] + medians["adapter_file"]
    merged_s = medians["merged_merge"] + medians["merged_to_cpu"]
    result = {
        "seconds": medians,
        "adapter_sync_s": adapter_s,
        "merged_sync_s": merged_s,
        "merged_over_adapter_s": merged_s / adapter_s,
        "adapter_mib": sizes["adapter"] / 2**20,
        "merged_mib": sizes["merged"] / 2**20,
        "merged_over_adapter_bytes": sizes["merged"] / sizes["adapter"],
        "vllm_max_lora_rank": slots.rank,
        "vllm_max_loras": slots.slots,
        "vllm_slot_gib": lora_slot_bytes(sampler, slots, args.dtype) / 2**30,
    }
    if args.adapter_vllm:
        result["vllm"] = vllm_sync(sampler, rank, args)
    return result


def vllm_sync(sampler, rank: int, args) -> dict:
    """vLLM's part of a sync on this device (``--adapter-vllm``): an engine built with ``--adapter-slots`` adapter
    slots serves ``--syncs`` versions as adapters (``SharedLLM.serve_adapter``: the base once, then ``add_lora``)
    and, on a second engine, merged (``SharedLLM.serve``: ``reload_weights`` of the whole model); seconds each, and
    the GPU memory the adapter engine holds."""
    import statistics
    from types import SimpleNamespace as Served

    from oprl.rollout.vllm_shared import allocated_lora_bytes, lora_slots_for, shared_llm

    device = torch.device(args.device)
    result: dict = {}
    for mode in ("adapter", "merged"):
        lora = lora_slots_for(rank, args.adapter_slots) if mode == "adapter" else None
        before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        shared = shared_llm(sampler, args.dtype, kv_cache_gb=1.0, lora=lora)
        if device.type == "cuda":
            result[f"{mode}_engine_gib"] = (torch.cuda.memory_allocated(device) - before) / 2**30
        served = Served(model=sampler, key=rank * 10 + (mode == "merged"), generation=0, lora_sync=mode)
        times = []
        for generation in range(args.syncs + 1):  # the first loads the base (adapter) or the model: not counted
            served.generation = generation
            synchronize(device)
            tick = time.perf_counter()
            shared.serve(served)
            synchronize(device)
            times.append(time.perf_counter() - tick)
        result[f"{mode}_first_s"], result[f"{mode}_sync_s"] = times[0], statistics.median(times[1:])
        if mode == "adapter":  # what vLLM allocated for its slots, against lora_slot_bytes' count
            result["slot_gib_allocated"] = allocated_lora_bytes(shared) / 2**30
    return result


def main(argv=None) -> dict:
    import torch.multiprocessing as mp

    args = parse(argv)
    args.started = time.perf_counter()  # CLOCK_MONOTONIC on Linux: comparable in the spawned ranks
    result: dict = {}
    if args.steps > 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        context = mp.get_context("spawn")
        results = context.Queue()
        if args.world_size == 1:
            rank_main(0, args, port, results)
        else:
            mp.start_processes(rank_main, args=(args, port, results), nprocs=args.world_size, start_method="spawn")
        result = results.get()
    if args.tinker:
        if args.threads:
            torch.set_num_threads(args.threads)
        result["tinker"] = tinker_section(args)
        print(json.dumps({"tinker": result["tinker"]}), file=sys.stderr, flush=True)
    if args.adapter_sync:
        if args.threads:
            torch.set_num_threads(args.threads)
        result["adapter_sync"] = adapter_sync_section(args)
    # This process's imports too: the Tinker section's, and the ranks' when they were other processes.
    imports = oprl_imports()
    result["oprl_imports"] = sorted(set(result.get("oprl_imports", [])) | set(imports))
    result["pydantic_imported"] = result.get("pydantic_imported", False) or "pydantic" in sys.modules
    result["not_on_gpu_image"] = sorted(set(result.get("not_on_gpu_image", [])) | set(not_on_gpu_image(imports)))
    if args.adapter_vllm:  # asked for: an image with vLLM, whose own dependencies (pydantic, Ray, ...) come with it
        result["image_check"] = "skipped: --adapter-vllm imports vLLM and its dependencies"
        result["not_on_gpu_image"] = []
    result["total_s"] = time.perf_counter() - args.started
    print(json.dumps(result, indent=1))
    if result["not_on_gpu_image"]:
        names = ", ".join(result["not_on_gpu_image"])
        raise SystemExit(f"gpu_check imported {names}: the GPU machine's image does not have it")
    return result


if __name__ == "__main__":
    main()
