"""Plot and summarise runs of the SmolLM2 word-problem examples (configs/examples/smollm2-arithmetic-*.yaml)
for docs/real-models.md: one run, or several seeds of one config side by side.

    python benchmarks/smollm2_demo_plot.py runs/examples/smollm2-arithmetic-cpu docs/img/smollm2-arithmetic-cpu.png
    python benchmarks/smollm2_demo_plot.py RUN_S0 RUN_S1 RUN_S2 docs/img/smollm2-arithmetic-vllm.png

Reads ``metrics.jsonl`` and ``summary.json`` of each run directory, draws the batch reward per step with a
5-step moving average, the evaluation accuracy, and the truncation and format rates, and prints the numbers
the docs quote as a markdown table (one column per run, plus the mean when there are several): first and last
five steps' mean reward, evaluation accuracy and format before and after, truncation, median throughputs,
wall time.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def moving_average(values: list[float], width: int) -> list[float]:
    return [statistics.fmean(values[max(0, i - width + 1) : i + 1]) for i in range(len(values))]


def read_run(run_dir: Path) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    summary_file = run_dir / "summary.json"
    return {
        "name": run_dir.name,
        "steps": [r for r in rows if r["step"] > 0 and "reward/mean" in r],
        "evals": [r for r in rows if "eval/accuracy" in r],
        "summary": json.loads(summary_file.read_text()) if summary_file.is_file() else {},
    }


def quantities(run: dict) -> dict[str, float]:
    steps, evals = run["steps"], run["evals"]
    reward = [r["reward/mean"] for r in steps]
    truncated = [r["response/truncated_frac"] for r in steps]
    k = min(5, len(reward) // 2)
    return {
        "steps": len(steps),
        f"mean batch reward, steps 1-{k}": statistics.fmean(reward[:k]),
        f"mean batch reward, last {k} steps": statistics.fmean(reward[-k:]),
        "eval accuracy before": evals[0]["eval/accuracy"],
        "eval accuracy after": evals[-1]["eval/accuracy"],
        "eval accuracy gain (points)": 100 * (evals[-1]["eval/accuracy"] - evals[0]["eval/accuracy"]),
        "eval format before": evals[0].get("eval/format", float("nan")),
        "eval format after": evals[-1].get("eval/format", float("nan")),
        f"truncated fraction, first {k} steps": statistics.fmean(truncated[:k]),
        f"truncated fraction, last {k} steps": statistics.fmean(truncated[-k:]),
        "median generate tokens/s": statistics.median(r["perf/generate_tokens_per_s"] for r in steps),
        "median train tokens/s (response tokens)": statistics.median(r["perf/train_tokens_per_s"] for r in steps),
        "wall time, min": run["summary"].get("seconds", float("nan")) / 60,
    }


def main(run_dirs: list[Path], out: Path) -> None:
    runs = [read_run(d) for d in run_dirs]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    for i, run in enumerate(runs):
        color = f"C{i}"
        x = [r["step"] for r in run["steps"]]
        reward = [r["reward/mean"] for r in run["steps"]]
        left.plot(x, reward, "o", color=color, alpha=0.25, markersize=3)
        left.plot(x, moving_average(reward, 5), "-", color=color, label=f"{run['name']}: reward, 5-step mean")
        evals = run["evals"]
        left.plot([e["step"] for e in evals], [e["eval/accuracy"] for e in evals], "s--", color=color, alpha=0.7)
        right.plot(x, [r["response/truncated_frac"] for r in run["steps"]], "-", color=color, label=run["name"])
        right.plot(x, [r["reward/format"] for r in run["steps"]], ":", color=color)
    problems = int(runs[0]["evals"][0].get("eval/num_problems", 0))
    left.plot([], [], "s--", color="gray", label=f"eval accuracy ({problems} test problems)")
    left.set_xlabel("trainer step")
    left.set_ylabel("reward = correct +- 0.1 format")
    left.legend(fontsize=7)
    right.plot([], [], "-", color="gray", label="truncated at max_new_tokens")
    right.plot([], [], ":", color="gray", label="ends with a number (format)")
    right.set_xlabel("trainer step")
    right.set_ylabel("fraction of batch replies")
    right.legend(fontsize=7)
    fig.suptitle("SmolLM2-135M-Instruct, GRPO, one-step word problems, 2 CPU cores")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    table = [quantities(run) for run in runs]
    header = ["quantity", *(run["name"] for run in runs)] + (["mean"] if len(runs) > 1 else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for key in table[0]:
        values = [row[key] for row in table] + ([statistics.fmean(row[key] for row in table)] if len(runs) > 1 else [])
        cells = [
            f"{v:.0f}" if key == "steps" else f"{v:.1f}" if "min" in key or "/s" in key else f"{v:.3f}" for v in values
        ]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: smollm2_demo_plot.py RUN_DIR [RUN_DIR ...] OUT.png")
    main([Path(p) for p in sys.argv[1:-1]], Path(sys.argv[-1]))
