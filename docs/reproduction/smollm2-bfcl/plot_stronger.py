"""stronger-k8.csv -> figures/stronger-k8.png (study 3's stronger RL phase, 8 samples a test problem)."""

import csv

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

root = "docs/reproduction/smollm2-bfcl/"
with open(root + "stronger-k8.csv") as f:
    rows = list(csv.DictReader(f))
warm = {r["eval_seed"]: float(r["k8_pass_at_1"]) for r in rows if r["run"] == "warm start"}
fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
curve = [r for r in rows if r["run"] == "stronger 40 steps seed 0" and r["eval_seed"] == "0"]
steps = [int(r["step"]) for r in curve]
series = [("k8_pass_at_1", "pass@1 (8 samples)"), ("k8_majority", "majority of 8"), ("k8_pass_at_8", "pass@8")]
for key, label in series:
    a.plot(steps, [float(r[key]) for r in curve], marker="o", label=label)
a.set(xlabel="RL step", ylabel="test accuracy (80 problems)", title="stronger phase, seed 0, eval.seed=0", xticks=steps)
a.legend()
finals = [r for r in rows if r["run"] != "warm start" and r["step"] in ("20", "40")]
labels = [f"{r['run'].replace('stronger ', '')}\nstep {r['step']}, eval seed {r['eval_seed']}" for r in finals]
gains = [100 * (float(r["k8_pass_at_1"]) - warm[r["eval_seed"]]) for r in finals]
b.bar(range(len(gains)), gains, color=["C2" if round(g, 6) >= 5 else "C0" for g in gains])
b.axhline(5, color="k", ls="--", lw=1, label="+5 goal")
b.set_xticks(range(len(gains)), labels, fontsize=7, rotation=30, ha="right")
b.set(ylabel="gain over the warm start (points, pass@1 of 8)", title="every stronger-phase run")
b.legend()
fig.tight_layout()
fig.savefig(root + "figures/stronger-k8.png", dpi=110)
