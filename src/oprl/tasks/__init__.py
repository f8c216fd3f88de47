"""Task plug-ins: each maps a name (the ``task.name`` config value) to a factory returning a ``Task``."""

from oprl.tasks.arithmetic import ArithmeticTask
from oprl.tasks.base import Problem, Reward, Task
from oprl.tasks.gsm8k import GSM8kTask
from oprl.tasks.math_problems import MathTask

TASKS = {
    "arithmetic": ArithmeticTask,
    "gsm8k": GSM8kTask,
    "math": MathTask,
}


def build_task(task_config) -> Task:
    """The task named by ``task_config.name``, built from the other fields of that config section."""
    fields = task_config.model_dump()
    return TASKS[fields.pop("name")](**fields)


__all__ = ["TASKS", "build_task", "ArithmeticTask", "GSM8kTask", "MathTask", "Problem", "Reward", "Task"]
