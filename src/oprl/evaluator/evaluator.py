"""``Evaluator``, the role of ``mode=eval``: loads one model (``model.path``, or a checkpoint's weights loaded
into it) and evaluates it with the same function the trainer evaluates with (``oprl.episodes.evaluation``)."""

from __future__ import annotations

from oprl.checkpoint.files import load_checkpoint_weights
from oprl.config import RunConfig
from oprl.episodes.evaluation import evaluation_row
from oprl.tasks import build_task
from oprl.worker_parts import load_model, make_engine


class Evaluator:
    """The worker of ``mode=eval``: one model (``model.path``, or a checkpoint's weights loaded into it)."""

    def __init__(self, config: RunConfig, model_path: str):
        self.config = config
        self.task = build_task(config.task)
        self.model, self.tokenizer = load_model(config, model_path)
        self.engine = make_engine(config, self.model, self.tokenizer)

    def load_checkpoint(self, checkpoint: str) -> int:
        """Only the trainer weights of a checkpoint; returns its step."""
        return load_checkpoint_weights(self.model, checkpoint)

    def evaluate(self, step: int) -> dict[str, float]:
        return evaluation_row(self.config, self.engine, self.task, self.tokenizer, step)
