"""One Config pattern for every task: each task's section sits beside its class, built on ``TaskSection``, and a
field shared along a section's bases is declared (and documented) once."""

import ast
import inspect
import textwrap

import pytest
from pydantic import BaseModel

from oprl.config import load_config
from oprl.tasks import TASKS
from oprl.tasks.section import ExpressionTaskSection, Section, TaskSection


def written_docs(cls: type) -> dict[str, str]:
    """The field docstrings written in ``cls``'s own body (``field: type = default`` then a string), by field."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    assert isinstance(body, ast.ClassDef)
    docs = {}
    for node, after in zip(body.body, body.body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def repeated_docs(section: type[Section]) -> list[str]:
    """Each field written twice with the same docstring along ``section``'s chain of bases (below ``Section``)."""
    chain = [base for base in reversed(section.__mro__) if issubclass(base, Section) and base is not Section]
    first: dict[tuple[str, str], str] = {}
    repeats = []
    for cls in chain:  # bases first
        for field, doc in written_docs(cls).items():
            if first.setdefault((field, doc), cls.__qualname__) != cls.__qualname__:
                repeats.append(f"{field!r} is written with its doc in {first[field, doc]} and {cls.__qualname__}")
    return repeats


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_carries_its_config_beside_its_class(name):
    task = TASKS[name]
    config = task.Config
    assert config.__module__ == task.__module__, f"{name}: {config.__qualname__} lives in {config.__module__}"
    assert issubclass(config, TaskSection), f"{name}: {config.__qualname__} is not a TaskSection"
    assert config.model_fields["name"].default == name  # the tag that picks it in the task union
    assert all(field.description for field in config.model_fields.values()), f"{name}: a field has no docstring"


@pytest.mark.parametrize("name", sorted(TASKS))
def test_no_field_is_declared_twice_with_the_same_doc(name):
    assert repeated_docs(TASKS[name].Config) == []


def test_a_redeclared_field_keeps_the_doc_it_overrides_unless_it_writes_its_own():
    class Base(Section):
        size: int = 3
        """How many."""
        kind: str = "a"
        """Which kind."""

    class Child(Base):
        size: int = 5  # a new default only
        kind: str = "b"
        """Which kind, here b."""

    assert Child.model_fields["size"].description == "How many."
    assert Child.model_fields["kind"].description == "Which kind, here b."
    assert Base.model_fields["kind"].description == "Which kind."  # the base's own field is untouched
    assert Child().size == 5


def test_the_duplication_check_sees_a_repeated_doc():
    class Base(Section):
        size: int = 3
        """How many."""

    class Child(Base):
        size: int = 5
        """How many."""

    assert written_docs(Base) == written_docs(Child) == {"size": "How many."}
    assert repeated_docs(Child) == [f"'size' is written with its doc in {Base.__qualname__} and {Child.__qualname__}"]


def test_arithmetic_fields_are_shared_once_with_each_tasks_defaults():
    arithmetic, tool = TASKS["arithmetic"].Config, TASKS["tool-arithmetic"].Config
    shared = set(ExpressionTaskSection.model_fields) - {"name"}
    assert shared == {"train_size", "test_size", "max_value", "num_operands", "operators", "seed"}
    assert issubclass(arithmetic, ExpressionTaskSection) and issubclass(tool, ExpressionTaskSection)
    for field in shared:
        assert arithmetic.model_fields[field].description == tool.model_fields[field].description
    assert (arithmetic().max_value, arithmetic().num_operands, arithmetic().operators) == (9, 3, "+-")
    assert (tool().max_value, tool().num_operands, tool().operators, tool().min_value) == (99, 2, "+-*", 10)
    with pytest.raises(ValueError, match="max_value"):  # the redeclared field kept its bound
        tool(max_value=0)


def test_the_task_union_still_picks_each_section():
    for name, task in TASKS.items():
        section = load_config(overrides=[f"task.name={name}"]).task
        assert type(section) is task.Config
        assert isinstance(section, BaseModel) and section.name == name
