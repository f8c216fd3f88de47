"""The teacher's cost: what scoring every sampled token with a second model adds to a step of on-policy
distillation, with worker threads and with worker processes, and the teacher process's memory.

``configs/examples/tiny-distill.yaml`` (the embedded tiny model, the distill preset) runs ``--steps`` steps in
four settings, one after the other:
- ``teacher``: the example as written, its ``teacher.path`` a 1-step GRPO run of the default job made first
  (the teacher's weights do not change its cost: same architecture, same tokens);
- ``baseline``: the same run without a teacher (``teacher.path=null``, ``algorithm.distill_mix=add``,
  ``algorithm.distill_coef=0``: the task reward's advantage through the same loss);
each with worker threads and with ``runtime.workers=processes``.

The four run in rotation ``--repeats`` times (a loaded machine hurts all alike). Reported per setting, the
median over repeats of each run's median over the steps after the first (whose time holds the start-up):
``perf/step_s``; the teacher's share of the step, ``perf/teacher_s / perf/step_s`` (on-policy, the teacher's
prefill sits on the step's critical path: explore -> score -> put -> train); the step against the baseline's;
``perf/teacher_utilization``; and for processes the peak resident set (``VmHWM`` in /proc, polled every
0.2 s) of each worker process, the teacher's among them. The final evaluation is cut to ``eval.num_problems=32``
and ``eval.interval=0`` (it is not a step).

Run:  python benchmarks/teacher_cost.py [--steps 20] [--repeats 3] [--json PATH] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from oprl.config import load_config
from oprl.metrics import read_metrics
from oprl.runtime.run import run

EXAMPLE = Path(__file__).resolve().parents[1] / "configs" / "examples" / "tiny-distill.yaml"
QUICK = ["eval.interval=0", "eval.num_problems=32", "progress=false", "tensorboard=false", "checkpoint.interval=0"]
BASELINE = ["teacher.path=null", "algorithm.distill_mix=add", "algorithm.distill_coef=0"]
SETTINGS = {
    "threads, teacher": [],
    "threads, baseline": BASELINE,
    "processes, teacher": ["runtime.workers=processes"],
    "processes, baseline": ["runtime.workers=processes", *BASELINE],
}


class PeakRss:
    """Peak resident set (MiB) of each worker process of this run, by process name (``oprl-teacher``, ...)."""

    def __init__(self, interval: float = 0.2):
        self.peaks: dict[str, float] = {}
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            for child in multiprocessing.active_children():
                peak = high_water_mark_mib(child.pid)
                if peak is not None:
                    self.peaks[child.name] = max(self.peaks.get(child.name, 0.0), peak)


def high_water_mark_mib(pid: int | None) -> float | None:
    """``VmHWM`` (the peak resident set so far) of process ``pid`` in MiB; None once it has exited."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        return None
    return None


def make_teacher(out: Path, extra: list[str]) -> Path:
    """A 1-step GRPO run of the default job (the example's teacher recipe, cut short): its run directory."""
    config = load_config(None, ["seed=0", "steps=1", *QUICK, *extra, f"output_dir={out}", "run_name=tiny-teacher"])
    return run(config, log=lambda *_: None).run_dir


def measure(name: str, overrides: list[str], out: Path, repeat: int) -> dict:
    run_name = f"{name.replace(', ', '-')}-{repeat}"
    config = load_config(EXAMPLE, [*QUICK, *overrides, f"output_dir={out}", f"run_name={run_name}"])
    start = time.perf_counter()
    with PeakRss() as rss:
        summary = run(config, log=lambda *_: None)
    rows = [r for r in read_metrics(summary.run_dir / "metrics.jsonl") if "perf/step_s" in r][1:]

    def median(key: str) -> float | None:
        values = [r[key] for r in rows if key in r]
        return statistics.median(values) if values else None

    shares = [r["perf/teacher_s"] / r["perf/step_s"] for r in rows if "perf/teacher_s" in r]
    return {
        "step_s": median("perf/step_s"),
        "teacher_s": median("perf/teacher_s"),
        "teacher_share": statistics.median(shares) if shares else None,
        "teacher_utilization": median("perf/teacher_utilization"),
        "generate_s": median("perf/generate_s"),
        "train_s": median("perf/train_s"),
        "peak_rss_mib": rss.peaks,
        "run_s": time.perf_counter() - start,
        "steps_measured": len(rows),
    }


def summarise(measured: list[dict]) -> dict:
    """The median over repeats of each number (peak memory: the largest over repeats, per process)."""
    out: dict = {}
    for key, first in measured[0].items():
        if key == "peak_rss_mib":
            names = {name for m in measured for name in m[key]}
            out[key] = {name: max(m[key].get(name, 0.0) for m in measured) for name in names}
        elif first is not None:
            out[key] = statistics.median(m[key] for m in measured)
        else:
            out[key] = None
    return out


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("overrides", nargs="*", help="extra key=value config overrides (every run)")
    args = parser.parse_args(argv)
    runs: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        teacher = make_teacher(Path(tmp), args.overrides)
        common = [f"steps={args.steps}", f"teacher.path={teacher}", *args.overrides]
        for repeat in range(args.repeats):
            for name, overrides in SETTINGS.items():
                runs[name].append(measure(name, [*common, *overrides], Path(tmp), repeat))
                print(f"repeat {repeat} {name}: {runs[name][-1]['step_s']:.3f} s/step", file=sys.stderr)
    results = {name: summarise(measured) for name, measured in runs.items()}
    print(
        f"\nload average at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; {args.steps} steps each, "
        f"medians over steps 2..N, then over {args.repeats} repeats\n"
    )
    print(
        "| setting | s/step | vs baseline | added s/step | teacher prefill s/step | teacher share | teacher util. "
        "| peak RSS MiB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, row in results.items():
        base = results[name.split(",")[0] + ", baseline"]["step_s"]
        peaks = ", ".join(f"{k.removeprefix('oprl-')} {v:.0f}" for k, v in sorted(row["peak_rss_mib"].items()))
        print(
            f"| {name} | {row['step_s']:.3f} | {row['step_s'] / base:.2f} | {row['step_s'] - base:+.3f} | "
            f"{fmt(row['teacher_s'], '.3f')} | "
            f"{fmt(row['teacher_share'], '.1%')} | {fmt(row['teacher_utilization'], '.2f')} | {peaks or '-'} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"argv": sys.argv[1:], "results": results, "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
