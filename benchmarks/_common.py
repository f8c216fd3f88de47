"""What the benchmark scripts share: the machine facts a results file records, a job run with overrides (in this
process, or as ``oprl`` in a fresh process with a fresh cache), the SmolLM2 sampling prompt, and the report file.

A script imports it as ``from _common import ...``: ``python benchmarks/x.py`` puts benchmarks/ on ``sys.path``.
The heavy imports (torch, oprl's runtime) are made inside the functions that need them, so that a script's
``--help`` and the subprocess-driven scripts stay light.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from oprl.machine import cpu

ROOT = Path(__file__).resolve().parents[1]


def commit() -> str:
    """The checkout's short HEAD commit ("" outside a git checkout): a results file names the code it measured."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()


def load_average() -> float:
    """The 1-minute load average: read before and after a benchmark, so that a loaded machine shows in its file."""
    return os.getloadavg()[0]


def machine(threads: int | None = None) -> str:
    """``"x86_64, 2 cores"`` (``", N threads"`` added when given): the results files' ``machine`` field."""
    text = f"{platform.machine()}, {os.cpu_count()} cores"
    return text if threads is None else f"{text}, {threads} threads"


def write_json(path: Path | None, report: dict) -> None:
    """``report`` as JSON indented by 2, ending in a newline, at ``path`` (its folder made); nothing when ``path`` is
    None (no ``--json`` / ``--out`` given)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


def job_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser``'s arguments plus the two every job benchmark takes, ``--json PATH`` (the report file) and extra
    ``key=value`` config overrides; where the script counts ``--steps``, at least 2 (its first step carries the
    engines' warm-up and is not counted)."""
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("overrides", nargs="*", help="extra key=value config overrides")
    args = parser.parse_args(argv)
    if getattr(args, "steps", 2) < 2:
        parser.error("--steps: at least 2 (the first step is not counted)")
    return args


def run_job(config: Path | None, overrides: list[str], out: Path, name: str) -> list[dict]:
    """Run the job ``config`` (a YAML file, or None for the default job) + ``overrides`` in this process, as
    ``out/name``, and return its ``metrics.jsonl`` rows."""
    from oprl.config import load_config
    from oprl.metrics import read_metrics
    from oprl.runtime.run import run

    run(load_config(config, [*overrides, f"output_dir={out}", f"run_name={name}"]), log=lambda *_: None)
    return read_metrics(out / name / "metrics.jsonl")


def cli_job(arguments: list[str], workdir: Path, name: str) -> float:
    """Wall seconds of ``oprl <arguments> output_dir=workdir/runs run_name=name progress=false`` in a fresh process
    with a fresh cache (``OPRL_CACHE_DIR=workdir/cache``), run from the repository root as a user runs it: the
    time includes the first-time warm start. A failed run raises ``CalledProcessError``."""
    env = dict(os.environ, OPRL_CACHE_DIR=str(workdir / "cache"))
    command = [sys.executable, "-m", "oprl.cli", *arguments]
    command += [f"output_dir={workdir / 'runs'}", f"run_name={name}", "progress=false"]
    start = time.perf_counter()
    subprocess.run(command, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def warm_start(cache: Path) -> dict:
    """The warm start's record (``steps``, ``seconds``, ``val_accuracy``, ...) of the tiny model in ``cache``."""
    recipe = next((cache / "models").glob("tiny-*/oprl_recipe.json"))
    return json.loads(recipe.read_text())["result"]


def seed_runs(
    description: str, run_once: Callable[[int, Path], dict], seeds: list[int], command: str | None = None
) -> int:
    """The main of a script that runs a job once per ``--seeds`` seed, each ``run_once(seed, workdir)`` in a fresh
    temporary folder, prints each result as a JSON line and writes ``{command?, machine, cpu, commit, runs}`` to
    ``--out``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--seeds", type=int, nargs="+", default=seeds)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results = []
    for seed in args.seeds:
        with tempfile.TemporaryDirectory() as tmp:
            results.append(run_once(seed, Path(tmp)))
        print(json.dumps(results[-1]), flush=True)
    report: dict[str, Any] = {"command": command} if command else {}
    report |= {
        "machine": f"{platform.machine()} {os.cpu_count()} cores, {platform.python_version()}",
        "cpu": cpu(),
        "commit": commit(),
        "runs": results,
    }
    write_json(args.out, report)
    return 0


COUNT_PROMPT = "Count from one to fifty in words."
"""The sampling benchmarks' request: replies run long, so a call measures decoding rather than the prompt."""


def count_prompt():
    """``(model, tokenizer, prompt ids)``: SmolLM2-135M-Instruct (float32, eval mode) and ``COUNT_PROMPT`` through
    its chat template."""
    from oprl.models.loading import load_pretrained

    model, tokenizer = load_pretrained("smollm2-135m-instruct")
    model.eval()
    chat = [{"role": "user", "content": COUNT_PROMPT}]
    text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    return model, tokenizer, tokenizer(text, add_special_tokens=False).input_ids
