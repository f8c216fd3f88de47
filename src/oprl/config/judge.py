"""The ``judge`` section: a model that scores the replies (a generative reward model, ``oprl.episodes.judge``).

A top-level section like ``teacher``, not a field of every task section: it is a second model of the run (its
path, dtype, batch size and GPUs are the teacher's settings; one judge per run, placed like the teacher), it
works with any single-turn task, built-in or plug-in, and its score joins the task's rule reward as one more
named component.
"""

from __future__ import annotations

import string
from typing import Literal

from pydantic import Field, field_validator, model_validator

from oprl.tasks.section import Section as _Section

PLACEHOLDERS = ("prompt", "completion", "reference")
"""The fields ``judge.template`` may name: the problem's last user message, the reply, the reference answer."""


class JudgeConfig(_Section):
    """A model as the judge (docs/tasks.md#a-model-as-the-judge): every reply of a batch is rendered into
    ``template`` and scored by the judge model, in one batch per step, without sampling (deterministic); the
    score joins the task's reward as the component ``name`` with weight ``weight``."""

    path: str | None = None
    """The judge: anything ``teacher.path`` accepts (a run directory, a checkpoint, a model directory, ``tiny``
    = the student's own starting model, ``smollm2-135m-instruct``, a hub id). Any tokenizer: it reads text.
    None = no judge."""
    template: str = "Question: {prompt}\nAnswer: {completion}\nReference: {reference}\nCorrect (yes/no):"
    """The text the judge reads (verbatim, no chat template), with ``{prompt}``, ``{completion}`` and
    ``{reference}`` filled in; write ``{{`` and ``}}`` for literal braces."""
    parser: Literal["yes-no", "number", "regex"] = "yes-no"
    """How the verdict becomes a score: ``yes-no`` = log p(yes) - log p(no) of the judge's next token after the
    template (one prefill, never unparsable); ``number`` = the first number of the judge's greedy continuation
    (up to ``max_new_tokens``); ``regex`` = ``pattern``'s first group (or whole match) in that continuation,
    read as a number. A continuation without one scores 0 and is counted (``reward/<name>_unparsed``)."""
    pattern: str = r"(-?\d+(?:\.\d+)?)"
    """parser=regex: the regular expression (Python ``re``) searched in the judge's continuation."""
    yes_text: str = "yes"
    """parser=yes-no: the text whose first token is the "yes" verdict. ``judge.yes_text=yes`` is the text "yes"
    (config YAML reads only true/false as booleans, and a text field takes any value as text:
    ``oprl.config.loading``)."""
    no_text: str = "no"
    """parser=yes-no: the text whose first token is the "no" verdict (must start with another token than yes)."""
    max_new_tokens: int = Field(8, gt=0)
    """parser=number/regex: tokens the judge continues the template with (greedy: no randomness)."""
    name: str = Field("judge", min_length=1)
    """The component's name: logged as ``reward/<name>`` (the raw score), with ``reward/<name>_unparsed``."""
    weight: float = 1.0
    """The judge's score enters the reward as ``rule reward + weight * score``."""
    micro_batch_size: int = Field(64, gt=0)
    """Rows per judge forward; only trades memory for speed."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """The judge's parameter dtype."""
    gpus: float = Field(0.0, ge=0.0)
    """backend=ray: GPUs the judge actor requests (0 = CPU). It runs on model.device, one judge per run."""

    @field_validator("template")
    @classmethod
    def _known_placeholders(cls, value: str) -> str:
        try:
            fields = [name for _, name, _, _ in string.Formatter().parse(value) if name is not None]
        except ValueError as exc:
            raise ValueError(f"unreadable template ({exc}); write {{{{ and }}}} for literal braces") from None
        for name in fields:
            if name not in PLACEHOLDERS:
                raise ValueError(f"unknown placeholder {{{name}}}; use {{prompt}}, {{completion}}, {{reference}}")
        return value

    @field_validator("yes_text", "no_text", mode="before")
    @classmethod
    def _digits_are_text(cls, value: object) -> object:
        """``judge.yes_text=1`` on the command line is YAML's number 1: the verdict text "1"."""
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        import re

        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        return value

    @model_validator(mode="after")
    def _different_verdicts(self) -> JudgeConfig:
        if self.parser == "yes-no" and self.yes_text == self.no_text:
            raise ValueError(f"judge.yes_text and judge.no_text are both {self.yes_text!r}")
        return self
