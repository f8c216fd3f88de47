"""Time per trainer step as the job grows: group size, response length, model size; and where the time goes.

Each point is a short on-policy run (k=1, m=0, so nothing overlaps and the parts add up) of the real runtime,
in this process, at ``--threads`` torch threads. Reported per point: the median over the timed steps of the
step's wall time and its parts as the runtime logs them: generation (``perf/generate_s``), reward scoring
(``perf/reward_s``), the trainer's log-prob forward + loss (``perf/train_forward_s``), backward
(``perf/train_backward_s``), gradient clipping + AdamW (``perf/train_optimizer_s``), weight sync
(``perf/sync_s``) and the rest (driver, buffer, metrics). Growth along each axis is fitted as
time = c * x^b by least squares in log-log space.

The tiny models are barely warm-started (one SFT step), so they rarely stop early and responses run to the
token limit: response length is what the axis says. SmolLM2-135M-Instruct (needs the ``gguf`` extra) answers
in its own words; its measured mean response length is in the table.

    python benchmarks/growth.py [--threads 2] [--steps 5] [--skip 2] [--no-smollm2] [--json out.json --png out.png]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import tempfile
from pathlib import Path

PARTS = [
    "perf/generate_s",
    "perf/reward_s",
    "perf/train_forward_s",
    "perf/train_backward_s",
    "perf/train_optimizer_s",
    "perf/sync_s",
]
BASE = [
    "warmstart.max_steps=1",
    "warmstart.check_interval=1",
    "warmstart.val_problems=8",
    "eval.interval=0",
    "eval.num_problems=8",
    "checkpoint.interval=0",
    "buffer.persist=false",
    "tensorboard=false",
    "progress=false",
    "sync.interval=1",
    "sync.offset=0",
    "task.train_size=400",
    "task.test_size=16",
]
TINY_WIDE = ["model.hidden_size=512", "model.num_layers=4", "model.num_heads=8"]


def axes(smollm2: bool) -> dict[str, list[tuple[float, list[str]]]]:
    """Axis name -> [(x value, overrides)]; the other knobs stay at 8 prompts x group 8, 16 new tokens."""
    group = [
        (g, [f"rollout.group_size={g}", "rollout.prompts_per_step=8", "rollout.max_new_tokens=16"])
        for g in (4, 8, 16, 32)
    ]
    length = [
        (t, ["rollout.group_size=8", "rollout.prompts_per_step=8", f"rollout.max_new_tokens={t}"])
        for t in (8, 16, 32, 64)
    ]
    small = ["rollout.group_size=8", "rollout.prompts_per_step=4", "rollout.max_new_tokens=16"]
    models = [(0.34e6, small), (0, [*small, *TINY_WIDE])]
    if smollm2:
        models.append((135e6, [*small, "model.path=smollm2-135m-instruct"]))
    return {"group size": group, "max new tokens": length, "model parameters": models}


def measure(overrides: list[str], steps: int, skip: int, threads: int) -> dict:
    from oprl.config import load_config
    from oprl.metrics import read_metrics
    from oprl.runtime.run import run

    with tempfile.TemporaryDirectory() as tmp:
        config = load_config(
            None,
            [
                *BASE,
                *overrides,
                f"steps={steps}",
                f"runtime.torch_threads={threads}",
                f"output_dir={tmp}",
                "run_name=g",
            ],
        )
        summary = run(config, log=lambda *_: None)
        rows = [r for r in read_metrics(summary.run_dir / "metrics.jsonl") if "reward/mean" in r][skip:]
        params = _parameters(summary.run_dir / "final")
    out = {key: statistics.median(r.get(key, 0.0) for r in rows) for key in ["perf/step_s", *PARTS]}
    out["other_s"] = max(0.0, out["perf/step_s"] - sum(out[k] for k in PARTS))
    out["response_length"] = statistics.mean(r["response/length_mean"] for r in rows)
    out["responses"] = statistics.mean(
        len_ for len_ in [r["response/tokens"] / r["response/length_mean"] for r in rows]
    )
    out["parameters"] = params
    return out


def _parameters(model_dir: Path) -> int:
    from safetensors import safe_open

    total = 0
    for file in model_dir.glob("*.safetensors"):
        with safe_open(str(file), "pt") as handle:
            for key in handle:
                total += math.prod(handle.get_slice(key).get_shape())
    return total


def fit_exponent(xs: list[float], ys: list[float]) -> float:
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.mean(lx), statistics.mean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum((a - mx) ** 2 for a in lx)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["generation", "reward", "log-probs + loss", "backward", "optimizer", "sync", "other"]
    keys = [*PARTS, "other_s"]
    fig, axes_ = plt.subplots(1, len(results), figsize=(4.6 * len(results), 3.8))
    for ax, (axis, points) in zip(axes_, results.items(), strict=True):
        names = [_label(axis, p) for p in points]
        bottom = [0.0] * len(points)
        for key, label in zip(keys, labels, strict=True):
            values = [p[key] for p in points]
            ax.bar(names, values, bottom=bottom, label=label)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.set_title(f"{axis} (fit: time ∝ x^{points[0]['fit_exponent']:.2f})")
        ax.set_ylabel("seconds per step")
    axes_[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _label(axis: str, point: dict) -> str:
    if axis == "model parameters":
        millions = point["parameters"] / 1e6
        return f"{millions:.2g}M" if millions < 100 else f"{millions:.0f}M"  # 135M, not 1.3e+02M
    return f"{point['x']:g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--skip", type=int, default=2, help="first steps left out (one-off setup)")
    parser.add_argument("--no-smollm2", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--png", type=Path, default=None)
    args = parser.parse_args()
    results: dict[str, list[dict]] = {}
    for axis, points in axes(not args.no_smollm2).items():
        results[axis] = []
        for x, overrides in points:
            point = measure(overrides, args.steps, args.skip, args.threads)
            point["x"] = point["parameters"] if axis == "model parameters" else x
            results[axis].append(point)
            print(f"{axis}={_label(axis, point)}: {point['perf/step_s']:.3f} s/step", flush=True)
        exponent = fit_exponent([p["x"] for p in results[axis]], [p["perf/step_s"] for p in results[axis]])
        for p in results[axis]:
            p["fit_exponent"] = exponent
    print(
        f"\n{platform.machine()}, {os.cpu_count()} cores, {args.threads} threads, load average "
        f"{os.getloadavg()[0]:.2f} at the end; medians of steps {args.skip + 1}..{args.steps}\n"
    )
    print(
        "| axis | x | responses | mean length | s/step | generation | log-probs + loss | backward | optimizer "
        "| reward | sync | other | fitted exponent |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for axis, points in results.items():
        for p in points:
            print(
                f"| {axis} | {_label(axis, p)} | {p['responses']:.0f} | {p['response_length']:.1f} | "
                f"{p['perf/step_s']:.3f} | {p['perf/generate_s']:.3f} | {p['perf/train_forward_s']:.3f} | "
                f"{p['perf/train_backward_s']:.3f} | {p['perf/train_optimizer_s']:.3f} | {p['perf/reward_s']:.4f} | "
                f"{p['perf/sync_s']:.4f} | {p['other_s']:.3f} | {p['fit_exponent']:.2f} |"
            )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    if args.png:
        args.png.parent.mkdir(parents=True, exist_ok=True)
        plot(results, args.png)


if __name__ == "__main__":
    main()
