"""Plot and summarise a run of configs/examples/smollm2-arithmetic-cpu.yaml for docs/real-models.md.

    python benchmarks/smollm2_demo_plot.py runs/examples/smollm2-arithmetic-cpu docs/img/smollm2-arithmetic-cpu.png

Reads ``metrics.jsonl`` and ``summary.json`` of the run directory, draws the batch reward per step with a
5-step moving average and the truncation rate, and prints the numbers the docs quote (markdown): first
and last five steps' mean reward, evaluation accuracy before and after, median throughputs, wall time.
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


def main(run_dir: Path, out: Path) -> None:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if r["step"] > 0 and "reward/mean" in r]
    evals = [r for r in rows if "eval/accuracy" in r]
    x = [r["step"] for r in steps]
    reward = [r["reward/mean"] for r in steps]
    truncated = [r["response/truncated_frac"] for r in steps]
    length = [r["response/length_mean"] for r in steps]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    left.plot(x, reward, "o", alpha=0.4, label="batch mean reward (16 responses)")
    left.plot(x, moving_average(reward, 5), "-", label="5-step moving average")
    left.plot([e["step"] for e in evals], [e["eval/accuracy"] for e in evals], "s--", label="eval accuracy (64 test)")
    right.plot(x, [r["reward/format"] for r in steps], "-", label="ends with a number (format)")
    left.set_xlabel("trainer step")
    left.set_ylabel("reward = correct +- 0.1 format")
    left.legend(fontsize=8)
    right.plot(x, truncated, "-", label="truncated at max_new_tokens")
    right.plot(x, [v / max(length) for v in length], "-", label="mean length / max")
    right.set_xlabel("trainer step")
    right.legend(fontsize=8)
    fig.suptitle("SmolLM2-135M-Instruct, GRPO, one-step word problems, 2 CPU cores")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    k = min(5, len(reward) // 2)
    lines = [
        "| quantity | value |",
        "|---|---|",
        f"| steps | {len(steps)} |",
        f"| mean batch reward, steps 1-{k} | {statistics.fmean(reward[:k]):.3f} |",
        f"| mean batch reward, last {k} steps | {statistics.fmean(reward[-k:]):.3f} |",
        f"| eval accuracy before -> after | {evals[0]['eval/accuracy']:.3f} -> {evals[-1]['eval/accuracy']:.3f} |",
        f"| eval format rate before -> after | {evals[0].get('eval/format', float('nan')):.3f} -> "
        f"{evals[-1].get('eval/format', float('nan')):.3f} |",
        f"| truncated fraction, first -> last {k} steps | {statistics.fmean(truncated[:k]):.2f} -> "
        f"{statistics.fmean(truncated[-k:]):.2f} |",
        f"| median generate tokens/s | {statistics.median(r['perf/generate_tokens_per_s'] for r in steps):.1f} |",
        "| median train tokens/s (response tokens) | "
        f"{statistics.median(r['perf/train_tokens_per_s'] for r in steps):.1f} |",
        f"| wall time | {summary.get('seconds', float('nan')) / 60:.1f} min |",
    ]
    print("\n".join(lines))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
