"""``task.name=reasoning-gym``: reasoning-gym's procedurally generated problems, scored by their own scorers.

reasoning-gym (``pip install 'oprl[reasoning-gym]'``, offline) has 100+ generators, each a seeded sequence of
``{"question", "answer", "metadata"}`` items with a ``score_answer(answer, entry)`` in [0, 1]. ``task.datasets``
mixes several, each with its sizes, seed and settings (``ReasoningGymDataset`` below): item
``i < train_size`` of a generator is a training problem, the next ``test_size`` items are its test split.

Scoring runs in ``RewardPool`` processes (``oprl.tasks.rewards.processes``) under a hard per-answer timeout, like every
reward that parses model output: the reward process rebuilds the generator from its settings (cached), takes the item
by index, extracts the answer (``<answer>`` tags with reasoning-gym's ``extract_answer``, or the whole reply)
and calls that generator's ``score_answer``. A timeout or a reward process's error scores 0 and is counted
(``verdicts``). Reward: the score; components ``correct`` (score 1) and ``format`` (an answer was found).

Run one reward process by hand: ``python -m oprl.tasks.reasoning_gym`` reads requests on its private channel only,
so test it through ``ReasoningGymTask(...).score``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, field_validator

from oprl.errors import OprlError
from oprl.tasks.base import Problem, Reward
from oprl.tasks.rewards.processes import RewardPool, fatal, serve, start_reward_process
from oprl.tasks.section import Section, TaskSection, task_section

INSTALL_HINT = "pip install 'oprl[reasoning-gym]'"
MAX_RESPONSE_CHARS = 20_000
"""Replies are cut here before they reach a scorer (no generator needs more)."""
PROCESS_MEMORY_MB = 2048


class ReasoningGymDataset(Section):
    """One reasoning-gym generator in ``task.datasets``: its name, sizes, seed and its own settings."""

    name: str
    """The generator (``reasoning_gym.create_dataset(name)``): basic_arithmetic, chain_sum, gsm_symbolic, ..."""
    train_size: int = Field(500, gt=0)
    """Training problems drawn from it."""
    test_size: int = Field(100, gt=0)
    """Held-out problems (items after the training ones in the same seeded sequence)."""
    seed: int = 1234
    """Seed of the generator; fixes both splits."""
    config: dict[str, Any] = Field(default_factory=dict)
    """The generator's own settings (e.g. ``{min_terms: 2, max_digits: 1}`` for basic_arithmetic)."""


class ReasoningGymTaskConfig(TaskSection):
    """Procedurally generated reasoning problems from reasoning-gym (100+ generators, offline), scored by each
    generator's own ``score_answer`` in timed reward processes (``pip install 'oprl[reasoning-gym]'``)."""

    name: Literal["reasoning-gym"] = "reasoning-gym"
    datasets: list[ReasoningGymDataset] = Field(
        default_factory=lambda: [ReasoningGymDataset(name="basic_arithmetic")], min_length=1
    )
    """The generators, mixed: a name (``[basic_arithmetic, chain_sum]``: default sizes and seed) or a section
    each (``[{name: chain_sum, train_size: 200, seed: 3, config: {max_terms: 3}}]``)."""
    system_prompt: str = "default"
    """The system message: a name from ``reasoning_gym.utils.SYSTEM_PROMPTS`` (``default`` asks for the answer in
    ``<answer>...</answer>``), any other text verbatim, or "" for none."""
    answer_format: Literal["tag", "plain"] = "tag"
    """Where the answer is: ``tag`` = inside ``<answer>...</answer>`` (reasoning-gym's ``extract_answer``),
    ``plain`` = the whole reply (the tiny model's format)."""
    verify_workers: int = Field(1, gt=0)
    """Scoring processes."""
    verify_timeout: float = Field(5.0, gt=0.0)
    """Seconds one answer may take to score; past it the worker is killed and the answer scores 0."""

    @field_validator("datasets", mode="before")
    @classmethod
    def _names_are_datasets(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [v.strip() for v in value.strip("[]").split(",") if v.strip()]
        if isinstance(value, list):
            return [{"name": v} if isinstance(v, str) else v for v in value]
        return value


class ReasoningGymTask:
    """The problems of ``task.datasets`` (see the module docstring), built from a ``ReasoningGymTaskConfig``."""

    Config = ReasoningGymTaskConfig

    def __init__(self, config: ReasoningGymTaskConfig | None = None, **fields) -> None:
        self.config = c = task_section(ReasoningGymTaskConfig, config, fields)
        self.name = c.name
        if importlib.util.find_spec("reasoning_gym") is None:
            raise OprlError(f"task.name=reasoning-gym needs reasoning-gym: {INSTALL_HINT}")
        self._splits: dict[str, list[Problem]] = {"train": [], "test": []}
        self._items: dict[str, tuple[str, int]] = {}
        """task_id -> (the generator's settings as JSON, item index): what a reward process needs to score it."""
        system = _system_prompt(c.system_prompt)
        for d in c.datasets:
            spec = json.dumps({"name": d.name, "seed": d.seed, "size": d.train_size + d.test_size, "config": d.config})
            dataset = _dataset(spec)
            for index in range(d.train_size + d.test_size):
                split = "train" if index < d.train_size else "test"
                item = dataset[index]
                system_message = ({"role": "system", "content": system},) if system else ()
                messages = (*system_message, {"role": "user", "content": item["question"]})
                task_id = f"{self.name}/{d.name}/{d.seed}/{split}/{index:06d}"
                self._splits[split].append(Problem(task_id=task_id, messages=messages, answer=str(item["answer"])))
                self._items[task_id] = (spec, index)
        self.verdicts = {"scored": 0, "timeout": 0, "error": 0}
        self._pool: RewardPool | None = None

    def problems(self, split: str) -> Sequence[Problem]:
        if split not in self._splits:
            raise OprlError(f"task {self.name}: unknown split {split!r}; valid: {sorted(self._splits)}")
        return self._splits[split]

    def score(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[Reward]:
        """Each generator's ``score_answer`` on the extracted answers, in the reward pool (module docstring)."""
        if self._pool is None:
            c = self.config
            self._pool = RewardPool(
                ["oprl.tasks.reasoning_gym"],
                c.verify_workers,
                c.verify_timeout,
                what="reasoning-gym scorer",
                memory_mb=PROCESS_MEMORY_MB,
            )
        requests = [
            {
                "dataset": self._items[p.task_id][0],
                "index": self._items[p.task_id][1],
                "response": r[:MAX_RESPONSE_CHARS],
                "format": self.config.answer_format,
            }
            for p, r in zip(problems, responses, strict=True)
        ]
        rewards = []
        for reply in self._pool.run(requests):
            if "score" in reply:
                self.verdicts["scored"] += 1
                score, found = float(reply["score"]), float(reply["found"])
            else:
                self.verdicts["timeout" if reply.get("verdict") == "timeout" else "error"] += 1
                score, found = 0.0, 0.0
            rewards.append(Reward(total=score, components={"correct": float(score >= 1.0), "format": found}))
        return rewards


def _system_prompt(setting: str) -> str:
    from reasoning_gym.utils import SYSTEM_PROMPTS

    return SYSTEM_PROMPTS.get(setting, setting)


_DATASETS: dict[str, Any] = {}


def _dataset(spec: str):
    """The generator of ``spec`` (JSON: name, seed, size, config), built once per process."""
    if spec not in _DATASETS:
        import reasoning_gym

        s = json.loads(spec)
        try:
            _DATASETS[spec] = reasoning_gym.create_dataset(s["name"], seed=s["seed"], size=s["size"], **s["config"])
        except Exception as exc:  # an unknown name or setting: one line naming it
            raise OprlError(f"task.datasets: reasoning-gym cannot build {s['name']!r}: {exc}") from None
    return _DATASETS[spec]


# ---------------------------------------------------------------- the reward process's side


def _score_request(request: dict) -> dict:
    from reasoning_gym.utils import extract_answer

    dataset = _dataset(request["dataset"])
    entry = dataset[int(request["index"])]
    response = str(request["response"])
    answer = extract_answer(response) if request.get("format") == "tag" else response.strip()
    score = 0.0 if answer is None else float(dataset.score_answer(answer, entry))
    return {"score": score, "found": answer is not None}


def _process_main() -> None:
    memory_mb = start_reward_process()
    try:
        import reasoning_gym  # noqa: F401
    except ImportError as exc:
        return fatal(f"reasoning-gym is not installed ({exc}): {INSTALL_HINT}")
    serve(_score_request, memory_mb=memory_mb)


if __name__ == "__main__":
    _process_main(*sys.argv[1:])
