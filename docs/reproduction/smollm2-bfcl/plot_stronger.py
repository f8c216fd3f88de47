"""stronger-k8.csv -> figures/stronger-k8.png (study 3's stronger RL phase, 8 samples a test problem).

Left: 8-sample pass@1 and majority of 8 along each 40-step run (eval.seed=0). Right: the gain over the warm
start per seed at steps 20 and 40 under both evaluation seeds (a missing bar was not measured). A step-20 point
comes from the 40-step run's own evaluation where it had one, else from the 20-step run of the same seed (the
same trajectory: per-step sampling seeds depend on the seed and step only).
"""

import csv

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

root = "docs/reproduction/smollm2-bfcl/"
with open(root + "stronger-k8.csv") as f:
    rows = list(csv.DictReader(f))
warm = {r["eval_seed"]: float(r["k8_pass_at_1"]) for r in rows if r["run"] == "warm start"}
point = {}  # (seed, step, eval_seed) -> row; the 40-step runs' rows first
for r in sorted((r for r in rows if r["seed"]), key=lambda r: r["steps"] != "40"):
    point.setdefault((r["seed"], r["step"], r["eval_seed"]), r)
seeds = sorted({r["seed"] for r in rows if r["seed"]})

fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
for i, seed in enumerate(seeds):
    curve = sorted(
        (r for r in rows if r["steps"] == "40" and r["seed"] == seed and r["eval_seed"] == "0"),
        key=lambda r: int(r["step"]),
    )
    if not curve:
        continue
    steps = [int(r["step"]) for r in curve]
    a.plot(steps, [float(r["k8_pass_at_1"]) for r in curve], marker="o", color=f"C{i}", label=f"seed {seed} pass@1")
    a.plot(
        steps,
        [float(r["k8_majority"]) for r in curve],
        ls="--",
        marker=".",
        color=f"C{i}",
        label=f"seed {seed} majority",
    )
a.set(
    xlabel="RL step", ylabel="test accuracy (80 problems, 8 samples)", title="40 steps, eval.seed=0", xticks=[0, 20, 40]
)
a.legend(fontsize=7)

cells = [("20", "0"), ("20", "1"), ("40", "0"), ("40", "1")]
width = 0.2
for j, (step, eval_seed) in enumerate(cells):
    xs, gains = [], []
    for i, seed in enumerate(seeds):
        r = point.get((seed, step, eval_seed))
        if r is not None:
            xs.append(i + (j - 1.5) * width)
            gains.append(100 * (float(r["k8_pass_at_1"]) - warm[eval_seed]))
    b.bar(xs, gains, width, label=f"step {step}, eval.seed={eval_seed}", color=f"C{j + 3}")
b.axhline(5, color="k", ls="--", lw=1, label="+5 goal")
b.set_xticks(range(len(seeds)), [f"seed {s}" for s in seeds])
b.set(ylabel="gain over the warm start (points)", title="every stronger-phase evaluation")
b.set_ylim(0, 13)  # headroom so the legend sits above the bars
b.legend(fontsize=7, ncol=2, loc="upper center")
fig.tight_layout()
fig.savefig(root + "figures/stronger-k8.png", dpi=110)
