"""The base configuration sections: ``Section`` (every section of the run's configuration, task or not),
``TaskSection`` (every task's) and the bases holding the fields that several tasks share.

Each task carries its own section as ``Config``, declared in the task's module next to the class (a module-level
``<Name>TaskConfig(TaskSection)`` and ``Config = <Name>TaskConfig`` in the class), built-in and plug-in tasks
alike (docs/tasks.md#adding-a-task-or-an-environment). This module holds only what more than one section
shares, each shared field declared once with its docstring; it stays apart from the Task protocol
(``oprl.tasks.base``, which needs no pydantic) and ``oprl.tasks.section.Section`` is the import path plug-ins
use. ``oprl.tasks`` derives the ``task`` field of the run's configuration from ``TASKS``.
"""

from __future__ import annotations

import typing
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from oprl.errors import OprlError


class Section(BaseModel):
    """Base of every configuration section: unknown keys are errors, docstrings document fields, and
    assignments are validated. ``oprl.config`` builds all its sections on it too. Numbers are finite
    (``optim.lr=inf`` is refused here, not when the first step turns the weights to NaN) and a boolean is not a
    number (``steps=true`` would otherwise be 1 step). A field redeclared in a subclass only to change its type
    or default (``name: Literal["gsm8k"]``) keeps the docstring of the field it overrides, so each field's
    docstring is written once; a docstring under the redeclaration replaces it."""

    model_config = ConfigDict(
        extra="forbid", use_attribute_docstrings=True, validate_assignment=True, allow_inf_nan=False
    )

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        for name, field in cls.model_fields.items():
            if field.description is None:  # redeclared without a docstring: the overridden field's
                inherited = (getattr(base, "__pydantic_fields__", {}).get(name) for base in cls.__mro__[1:])
                field.description = next((f.description for f in inherited if f and f.description), None)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name is not None:
            annotation = cls.model_fields[info.field_name].annotation
            accepted = {annotation, *typing.get_args(annotation)}
            if bool not in accepted and accepted & {int, float}:
                raise ValueError("true/false is not a number here; give a number")
        return value


class TaskSection(Section):
    """Base of every task's section (``TASKS[name].Config``); each redeclares ``name`` as
    ``Literal["<its key>"]``, the tag that picks it in the ``task`` union."""

    name: str
    """Task plug-in: a key of ``oprl.tasks.TASKS`` (``oprl config --help`` lists them)."""


class ExpressionTaskSection(TaskSection):
    """Fields shared by the tasks that generate seeded integer expressions (arithmetic, tool-arithmetic); the
    defaults are arithmetic's."""

    train_size: int = Field(2500, gt=0)
    """Number of training problems."""
    test_size: int = Field(500, gt=0)
    """Number of held-out test problems (evaluation)."""
    max_value: int = Field(9, gt=0)
    """Largest operand: operands are drawn uniformly from 0 (tool-arithmetic: from min_value) to max_value."""
    num_operands: int = Field(3, ge=2)
    """Operands per expression."""
    operators: str = "+-"
    """Operators to draw from, a subset of '+-*'."""
    seed: int = 1234
    """Seed of problem generation; fixes both splits."""


class ReasoningTaskSection(TaskSection):
    """Fields shared by the tasks whose answers are checked by math-verify in reward processes (gsm8k,
    math)."""

    source: Literal["auto", "hub", "files", "synthetic"] = "auto"
    """Where problems come from: ``hub`` (``datasets.load_dataset(hub_id)``, needs the network or the HF
    cache), ``files`` (task.train_file / task.test_file, or task.path), ``auto`` = files when any of those is
    set, else hub."""
    hub_id: str = ""
    """Hugging Face dataset id for source=hub."""
    hub_config: str | None = None
    """Dataset configuration name for source=hub (None = the dataset's default)."""
    path: str | None = None
    """Directory holding the splits: the one file under it whose name starts with ``train`` (``test``) and
    ends in .jsonl, .json or .parquet, e.g. a downloaded hub snapshot (``main/train-00000-of-00001.parquet``)."""
    train_file: str | None = None
    """Training split file (.jsonl, .json list of objects, or .parquet); overrides task.path for train."""
    test_file: str | None = None
    """Test split file; overrides task.path for test."""
    train_size: int | None = Field(None, gt=0)
    """Use only the first train_size usable training rows (None = all). source=synthetic: problems to
    generate (None = 2000)."""
    test_size: int | None = Field(None, gt=0)
    """Use only the first test_size usable test rows (None = all). source=synthetic: problems to generate,
    disjoint from the training ones (None = 500)."""
    system_prompt: str | None = None
    """System message of every prompt (None = the task's default: gsm8k the DeepSeek-R1 prompt, or for
    reward=last-number a plain one; math none)."""
    verify_timeout: float = Field(5.0, gt=0.0)
    """Seconds one answer may take to check; past that its worker process is killed, the answer scores as
    wrong and ``reward/verify_timeout`` counts it."""
    verify_workers: int = Field(1, gt=0)
    """Answer-checking worker processes (each ~200 MB)."""


class ToolTaskSection(TaskSection):
    """Fields shared by the tool-calling tasks (bfcl, bfcl-multi-turn)."""

    train_size: int | None = Field(None, gt=0)
    """Use only the first train_size training problems of the split (None = all)."""
    test_size: int | None = Field(None, gt=0)
    """Use only the first test_size test problems (None = all)."""
    test_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    """Share of the chosen subsets' problems held out as the test split (after a shuffle by ``seed``)."""
    seed: int = 1234
    """Seed of the train/test split; a seed fixes both splits."""
    verify_timeout: float = Field(5.0, gt=0.0)
    """Seconds one response may take to check; past that its worker process is killed and it scores 0
    (``reward/verify_timeout``)."""
    verify_workers: int = Field(1, gt=0)
    """Call-checking worker processes (each ~30 MB)."""

    @staticmethod
    def _check_subsets(subsets: list[str], valid: tuple[str, ...]) -> list[str]:
        if not subsets:
            raise ValueError(f"empty; choose from {', '.join(valid)}")
        for subset in subsets:
            if subset not in valid:
                raise ValueError(f"{subset!r} is not a subset of this task; valid: {', '.join(valid)}")
        return subsets


S = TypeVar("S", bound=Section)


def task_section(section: type[S], config: S | None, fields: dict[str, Any]) -> S:
    """A task's section: ``config`` itself, or one validated from keyword ``fields`` (``ArithmeticTask(seed=3)``);
    an invalid field is one ``OprlError`` line naming ``task.<key>``."""
    if config is not None:
        if fields:
            raise TypeError(f"pass either a {section.__name__} or keyword fields, not both")
        return config
    try:
        return section(**fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        key = ".".join(str(part) for part in error["loc"])
        raise OprlError(f"task.{key}: {error['msg']} (got {error.get('input')!r})") from None
