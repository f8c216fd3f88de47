"""BFCL function calling (Berkeley Function Calling Leaderboard; Patil et al., ICML 2025) with the paper's
tool-call reward, on the data shipped inside the ``bfcl-eval`` wheel.

``pip install --no-deps bfcl-eval`` (its declared dependencies are heavy and pin an old numpy; oprl needs
none of them): the questions (``bfcl_eval/data/BFCL_v4_<subset>.json``, one JSON object per line) and the
ground truth (``bfcl_eval/data/possible_answer/BFCL_v4_<subset>.json``) are located through the installed
distribution's file list, like the SmolLM2 GGUF in ``oprl.models.loading``; no network, no bfcl-eval code.

The rows of the chosen ``task.subsets`` are shuffled with ``task.seed`` and the first ``test_fraction`` of
them form the test split (fixed for a seed, whatever ``train_size``). Each problem's tools travel in
``Problem.tools`` (OpenAI function schemas) and are rendered by the chat template (``tools=``) when it has a
tools section, else by ``oprl.models.chat``'s documented system-prompt format. The reward is
``oprl.tasks.bfcl.toolcall``'s, checked in timed reward processes: 1 when the response follows the format rules
(``task.think``) and its calls match the ground truth, else 0; components ``format`` and ``correct``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from oprl.errors import OprlError
from oprl.tasks.base import Problem, Reward
from oprl.tasks.bfcl.toolcall import reference_response, tool_call_rewards
from oprl.tasks.rewards.verify import VerifierPool
from oprl.tasks.section import ToolTaskSection, task_section

DISTRIBUTION = "bfcl-eval"
INSTALL = "pip install --no-deps bfcl-eval"

THINK_PROMPT = (
    "You are a helpful assistant that calls functions. First think about the request inside <think> </think>, "
    'then call the function(s) that answer it, each as <tool_call>{"name": <function-name>, "arguments": '
    "<args-json-object>}</tool_call>. Several independent calls are several <tool_call> blocks."
)
PLAIN_PROMPT = (
    "You are a helpful assistant that calls functions. Call the function(s) that answer the request, each as "
    '<tool_call>{"name": <function-name>, "arguments": <args-json-object>}</tool_call>.'
)
_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}


def data_file(relative: str, *, key: str = "task.name") -> Path:
    """``bfcl_eval/data/<relative>`` of the installed wheel; a one-line ``OprlError`` when it is missing."""
    try:
        files = metadata.distribution(DISTRIBUTION).files or []
    except metadata.PackageNotFoundError:
        raise OprlError(
            f"{key}: the BFCL data ships in the bfcl-eval wheel, which is not installed; {INSTALL}"
        ) from None
    wanted = f"bfcl_eval/data/{relative}"
    for file in files:
        if str(file) == wanted:
            return Path(file.locate())
    raise OprlError(f"{key}: {wanted} is not in the installed bfcl-eval {metadata.version(DISTRIBUTION)}; {INSTALL}")


def read_lines(path: Path) -> list[dict]:
    """The JSON objects of a BFCL data file (one per line, despite the ``.json`` name)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def tool_schema(function: dict) -> dict:
    """A BFCL function document as an OpenAI-style tool (``{"type": "function", "function": ...}``); BFCL's
    Python type names (dict, float, tuple) become JSON-schema ones."""
    return {"type": "function", "function": _json_types(function)}


def _json_types(value):
    if isinstance(value, dict):
        return {
            k: (_TYPES.get(v, v) if k == "type" and isinstance(v, str) else _json_types(v)) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_json_types(v) for v in value]
    return value


def with_system(system: str, messages: list[dict]) -> tuple[dict, ...]:
    """``messages`` behind a system message ``system``, merged into the first one if there is one already
    (several chat templates accept only one system message)."""
    if messages and messages[0].get("role") == "system":
        first = {"role": "system", "content": f"{system}\n\n{messages[0]['content']}"}
        return (first, *messages[1:])
    return ({"role": "system", "content": system}, *messages)


def answered_rows(subset: str) -> list[tuple[dict, list]]:
    """The rows of BFCL subset ``subset``, each with its ground truth (``possible_answer/``); a row with none is
    left out."""
    truth = {r["id"]: r["ground_truth"] for r in read_lines(data_file(f"possible_answer/BFCL_v4_{subset}.json"))}
    return [(row, truth[row["id"]]) for row in read_lines(data_file(f"BFCL_v4_{subset}.json")) if row["id"] in truth]


def split_rows(rows: list, *, seed: int, test_fraction: float, train_size, test_size) -> dict[str, list]:
    """Shuffle ``rows`` with ``seed``; the first ``test_fraction`` are the test split (then cut to the sizes)."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    cut = max(1, round(test_fraction * len(rows)))
    test, train = [rows[i] for i in order[:cut]], [rows[i] for i in order[cut:]]
    if not train:
        raise OprlError(f"task.test_fraction: {test_fraction} leaves no training problem out of {len(rows)}")
    return {"train": train[:train_size], "test": test[:test_size]}


BFCL_SUBSETS = (
    "simple_python",
    "simple_java",
    "simple_javascript",
    "multiple",
    "parallel",
    "parallel_multiple",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
)
"""The single-turn BFCL subsets that ship ground truth (``irrelevance`` and friends have none)."""


class BfclTaskConfig(ToolTaskSection):
    """BFCL single-turn function calling (Patil et al., ICML 2025; data from the ``bfcl-eval`` wheel) with the
    paper's tool-call reward (Trinity-RFT's rules): 1 when the response has the format and its calls match
    the ground truth, else 0."""

    name: Literal["bfcl"] = "bfcl"
    subsets: list[str] = Field(default_factory=lambda: ["simple_python"])
    """BFCL subsets to draw problems from: simple_python, simple_java, simple_javascript, multiple,
    parallel, parallel_multiple, live_simple, live_multiple, live_parallel, live_parallel_multiple."""
    think: bool = True
    """Require the paper's think rules (one ``<think>...</think>`` before the calls); False = calls only,
    for models that do not reason first."""
    system_prompt: str | None = None
    """System message of every prompt (None = oprl.tasks.bfcl.single_turn's THINK_PROMPT or PLAIN_PROMPT,
    after ``think``)."""
    format_bonus: float = Field(0.0, ge=0.0)
    """Format-aware training reward (ToolRL's format term): +format_bonus when the response is well formed,
    -format_bonus otherwise, added to the 0/1 correctness; 0 = the paper's reward. Accuracy stays correctness."""
    partial_credit: float = Field(0.0, ge=0.0, lt=1.0)
    """ToolRL's fine-grained correctness as a training reward: a well-formed wrong call earns partial_credit x
    its credit in [0, 1] (right function name, argument names and values; oprl.tasks.bfcl.toolcall.calls_credit),
    so groups of only wrong calls still rank their replies; < 1 keeps every correct call above every wrong
    one. 0 = the paper's 0/1 reward. Accuracy stays correctness."""

    @field_validator("subsets")
    @classmethod
    def _subsets(cls, value: list[str]) -> list[str]:
        return cls._check_subsets(value, BFCL_SUBSETS)


class BfclTask:
    """Single-turn BFCL problems and the tool-call reward, built from a ``BfclTaskConfig`` (or its fields)."""

    Config = BfclTaskConfig

    def __init__(self, config: BfclTaskConfig | None = None, **fields) -> None:
        self.config = c = task_section(BfclTaskConfig, config, fields)
        self.name = c.name
        rows = [answered for subset in c.subsets for answered in answered_rows(subset)]
        split = split_rows(
            rows, seed=c.seed, test_fraction=c.test_fraction, train_size=c.train_size, test_size=c.test_size
        )
        self._splits = {
            name: [self._problem(name, row, truth) for row, truth in chosen] for name, chosen in split.items()
        }
        self._pool: VerifierPool | None = None

    def _problem(self, split: str, row: dict, truth: list) -> Problem:
        c = self.config
        system = c.system_prompt or (THINK_PROMPT if c.think else PLAIN_PROMPT)
        return Problem(
            task_id=f"{self.name}/{row['id']}",
            messages=with_system(system, list(row["question"][0])),
            answer=json.dumps(truth),
            tools=tuple(tool_schema(f) for f in row["function"]),
        )

    def problems(self, split: str) -> Sequence[Problem]:
        if split not in self._splits:
            raise OprlError(f"task {self.name}: unknown split {split!r}; valid: {sorted(self._splits)}")
        return self._splits[split]

    def demonstration(self, problem: Problem) -> list[str] | None:
        """The ground truth as the model's one turn (``toolcall.reference_response``: a short think, then the
        calls with one acceptable value per required argument), the target of warm starts
        (``warmstart.pretrained``); None for the rows no call can match."""
        try:
            return [reference_response(json.loads(problem.answer), think=self.config.think)]
        except ValueError:
            return None

    @property
    def verifier(self) -> VerifierPool:
        """The call-checking process pool (started on first use); ``verifier.counts`` tallies verdicts."""
        if self._pool is None:
            self._pool = VerifierPool(self.config.verify_workers, self.config.verify_timeout, kind="tool-call")
        return self._pool

    def score(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[Reward]:
        c = self.config
        answers = [p.answer for p in problems]
        return tool_call_rewards(
            self.verifier,
            answers,
            list(responses),
            think=c.think,
            format_bonus=c.format_bonus,
            partial_credit=c.partial_credit,
        )
