"""The SmolLM2 arithmetic job two ways, one after the other in one invocation: as a tinker-cookbook recipe through
``oprl serve tinker`` (``examples/tinker_smollm2_arithmetic.py``) and as ``oprl train`` on the config the recipe takes
its task from (``configs/examples/smollm2-arithmetic-vllm.yaml``: vLLM sampling one step ahead of the trainer, two
worker processes). Same task, model, batch (4 problems × 8 replies of ≤ 48 tokens), steps and evaluation schedule
(the first ``--eval-problems`` test problems at temperature 1, before training and every ``--eval-every`` steps).

Reported per side: wall time of the whole process (start-up and evaluations included), median seconds per training
step (the recipe: the cookbook's ``time/total``; ``oprl train``: ``perf/step_s``; both include the evaluations of
their step), the test accuracy curve, and the minutes until the accuracy first reached the start + 30 points; then
the ratios recipe / ``oprl train``. Also the CPU, its bf16/AMX flags and the load average before and after.

    python benchmarks/tinker_recipe_vs_train.py --steps 30 --json benchmarks/results/tinker_recipe_vs_train.json \\
        -- --async-off-policy 1 --overlap --loss stable_reinforce --stable-reinforce grpo

Arguments after ``--`` go to the recipe (``examples/tinker_smollm2_arithmetic.py --help``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# benchmarks/ is the script's directory, so on sys.path
from _common import commit, cpu

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "configs/examples/smollm2-arithmetic-vllm.yaml"


def timed(command: list[str], log: Path, env: dict[str, str]) -> float:
    start = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{command[1]} exited {done.returncode}; see {log}")
    return time.monotonic() - start


def first_gain(evals: list[dict], points: float) -> float | None:
    """Minutes until an evaluation first reached the first one's accuracy + ``points``/100 (None: never)."""
    start = evals[0]["accuracy"]
    return next((e["minutes"] for e in evals if e["accuracy"] >= start + points / 100), None)


def recipe_side(args, work: Path, env: dict[str, str]) -> dict:
    results = work / "recipe.json"
    command = [sys.executable, "examples/tinker_smollm2_arithmetic.py", "--steps", str(args.steps), "--eval-problems",
               str(args.eval_problems), "--eval-every", str(args.eval_every), "--log-path", str(work / "recipe"),
               "--results", str(results), *args.recipe]  # fmt: skip
    wall = timed(command, work / "recipe.log", env)
    curve = json.loads(results.read_text())["curve"]
    seconds = [s["seconds"] for s in curve["steps"] if s["seconds"] is not None]
    return {"command": " ".join(command[1:]), "wall_s": wall, "step_s_median": statistics.median(seconds),
            "evals": curve["evals"], "minutes_to_30_points": first_gain(curve["evals"], 30)}  # fmt: skip


def train_side(args, work: Path, env: dict[str, str]) -> dict:
    command = [sys.executable, "-m", "oprl", "train", args.config, f"steps={args.steps}",
               f"eval.interval={args.eval_every}", f"eval.num_problems={args.eval_problems}",
               f"output_dir={work}", "run_name=train", "tensorboard=false", *args.set]  # fmt: skip
    wall = timed(command, work / "train.log", env)
    rows = [json.loads(line) for line in (work / "train" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "perf/step_s" in r]
    ends = {r["step"]: r["perf/elapsed_s"] / 60 for r in steps}
    # An evaluation logged at step s scores the weights of steps 0..s-1 (step 0's: the start), as the recipe's do.
    evals = [{"step": r["step"], "accuracy": r["eval/accuracy"], "minutes": round(ends.get(r["step"] - 1, 0.0), 3)}
             for r in rows if "eval/accuracy" in r]  # fmt: skip
    return {"command": " ".join(command[1:]), "wall_s": wall,
            "step_s_median": statistics.median(r["perf/step_s"] for r in steps),
            "evals": evals, "minutes_to_30_points": first_gain(evals, 30)}  # fmt: skip


def main() -> None:
    argv = sys.argv[1:]
    recipe = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--eval-problems", type=int, default=64)
    parser.add_argument("--eval-every", type=int, default=6)
    parser.add_argument("--config", default=CONFIG, help="the oprl train side's config")
    parser.add_argument("--set", nargs="*", default=[], help="oprl settings for the oprl train side")
    parser.add_argument("--sides", nargs="+", choices=("recipe", "train"), default=["recipe", "train"])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    args.recipe = recipe
    work = Path(tempfile.mkdtemp(prefix="recipe-vs-train-"))
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", TINKER_TELEMETRY="0", HF_HUB_OFFLINE="1")
    env.setdefault("VLLM_PLUGINS", "")
    result = {"command": " ".join(sys.argv), "commit": commit(), "cpu": cpu(), "load_before": os.getloadavg()}
    for side in args.sides:
        print(f"{side} ... (logs in {work})", flush=True)
        result[side] = (recipe_side if side == "recipe" else train_side)(args, work, env)
        print(f"{side}: {result[side]['wall_s'] / 60:.1f} min, {result[side]['step_s_median']:.1f} s/step, "
              f"accuracy {[round(e['accuracy'], 3) for e in result[side]['evals']]}", flush=True)  # fmt: skip
    result["load_after"] = os.getloadavg()
    if "recipe" in result and "train" in result:
        result["ratio"] = {key: result["recipe"][key] / result["train"][key] for key in ("wall_s", "step_s_median")}
        print(
            f"recipe / oprl train: wall {result['ratio']['wall_s']:.2f}x, step {result['ratio']['step_s_median']:.2f}x"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
