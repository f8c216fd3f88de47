"""A sequence-classification model as a reward: ``task.reward=model:PATH``.

PATH is a directory (or anything ``from_pretrained`` reads) holding a Hugging Face
``AutoModelForSequenceClassification`` and its tokenizer: a reward model as TRL's ``RewardTrainer`` or a
classifier fine-tuned elsewhere leaves it. The reward of a completion is the model's score of the prompt
followed by the completion (the prompt's chat messages plus the completion as the assistant's turn, through
the tokenizer's chat template where it has one; else the texts joined):

    r = logit_0                      num_labels = 1 (a reward model: Bradley-Terry's scalar)
    r = softmax(logits)_{L-1}        num_labels = L >= 2 (the last label's probability: "positive" in a binary one)

The model runs in the process that scores (the explorer's), on its device: CUDA where that process sees one, else
the CPU, in batches of ``BATCH`` rows, ``torch.no_grad``, truncated to the model's maximum length (left:
the completion's end is kept). It loads at the first score, so the pre-run check of the reward functions (in the
driver) does not load it; the path and its config are checked when the task is built (one line naming
``task.reward``). Not here: a reward model served elsewhere (a ``file.py:function`` that calls it does that),
pairwise judging (``oprl.episodes.judge``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from oprl.errors import OprlError

PREFIX = "model:"
"""How ``task.reward`` names a classifier: ``model:PATH``."""
BATCH = 16
"""Rows per forward: bounds the activations' memory for long completions."""
KEY = "task.reward"


def is_model_spec(spec: str) -> bool:
    return spec.startswith(PREFIX)


class ClassifierReward:
    """``score(rows) -> [float]`` of ``{"prompt", "completion", ...}`` rows by the classifier at ``spec``
    (``model:PATH``); its config is read here (a bad PATH is one ``OprlError`` line), its weights at the first
    ``score``."""

    def __init__(self, spec: str):
        from transformers import AutoConfig

        self.spec, self.path = spec, spec.removeprefix(PREFIX)
        if not self.path:
            raise OprlError(f"{KEY}: {spec!r} names no model; use model:PATH (a sequence-classification model)")
        if self.path.startswith((".", "/", "~")) and not Path(self.path).expanduser().is_dir():  # not a hub id
            raise OprlError(f"{KEY}: {spec}: {self.path!r} is no directory (model:PATH names a saved classifier)")
        try:
            config = AutoConfig.from_pretrained(self.path)
        except (OSError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise OprlError(f"{KEY}: {spec}: no model config at {self.path!r} ({first})") from None
        if not any(name.endswith("ForSequenceClassification") for name in config.architectures or []):
            raise OprlError(
                f"{KEY}: {spec}: {self.path!r} is a {', '.join(config.architectures or ['model'])}, not a "
                "sequence-classification model (AutoModelForSequenceClassification)"
            )
        self.name = "reward_model"
        self._model: Any = None
        self._tokenizer: Any = None

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the scoring process's own
        self._tokenizer = AutoTokenizer.from_pretrained(self.path)
        self._tokenizer.truncation_side = "left"  # keep the completion's end: a verdict lives there
        if self._tokenizer.pad_token is None:
            self._tokenizer.pad_token = self._tokenizer.eos_token or self._tokenizer.unk_token
        model = AutoModelForSequenceClassification.from_pretrained(self.path).to(device).eval()
        if model.config.pad_token_id is None:  # the classifier pools at the last non-pad token: it must know pad
            model.config.pad_token_id = self._tokenizer.pad_token_id
        self._model = model

    def text(self, prompt: Any, completion: str) -> str:
        """The scored text: chat messages + the completion as the assistant's turn (chat template), or the
        prompt's text followed by the completion."""
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt or [])
        if getattr(self._tokenizer, "chat_template", None):
            turns = [*messages, {"role": "assistant", "content": completion}]
            return self._tokenizer.apply_chat_template(turns, tokenize=False)
        return "".join(str(m.get("content", "")) for m in messages) + completion

    def score(self, rows: Sequence[dict[str, Any]]) -> list[float]:
        """One reward per row (module docstring's r), in batches of ``BATCH``."""
        import torch

        if self._model is None:
            self._load()
        texts = [self.text(row["prompt"], row["completion"]) for row in rows]
        limit = min(getattr(self._tokenizer, "model_max_length", 4096), 4096)
        out: list[float] = []
        for start in range(0, len(texts), BATCH):
            batch = self._tokenizer(texts[start : start + BATCH], return_tensors="pt", padding=True,
                                    truncation=True, max_length=limit).to(self._model.device)  # fmt: skip
            with torch.no_grad():
                logits = self._model(**batch).logits.float()  # (B, L)
            scores = logits[:, 0] if logits.shape[-1] == 1 else logits.softmax(-1)[:, -1]  # (B,)
            out += [float(s) for s in scores.cpu()]
        if not all(math.isfinite(s) for s in out):
            raise OprlError(f"{KEY}: {self.spec} scored a non-finite reward (a NaN in the model's weights?)")
        return out
