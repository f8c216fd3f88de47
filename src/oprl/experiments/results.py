"""Reading run directories into per-run records and one results table (CSV).

A record holds the run's identity (its sweep labels, or labels derived from its config), its curves
(``metrics.jsonl`` rows) and summary numbers: final / best eval accuracy, the area under the eval-accuracy
curve (trapezoid over steps, divided by the step span, so it is a mean accuracy), the first evaluated step
reaching a threshold, and the late training reward.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from oprl.metrics import read_metrics

THRESHOLD_GAIN = 0.05
"""``steps_to_threshold`` = first eval step where accuracy >= initial accuracy + this."""


@dataclass
class RunRecord:
    run_dir: Path
    labels: dict[str, str]
    config: dict
    rows: list[dict] = field(repr=False)

    def curve(self, key: str) -> tuple[list[int], list[float]]:
        points = [(r["step"], r[key]) for r in self.rows if key in r and r[key] is not None]
        return [p[0] for p in points], [p[1] for p in points]


def setting_of(config: dict) -> str:
    """A readable off-policy setting name from the schedule (docs/paper.md#off-policy); an async run's is
    ``async-S`` (lag <= sync.max_staleness S, which timing decides), never a scheduled one's (issue #71: it was
    drawn in the on-policy panel, its k=1 and m=0 being the scheduled on-policy run's)."""
    k, m, steps = config["sync"]["interval"], config["sync"]["offset"], config["steps"]
    if m + k >= steps or config.get("mode") == "offline":  # mode=offline: a stored experience directory
        return "offline"
    if config["sync"].get("mode") == "async":
        return f"async-{config['sync'].get('max_staleness', 1)}"
    if k == 1 and m == 0:
        return "on-policy"
    if k == 1:
        return f"stale-{m}"
    return f"sync-{k}" if m == 0 else f"sync-{k}-offset-{m}"


def objective_of(algorithm: dict) -> str:
    """What a run optimises, as its label: the preset, unless the teacher's signal enters the advantage
    (``distill_coef`` > 0): ``distill`` (the preset), ``distill (rec-oneside-nois loss)`` (pure distillation,
    ``distill_mix=replace``, through another preset's loss and clip) or ``grpo+distill`` (``add``: reward and
    teacher together). A clipped distillation run is not RL, and its label says so."""
    preset = str(algorithm.get("preset") or "custom")
    if not (algorithm.get("distill_coef") or 0) > 0:
        return preset
    if algorithm.get("distill_mix") == "add":
        return f"{preset}+distill"
    return "distill" if preset == "distill" else f"distill ({preset} loss)"


def load_run(run_dir: Path, labels: dict[str, str] | None = None) -> RunRecord:
    run_dir = Path(run_dir)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    rows = read_metrics(run_dir / "metrics.jsonl")
    derived = {"preset": objective_of(config["algorithm"]), "setting": setting_of(config), "seed": str(config["seed"])}
    merged = derived | {_canonical(k): v for k, v in (labels or {}).items()}
    return RunRecord(run_dir=run_dir, labels=merged, config=config, rows=rows)


def summarize(record: RunRecord, threshold_gain: float = THRESHOLD_GAIN) -> dict:
    steps, accuracy = record.curve("eval/accuracy")
    _, reward = record.curve("reward/mean")
    tail = reward[-max(1, len(reward) // 10) :] if reward else [float("nan")]
    out = {
        "final_accuracy": accuracy[-1] if accuracy else float("nan"),
        "initial_accuracy": accuracy[0] if accuracy else float("nan"),
        "best_accuracy": max(accuracy) if accuracy else float("nan"),
        "accuracy_auc": _auc(steps, accuracy),
        "steps_to_threshold": _first_reaching(steps, accuracy, threshold_gain),
        "late_train_reward": sum(tail) / len(tail),
    }
    summary_path = record.run_dir / "summary.json"
    if summary_path.is_file():
        out["seconds"] = json.loads(summary_path.read_text()).get("seconds", float("nan"))
    return out


def collect_results(sweep_dir: Path, planned=None, threshold_gain: float = THRESHOLD_GAIN) -> list[dict]:
    """One row per finished run: labels, key config values, summary numbers."""
    planned_runs: list[tuple[Path, dict[str, str]]]
    if planned is None:
        planned_runs = [(d, {}) for d in sorted(Path(sweep_dir).iterdir()) if (d / "summary.json").is_file()]
    else:
        planned_runs = [
            (Path(sweep_dir) / r.name, r.labels)
            for r in planned
            if (Path(sweep_dir) / r.name / "summary.json").is_file()
        ]
    table = []
    for run_dir, labels in planned_runs:
        record = load_run(run_dir, labels)
        table.append(
            {
                "run": run_dir.name,
                **record.labels,
                "lr": record.config["optim"]["lr"],
                "sync_interval": record.config["sync"]["interval"],
                "sync_offset": record.config["sync"]["offset"],
                "steps": record.config["steps"],
                **summarize(record, threshold_gain),
            }
        )
    return table


def write_table(table: list[dict], path: Path) -> None:
    columns: list[str] = []
    for row in table:
        columns += [c for c in row if c not in columns]
    with Path(path).open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(table)


def _canonical(axis: str) -> str:
    return {"algorithm.preset": "preset"}.get(axis, axis.split(".")[-1])


def _auc(steps: list[int], values: list[float]) -> float:
    if len(steps) < 2:
        return values[0] if values else float("nan")
    area = sum((steps[i + 1] - steps[i]) * (values[i] + values[i + 1]) / 2 for i in range(len(steps) - 1))
    return area / (steps[-1] - steps[0])


def _first_reaching(steps: list[int], values: list[float], gain: float) -> float:
    if not values:
        return float("nan")
    target = values[0] + gain
    return next((float(s) for s, v in zip(steps, values, strict=True) if v >= target), float("nan"))
