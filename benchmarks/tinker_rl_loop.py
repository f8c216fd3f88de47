"""An RL loop written against the Tinker API, run through ``oprl serve tinker``, against ``oprl train`` on the same job.

The loop is the shape of tinker-cookbook's ``recipes/rl_loop.py`` (which cannot run here: tinker-cookbook 0.6.1
needs ``tml-renderers>=0.4.1``, not on the package index), written with the real ``tinker`` SDK only: each step
saves the weights and gets a sampling client, samples ``--group`` replies for each of ``--prompts`` problems of
oprl's arithmetic task (the default job's task, train split, the same order for every seed), scores them with the
task's reward, gives each reply A = r − mean(group) (std-normalised, GRPO's advantages), sends one
``forward_backward`` with ``importance_sampling`` and ``{"preset": "grpo"}`` (oprl's GRPO loss as a sum) and one
``optim_step`` (Adam, ``--lr``). The server trains every parameter (``rank=0``) of the warm-started tiny model,
the model ``oprl train`` starts from.

Reported per side: median seconds per step (after ``--skip`` warm-up steps), the mean training reward of the
first and last 5 steps, and for the Tinker side where the time goes (sampling, forward_backward, optim_step, the
client's own work). The two sides do not compute the same update (oprl normalises the loss by the batch's
tokens, the Tinker loss is a sum; the lr here is per summed token), so compare their costs, and the rewards only
as "it learns". Also recorded: the tree's commit (``--label`` overrides it), the CPU's name and bf16/AMX flags,
and the load average before and after (the machine may be shared).

``--config`` / ``--set`` choose the job for both sides (any oprl config and ``key=value`` settings; the model is
its ``model.path``, served under that name; the embedded ``tiny`` is served warm-started as ``oprl train`` starts
it). SmolLM2 on the arithmetic example, a shorter job:

    python benchmarks/tinker_rl_loop.py --steps 30 --json benchmarks/results/tinker_rl_loop.json
    python benchmarks/tinker_rl_loop.py --config configs/examples/smollm2-arithmetic-cpu.yaml --steps 6 --skip 1 \
        --prompts 4 --group 4 --max-tokens 48 --lr 1e-5 --json benchmarks/results/tinker_rl_loop_smollm2.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# benchmarks/ is the script's directory, so on sys.path
from _common import cpu

from oprl.machine import cpu_flags


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def served_name(args) -> str:
    """The ``base_model`` name of the job's model: the embedded model's, or its ``model.path`` as given."""
    path = job_config(args).model.path
    return "oprl/tiny" if path == "tiny" else path


def job_config(args):
    from oprl.config import load_config

    return load_config(args.config, [*args.set, f"seed={args.seed}"])


def worker_threads(args) -> int:
    """The torch threads ``oprl train`` gives each of its workers on this job (``runtime.torch_threads``, else the
    cores over trainer + explorers): the server computes with as many, so both sides multiply alike. On a loaded
    machine this matters more than anything else: an OpenMP region waits for its slowest thread, and with more
    threads than the free cores one is often descheduled."""
    runtime = job_config(args).runtime
    return runtime.torch_threads or max(1, (os.cpu_count() or 1) // (1 + runtime.explorers))


def start_server(args, port: int, log: Path, source: Path | None = None) -> subprocess.Popen:
    """``oprl serve tinker`` on ``port``; from the source tree ``source`` (its ``src/`` first on the path: the A/B
    of ``--before``) or this one."""
    env = dict(os.environ, TINKER_TELEMETRY="0")
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(source / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    name = served_name(args)
    models = [] if name == "oprl/tiny" else ["--model", f"{name}={name}"]
    threads = [] if args.server_threads == "default" else ["--threads", str(worker_threads(args))]
    proc = subprocess.Popen(
        [sys.executable, "-m", "oprl", "serve", "tinker", "--port", str(port), *models, *threads],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode}); see {log}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"the server did not listen within 600 s; see {log}")


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far (its threads included), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def tinker_loop(args, port: int, server_pid: int | None = None) -> dict:
    import numpy as np
    import tinker
    from tinker import types

    from oprl.models.chat import encode_problem
    from oprl.tasks import build_task

    os.environ.update(TINKER_BASE_URL=f"http://127.0.0.1:{port}", TINKER_API_KEY="tml-local", TINKER_TELEMETRY="0")
    requests = count_requests()
    task = build_task(job_config(args).task)
    problems = list(task.problems("train"))
    service = tinker.ServiceClient()
    trainer = service.create_lora_training_client(base_model=served_name(args), rank=0, seed=args.seed).result()
    tokenizer = trainer.get_tokenizer()
    rewards, seconds, cpu, parts = [], [], [], {"sample": [], "forward_backward": [], "optim_step": [], "client": []}
    cursor = 0
    per_step: list[dict[str, int]] = []
    for step in range(args.steps):
        seen = dict(requests)
        start = time.perf_counter()
        cpu_start = (own_cpu_s(), process_cpu_s(server_pid) if server_pid else 0.0)
        sampler = trainer.save_weights_and_get_sampling_client().result()
        batch = problems[cursor : cursor + args.prompts]
        cursor += args.prompts
        tick = time.perf_counter()
        futures = []
        for i, problem in enumerate(batch):
            prompt = encode_problem(tokenizer, problem)
            params = types.SamplingParams(max_tokens=args.max_tokens, seed=args.seed * 100_003 + step * 1_009 + i)
            futures.append((problem, prompt, sampler.sample(types.ModelInput.from_ints(prompt), args.group, params)))
        results = [(problem, prompt, future.result()) for problem, prompt, future in futures]
        sampled = time.perf_counter()
        data, step_rewards = [], []
        for problem, prompt, result in results:
            replies = [tokenizer.decode(s.tokens, skip_special_tokens=True) for s in result.sequences]
            scores = np.array([r.total for r in task.score([problem] * len(replies), replies)], dtype=np.float64)
            step_rewards.extend(scores.tolist())
            std = scores.std()
            advantages = (scores - scores.mean()) / (std + 1e-6) if std > 0 else np.zeros_like(scores)
            for sequence, advantage in zip(result.sequences, advantages, strict=True):
                tokens = prompt + list(sequence.tokens)
                n = len(prompt) - 1  # positions before the reply: no loss there
                data.append(
                    types.Datum(
                        model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={
                            "target_tokens": tokens[1:],
                            "logprobs": [0.0] * n + list(sequence.logprobs),
                            "advantages": [0.0] * n + [float(advantage)] * len(sequence.tokens),
                        },
                    )
                )
        built = time.perf_counter()
        fb = trainer.forward_backward(data, "importance_sampling", {"preset": "grpo"})
        fb.result()
        backward = time.perf_counter()
        trainer.optim_step(types.AdamParams(learning_rate=args.lr, grad_clip_norm=1.0)).result()
        done = time.perf_counter()
        rewards.append(float(np.mean(step_rewards)))
        seconds.append(done - start)
        if server_pid:
            cpu.append((own_cpu_s() - cpu_start[0], process_cpu_s(server_pid) - cpu_start[1]))
        parts["sample"].append(sampled - tick)
        parts["forward_backward"].append(backward - built)
        parts["optim_step"].append(done - backward)
        parts["client"].append((tick - start) + (built - sampled))
        per_step.append({route: n - seen.get(route, 0) for route, n in requests.items() if n > seen.get(route, 0)})
        print(f"tinker step {step + 1}/{args.steps}: reward {rewards[-1]:.3f}, {seconds[-1]:.2f} s", flush=True)
    kept = slice(args.skip, None)
    return {
        "median_step_s": statistics.median(seconds[kept]),
        "mean_cpu_per_step_s": statistics.mean(c + s for c, s in cpu[kept]) if cpu else None,
        "mean_cpu_client_server_s": [statistics.mean(c[i] for c in cpu[kept]) for i in (0, 1)] if cpu else None,
        "median_parts_s": {k: statistics.median(v[kept]) for k, v in parts.items()},
        "reward_first5": statistics.mean(rewards[:5]),
        "reward_last5": statistics.mean(rewards[-5:]),
        "http_requests_per_step": per_step[-1] if per_step else {},
    }


REQUESTS: dict[str, int] = {}


def count_requests() -> dict[str, int]:
    """HTTP requests the SDK sends from now on, by route (``/api/v1/asample``: n), counted at httpx's ``send``
    (the SDK's one way out): the round trips a step costs, its polls of futures included."""
    import httpx

    counts = REQUESTS  # one count for the process: the patch is applied once, each loop reads differences

    def counted(send):
        def wrapper(self, request, *args, **kwargs):
            counts[request.url.path] = counts.get(request.url.path, 0) + 1
            return send(self, request, *args, **kwargs)

        return wrapper

    for cls in (httpx.Client, httpx.AsyncClient):
        if not getattr(cls.send, "_oprl_counted", False):
            cls.send = counted(cls.send)
            cls.send._oprl_counted = True
    return counts


def oprl_cpu_per_step(args, full_run_cpu_s: float) -> float:
    """``oprl train``'s CPU seconds per step (all its threads), start-up cancelled out: the CPU of its run of
    ``--steps`` steps less that of a run of ``--skip`` steps, over the ``steps - skip`` steps between (the same
    steps the medians keep). CPU time, unlike wall time, hardly moves with the machine's load."""
    return (full_run_cpu_s - oprl_train(args, steps=args.skip)["cpu_s"]) / (args.steps - args.skip)


def oprl_train(args, steps: int | None = None) -> dict:
    out = Path(tempfile.mkdtemp(prefix="oprl-vs-tinker-"))
    steps = args.steps if steps is None else steps
    command = [
        sys.executable, "-m", "oprl", "train", *([args.config] if args.config else []), *args.set,
        f"steps={steps}", f"seed={args.seed}",
        f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group}",
        f"rollout.max_new_tokens={args.max_tokens}", "eval.interval=0", "eval.num_problems=1", "tensorboard=false",
        "checkpoint.interval=0", "progress=false", f"output_dir={out}", "run_name=oprl", *args.oprl_set,
    ]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rows = [json.loads(line) for line in (out / "oprl" / "metrics.jsonl").open()]
    trained = [r for r in rows if "reward/mean" in r]
    step_s = [r["perf/step_s"] for r in trained if "perf/step_s" in r][args.skip :]
    rewards = [r["reward/mean"] for r in trained]
    return {
        "median_step_s": statistics.median(step_s) if step_s else float("nan"),
        "cpu_s": cpu_s,
        "reward_first5": statistics.mean(rewards[:5]),
        "reward_last5": statistics.mean(rewards[-5:]),
    }


def commit() -> str:
    """The working tree's commit (``-dirty`` when it has changes), or ``unknown`` outside a git checkout."""
    done = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or "unknown"


def bf16_flags() -> list[str]:
    """The bf16 / AMX flags of the CPU (what decides whether bf16 matmuls are native)."""
    return sorted(cpu_flags() & {"avx512_bf16", "amx_bf16", "amx_tile"})


def server_side(args, source: Path | None) -> dict:
    """The Tinker loop against a server started for it (from ``source``, or this tree), stopped after."""
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="oprl-tinker-bench-")) / "server.log"
    server = start_server(args, port, log, source)
    try:
        return tinker_loop(args, port, server.pid)
    finally:
        server.terminate()
        server.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--skip", type=int, default=3, help="warm-up steps left out of the medians")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", default=None, help="an oprl config for both sides (default: the default job)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="oprl setting; repeatable")
    parser.add_argument(
        "--oprl-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of the oprl train side only (e.g. rollout.dtype=float32, the server's precision); repeatable",
    )
    parser.add_argument(
        "--before",
        type=Path,
        default=None,
        help="a source tree (e.g. `git archive REV src | tar "
        "-x -C DIR`) whose server runs the same loop too, each round: the A/B in one run",
    )
    parser.add_argument(
        "--source",
        type=Path,
        default=None,
        help="the source tree of the server under test (default: this one; a snapshot keeps others' uncommitted "
        "edits of a shared tree out)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="rounds of [before server,] server, oprl train, "
        "one after the other (a shared machine's load drifts alike for every side)",
    )
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="also CPU seconds per step (server + client processes; oprl train by a difference of two runs): "
        "on a loaded machine wall time measures the load, CPU time the work",
    )
    parser.add_argument("--label", default=None, help="what ran, in the JSON (default: the tree's git commit)")
    parser.add_argument(
        "--server-threads",
        choices=("job", "default"),
        default="job",
        help="the server's torch "
        "threads: oprl train's per worker on this job (default), or torch's default (servers "
        "before --threads)",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()  # fmt: skip
    load_before = os.getloadavg()
    rounds = []
    for r in range(args.rounds):
        one = {}
        if args.before is not None:
            one["tinker_server_before"] = server_side(args, args.before)
        one["tinker_server"] = server_side(args, args.source)
        one["oprl_train"] = oprl_train(args)
        oprl_s = one["oprl_train"]["median_step_s"]
        one["ratio_step_s"] = one["tinker_server"]["median_step_s"] / oprl_s
        if args.before is not None:
            one["ratio_before_step_s"] = one["tinker_server_before"]["median_step_s"] / oprl_s
        if args.cpu:
            oprl_cpu = one["oprl_train"]["cpu_per_step_s"] = oprl_cpu_per_step(args, one["oprl_train"]["cpu_s"])
            for side in [k for k in one if k.startswith("tinker_server")]:
                suffix = side.removeprefix("tinker_server")
                one[f"ratio{suffix}_cpu_per_step"] = one[side]["mean_cpu_per_step_s"] / oprl_cpu
        one["load_average_1_5_15"] = os.getloadavg()
        print(f"round {r + 1}/{args.rounds}: " + json.dumps({k: v for k, v in one.items() if k.startswith("ratio")}))
        rounds.append(one)
        if args.json:  # each round as it ends: a later round's failure keeps the earlier ones
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"label": args.label or commit(), "rounds": rounds}, indent=2) + "\n")
    result = {
        "label": args.label or commit(),
        "model": served_name(args),
        "cpu": cpu()["model"],
        "cpu_flags": bf16_flags(),
        "cores": os.cpu_count(),
        "load_average_1_5_15": {"before": load_before, "after": os.getloadavg()},
        "server_threads": worker_threads(args) if args.server_threads == "job" else "torch default",
        "settings": vars(args) | {"json": str(args.json) if args.json else None,
                                  "before": str(args.before) if args.before else None,
                                  "source": str(args.source) if args.source else None},
        **{k: v for k, v in rounds[0].items() if k != "load_average_1_5_15"},
    }  # fmt: skip
    if args.rounds > 1:
        result["rounds"] = rounds
        for key in [k for k in rounds[0] if k.startswith("ratio")]:
            result[f"median_{key}"] = statistics.median(r[key] for r in rounds)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
