"""BFCL multi-turn: conversations in which the model works simulated APIs over several user turns, rewarded by
state checks (Patil et al., ICML 2025; data from the ``bfcl-eval`` wheel, like ``oprl.tasks.bfcl.single_turn``).

Problems are the rows of the chosen subsets whose APIs oprl simulates (``oprl.tasks.bfcl.apis``: the file
system and the math API; 25 of the 200 ``multi_turn_base`` rows), split train/test by ``task.seed``. An
episode (``BfclEnvironment``):

- the prompt is a system message (how to call, ``oprl.tasks.bfcl.single_turn.PLAIN_PROMPT``), the tools (the APIs'
  function documents minus the row's ``excluded_function``), and the first user turn;
- a model turn with ``<tool_call>{json}</tool_call>`` blocks runs each call on the simulators and answers with
  one ``tool`` message per call (the result as JSON); a malformed block is answered with an error message;
- a model turn without a call ends the user turn: the next user message follows, or the episode ends.

Reward (BFCL's two checks, with the ground truth's calls executed on fresh simulators of the same initial
state): ``correct`` = 1 when the final API state equals the ground truth's (state check) and, in every user
turn, each result of the ground truth's calls is among the results of the model's calls of that turn
(response check); ``format`` = every tool-call block of the episode parsed. The total is ``correct``.
"""

from __future__ import annotations

import ast
import json
from collections import Counter
from collections.abc import Sequence
from typing import Literal

from pydantic import Field, field_validator

from oprl.errors import OprlError
from oprl.tasks.base import Problem, Reward, Step
from oprl.tasks.bfcl.apis import APIS, execute, functions_of
from oprl.tasks.bfcl.single_turn import (
    PLAIN_PROMPT,
    answered_rows,
    data_file,
    read_lines,
    split_rows,
    tool_schema,
    with_system,
)
from oprl.tasks.bfcl.toolcall import CLOSE, OPEN, parse_calls
from oprl.tasks.section import ToolTaskSection, task_section

DOCS = {"GorillaFileSystem": "gorilla_file_system.json", "MathAPI": "math_api.json"}


def parse_call(text: str, docs: dict[str, dict]) -> tuple[str, dict]:
    """A ground-truth call string (``cd(folder='document')``, ``sort('final_report.pdf')``) as ``(name,
    keyword arguments)``; positional arguments take the documented parameter order. Literals only."""
    node = ast.parse(text, mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a call: {text!r}")
    name = node.func.id
    order = list(docs[name]["parameters"]["properties"])
    arguments = {order[i]: ast.literal_eval(arg) for i, arg in enumerate(node.args)}
    arguments |= {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
    return name, arguments


class Simulators:
    """The simulated APIs of one episode, built from a row's ``initial_config``."""

    def __init__(self, classes: Sequence[str], initial_config: dict):
        self.apis = [APIS[c](initial_config.get(c, {})) for c in classes]
        self.functions = {n: f for api in self.apis for n, f in functions_of(api).items()}

    def call(self, name: str, arguments: dict) -> str:
        return json.dumps(execute(self.functions, name, arguments), sort_keys=True)

    def state(self) -> list:
        return [api.state() for api in self.apis]


class BfclEnvironment:
    """One episode of a BFCL multi-turn problem (the module docstring has the protocol)."""

    def __init__(self, problem: Problem, row: dict, docs: dict[str, dict]):
        self.problem, self.row, self.docs = problem, row, docs

    def reset(self, problem: Problem) -> tuple[dict, ...]:
        self.simulators = Simulators(self.row["involved_classes"], self.row["initial_config"])
        self.turn, self.malformed = 0, 0
        self.results: list[list[str]] = [[]]  # per user turn, the results of the model's calls
        return problem.messages

    def step(self, reply: str) -> Step:
        if OPEN in reply or CLOSE in reply:
            calls = parse_calls(reply)
            if calls is None:
                self.malformed += 1
                error = (
                    'error: malformed <tool_call> block; write <tool_call>{"name": ..., "arguments": {...}}</tool_call>'
                )
                return Step(observation=({"role": "tool", "content": error},))
            results = [self.simulators.call(c["name"], c["arguments"]) for c in calls]
            self.results[-1] += results
            return Step(observation=tuple({"role": "tool", "content": r} for r in results))
        self.turn += 1
        questions = self.row["question"]
        if self.turn < len(questions):
            self.results.append([])
            return Step(observation=tuple(questions[self.turn]))
        return Step(done=True, reward=self.reward())

    def reward(self) -> Reward:
        expected = Simulators(self.row["involved_classes"], self.row["initial_config"])
        responses_ok = True
        for calls, got in zip(self.row["ground_truth"], self.results, strict=True):
            wanted = Counter(expected.call(*parse_call(c, self.docs)) for c in calls)
            responses_ok &= not (wanted - Counter(got))  # every expected result appears in this turn's results
        correct = float(responses_ok and expected.state() == self.simulators.state())
        return Reward(
            total=correct,
            components={
                "correct": correct,
                "format": float(self.malformed == 0),
                "tool_calls": float(sum(len(r) for r in self.results)),
            },
        )


BFCL_MULTI_TURN_SUBSETS = ("multi_turn_base", "multi_turn_long_context")
"""The BFCL multi-turn subsets oprl can simulate (rows on the file system and math APIs only)."""


class BfclMultiTurnTaskConfig(ToolTaskSection):
    """BFCL multi-turn (data from the ``bfcl-eval`` wheel) on oprl's simulated file system and math API: the
    model calls tools over several user turns; reward 1 when the final API state and every turn's call results
    match the ground truth's (oprl.tasks.bfcl.multi_turn). Set rollout.max_turns (about 20) and
    rollout.max_episode_tokens (a few thousand) to fit its conversations."""

    name: Literal["bfcl-multi-turn"] = "bfcl-multi-turn"
    subsets: list[str] = Field(default_factory=lambda: ["multi_turn_base"])
    """BFCL multi-turn subsets: multi_turn_base, multi_turn_long_context (the rows on simulated APIs)."""
    system_prompt: str | None = None
    """System message of every prompt (None = oprl.tasks.bfcl.single_turn's PLAIN_PROMPT)."""

    @field_validator("subsets")
    @classmethod
    def _subsets(cls, value: list[str]) -> list[str]:
        return cls._check_subsets(value, BFCL_MULTI_TURN_SUBSETS)


class BfclMultiTurnTask:
    """BFCL multi-turn problems on simulated APIs, built from a ``BfclMultiTurnTaskConfig`` (or its fields)."""

    Config = BfclMultiTurnTaskConfig

    def __init__(self, config: BfclMultiTurnTaskConfig | None = None, **fields) -> None:
        self.config = c = task_section(BfclMultiTurnTaskConfig, config, fields)
        self.name = c.name
        self.docs = {}
        for cls, file in DOCS.items():
            for doc in read_lines(data_file(f"multi_turn_func_doc/{file}")):
                self.docs[doc["name"]] = doc | {"class": cls}
        rows = [
            row | {"ground_truth": truth}
            for subset in c.subsets
            for row, truth in answered_rows(subset)
            if set(row["involved_classes"]) <= set(DOCS)
        ]
        chosen = split_rows(
            rows, seed=c.seed, test_fraction=c.test_fraction, train_size=c.train_size, test_size=c.test_size
        )
        self._rows: dict[str, dict] = {}
        self._splits = {split: [self._problem(row) for row in chosen[split]] for split in ("train", "test")}

    def _problem(self, row: dict) -> Problem:
        excluded = set(row.get("excluded_function", []))
        tools = tuple(
            tool_schema({k: v for k, v in doc.items() if k != "class"})
            for doc in self.docs.values()
            if doc["class"] in row["involved_classes"] and doc["name"] not in excluded
        )
        problem = Problem(
            task_id=f"{self.name}/{row['id']}",
            messages=with_system(self.config.system_prompt or PLAIN_PROMPT, list(row["question"][0])),
            answer=json.dumps(row["ground_truth"]),
            tools=tools,
        )
        self._rows[problem.task_id] = row
        return problem

    def problems(self, split: str) -> Sequence[Problem]:
        if split not in self._splits:
            raise OprlError(f"task {self.name}: unknown split {split!r}; valid: {sorted(self._splits)}")
        return self._splits[split]

    def environment(self, problem: Problem) -> BfclEnvironment:
        return BfclEnvironment(problem, self._rows[problem.task_id], self.docs)

    def demonstration(self, problem: Problem) -> list[str]:
        """The ground truth as model turns: each user turn's calls in one turn, then a short closing reply."""
        turns = []
        for calls in json.loads(problem.answer):
            if calls:
                parsed = [parse_call(c, self.docs) for c in calls]
                turns.append("".join(f"{OPEN}{json.dumps({'name': n, 'arguments': a})}{CLOSE}" for n, a in parsed))
            turns.append("Done.")
        return turns

    def score(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[Reward]:
        """Single replies cannot be scored without running the episode; they score 0."""
        return [Reward(total=0.0, components={"correct": 0.0}) for _ in responses]
