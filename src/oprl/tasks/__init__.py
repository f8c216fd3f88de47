"""Task plug-ins: each maps a name (the ``task.name`` config value) to a factory returning a ``Task``."""

from oprl.tasks.arithmetic import ArithmeticTask
from oprl.tasks.base import Problem, Reward, Task

TASKS = {
    "arithmetic": ArithmeticTask,
}

__all__ = ["TASKS", "ArithmeticTask", "Problem", "Reward", "Task"]
