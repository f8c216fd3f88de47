"""Task plug-ins, registered once in ``TASKS``: ``task.name`` -> the task class.

Each task class names its configuration section (``Config``, a ``oprl.tasks.section.TaskSection`` declared in the
task's module, whose ``name`` field is ``Literal[<its key>]``) and is built from it:
``TASKS[section.name](section)``. The ``task`` field of the run's configuration (``TaskConfig``, a union tagged
by ``name``) is derived from this dict, so adding a task is: write its section and class in one module, add one
entry here. A task outside oprl needs no entry: ``task.name``
may also be an installed entry point (group ``oprl.tasks``) or an import path (``my_pkg.tasks:MyTask``,
``path/to/file.py:MyTask``), resolved by ``oprl.plugins`` (docs/tasks.md#plug-ins).
"""

from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import BaseModel, Discriminator, SerializeAsAny, Tag, ValidationError, WrapValidator

from oprl import plugins
from oprl.errors import OprlError
from oprl.tasks.agent import AgentTask
from oprl.tasks.arithmetic import ArithmeticTask
from oprl.tasks.base import Problem, Reward, Task
from oprl.tasks.bfcl.multi_turn import BfclMultiTurnTask
from oprl.tasks.bfcl.single_turn import BfclTask
from oprl.tasks.data.dataset import DatasetTask
from oprl.tasks.gsm8k import GSM8kTask
from oprl.tasks.math_problems import MathTask
from oprl.tasks.reasoning_gym import ReasoningGymTask
from oprl.tasks.tool_arithmetic import ToolArithmeticTask

TASKS: dict[str, Any] = {
    "arithmetic": ArithmeticTask,
    "gsm8k": GSM8kTask,
    "math": MathTask,
    "dataset": DatasetTask,
    "bfcl": BfclTask,
    "bfcl-multi-turn": BfclMultiTurnTask,
    "tool-arithmetic": ToolArithmeticTask,
    "agent": AgentTask,
    "reasoning-gym": ReasoningGymTask,
}
"""Every task plug-in by its ``task.name``; ``TASKS[name].Config`` is its configuration section."""

DEFAULT_TASK = "arithmetic"


def task_class(name: str) -> Any:
    """The task class ``name`` names: a key of ``TASKS``, an entry point of ``oprl.tasks``, or an import path
    (``oprl.plugins.resolve``); a plug-in must carry its section as ``Config`` (a pydantic model)."""
    found = plugins.resolve("task", name, TASKS, key="task.name")
    config = getattr(found, "Config", None)
    if not isinstance(found, type) or not (isinstance(config, type) and issubclass(config, BaseModel)):
        raise OprlError(
            f"task.name: {name!r} is not a task class with a Config section (a pydantic model, e.g. an "
            "oprl.tasks.section.TaskSection subclass)"
        )
    return found


def build_task(section: Any) -> Task:
    """The task named by ``section.name``, built from that section. A task made of another task (``nested``: the
    name of the field holding that task's section, e.g. the agent task's ``problems``) gets it built here first,
    as ``inner``: the registry builds both, so no task module imports the registry."""
    cls = task_class(section.name)
    nested = getattr(cls, "nested", None)
    if nested is None:
        return cls(section)
    return cls(section, inner=_nested_task(getattr(section, nested), f"task.{nested}"))


def _nested_task(section: dict, key: str) -> Task:
    """The task of a nested section (a dict; tool-arithmetic when it names none), errors naming ``key``."""
    from pydantic import TypeAdapter

    if section.get("name", "tool-arithmetic") == "agent":
        raise OprlError(f"{key}.name: an agent task's problems come from another task, not 'agent'")
    try:
        config = TypeAdapter(TaskConfig).validate_python({"name": "tool-arithmetic", **section})
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"][1:])
        raise OprlError(f"{key}.{where}: {error['msg']} (got {str(error.get('input'))[:200]!r})") from None
    return build_task(config)


def plugin_section(name: str, value: Any) -> Any:
    """The section of the plug-in task ``name`` validated from ``value`` (a dict, or its section itself), with
    ``name`` set to the plug-in's name as given: the run's config.yaml records it, so a resume finds it again."""
    cls = task_class(name)
    if isinstance(value, cls.Config):
        section = value
    else:
        fields = {k: v for k, v in dict(value).items() if k != "name"}
        try:
            section = cls.Config(**fields)
        except ValidationError as exc:
            error = exc.errors()[0]
            key = ".".join(str(part) for part in error["loc"])
            raise OprlError(f"task.{key}: {error['msg']} (got {error.get('input')!r}; task {name})") from None
    if getattr(section, "name", None) == name:
        return section
    return section.model_copy(update={"name": name})  # a Literal name field holds the plug-in's spec


def _plugin_or_builtin(value: Any, handler: Any) -> Any:
    """Built-in task names go through the tagged union; any other ``name`` is a plug-in's section."""
    name = _task_tag(value)
    if name in TASKS:
        return handler(value)
    return plugin_section(name, value)


def _task_tag(value: Any) -> str:
    """Which task section a raw value is: its ``name``, the default task when absent."""
    if isinstance(value, dict):
        return str(value.get("name", DEFAULT_TASK))
    return str(getattr(value, "name", DEFAULT_TASK))


if TYPE_CHECKING:  # a union built from TASKS at run time is beyond a static checker: any section
    TaskConfig = Any
else:  # Union[...] of a tuple: the `|` form cannot be built from a sequence
    _SECTIONS = tuple(Annotated[task.Config, Tag(name)] for name, task in TASKS.items())
    _BUILTIN = Annotated[Union[_SECTIONS], Discriminator(_task_tag)]  # noqa: UP007
    TaskConfig = Annotated[SerializeAsAny[_BUILTIN], WrapValidator(_plugin_or_builtin)]
"""The ``task`` configuration section: one of the ``TASKS[name].Config``, chosen by ``task.name``."""

__all__ = [
    "TASKS",
    "ArithmeticTask",
    "DatasetTask",
    "GSM8kTask",
    "MathTask",
    "Problem",
    "Reward",
    "Task",
    "TaskConfig",
    "build_task",
    "task_class",
]
