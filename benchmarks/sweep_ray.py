"""A sweep on the local pool against the same sweep on Ray (issue 57 item 3): identical results, and the wall time
of each. docs/sweeps.md#sweeps-on-a-ray-cluster has the figures.

The same runs (default: the 4 runs of configs/sweeps/smoke.yaml) go through ``oprl sweep`` twice, each in a fresh
output directory: the local pool (``--parallel``, runner processes) and ``--backend ray --address`` on a two-node
``ray.cluster_utils.Cluster`` started here on this machine (a head without CPUs, two worker nodes of
``--node-cpus`` CPUs each: runs can only go to the worker nodes, two at once with the defaults, as the local pool's
``parallel: 2``). Both are timed from the command's start to its end (process start-up, every run, results.csv);
the cluster's own start-up is timed apart and not counted. ``--rounds`` alternates which goes first.

Checked per round: the two results.csv agree on every column but ``seconds`` (a difference fails the benchmark),
and which Ray node each run went to (from the attempt headers of its log). Reported with the CPU and the load
average before and after, since the development machine is usually shared with other sweeps.

Run:  python benchmarks/sweep_ray.py [--spec configs/sweeps/smoke.yaml] [--set steps=30 ...] [--only AXIS=V ...]
      [--parallel 2] [--node-cpus 1] [--rounds 1] [--root runs/bench-sweep-ray]
      [--out benchmarks/results/sweep_ray.json]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from oprl.machine import cpu_name


def sweep(spec: str, out: Path, extra: list[str]) -> float:
    command = [sys.executable, "-m", "oprl.cli", "sweep", spec, "--out", str(out), *extra]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    (out / "sweep-console.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)}: exit {done.returncode}: {done.stderr.strip()[-600:]}")
    return wall


def table(out: Path) -> dict[str, dict]:
    """results.csv by run directory, without ``seconds`` (wall time, the one column a rerun changes)."""
    rows = {}
    for row in csv.DictReader((out / "results.csv").open()):
        row.pop("seconds", None)
        rows[row.get("run") or json.dumps(row, sort_keys=True)] = row
    return rows


def nodes(out: Path) -> dict[str, list[str]]:
    """Run -> the node of each attempt (``# oprl sweep: attempt N of M on node ID at IP, TIME``)."""
    found = {}
    for log in sorted((out / "logs").glob("*.log")):
        found[log.stem] = re.findall(r"^# oprl sweep: attempt \d+ of \d+ on node (\w+)", log.read_text(), re.M)
    return found


def run_seconds(out: Path) -> float:
    """The runs' own seconds (``summary.json``: from the run's start to its end, in its process), summed: what a
    sweep's wall time holds beside process start-up and scheduling."""
    return sum(json.loads(p.read_text())["seconds"] for p in out.glob("*/summary.json"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default="configs/sweeps/smoke.yaml")
    parser.add_argument("--set", nargs="+", default=[], dest="sets", metavar="KEY=VALUE")
    parser.add_argument("--only", nargs="+", default=[], metavar="AXIS=VALUES")
    parser.add_argument("--parallel", type=int, default=2, help="the local pool's runs at once")
    parser.add_argument("--node-cpus", type=int, default=1, help="CPUs of each of the two Ray worker nodes")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--root", type=Path, default=Path("runs/bench-sweep-ray"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/sweep_ray.json"))
    args = parser.parse_args(argv)
    import ray
    from ray.cluster_utils import Cluster

    common = [*(["--set", *args.sets] if args.sets else []), *(["--only", *args.only] if args.only else [])]
    started = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for _ in range(2):
        cluster.add_node(num_cpus=args.node_cpus)
    cluster.wait_for_nodes()
    cluster_s = time.perf_counter() - started
    report = {
        "command": " ".join([sys.executable, *sys.argv]),
        "machine": f"{cpu_name()}, {os.cpu_count()} cores",
        "spec": args.spec,
        "sets": args.sets,
        "only": args.only,
        "local": f"--parallel {args.parallel}",
        "ray": f"two worker nodes of {args.node_cpus} CPU(s) (ray.cluster_utils.Cluster, head without CPUs)",
        "ray_cluster_start_s": round(cluster_s, 1),
        "loadavg_before": os.getloadavg()[0],
        "rounds": [],
    }
    try:
        for round_ in range(args.rounds):
            root = args.root / f"round-{round_}"
            shutil.rmtree(root, ignore_errors=True)
            order = ["local", "ray"] if round_ % 2 == 0 else ["ray", "local"]
            walls = {}
            for backend in order:
                extra = ["--parallel", str(args.parallel)]
                if backend == "ray":
                    extra = ["--backend", "ray", "--address", cluster.address]
                walls[backend] = sweep(args.spec, root / backend, [*common, *extra])
                print(f"round {round_}: {backend} {walls[backend]:.1f} s", flush=True)
            local, on_ray = table(root / "local"), table(root / "ray")
            if local != on_ray:
                raise SystemExit(f"round {round_}: results.csv differ beyond `seconds`: {local} != {on_ray}")
            placed = nodes(root / "ray")
            report["rounds"].append(
                {
                    "order": order,
                    "runs": len(local),
                    "local_s": round(walls["local"], 1),
                    "ray_s": round(walls["ray"], 1),
                    "ray_over_local": round(walls["ray"] / walls["local"], 3),
                    "local_run_seconds_sum": round(run_seconds(root / "local"), 1),
                    "ray_run_seconds_sum": round(run_seconds(root / "ray"), 1),
                    "identical_results": True,
                    "ray_nodes": placed,
                    "ray_nodes_used": len({n for attempts in placed.values() for n in attempts}),
                }
            )
    finally:
        ray.shutdown()
        cluster.shutdown()
    report["loadavg_after"] = os.getloadavg()[0]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for r in report["rounds"]:
        print(
            f"{r['runs']} runs, identical results.csv (every column but seconds); local pool {r['local_s']} s, "
            f"Ray on 2 nodes {r['ray_s']} s (x{r['ray_over_local']}), {r['ray_nodes_used']} node(s) used; "
            f"the runs' own seconds summed: local {r['local_run_seconds_sum']}, Ray {r['ray_run_seconds_sum']}; "
            f"order {' then '.join(r['order'])}"
        )
    print(
        f"{report['machine']}; load average {report['loadavg_before']:.2f} before, {report['loadavg_after']:.2f} "
        f"after; Ray cluster started in {cluster_s:.1f} s (not counted); {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
