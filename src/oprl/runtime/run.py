"""One training run, end to end, in one process: the local sequential backend.

Wiring only: build the task, load the model, then alternate explorer and trainer following the schedule
of ``oprl.runtime.schedule``. A batch for step t is generated exactly when the trainer holds version v(t)
(right after step v(t)), so a single copy of the weights serves both sides and the policy version recorded
in each experience is the true one. Evaluation happens before training, every ``eval.interval`` steps and
after training; the run directory receives the resolved config, ``metrics.jsonl``, tensorboard events,
``metrics.png``, ``summary.json`` and the final model (``final/``, loadable with ``from_pretrained``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import torch

from oprl.config import RunConfig, algorithm_settings, save_config
from oprl.errors import OprlError
from oprl.metrics import MetricsLogger, plot_run, read_metrics
from oprl.progress import RunProgress
from oprl.models.loading import load_pretrained
from oprl.rollout import HFGenerateEngine
from oprl.runtime.evaluate import evaluate
from oprl.runtime.explorer import Explorer
from oprl.runtime.schedule import lag, policy_version
from oprl.runtime.trainer import Trainer
from oprl.runtime.warmstart import warm_started_model
from oprl.tasks import build_task

EVAL_SEED_OFFSET = 7_777_777


@dataclass
class RunSummary:
    run_dir: Path
    accuracy_before: float
    accuracy_after: float
    seconds: float


def load_policy(config: RunConfig, task, log=print):
    """(model, tokenizer) for ``model.path``: the cached warm-started tiny model, or a Hugging Face model."""
    path = config.model.path
    if path == "tiny":
        path = warm_started_model(config.model, config.task, config.warmstart, task, log=log)
    return load_pretrained(path, dtype=config.model.dtype)


def make_run_dir(config: RunConfig) -> Path:
    name = config.run_name or (
        f"{config.algorithm.preset}-k{config.sync.interval}-m{config.sync.offset}-s{config.seed}-"
        f"{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    )
    run_dir = Path(config.output_dir) / name
    if (run_dir / "metrics.jsonl").exists():
        raise OprlError(f"run_name: {run_dir} already holds a run; choose another run_name")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def train(config: RunConfig, log=print) -> RunSummary:
    started = time.perf_counter()
    _quiet_transformers()
    torch.manual_seed(config.seed)
    run_dir = make_run_dir(config)
    save_config(config, run_dir / "config.yaml")
    task = build_task(config.task)
    model, tokenizer = load_policy(config, task, log=log)
    engine = HFGenerateEngine(
        model, tokenizer, temperature=config.rollout.temperature, top_p=config.rollout.top_p,
        max_new_tokens=config.rollout.max_new_tokens,
    )
    explorer = Explorer(
        task, tokenizer, engine, prompts_per_step=config.rollout.prompts_per_step,
        group_size=config.rollout.group_size, seed=config.seed,
    )
    trainer = Trainer(
        model, pad_id=tokenizer.pad_token_id, settings=algorithm_settings(config), optim=config.optim,
        sampling_temperature=config.rollout.temperature, max_response_tokens=config.rollout.max_new_tokens,
        kl_coef=config.algorithm.kl_coef, kl_estimator=config.algorithm.kl_estimator,
        entropy_coef=config.algorithm.entropy_coef, seed=config.seed,
    )

    def run_eval(step: int) -> dict[str, float]:
        result = evaluate(
            engine, task, tokenizer, num_problems=config.eval.num_problems, temperature=config.eval.temperature,
            seed=config.seed * 1_000_003 + EVAL_SEED_OFFSET + step, batch_size=config.eval.batch_size,
        )
        return {f"eval/{k}": v for k, v in result.items()}

    logger = MetricsLogger(run_dir, tensorboard=config.tensorboard)
    before = run_eval(0)
    logger.log(0, before)
    eval_row = before
    k, m = config.sync.interval, config.sync.offset
    pending: dict[int, tuple[list, dict]] = {}
    next_batch = 1
    with RunProgress(config.steps, enabled=config.progress) as progress:
        progress.update(0, accuracy=before["eval/accuracy"])
        for step in range(1, config.steps + 1):
            # Generate every batch whose scheduled version is the trainer's current one (explorer runs ahead).
            while next_batch <= config.steps and policy_version(next_batch, k, m) <= trainer.version:
                pending[next_batch] = explorer.explore(next_batch, trainer.version)
                next_batch += 1
            batch, timing = pending.pop(step)
            row = trainer.step(batch)
            row.update(_schedule_metrics(step, k, m, batch, len(pending), timing))
            if config.eval.interval and step % config.eval.interval == 0 and step != config.steps:
                eval_row = run_eval(step)
                row.update(eval_row)
            if step == config.steps:
                eval_row = run_eval(step)
                row.update(eval_row)
            logger.log(step, row)
            progress.update(step, reward=row["reward/mean"], accuracy=eval_row["eval/accuracy"])
    logger.close()
    model.save_pretrained(run_dir / "final")
    tokenizer.save_pretrained(run_dir / "final")
    plot_run(read_metrics(run_dir / "metrics.jsonl"), run_dir / "metrics.png", title=run_dir.name)
    summary = RunSummary(run_dir, before["eval/accuracy"], eval_row["eval/accuracy"], time.perf_counter() - started)
    (run_dir / "summary.json").write_text(
        json.dumps({
            "eval_accuracy_before": summary.accuracy_before,
            "eval_accuracy_after": summary.accuracy_after,
            "steps": config.steps,
            "seconds": summary.seconds,
        }, indent=2)
    )
    return summary


def _schedule_metrics(step, k, m, batch, buffered, timing) -> dict[str, float]:
    versions = [e.policy_version for e in batch]
    lags = [(step - 1) - v for v in versions]
    assert versions[0] == policy_version(step, k, m), "batch generated by the wrong policy version"
    return {
        "lag/min": float(min(lags)),
        "lag/mean": sum(lags) / len(lags),
        "lag/max": float(max(lags)),
        "lag/scheduled": float(lag(step, k, m)),
        "buffer/batches_ahead": float(buffered),
        "perf/generate_s": timing["generate_s"],
        "perf/reward_s": timing["reward_s"],
        "perf/generate_tokens_per_s": timing["generated_tokens"] / max(timing["generate_s"], 1e-9),
    }


def _quiet_transformers() -> None:
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
