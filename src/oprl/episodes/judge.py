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

A run has one judge, a role of its own placed by the backend like the teacher (``oprl.judge.JudgeWorker``,
loaded as the teacher is, ``oprl.worker_parts.load_frozen``): a thread, a process of its own, or a Ray actor with
``judge.gpus`` GPUs. Each explorer holds a line to it (``oprl.roles.JudgeClient``, a ``JudgeSource``) and sends
it the (prompt, completion, reference) rows of a batch in one call right after sampling; the judge renders
them and answers ``Verdicts`` (scores, unparsed flags, its seconds: ``perf/judge_s``). Calls of several explorers are
answered one at a time, each batch in one piece, so a verdict does not depend on which explorer asked or when.
``judged(task, config, student_path)`` without a judge builds one in this process (a standalone explorer).

Not here: multi-turn tasks (their environments reward), judging evaluation (``eval/*`` stays the task's rule),
sampling the judge at a temperature.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import torch

from oprl.errors import OprlError
from oprl.messages import JudgeRow, Verdicts
from oprl.tasks.base import EpisodicTask, Problem, Reward, Task
from oprl.worker_parts import load_frozen

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

    def judge(self, rows: Sequence[JudgeRow]) -> Verdicts:
        """The ``Verdicts`` of (prompt, completion, reference) rows, rendered into ``judge.template``: s per row
        (0 where unparsed), the unparsed flags, and the seconds it took."""
        start = time.perf_counter()
        found = self.verdicts([render(self.settings.template, *row) for row in rows])
        scores = [0.0 if v is None else v for v in found]
        return Verdicts(scores, [v is None for v in found], time.perf_counter() - start)

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


class JudgeSource(Protocol):
    """Where ``JudgedTask`` gets its verdicts: a ``Judge`` in this process, or the run's ``JudgeWorker`` through
    ``oprl.roles.JudgeClient``."""

    def judge(self, rows: list[JudgeRow]) -> Verdicts: ...


class JudgedTask:
    """``task`` with the judge's score added to its reward (module docstring); problems are the task's.
    ``settings`` (``judge.name``, ``judge.weight``): the judge's own when it is a ``Judge``."""

    def __init__(self, task: Task, judge: JudgeSource, settings: JudgeConfig | None = None):
        if isinstance(task, EpisodicTask):
            raise OprlError(
                f"judge.path: task {task.name!r} is multi-turn (its environment rewards); a judge scores single replies"
            )
        if settings is None:
            assert isinstance(judge, Judge), "a judge of another process comes with its settings"
            settings = judge.settings
        self.task, self.judge, self.settings = task, judge, settings
        self.name = task.name
        self.judge_s = 0.0
        """Seconds the judge computed the verdicts of the last ``score`` call (``perf/judge_s``)."""
        self._warned = False

    def problems(self, split: str) -> Sequence[Problem]:
        return self.task.problems(split)

    def score(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[Reward]:
        rules = self.task.score(problems, responses)
        settings = self.settings
        verdicts = self.judge.judge(
            [(prompt_text(p), r, p.answer) for p, r in zip(problems, responses, strict=True)]
        )  # the whole batch in one call
        self.judge_s = verdicts.seconds
        self._warn_unparsed(problems, verdicts.unparsed)
        out = []
        for rule, score, unparsed in zip(rules, verdicts.scores, verdicts.unparsed, strict=True):
            if settings.name in rule.components or f"{settings.name}_unparsed" in rule.components:
                raise OprlError(f"judge.name: the task already has a reward component {settings.name!r}; rename it")
            components = {**rule.components, settings.name: score, f"{settings.name}_unparsed": float(unparsed)}
            out.append(Reward(total=rule.total + settings.weight * score, components=components))
        return out

    def _warn_unparsed(self, problems: Sequence[Problem], unparsed: list[bool]) -> None:
        """One warning line the first time a batch has unparsed verdicts (each scores 0 and is counted)."""
        missing = [p.task_id for p, flag in zip(problems, unparsed, strict=True) if flag]
        if missing and not self._warned:
            self._warned = True
            log.warning(
                "judge.parser: %d of %d verdicts of a batch had no number (each scores 0, counted in "
                "reward/%s_unparsed; said once); e.g. %s",
                len(missing),
                len(unparsed),
                self.settings.name,
                missing[0],
            )

    def __getattr__(self, name: str):  # the task's other attributes (demonstrations, tools, ...) stay reachable
        if name == "task":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.task, name)


def judged(task: Task, config: RunConfig, student_path: str, judge: JudgeSource | None = None) -> Task:
    """``task`` itself without ``judge.path``, else ``JudgedTask(task, judge)``: the run's judge when given,
    else one built here (``build_judge``)."""
    if config.judge.path is None:
        return task
    return JudgedTask(task, judge or build_judge(config, student_path), config.judge)
