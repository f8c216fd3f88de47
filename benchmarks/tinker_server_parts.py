"""The Tinker server's two compute paths with and without what makes them cheaper, interleaved in one process (so
that a shared machine's load drifts the same for both): sampling 16 requests of 8 replies as one batched engine
call against one call per request (what the server did before batching), and one ``forward_backward`` of the 128
datums with their 16 prompts run once against every datum run whole. The job's shape is
``tinker_rl_loop.py``'s (the default task's first 16 training problems, 8 replies of up to 8 tokens, GRPO's
preset; the warm-started tiny model, full fine-tuning), without HTTP: the server's backend is called directly.

    python benchmarks/tinker_server_parts.py --threads 1 --json benchmarks/results/tinker_server_parts.json

``--model NAME=DIR --prompts --group --max-tokens`` change the job (SmolLM2's directory for the recipe's shape),
``--paths forward_backward`` times only those paths.

``--lora-samplers NAME=DIR ...`` measures instead what a new LoRA sampling client of a checkpoint
(``save_weights_for_sampler`` + ``create_sampling_client(model_path=)``) costs before its first sample: a host module
of its own (what the server did before #72: the base loaded, adapters added, the checkpoint copied in) against the
checkpoint's adapter tensors switched into the one host its base and adapter shape share (``_path_host``), seconds
(interleaved, medians) and bytes held per sampler:

    python benchmarks/tinker_server_parts.py --lora-samplers tiny=tiny smollm2=$SMOLLM2_DIR --rank 16 \
        --json benchmarks/results/tinker_lora_samplers.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1], help="torch threads; one run per value")
    parser.add_argument("--repeats", type=int, default=6, help="interleaved repeats (the first is left out)")
    parser.add_argument("--label", default=None, help="what ran, in the JSON (default: the tree's git commit)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--lora-samplers",
        nargs="+",
        default=None,
        metavar="NAME=DIR",
        help="measure a new LoRA checkpoint sampler's cost instead ('tiny' = the embedded model)",
    )
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank of --lora-samplers")
    parser.add_argument("--model", default="tiny=tiny", metavar="NAME=DIR", help="the model ('tiny': embedded)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8, help="replies per prompt")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--paths", nargs="+", default=["sample", "forward_backward"], help="which paths (prefixes)")
    parser.add_argument(
        "--rewards",
        action="store_true",
        help="GRPO advantages of the task's rewards (the loop's; "
        "a group whose replies score alike is loss-free) instead of ±1 alternating",
    )
    args = parser.parse_args()  # fmt: skip
    if args.lora_samplers:
        lora_samplers(args)
        return

    import numpy as np
    import torch

    from oprl.config import load_config
    from oprl.models.chat import encode_problem
    from oprl.serve.tinker.backend import ModelTable, TinkerModels, tiny_directory
    from oprl.serve.tinker.losses import loss_spec
    from oprl.serve.tinker.records import Datum, ForwardBackward
    from oprl.tasks import build_task

    name, directory = args.model.split("=", 1)
    directory = tiny_directory([]) if directory == "tiny" else directory
    models = TinkerModels(ModelTable({name: directory}, [], "cpu"), Path(tempfile.mkdtemp()))
    policy = models.create_policy("p", "owner", name, {"rank": 0, "seed": 0})
    sampler = models.snapshot_sampler(policy, "s")
    problems = list(build_task(load_config(None, ["seed=0"]).task).problems("train"))[: args.prompts]
    prompts = [encode_problem(policy.tokenizer, p) for p in problems]
    requests = [
        {
            "prompt": {"chunks": [{"tokens": p}]},
            "num_samples": args.group,
            "sampling_params": {"max_tokens": args.max_tokens, "seed": i},
        }
        for i, p in enumerate(prompts)
    ]
    data = []  # the loop's datums: prompt + reply, the reply's advantage on its positions
    task = build_task(load_config(None, ["seed=0"]).task)
    for problem, prompt, sampled in zip(problems, prompts, models.sample(sampler, requests), strict=True):
        if args.rewards:  # GRPO's advantages of the task's rewards, as tinker_rl_loop.py: alike replies give A = 0
            replies = [policy.tokenizer.decode(s.tokens, skip_special_tokens=True) for s in sampled.sequences]
            scores = np.array([r.total for r in task.score([problem] * len(replies), replies)])
            std = scores.std()
            advantages = ((scores - scores.mean()) / (std + 1e-6) if std > 0 else np.zeros_like(scores)).tolist()
        else:  # ±1 alternating: every datum carries loss
            advantages = [1.0 if k % 2 else -1.0 for k in range(len(sampled.sequences))]
        for sequence, advantage in zip(sampled.sequences, advantages, strict=True):
            reply = sequence.tokens
            full, pad = prompt + reply, len(prompt) - 1
            logprobs = sequence.logprobs
            inputs = {
                "target_tokens": np.array(full[1:], np.int64),
                "logprobs": np.array([0.0] * pad + logprobs, np.float32),
                "advantages": np.array([0.0] * pad + [advantage] * len(reply), np.float32),
            }
            data.append(Datum(full[:-1], inputs))
    loss_free = sum(not d.inputs["advantages"].any() for d in data)
    request = ForwardBackward("p", 1, "importance_sampling", {"preset": "grpo"}, False, data)
    spec = loss_spec("importance_sampling", {"preset": "grpo"})

    def one_at_a_time():
        for r in requests:
            models.sample(sampler, [r])

    def backward(shared: bool, skip: bool = True):
        models.group_prefixes, models.skip_zero_gradient = shared, skip
        models.forward_backward(policy, request, spec)
        policy.optimizer.zero_grad(set_to_none=True)

    paths = {
        "sample: one batched call": lambda: models.sample(sampler, requests),
        "sample: one call per request": one_at_a_time,
        "forward_backward: shared prompts once": lambda: backward(True),
        "forward_backward: shared prompts once, every position under autograd": lambda: backward(True, False),
        "forward_backward: every datum whole": lambda: backward(False, False),
    }
    runs = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        seconds: dict[str, list[float]] = {name: [] for name in paths}
        cpu: dict[str, list[float]] = {name: [] for name in paths}  # this thread's CPU: the load hardly moves it
        load_before = os.getloadavg()
        for _ in range(args.repeats):
            for name, run in paths.items():
                if not name.startswith(tuple(args.paths)):
                    continue
                start, start_cpu = time.perf_counter(), time.thread_time()
                run()
                seconds[name].append(time.perf_counter() - start)
                cpu[name].append(time.thread_time() - start_cpu)
        medians = {name: statistics.median(values[1:]) for name, values in seconds.items() if values[1:]}
        cpu_medians = {name: statistics.median(values[1:]) for name, values in cpu.items() if values[1:]}
        runs.append({"threads": threads, "load_average_1_5_15": [load_before, os.getloadavg()], "median_s": medians,
                     "median_thread_cpu_s": cpu_medians})  # fmt: skip
        print(json.dumps(runs[-1], indent=2), flush=True)
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True, check=False)
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        "unknown",
    )
    result = {"label": args.label or commit.stdout.strip(), "cpu": cpu, "cores": os.cpu_count(), "datums": len(data),
              "loss_free_datums": loss_free, "advantages": "rewards" if args.rewards else "alternating",
              "runs": runs}  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


def machine(args) -> dict:
    """What ran where: the tree's commit (or ``--label``), the CPU's name, its cores."""
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True, check=False)
    names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
             if "model name" in line]  # fmt: skip
    return {"label": args.label or commit.stdout.strip(), "cpu": names[0] if names else "unknown",
            "cores": os.cpu_count()}  # fmt: skip


def own_host(models, path: str):
    """Before #72: a checkpoint sampler's module of its own (the base loaded, adapters added, the file copied in)."""
    from oprl.checkpoint.files import load_weights
    from oprl.serve.tinker.models import copy_into

    folder, meta = models.checkpoint(path, "model_path")
    host = models.create_policy(f"own:{path}", "owner", meta["base_model"], meta["lora"])
    del models.policies[host.model_id]
    copy_into(host, load_weights(folder / "weights.safetensors"))
    return host


def shared_host(models, name: str, path: str):
    """After: the host its base and adapter shape share, with this checkpoint's adapters switched in."""
    from oprl.serve.tinker.models import Sampler

    return models._path_host(Sampler(f"s:{path}", "owner", name, model_path=path))


def lora_samplers(args) -> None:
    """Per model: seconds and bytes of a new LoRA checkpoint sampler, a host of its own vs the shared host."""
    import torch

    from oprl.serve.tinker.backend import ModelTable, TinkerModels, tiny_directory

    torch.set_num_threads(args.threads[0])
    out = []
    for entry in args.lora_samplers:
        name, directory = entry.split("=", 1)
        directory = tiny_directory([]) if directory == "tiny" else directory
        models = TinkerModels(ModelTable({name: directory}, [], "cpu"), Path(tempfile.mkdtemp()))
        policy = models.create_policy("p", "owner", name, {"rank": args.rank, "seed": 0})
        paths = []
        for version in range(args.repeats + 1):  # one checkpoint per version, every one different
            with torch.no_grad():
                for tensor in policy.trainable().values():
                    tensor.add_(0.01)
            policy.version += 1
            paths.append(models.save(policy, "sampler_weights", f"v{version}", optimizer=False))

        shared_host(models, name, paths[0])  # the shared host exists once: what every later sampler finds
        seconds: dict[str, list[float]] = {"own host": [], "shared host": []}
        held = {}
        for path in paths[1:]:
            start = time.perf_counter()
            host = own_host(models, path)
            seconds["own host"].append(time.perf_counter() - start)
            tensors = [*host.model.parameters(), *host.model.buffers()]  # a tied head counted once
            held["own host"] = sum(t.numel() * t.element_size() for t in tensors)
            del host
            start = time.perf_counter()
            shared_host(models, name, path)
            seconds["shared host"].append(time.perf_counter() - start)
            held["shared host"] = sum(t.numel() * t.element_size() for t in models.adapters[path].values())
        medians = {key: statistics.median(values) for key, values in seconds.items()}
        out.append({"model": name, "rank": args.rank, "samplers": len(paths) - 1, "median_s": medians,
                    "bytes_per_sampler": held, "load_average_1_5_15": os.getloadavg()})  # fmt: skip
        print(json.dumps(out[-1], indent=2), flush=True)
    if args.json:
        args.json.write_text(json.dumps({**machine(args), "threads": args.threads[0], "runs": out}, indent=2) + "\n")


if __name__ == "__main__":
    main()
