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

And ``make demo`` on a fresh clone (#71), each commit once (minutes each): ``--fresh-demo REV [REV ...]`` clones
this repository at each REV into a temporary directory and runs ``make demo`` there with an empty pip cache
(``PIP_NO_CACHE_DIR=1``) and an empty model cache (``OPRL_CACHE_DIR``): the install (the stamp), then the job,
timed to its first training step and to its end; what was installed (packages, MB) and the job's eval accuracy.
``--public-pip`` sets this machine's pip configuration aside (``PIP_CONFIG_FILE=/dev/null``, no ``PIP_*``
variable but the cache's), so everything but torch comes from PyPI as on an ordinary machine; ``--torch-index``
is the Makefile's TORCH_INDEX (where download.pytorch.org is out of reach: a local PEP 503 directory,
``torch/index.html`` linking the wheel beside it):

    python benchmarks/startup.py --fresh-demo 70678ca HEAD --public-pip --torch-index file:///tmp/torchidx \
        --out benchmarks/results/fresh_demo.json

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
import threading
import time
from pathlib import Path

# benchmarks/ is the script's directory, so on sys.path
from _common import cpu

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


def fresh_demo(rev: str, public_pip: bool, torch_index: str | None) -> dict:
    """``make demo`` in a fresh clone at ``rev`` (module docstring): seconds of the install and of the job (to its
    first training step, to its end), with the load average beside each."""
    root = Path(__file__).resolve().parents[1]
    commit = subprocess.run(["git", "rev-parse", "--short", rev], cwd=root, capture_output=True, text=True, check=True)
    with tempfile.TemporaryDirectory(prefix="oprl-fresh-") as work:
        clone = Path(work) / "clone"
        subprocess.run(["git", "clone", "-q", str(root), str(clone)], check=True)
        subprocess.run(["git", "checkout", "-q", commit.stdout.strip()], cwd=clone, check=True)
        env = {k: v for k, v in os.environ.items() if not (public_pip and k.startswith("PIP_"))}
        env |= {"PIP_NO_CACHE_DIR": "1", "OPRL_CACHE_DIR": str(Path(work) / "cache")}
        env |= {"PIP_CONFIG_FILE": os.devnull} if public_pip else {}
        env = {k: v for k, v in env.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
        settings = [f"TORCH_INDEX={torch_index}"] if torch_index else []
        load_install = os.getloadavg()
        start = time.perf_counter()
        subprocess.run(["make", "-s", ".venv/.oprl-demo-installed", *settings], cwd=clone, env=env, check=True)
        install = time.perf_counter() - start
        site = next((clone / ".venv" / "lib").glob("python3*/site-packages"))
        listed = subprocess.run([str(clone / ".venv/bin/python"), "-m", "pip", "list", "--format=json"],
                                capture_output=True, text=True, env=env, check=True).stdout  # fmt: skip
        size = sum(f.stat().st_size for f in site.rglob("*") if f.is_file() and not f.is_symlink())
        load_run = os.getloadavg()
        job = _timed_demo(clone, env, settings)
        summary = json.loads(next((clone / "runs").glob("*/summary.json")).read_text())
        return {
            "commit": commit.stdout.strip(),
            "install_s": install,
            "load_at_install": load_install,
            "packages": len(json.loads(listed)),
            "site_packages_mb": size / 1e6,
            "load_at_run": load_run,
            **job,
            "load_after": os.getloadavg(),
            "total_s": install + job["run_s"],
            "eval_accuracy": [summary["eval_accuracy_before"], summary["eval_accuracy_after"]],
        }


def _timed_demo(clone: Path, env: dict, settings: list[str]) -> dict:
    """``make demo`` with its install in place: seconds to the first training step's row and to the end, and
    whether the warm start trained or came committed (its log line)."""
    start = time.perf_counter()
    process = subprocess.Popen(["make", "-s", "demo", *settings], cwd=clone, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(line.rstrip() for line in process.stdout or ()))
    reader.start()
    first = None
    while process.poll() is None:  # the first step's row in metrics.jsonl, polled as first_step does
        if first is None and any(
            json.loads(row).get("step") == 1 for m in (clone / "runs").glob("*/metrics.jsonl") for row in _rows(m)
        ):
            first = time.perf_counter() - start
        time.sleep(0.05)
    reader.join()
    if process.wait() != 0:
        raise RuntimeError("make demo failed:\n" + "\n".join(lines[-20:]))
    warm = [line for line in lines if "warm start" in line or "warm-starting" in line]
    return {"first_step_s": first, "run_s": time.perf_counter() - start, "warm_start_lines": warm[:1] + warm[-1:]}


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
    parser.add_argument("--fresh-demo", nargs="+", metavar="REV", help="`make demo` in a fresh clone at each REV")
    parser.add_argument("--public-pip", action="store_true", help="with --fresh-demo: no pip configuration of ours")
    parser.add_argument("--torch-index", help="with --fresh-demo: the Makefile's TORCH_INDEX")
    args = parser.parse_args()
    if args.fresh_demo:
        runs = []
        for rev in args.fresh_demo:
            runs.append(fresh_demo(rev, args.public_pip, args.torch_index))
            print(json.dumps(runs[-1]), flush=True)
        record = {
            "command": "python " + " ".join(sys.argv),
            "machine": f"{platform.machine()}, {os.cpu_count()} cpus, {_cpu()}",
            "public_pip": args.public_pip,
            "torch_index": args.torch_index,
            "runs": runs,
        }
        if args.out:
            args.out.write_text(json.dumps(record, indent=2) + "\n")
        return 0
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


def _cpu() -> str:
    """``"AMD EPYC ... avx512_bf16"``: ``_common.cpu``'s facts in the record's words."""
    facts = cpu()
    return facts["model"] + (" avx512_bf16" if facts["avx512_bf16"] else "") + (" AMX" if facts["amx"] else "")


if __name__ == "__main__":
    raise SystemExit(main())
