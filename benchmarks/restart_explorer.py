"""Seconds lost per restart, per worker kind (issue 57): the tiny job on worker processes, undisturbed against the
same run with one worker killed part way (``OPRL_FAULT``, a SIGKILL), in rotation, ``--repeats`` rounds.

``--worker``: ``explorer`` (killed as batch ``--kill-step`` reaches it; restarted alone), ``trainer`` and ``teacher``
(killed as step ``--kill-step`` reaches them; every worker starts again from the newest checkpoint,
``--checkpoint-interval``; the teacher: a distillation whose teacher is the warm-started model), ``engine`` (the
explorer's vLLM engine process, ``rollout.engine=vllm rollout.engine_process=true``; a new explorer with a new
engine), ``reward`` (a dataset task whose user reward kills the reward process scoring the ``--kill-row``-th row
once: the pool scores the row again in a new process; no driver restart). docs/runtime.md#self-healing-runs has
the figures.

Reported per round: each run's wall seconds (``summary.json``), the killed run's extra seconds over the
undisturbed run of its round, the driver's own account of the restart (``ready_s``: death noticed -> new
worker(s) ready; ``seconds_lost``: that plus the lost call's seconds) and, for a reward process, the killed
batch's extra ``perf/reward_s`` over the same batch undisturbed; the median step time, and the loss in steps
(``seconds_lost / step_s``). Each killed run is checked against its undisturbed one: every ``metrics.jsonl``
column but ``perf/*`` and ``final/model.safetensors`` byte for byte (a round whose numbers differ fails).

Run:  flock /tmp/oprl-bench.lock python benchmarks/restart_explorer.py [--worker explorer|trainer|teacher|engine|
      reward] [--steps 24] [--kill-step 12] [--kill-after 0] [--kill-row 200] [--explorers 1] [--repeats 3]
      [--checkpoint-interval 24] [--out benchmarks/results/restart_explorer.json]
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

import yaml

# benchmarks/ is the script's directory, so on sys.path
from _common import cpu

from oprl.metrics import deterministic_view, read_metrics

SMALL = [  # the test suite's small recipe (tests/conftest.py), with its warm start
    "task.train_size=600",
    "task.test_size=64",
    "warmstart.max_steps=40",
    "warmstart.check_interval=20",
    "warmstart.val_problems=64",
    "warmstart.target_accuracy=0.99",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "eval.num_problems=32",
    "progress=false",
    "tensorboard=false",
    "runtime.workers=processes",
    "runtime.torch_threads=1",
]


ROOT = Path(__file__).resolve().parents[1]
REWARD = '''"""The example arithmetic reward, and a kill: the reward process that scores the KILL_ROW-th row of the run
(counted in a file, one byte per row) dies by SIGKILL, once."""
import os
import re
import signal
from pathlib import Path


def reward(prompt, completion, reference, **row):
    kill_row = int(os.environ.get("RESTART_BENCH_KILL_ROW", "0"))
    if kill_row:
        directory = Path(os.environ["RESTART_BENCH_DIR"])
        with open(directory / "rows", "a") as f:
            f.write(".")
        if (directory / "rows").stat().st_size >= kill_row:
            try:
                os.close(os.open(directory / "killed", os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                os.kill(os.getpid(), signal.SIGKILL)
    numbers = re.findall(r"-?\\d+", completion)  # the last number is the answer (the tiny model's whole reply)
    return {"correct": float(bool(numbers) and int(numbers[-1]) == int(reference)), "format": 0.1 * bool(numbers)}
'''


def train(root: Path, name: str, settings: list[str], fault: str | None, env: dict | None = None) -> dict:
    env = (
        {k: v for k, v in os.environ.items() if k != "OPRL_FAULT"}
        | (env or {})
        | ({"OPRL_FAULT": fault} if fault else {})
    )
    # With --config the YAML is the first setting: ``oprl train CONFIG.yaml key=value ...``.
    command = [sys.executable, "-m", "oprl.cli", "train", *settings, f"output_dir={root}", f"run_name={name}"]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{name}: oprl train exited {done.returncode}: {done.stderr.strip()[-400:]}")
    summary = json.loads((root / name / "summary.json").read_text())
    rows = read_metrics(root / name / "metrics.jsonl")
    steps = [r["perf/step_s"] for r in rows if "perf/step_s" in r]
    reward_s = {r["step"]: r["perf/reward_s"] for r in rows if "perf/reward_s" in r}
    return {
        "wall_s": wall,
        "run_s": summary["seconds"],
        "restarts": summary["restarts"],
        "step_s": steps,
        "reward_s": reward_s,
    }


def same_numbers(root: Path, a: str, b: str) -> bool:
    rows_a, rows_b = read_metrics(root / a / "metrics.jsonl"), read_metrics(root / b / "metrics.jsonl")
    weights = [(root / n / "final" / "model.safetensors").read_bytes() for n in (a, b)]
    return deterministic_view(rows_a) == deterministic_view(rows_b) and weights[0] == weights[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", choices=["explorer", "trainer", "teacher", "engine", "reward"], default="explorer")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--kill-step", type=int, default=12)
    parser.add_argument("--kill-after", type=float, default=0.0, help="seconds into the batch (explorer, trainer)")
    parser.add_argument("--kill-row", type=int, default=200, help="--worker reward: the row whose process dies")
    parser.add_argument("--explorers", type=int, default=1)
    parser.add_argument("--offset", type=int, default=1, help="sync.offset: 1 overlaps generation and training")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--checkpoint-interval", type=int, default=None, help="default: --steps (none before)")
    parser.add_argument("--config", type=Path, default=None, help="a YAML config instead of the small test recipe")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="settings over --config")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.config is not None and not args.config.is_file():
        raise SystemExit(f"--config {args.config}: no such file")
    if args.repeats < 1 or args.steps < 2 or not 1 <= args.kill_step <= args.steps:
        raise SystemExit(
            f"--repeats {args.repeats} --steps {args.steps} --kill-step {args.kill_step}: need "
            "repeats >= 1 and 1 <= kill-step <= steps"
        )
    # --config: its YAML, this job's runtime (progress, tensorboard, workers, threads: SMALL's last 4), --set over both
    base = SMALL if args.config is None else [str(args.config), *SMALL[-4:], *args.set]
    settings = [
        *base,
        f"steps={args.steps}",
        f"sync.offset={args.offset}",
        f"runtime.explorers={args.explorers}",
        f"eval.interval={args.steps}",
        f"checkpoint.interval={args.checkpoint_interval or args.steps}",
    ]
    fault = {
        "explorer": f"explorer@step={args.kill_step}+{args.kill_after}",
        "trainer": f"trainer@step={args.kill_step}+{args.kill_after}",
        "teacher": f"teacher@step={args.kill_step}",
        "engine": f"engine@step={args.kill_step}",
        "reward": None,
    }[args.worker]
    load = os.getloadavg()[0]
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env: dict[str, str] = {}
        killed_env: dict[str, str] = {}
        if args.worker == "engine":
            settings += ["rollout.engine=vllm", "rollout.engine_process=true"]
        if args.worker == "reward":
            (root / "bench_reward.py").write_text(REWARD)
            if args.config is not None:  # its task section names another task's keys: the dataset task replaces it
                config = yaml.safe_load(args.config.read_text()) or {}
                config.pop("task", None)
                (root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
                settings[0] = str(root / "config.yaml")
            settings = [s for s in settings if not s.startswith("task.")] + [
                "task.name=dataset",
                f"task.train_file={ROOT / 'examples' / 'arithmetic_train.jsonl'}",
                f"task.test_file={ROOT / 'examples' / 'arithmetic_test.jsonl'}",
                f"task.reward={root / 'bench_reward.py'}:reward",
            ]
        train(root, "warm", [*settings, "steps=1"], None)  # builds the warm-started model once, untimed
        if args.worker == "teacher":  # a distillation whose teacher is the warm-started model's one-step run
            settings += ["algorithm.preset=distill", f"teacher.path={root / 'warm'}"]
        for index in range(args.repeats):
            if args.worker == "reward":
                counter = root / f"counter-{index}"
                counter.mkdir()
                env = {"RESTART_BENCH_DIR": str(counter)}
                killed_env = env | {"RESTART_BENCH_KILL_ROW": str(args.kill_row)}
            whole = train(root, f"whole-{index}", settings, None, env)
            killed = train(root, f"killed-{index}", settings, fault, killed_env or env)
            expected = 0 if args.worker == "reward" else 1
            if len(killed["restarts"]) != expected or not same_numbers(root, f"whole-{index}", f"killed-{index}"):
                raise SystemExit(
                    f"round {index}: not {expected} restart(s) with the undisturbed numbers: {killed['restarts']}"
                )
            step_s = statistics.median(whole["step_s"])
            extra = killed["run_s"] - whole["run_s"]
            if args.worker == "reward":
                if not (root / f"counter-{index}" / "killed").exists():
                    raise SystemExit(
                        f"round {index}: no reward process was killed (the run scored < {args.kill_row} rows)"
                    )
                extra_reward = {b: killed["reward_s"][b] - whole["reward_s"][b] for b in whole["reward_s"]}
                batch = max(extra_reward, key=extra_reward.get)
                restart = {
                    "ready_s": None,
                    "seconds_lost": extra_reward[batch],
                    "batches": [batch],
                    "worker": "reward process",
                }
            else:
                restart = killed["restarts"][0]
            rounds.append(
                {
                    "whole_s": whole["run_s"],
                    "killed_s": killed["run_s"],
                    "extra_s": extra,
                    "worker": restart["worker"],
                    "ready_s": restart["ready_s"],
                    "seconds_lost": restart["seconds_lost"],
                    "batches": restart["batches"],
                    "step_s": step_s,
                    "steps_lost": restart["seconds_lost"] / step_s,
                }
            )
            ready = "" if restart["ready_s"] is None else f"restart ready in {restart['ready_s']:.1f} s, "
            print(
                f"round {index}: undisturbed {whole['run_s']:.1f} s, killed {killed['run_s']:.1f} s "
                f"(+{extra:.1f} s); {restart['worker']}: {ready}seconds lost {restart['seconds_lost']:.2f} "
                f"= {restart['seconds_lost'] / step_s:.1f} steps of {step_s:.3f} s, batches {restart['batches']}; "
                "numbers equal",
                flush=True,
            )
    keys = ("extra_s", "seconds_lost", "steps_lost", "step_s") + (("ready_s",) if args.worker != "reward" else ())
    medians = {key: statistics.median(r[key] for r in rounds) for key in keys}
    end_load = os.getloadavg()[0]
    print(
        f"{args.worker}: median over {len(rounds)} rounds: seconds lost {medians['seconds_lost']:.2f} "
        f"({medians['steps_lost']:.1f} steps of {medians['step_s']:.3f} s), +{medians['extra_s']:.1f} s wall "
        f"(load {load:.1f} at start, {end_load:.1f} at end)"
    )
    if args.out:
        result = {
            "worker": args.worker,
            "settings": [s.replace(tmp, "<tmp>") for s in settings],
            "fault": fault or f"the reward process scoring row {args.kill_row} (SIGKILL, once)",
            "cpu": cpu(),
            "load_at_start": load,
            "load_at_end": end_load,
            "rounds": rounds,
            "medians": medians,
        }
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
