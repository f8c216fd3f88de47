"""The trainer's memory per rank, from the model's shape: the tables of docs/runtime.md ("Memory plan").

Per parameter, with AdamW and trainer.sharding=fsdp (float32 master weights whatever model.dtype):
  weights 4 B + gradients 4 B + AdamW exp_avg 4 B + exp_avg_sq 4 B = 16 B, divided over N ranks.
sharding=none/ddp keep all 16 B on every rank (model.dtype=float32) or 8 B (bfloat16 weights, gradients and
AdamW state: 2 + 2 + 4; small updates round away, see docs/runtime.md). On top, per rank, in the compute dtype:
  - the root FSDP group (embeddings, final norm, head) gathered for the whole forward/backward: V d (x2 if untied)
    parameters, plus its gradient before the reduce-scatter;
  - two decoder layers gathered at a time (the current one and the prefetched next);
  - activations kept for backward (no activation checkpointing): per token and layer about
    9 d + 3 d_kv + 4 I values (norm inputs/outputs, q/k/v after RoPE, attention output, o_proj input, gate/up,
    silu(gate), their product) -- an estimate of what autograd saves for a Llama block with SDPA attention;
    tokens per micro-batch = groups x prompt + rows x response (each group's prompt is prefilled once);
  - with trainer.activation_checkpointing (--activation-checkpointing): each layer's input only, d values per
    token and layer, plus one layer's intermediates while backward recomputes it; tokens = rows x (prompt +
    response), since checkpointed rows run their prompt packed with the response (no shared prefill).

    python benchmarks/memory_plan.py                       # the tables for 135M / 1.5B / 8B
    python benchmarks/memory_plan.py --activation-checkpointing
    python benchmarks/memory_plan.py --shape qwen2.5-0.5b --world-sizes 2 --dtype float32 --rows 4 --groups 2 \
        --prompt 32 --response 32                         # the prediction next to the CPU measurement
"""

from __future__ import annotations

import argparse

SHAPES = {  # (vocab, d, layers, intermediate, kv width, tied)
    "smollm2-135m": (49152, 576, 30, 1536, 192, True),
    "qwen2.5-0.5b": (151936, 896, 24, 4864, 128, True),
    "qwen2.5-1.5b": (151936, 1536, 28, 8960, 256, True),
    "llama-3.1-8b": (128256, 4096, 32, 14336, 1024, False),
}
GIB = 2**30


def parameters(shape: str) -> tuple[int, int, int]:
    """(total, root group, one decoder layer) parameter counts (Qwen's q/k/v biases included)."""
    vocab, d, layers, inter, kv, tied = SHAPES[shape]
    layer = d * d + 2 * d * kv + d * d + 3 * d * inter + 2 * d + (d + 2 * kv if shape.startswith("qwen") else 0)
    root = vocab * d * (1 if tied else 2) + d
    return root + layers * layer, root, layer


def per_rank_gib(
    shape: str, world: int, *, sharding: str, dtype: str, tokens: int, checkpointing: bool = False
) -> dict[str, float]:
    _, d, layers, inter, kv, _ = SHAPES[shape]
    total, root, layer = parameters(shape)
    compute = 2 if dtype == "bfloat16" else 4
    if sharding == "fsdp":
        state = 16 * total / world
        gathered = (root * 2 + 2 * layer) * compute if world > 1 or compute == 2 else 0
    else:
        state = (8 if dtype == "bfloat16" else 16) * total
        gathered = 0
    per_layer = 9 * d + 3 * kv + 4 * inter  # values autograd saves per token in one decoder layer
    if checkpointing:
        activations = tokens * (layers * d + per_layer) * compute
    else:
        activations = tokens * layers * per_layer * compute
    return {
        "state": state / GIB,
        "gathered": gathered / GIB,
        "activations": activations / GIB,
        "total": (state + gathered + activations) / GIB,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), action="append")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--sharding", choices=["fsdp", "none"], default="fsdp")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16", help="compute dtype")
    parser.add_argument("--groups", type=int, default=2, help="groups per micro-batch")
    parser.add_argument("--rows", type=int, default=16, help="rows per micro-batch (optim.micro_batch_size)")
    parser.add_argument("--prompt", type=int, default=200)
    parser.add_argument("--response", type=int, default=1024)
    parser.add_argument("--activation-checkpointing", action="store_true")
    args = parser.parse_args(argv)
    if args.activation_checkpointing:
        tokens = args.rows * (args.prompt + args.response)
    else:
        tokens = args.groups * args.prompt + args.rows * args.response
    print(
        f"micro-batch: {args.rows} rows, {args.groups} groups, {tokens} tokens; sharding={args.sharding}, "
        f"compute {args.dtype}, activation checkpointing {'on' if args.activation_checkpointing else 'off'}"
    )
    print(f"{'model':14} {'params':>7} " + " ".join(f"{'N=' + str(n):>22}" for n in args.world_sizes))
    for shape in args.shape or ["smollm2-135m", "qwen2.5-1.5b", "llama-3.1-8b"]:
        cells = []
        for world in args.world_sizes:
            m = per_rank_gib(
                shape,
                world,
                sharding=args.sharding,
                dtype=args.dtype,
                tokens=tokens,
                checkpointing=args.activation_checkpointing,
            )
            cells.append(f"{m['state']:5.1f}+{m['gathered']:4.1f}+{m['activations']:5.1f}={m['total']:5.1f}")
        print(f"{shape:14} {parameters(shape)[0] / 1e9:6.2f}B " + " ".join(f"{c:>22}" for c in cells))
    print("GiB per rank: sharded state + gathered (root, 2 layers) + activations = total")


if __name__ == "__main__":
    main()
