"""Benchmark: start-up of the command line, as whole processes, this tree against another (e.g. an older commit).

Three figures, each the median of ``--runs`` runs, the two trees interleaved (A B A B ...) so that a drift in
the machine's speed hits both; the ratio is taken pair by pair, then its median:

- ``help``: ``oprl --help`` (goal <= 0.5 s);
- ``config``: ``oprl config`` (goal <= 1.5 s);
- ``first_step``: launch of ``oprl train`` (the default job, ``progress=false``) to the moment its first
  trainer step's row is in ``metrics.jsonl``, with the warm start cached (goal <= 4 s). The default job
  evaluates before step 1, so this includes that evaluation; the process is killed there.

    python benchmarks/startup.py --before /path/to/old/checkout/src [--runs 7] [--out benchmarks/results/startup.json]
    python benchmarks/startup.py --once first_step [--src DIR]     # one measurement (for /usr/bin/time & co)

The warm start is built first if needed (not timed), in the default cache, for both trees: its recipe key
is the same. Timings only mean something side by side on one machine: quote the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "src"


def _env(src: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(src))


def whole_process(src: Path, args: list[str]) -> float:
    """Wall seconds of ``python -m oprl.cli ARGS`` with ``src`` first on the path."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "oprl.cli", *args], env=_env(src), stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def first_step(src: Path, timeout: float = 120.0) -> float:
    """Seconds from launching the default job to its step-1 row in ``metrics.jsonl`` (then it is killed)."""
    with tempfile.TemporaryDirectory(prefix="oprl-startup-") as out:
        metrics = Path(out) / "r" / "metrics.jsonl"
        command = [sys.executable, "-m", "oprl.cli", "train", f"output_dir={out}", "run_name=r", "progress=false"]
        start = time.perf_counter()
        process = subprocess.Popen(command, env=_env(src), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while time.perf_counter() - start < timeout:
                if metrics.is_file() and any(json.loads(row)["step"] == 1 for row in _rows(metrics)):
                    return time.perf_counter() - start
                if process.poll() is not None:
                    raise RuntimeError(f"oprl train exited with {process.returncode} before its first step")
                time.sleep(0.01)
            raise RuntimeError(f"no first step within {timeout:.0f}s")
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
            process.wait()


def _rows(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.endswith("}")]  # skip a half-written line


FIGURES = {
    "help": lambda src: whole_process(src, ["--help"]),
    "config": lambda src: whole_process(src, ["config"]),
    "first_step": first_step,
}
GOALS = {"help": 0.5, "config": 1.5, "first_step": 4.0}


def compare(after: Path, before: Path | None, runs: int) -> dict:
    """Per figure: each tree's median and the median of the pairwise ratios after / before."""
    whole_process(after, ["train", "steps=1", f"output_dir={tempfile.mkdtemp()}", "progress=false"])  # warm start
    results = {}
    for name, measure in FIGURES.items():
        measure(after)  # one warm-up each (file cache)
        if before is not None:
            measure(before)
        times_after, times_before = [], []
        for _ in range(runs):
            times_after.append(measure(after))
            if before is not None:
                times_before.append(measure(before))
        entry = {"after_s": times_after, "after_median_s": statistics.median(times_after), "goal_s": GOALS[name]}
        if before is not None:
            ratios = [a / b for a, b in zip(times_after, times_before, strict=True)]
            entry |= {
                "before_s": times_before,
                "before_median_s": statistics.median(times_before),
                "ratio_median": statistics.median(ratios),
            }
        results[name] = entry
        print(_line(name, entry), flush=True)
    return results


def _line(name: str, entry: dict) -> str:
    text = f"{name:>10}: after {entry['after_median_s']:.2f}s (goal <= {entry['goal_s']}s)"
    if "before_median_s" in entry:
        text += f", before {entry['before_median_s']:.2f}s, after/before {entry['ratio_median']:.2f}"
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="the other tree's src/ directory (e.g. a checkout of 9981eb2)")
    parser.add_argument("--runs", type=int, default=7, help="timed runs per figure and tree (median reported)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    parser.add_argument("--once", choices=FIGURES, help="measure this figure once for --src and print it")
    parser.add_argument("--src", type=Path, default=HERE, help="with --once: the tree to measure")
    args = parser.parse_args()
    if args.once:  # one measurement, for an outside timer of whole processes
        print(f"{args.once}: {FIGURES[args.once](args.src):.3f}s")
        return 0
    load_before = os.getloadavg()
    results = compare(HERE, args.before, args.runs)
    record = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus",
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "runs": args.runs,
        "before": str(args.before) if args.before else None,
        "figures": results,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
