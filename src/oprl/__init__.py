"""oprl: off-policy RL fine-tuning of language models with group-relative REINFORCE and its relatives.

Use it from Python: ``run = oprl.train(steps=20)``, ``oprl.evaluate(checkpoint=run.run_dir)`` (docs/api.md).

Layout (imports flow one way, no package cycle: tests/test_layering.py):
- ``oprl.algorithms``: pure tensor math (advantages, policy losses, presets, the consistency surrogate).
- ``oprl.tasks``: what to learn: the Task protocol, problem generators and reward functions.
- ``oprl.models``: Hugging Face glue: the embedded tiny model, loading, log-prob computation.
- ``oprl.rollout``: how samples are produced (engines ``lean``, ``hf`` generate, ``vllm``) with behaviour
  log-probs.
- the roles: ``oprl.explorer`` (episodes, evaluation), ``oprl.trainer`` (trainer, ranks), ``oprl.buffer``,
  ``oprl.checkpoint`` (files, resume), ``oprl.backends`` (threads, processes, Ray); ``oprl.messages`` is
  what travels between them, ``oprl.schedule`` the lag rule.
- ``oprl.runtime``: the orchestration: ``run`` wires the workers, the driver drives them, the synchronizer
  hands weights to the explorers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["RunResult", "evaluate", "load_config", "train"]

if TYPE_CHECKING:
    from oprl.api import RunResult, evaluate, train
    from oprl.config import load_config


def __dir__() -> list[str]:
    """``dir(oprl)`` lists the lazily imported API too (``train``, ``evaluate``, ...)."""
    return sorted({*globals(), *__all__})


def __getattr__(name: str) -> Any:
    """``oprl.train`` / ``oprl.evaluate`` / ``oprl.RunResult`` (docs/api.md), imported on first use so that
    ``import oprl`` stays light."""
    if name in ("train", "evaluate", "RunResult"):
        from oprl import api

        return getattr(api, name)
    if name == "load_config":
        from oprl.config import load_config

        return load_config
    raise AttributeError(f"module 'oprl' has no attribute {name!r}")
