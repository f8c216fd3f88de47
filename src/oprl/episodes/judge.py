"""A model as the judge: ``Judge`` scores replies with a second model, ``JudgedTask`` adds its score to a task's.

Each reply of a batch is rendered into ``judge.template`` (``{prompt}`` = the problem's last user message,
``{completion}`` = the reply, ``{reference}`` = the reference answer) and read by the judge model as plain text,
all rows of the batch together (right-padded, ``judge.micro_batch_size`` rows per forward). Its score s is:

- ``yes-no``: s = log p(yes | text) - log p(no | text), the log-ratio of the judge's next-token probabilities of
  the first tokens of ``judge.yes_text`` and ``judge.no_text`` (one prefill, no sampling, never unparsable);
- ``number`` / ``regex``: the judge continues the text greedily (argmax, ``judge.max_new_tokens`` tokens) and s
  is the first number (``regex``: ``judge.pattern``'s first group) of the continuation. None found: s = 0 and
  the row is counted as unparsed.

Neither draws a random number, so the verdicts depend only on the judge's weights (loaded under the run's seed,
as every model of the run) and the texts: the same run gives the same verdicts. ``JudgedTask.score`` is the one
place the verdict joins the rule reward: total = rule total + ``judge.weight`` * s, with the components
``<name>`` (s) and ``<name>_unparsed`` (0/1) beside the task's own, logged as ``reward/<name>`` and
``reward/<name>_unparsed`` (the batch's share of unparsed verdicts).

The judge lives in each explorer's process (loaded as the teacher is, ``oprl.worker.load_frozen``), so it
is placed wherever the explorer is. Not here: multi-turn tasks (their environments reward), judging evaluation
(``eval/*`` stays the task's rule), sampling the judge at a temperature.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from oprl.errors import OprlError
from oprl.tasks.base import EpisodicTask, Problem, Reward, Task
from oprl.worker import load_frozen

if TYPE_CHECKING:
    from oprl.config import JudgeConfig, RunConfig

_NUMBER = r"(-?\d+(?:\.\d+)?)"
log = logging.getLogger("oprl.tasks")


def render(template: str, prompt: str, completion: str, reference: str | None) -> str:
    """``template`` with its placeholders filled (``JudgeConfig`` has refused any other placeholder)."""
    return template.format(prompt=prompt, completion=completion, reference="" if reference is None else reference)


def prompt_text(problem: Problem) -> str:
    """``{prompt}``: the content of the problem's last user message (its whole text when it has none)."""
    users = [m for m in problem.messages if m.get("role") == "user"]
    chosen = users[-1:] or list(problem.messages)
    return "\n".join(str(m.get("content", "")) for m in chosen)


def parse_number(text: str, pattern: str) -> float | None:
    """The first match of ``pattern`` in ``text`` (its first group when it has one) as a finite float, or None."""
    found = re.search(pattern, text)
    if found is None:
        return None
    try:
        value = float(found.group(1) if found.groups() else found.group(0))
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


class Judge:
    """A frozen causal LM that scores texts: ``verdicts(texts)`` -> (score or None = unparsed) per text."""

    def __init__(self, model, tokenizer, settings: JudgeConfig):
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.settings = settings
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        if settings.parser == "yes-no":
            self.yes, self.no = (
                self._first_token(settings.yes_text, "yes_text"),
                self._first_token(settings.no_text, "no_text"),
            )
            if self.yes == self.no:
                raise OprlError(
                    f"judge.yes_text {settings.yes_text!r} and judge.no_text {settings.no_text!r} start with the "
                    "same token of the judge's tokenizer"
                )

    def _first_token(self, text: str, key: str) -> int:
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if not ids:
            raise OprlError(f"judge.{key}: {text!r} is no token of the judge's tokenizer")
        return ids[0]

    def encode(self, text: str) -> list[int]:
        """The text's tokens; past the judge's context (less the continuation) only its last tokens, which hold
        the template's question: a long reply is judged on its end rather than crashing the batch."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        context = getattr(self.model.config, "max_position_embeddings", None)
        if context is None:
            return ids
        room = context - (0 if self.settings.parser == "yes-no" else self.settings.max_new_tokens)
        return ids[-max(room, 1) :]

    @torch.no_grad()
    def next_logprobs(self, rows: Sequence[list[int]]) -> torch.Tensor:
        """log p(next token | row) for each row, (B, V) in float32: right-padded, read at each row's last token."""
        lengths = torch.tensor([len(r) for r in rows])
        ids = torch.full((len(rows), int(lengths.max())), self.pad_id, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
        mask = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()
        device = next(self.model.parameters()).device
        logits = self.model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits  # (B, T, V)
        last = logits[torch.arange(len(rows)), (lengths - 1).to(device)]  # (B, V)
        return torch.log_softmax(last.float(), dim=-1).cpu()

    def verdicts(self, texts: Sequence[str]) -> list[float | None]:
        """The score of each text (module docstring), ``judge.micro_batch_size`` texts per forward."""
        out: list[float | None] = []
        size = self.settings.micro_batch_size
        for first in range(0, len(texts), size):
            rows = [self.encode(t) for t in texts[first : first + size]]
            out += self._yes_no(rows) if self.settings.parser == "yes-no" else self._parsed(rows)
        return out

    def _yes_no(self, rows: list[list[int]]) -> list[float | None]:
        logprobs = self.next_logprobs(rows)  # (B, V)
        return (logprobs[:, self.yes] - logprobs[:, self.no]).tolist()

    def _parsed(self, rows: list[list[int]]) -> list[float | None]:
        """Greedy continuations (a full forward per token: they are a few tokens long), then the parser."""
        settings = self.settings
        pattern = _NUMBER if settings.parser == "number" else settings.pattern
        grown = [list(r) for r in rows]
        for _ in range(settings.max_new_tokens):
            chosen = self.next_logprobs(grown).argmax(dim=-1).tolist()  # (B,)
            for row, token in zip(grown, chosen, strict=True):
                row.append(token)
        continuations = [
            self.tokenizer.decode(g[len(r) :], skip_special_tokens=True) for g, r in zip(grown, rows, strict=True)
        ]
        return [parse_number(text, pattern) for text in continuations]


def build_judge(config: RunConfig, student_path: str) -> Judge:
    """The ``Judge`` of ``config.judge`` (``judge.path`` resolved as ``teacher.path`` is), frozen, on model.device."""
    path = config.judge.path
    assert path is not None, "a judge is built only with judge.path"
    model, tokenizer, _ = load_frozen(path, "judge.path", config.judge.dtype, config, student_path)
    return Judge(model, tokenizer, config.judge)


class JudgedTask:
    """``task`` with the judge's score added to its reward (module docstring); problems are the task's."""

    def __init__(self, task: Task, judge: Judge):
        if isinstance(task, EpisodicTask):
            raise OprlError(
                f"judge.path: task {task.name!r} is multi-turn (its environment rewards); a judge scores single replies"
            )
        self.task, self.judge = task, judge
        self.name = task.name
        self._warned = False

    def problems(self, split: str) -> Sequence[Problem]:
        return self.task.problems(split)

    def score(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[Reward]:
        rules = self.task.score(problems, responses)
        settings = self.judge.settings
        texts = [
            render(settings.template, prompt_text(p), r, p.answer) for p, r in zip(problems, responses, strict=True)
        ]
        verdicts = self.judge.verdicts(texts)
        self._warn_unparsed(problems, verdicts)
        out = []
        for rule, verdict in zip(rules, verdicts, strict=True):
            if settings.name in rule.components or f"{settings.name}_unparsed" in rule.components:
                raise OprlError(f"judge.name: the task already has a reward component {settings.name!r}; rename it")
            score = 0.0 if verdict is None else verdict
            components = {**rule.components, settings.name: score, f"{settings.name}_unparsed": float(verdict is None)}
            out.append(Reward(total=rule.total + settings.weight * score, components=components))
        return out

    def _warn_unparsed(self, problems: Sequence[Problem], verdicts: list[float | None]) -> None:
        """One warning line the first time a batch has unparsed verdicts (each scores 0 and is counted)."""
        unparsed = [p.task_id for p, v in zip(problems, verdicts, strict=True) if v is None]
        if unparsed and not self._warned:
            self._warned = True
            name = self.judge.settings.name
            log.warning(
                "judge.parser: %d of %d verdicts of a batch had no number (each scores 0, counted in "
                "reward/%s_unparsed; said once); e.g. %s",
                len(unparsed),
                len(verdicts),
                name,
                unparsed[0],
            )

    def __getattr__(self, name: str):  # the task's other attributes (demonstrations, tools, ...) stay reachable
        if name == "task":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.task, name)


def judged(task: Task, config: RunConfig, student_path: str) -> Task:
    """``task`` itself without ``judge.path``, else ``JudgedTask(task, build_judge(...))``."""
    if config.judge.path is None:
        return task
    return JudgedTask(task, build_judge(config, student_path))
