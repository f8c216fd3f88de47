"""``task.name=agent``: the user's own agent, an OpenAI-client loop, as a multi-turn task.

The task is the problems of another task (``task.problems``, tool-arithmetic by default) plus the user's
``rollout(client, problem)`` function, loaded from ``task.agent``. The explorer runs the agent against its
OpenAI-compatible endpoint (``oprl.episodes.agents``, ``oprl.episodes.endpoint.server``) and stores the tokens the
engine sampled; the agent's return value is the reward. This module only loads the agent and the problems:
it knows nothing of HTTP, sessions or engines.

To the runtime the task is episodic (``EpisodicTask``): ``environment`` and ``demonstration`` are the wrapped
task's when it is episodic itself (the supervised warm start replays its demonstrations), and
``oprl.episodes.agents.task_episodes`` hands agent tasks to the endpoint instead of an environment loop.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any, Literal

from pydantic import Field

from oprl.errors import OprlError
from oprl.tasks.base import Problem, Reward, Task
from oprl.tasks.rewards.user import reward_value
from oprl.tasks.section import TaskSection, task_section


class AgentTaskConfig(TaskSection):
    """Bring your own agent: ``rollout(client, problem)`` written against an OpenAI client, run by the explorer
    against its endpoint (oprl.episodes.agents; docs/tasks.md#bring-your-own-agent)."""

    name: Literal["agent"] = "agent"
    agent: str = ""
    """The agent: ``path/to/file.py:function`` or ``package.module:function``, a function
    ``rollout(client: openai.OpenAI, problem: dict) -> float | dict`` (an ``async def`` gets an
    ``openai.AsyncOpenAI``); a dict's ``reward`` entry is the total, its other numeric entries logged components,
    the rest kept with the episode (``agent_reward``)."""
    problems: dict[str, Any] = Field(default_factory=lambda: {"name": "tool-arithmetic"})
    """The task whose problems the agent gets (its ``task`` section: ``task.problems.name=arithmetic``,
    ``task.problems.train_size=600``); the agent is handed each as a dict (task_id, messages, answer, tools) and
    its own reward replaces the task's. Its demonstrations, if any, are the warm start's."""
    host: str = "127.0.0.1"
    """Address the endpoint listens on: loopback by default (agents run in the explorer's process)."""
    port: int = Field(0, ge=0, le=65535)
    """Port of the endpoint; 0 = a free port chosen by the system (one endpoint per explorer)."""
    batch_wait_s: float = Field(0.05, ge=0.0)
    """How long a request waits for the other running agents' requests before the engine is called without
    them. Once every running agent has a request waiting, the call goes at once."""
    max_request_bytes: int = Field(4 * 2**20, gt=0)
    """Largest request body the endpoint reads (bytes); a larger one is a 413 before it is read whole, which
    bounds the memory one request can take (a long conversation of a 32k-token model is ~150 KB)."""
    max_failed_batches: int = Field(5, ge=0)
    """Stop the run (one line) when every episode of this many batches in a row failed (the agent raised,
    timed out or returned no number); 0 = never. A batch in which all failed is one warning line."""


class AgentTask:
    """Problems of ``task.problems`` solved by the agent of ``task.agent`` (see the module docstring)."""

    Config = AgentTaskConfig

    loses_episodes = True
    """An agent's episode can be lost to the infrastructure (a connection error, a timeout, a 5xx): the explorer
    leaves it out of its group and counts it in ``episode/lost`` (tasks without this attribute lose none)."""

    nested = "problems"
    """The field holding another task's section: ``oprl.tasks.build_task`` builds that task and hands it over as
    ``inner`` (so this module never imports the registry that imports it)."""

    def __init__(self, config: AgentTaskConfig | None = None, *, inner: Task | None = None, **fields) -> None:
        self.config = c = task_section(AgentTaskConfig, config, fields)
        self.name = c.name
        if not c.agent:
            raise OprlError("task.agent: name the agent, e.g. task.agent=my_agent.py:rollout (docs/tasks.md)")
        if inner is None:
            raise OprlError("an agent task is built by oprl.tasks.build_task, which builds its task.problems")
        self.rollout = load_agent(c.agent)
        self.is_async = inspect.iscoroutinefunction(self.rollout)
        self.inner = inner
        self.endpoint = None
        """The explorer's endpoint serving this task's agents, started on first use (``oprl.episodes.agents``)."""

    def problems(self, split: str) -> Sequence[Problem]:
        return self.inner.problems(split)

    def score(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[Reward]:
        """The wrapped task's scoring of single replies (the runtime scores agent episodes by their return)."""
        return self.inner.score(problems, responses)

    def environment(self, problem: Problem):
        if not hasattr(self.inner, "environment"):
            raise OprlError(f"task.problems: task {self.inner.name} has no environment; agents need none")
        return self.inner.environment(problem)

    def demonstration(self, problem: Problem) -> list[str] | None:
        demonstration = getattr(self.inner, "demonstration", None)
        return demonstration(problem) if demonstration is not None and hasattr(self.inner, "environment") else None


def problem_dict(problem: Problem) -> dict:
    """What the agent is handed: the problem as plain JSON-like data (lists, not tuples)."""
    data = asdict(problem)
    data["messages"], data["tools"] = [dict(m) for m in problem.messages], [dict(t) for t in problem.tools]
    return data


def agent_reward(value) -> tuple[Reward, dict[str, Any]]:
    """The agent's return as a ``Reward`` and the episode's notes, checked as a dataset reward is
    (``oprl.tasks.rewards.user.reward_value``: anything with ``__float__`` but a bool, finite, within
    ±``MAX_ABS_REWARD``). A number is the total; a dict's ``reward`` is the total and every numeric entry a
    component; its other entries (text, bools, lists: ``{"reward": 1.0, "final_answer": "42"}``) are the notes,
    kept with the episode (``NOTE_CHARS`` characters each). Anything else, a non-finite or out-of-range number
    included, is the agent's error (``TypeError`` naming the value; the episode scores 0, counted as failed)."""
    if not isinstance(value, dict):
        total = _number(value, "")
        return Reward(total=total, components={"reward": total}), {}
    if "reward" not in value:
        raise TypeError(f"returned a dict without a 'reward' entry (keys: {sorted(map(str, value))[:8]})")
    components, notes = {}, {}
    for key, item in value.items():
        if key == "reward" or (not isinstance(item, bool) and hasattr(item, "__float__")):
            components[str(key)] = _number(item, f"{key!r}: ")
        else:
            notes[str(key)] = item if isinstance(item, bool | None) else str(item)[:NOTE_CHARS]
    return Reward(total=components["reward"], components=components), notes


NOTE_CHARS = 1000
"""Characters of a non-numeric entry of the agent's dict kept with the episode (a long final answer is cut)."""


def _number(value, where: str) -> float:
    """``value`` as a reward (``reward_value``'s rule), or one ``TypeError`` naming it."""
    try:
        number = reward_value(value)
    except (TypeError, ValueError, ArithmeticError, RuntimeError) as exc:  # float() of 10**400, of a 2-vector
        why = str(exc) if str(exc).startswith("returned") else f"returned {type(value).__name__}: {exc}"
        raise TypeError(f"{where}{why}") from None
    if not isinstance(number, float):  # a dict inside the dict
        raise TypeError(f"{where}returned a dict; need a float")
    return number


def load_agent(spec: str) -> Callable:
    """The function named by ``spec`` (``file.py:function`` or ``module:function``), or one OprlError line."""
    source, _, attribute = spec.rpartition(":")
    if not source or not attribute:
        raise OprlError(f"task.agent={spec!r}: expected path/to/file.py:function or package.module:function")
    try:
        if source.endswith(".py"):
            if not os.path.isfile(source):
                raise OprlError(f"task.agent: no file {source}")
            name = f"oprl_agent_{abs(hash(os.path.abspath(source)))}"
            module_spec = importlib.util.spec_from_file_location(name, source)
            assert module_spec is not None and module_spec.loader is not None
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module  # dataclasses and pickling look the module up by name
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(source)
    except OprlError:
        raise
    except Exception as exc:  # the user's module failed to import: one line naming it
        raise OprlError(f"task.agent: importing {source} failed: {type(exc).__name__}: {exc}") from None
    function = getattr(module, attribute, None)
    if not callable(function):
        raise OprlError(f"task.agent: {source} has no function {attribute!r}")
    return function
