"""Task plug-ins, registered once in ``TASKS``: ``task.name`` -> the task class.

Each task class names its configuration section (``Config``, a ``oprl.tasks.config.Section`` whose ``name``
field is ``Literal[<its key>]``) and is built from it: ``TASKS[section.name](section)``. The ``task`` field
of the run's configuration (``TaskConfig``, a union tagged by ``name``) is derived from this dict, so adding
a task is: write its section and class, add one entry here.
"""

from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import Discriminator, Tag

from oprl.tasks.agent import AgentTask
from oprl.tasks.arithmetic import ArithmeticTask
from oprl.tasks.base import Problem, Reward, Task
from oprl.tasks.bfcl import BfclTask
from oprl.tasks.bfcl_multi_turn import BfclMultiTurnTask
from oprl.tasks.dataset import DatasetTask
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


def build_task(section: Any) -> Task:
    """The task named by ``section.name``, built from that section."""
    return TASKS[section.name](section)


def _task_tag(value: Any) -> str:
    """Which task section a raw value is: its ``name``, the default task when absent."""
    if isinstance(value, dict):
        return str(value.get("name", DEFAULT_TASK))
    return str(getattr(value, "name", DEFAULT_TASK))


if TYPE_CHECKING:  # a union built from TASKS at run time is beyond a static checker: any section
    TaskConfig = Any
else:  # Union[...] of a tuple: the `|` form cannot be built from a sequence
    _SECTIONS = tuple(Annotated[task.Config, Tag(name)] for name, task in TASKS.items())
    TaskConfig = Annotated[Union[_SECTIONS], Discriminator(_task_tag)]  # noqa: UP007
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
]
