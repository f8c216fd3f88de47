"""Configuration sections of the task plug-ins: one per entry of ``oprl.tasks.TASKS``, chosen by ``task.name``.

Each task class names its section (``Config``) and is built from it; ``oprl.tasks`` derives the ``task``
field of the run's configuration tree from ``TASKS``, so a new task writes its section and adds one entry
there. Every field carries its default and meaning in the docstring under it, as everywhere in the
configuration.
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
    number (``steps=true`` would otherwise be 1 step)."""

    model_config = ConfigDict(
        extra="forbid", use_attribute_docstrings=True, validate_assignment=True, allow_inf_nan=False
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name is not None:
            annotation = cls.model_fields[info.field_name].annotation
            accepted = {annotation, *typing.get_args(annotation)}
            if bool not in accepted and accepted & {int, float}:
                raise ValueError("true/false is not a number here; give a number")
        return value


class ArithmeticTaskConfig(Section):
    """Procedurally generated integer arithmetic (``"37+58-12="`` -> ``83``): the embedded default task."""

    name: Literal["arithmetic"] = "arithmetic"
    """Task plug-in: a key of ``oprl.tasks.TASKS`` (``oprl config --help`` lists them)."""
    train_size: int = Field(2500, gt=0)
    """Number of training problems."""
    test_size: int = Field(500, gt=0)
    """Number of held-out test problems (evaluation)."""
    max_value: int = Field(9, gt=0)
    """Arithmetic: operands are drawn uniformly from 0..max_value."""
    num_operands: int = Field(3, ge=2)
    """Arithmetic: operands per expression."""
    operators: str = "+-"
    """Arithmetic: operators to draw from, a subset of '+-*'."""
    seed: int = 1234
    """Seed of problem generation; fixes both splits."""


class _ReasoningTaskConfig(Section):
    """Fields shared by the tasks whose answers are checked by math-verify in reward processes."""

    name: str
    """Task plug-in: a key of ``oprl.tasks.TASKS`` (``oprl config --help`` lists them)."""
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


class GSM8kTaskConfig(_ReasoningTaskConfig):
    """GSM8k (Cobbe et al. 2021, arXiv 2110.14168) with the paper's reward: math-verify accuracy of the
    ``<answer>`` content plus +-format_bonus for the ``<think>...</think> <answer>...</answer>`` form, under
    the DeepSeek-R1 system prompt (docs/paper.md#reward)."""

    name: Literal["gsm8k"] = "gsm8k"
    """Task plug-in: a key of ``oprl.tasks.TASKS`` (``oprl config --help`` lists them)."""
    source: Literal["auto", "hub", "files", "synthetic"] = "auto"
    """Where problems come from: ``hub`` (openai/gsm8k through ``datasets``; needs the network or the HF
    cache), ``files`` (task.train_file / task.test_file, or task.path; rows with question/answer fields),
    ``synthetic`` (seeded GSM8k-format word problems, offline), ``auto`` = files when any file is set, else hub."""
    hub_id: str = "openai/gsm8k"
    """Hugging Face dataset id for source=hub."""
    hub_config: str | None = "main"
    """Dataset configuration name for source=hub."""
    question_field: str = "question"
    """Row field holding the question."""
    answer_field: str = "answer"
    """Row field holding the worked answer; the reference is the number after its last ``####``."""
    reward: Literal["r1", "last-number"] = "r1"
    """``r1`` = the paper's reward under the DeepSeek-R1 system prompt; ``last-number`` = the same shape for
    models too small to follow the R1 format (SmolLM2-135M never does): correct when the response's last
    number is the reference, and the format term rewards ending the response with a number."""
    format_bonus: float = Field(0.1, ge=0.0)
    """+format_bonus when the response has the reward's format, -format_bonus otherwise (paper: 0.1)."""
    synthetic_min_steps: int = Field(2, gt=0)
    """source=synthetic: fewest changes to the count after the opening sentence."""
    synthetic_max_steps: int = Field(3, gt=0)
    """source=synthetic: most changes to the count (1 = easy one-step problems)."""
    synthetic_max_value: int = Field(20, ge=2)
    """source=synthetic: largest number drawn for a quantity."""
    synthetic_operations: str = "+-*/"
    """source=synthetic: kinds of change to draw from: + (buy more), - (give away), * (k times as many, and
    the "packs of" opening), / (split into equal piles); must contain + or *."""
    seed: int = 1234
    """source=synthetic: seed of problem generation; fixes both splits."""


class MathTaskConfig(_ReasoningTaskConfig):
    """MATH competition problems (Hendrycks et al. 2021, arXiv 2103.03874) with the boxed-answer reward:
    1 when the last ``\\boxed{}`` of the response matches the reference under math-verify, else 0."""

    name: Literal["math"] = "math"
    """Task plug-in: a key of ``oprl.tasks.TASKS`` (``oprl config --help`` lists them)."""
    source: Literal["auto", "hub", "files"] = "auto"
    """Where problems come from: ``hub``, ``files`` (task.train_file / task.test_file, or task.path), or
    ``auto`` = files when any file is set, else hub."""
    hub_id: str = "DigitalLearningGmbH/MATH-lighteval"
    """Hugging Face dataset id for source=hub (the 7,500 / 5,000 split of MATH)."""
    problem_field: str = "problem"
    """Row field holding the problem statement."""
    answer_field: str = "solution"
    """Row field holding the reference: the content of its last ``\\boxed{}``; a single-line field without
    one is taken whole (MATH-500's ``answer`` column)."""
    instruction: str = "Please reason step by step, and put your final answer within \\boxed{}."
    """Appended to every problem, on its own line."""


class DatasetTaskConfig(Section):
    """Your data, your reward: prompts from a JSONL / JSON / parquet / CSV file or a Hugging Face ``datasets``
    name or directory, scored by your own Python function(s) (see docs/tasks.md for the reward contract)."""

    name: Literal["dataset"] = "dataset"
    """Task plug-in (see ``oprl.tasks.TASKS``)."""
    train_file: str | None = None
    """Training split file: .jsonl, .json (a list of objects), .parquet or .csv. Or set task.hf_name."""
    test_file: str | None = None
    """Test split file (evaluation); None = the training file (evaluation then measures training prompts)."""
    hf_name: str | None = None
    """Instead of files: a ``datasets`` dataset: a hub name (needs the network or the HF cache), a local
    directory written by ``Dataset(Dict).save_to_disk``, or a local directory of data files."""
    hf_config: str | None = None
    """hf_name's configuration name (None = its default)."""
    train_split: str = "train"
    """hf_name's split used for training."""
    test_split: str | None = "test"
    """hf_name's split used for evaluation; None (or a split the dataset lacks) = the training split."""
    prompt_column: str = "prompt"
    """Column holding the prompt: a string (sent as one user message) or a list of chat messages
    ``[{"role": ..., "content": ...}, ...]``."""
    reference_column: str | None = "reference"
    """Column handed to the reward as ``reference`` (None = no reference column; the reward gets None)."""
    system_prompt: str | None = None
    """System message put before string prompts (None = none)."""
    reward: str | list[str] = ""
    """Your reward function(s): ``package.module:function`` (importable from the current directory or the
    environment) or ``path/to/file.py:function``, or a list of them. Called as
    ``fn(prompt, completion, reference, **row) -> float | dict[str, float]`` in reward processes; a dict's
    values are named components (logged as ``reward/<name>``) and its reward is their sum."""
    reward_weights: list[float] | None = None
    """Weight of each reward function in the total (None = 1.0 each), as TRL's ``reward_weights``."""
    reward_timeout: float = Field(5.0, gt=0.0)
    """Seconds one reward call may take; past that its worker is killed, the call scores 0 and
    ``reward/reward_timeout`` counts it."""
    reward_workers: int = Field(1, gt=0)
    """Reward worker processes (each imports your reward module once)."""
    reward_memory_mb: int = Field(4096, ge=0)
    """Address-space limit of each reward process in MB (``resource.setrlimit``; 0 = none). A call that
    allocates past it fails with a ``MemoryError`` and scores 0. Importing torch and transformers takes ~700."""
    reward_import_timeout: float = Field(60.0, gt=0.0)
    """Seconds a reward process may take to start (import your module); past that the run stops with one line."""
    reward_max_error_fraction: float = Field(1.0, gt=0.0, le=1.0)
    """The run stops when a reward function fails (raises, times out, returns a non-number) on at least this
    share of a batch's rows; below it, failed rows score 0 and are counted (``reward/reward_error``,
    ``reward/reward_timeout``). 1.0 = stop only when every row of a batch fails."""
    train_size: int | None = Field(None, gt=0)
    """Use only the first train_size usable training rows (None = all)."""
    test_size: int | None = Field(None, gt=0)
    """Use only the first test_size usable test rows (None = all)."""


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


class _ToolTaskConfig(Section):
    """Fields shared by the tool-calling tasks."""

    name: str
    """Task plug-in (see ``oprl.tasks.TASKS``)."""
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


class BfclTaskConfig(_ToolTaskConfig):
    """BFCL single-turn function calling (Patil et al., ICML 2025; data from the ``bfcl-eval`` wheel) with the
    paper's tool-call reward (Trinity-RFT's rules): 1 when the response has the format and its calls match
    the ground truth, else 0."""

    name: Literal["bfcl"] = "bfcl"
    """Task plug-in (see ``oprl.tasks.TASKS``)."""
    subsets: list[str] = ["simple_python"]
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


BFCL_MULTI_TURN_SUBSETS = ("multi_turn_base", "multi_turn_long_context")
"""The BFCL multi-turn subsets oprl can simulate (rows on the file system and math APIs only)."""


class BfclMultiTurnTaskConfig(_ToolTaskConfig):
    """BFCL multi-turn (data from the ``bfcl-eval`` wheel) on oprl's simulated file system and math API: the
    model calls tools over several user turns; reward 1 when the final API state and every turn's call results
    match the ground truth's (oprl.tasks.bfcl.multi_turn). Set rollout.max_turns (about 20) and
    rollout.max_episode_tokens (a few thousand) to fit its conversations."""

    name: Literal["bfcl-multi-turn"] = "bfcl-multi-turn"
    """Task plug-in (see ``oprl.tasks.TASKS``)."""
    subsets: list[str] = ["multi_turn_base"]
    """BFCL multi-turn subsets: multi_turn_base, multi_turn_long_context (the rows on simulated APIs)."""
    system_prompt: str | None = None
    """System message of every prompt (None = oprl.tasks.bfcl.single_turn's PLAIN_PROMPT)."""

    @field_validator("subsets")
    @classmethod
    def _subsets(cls, value: list[str]) -> list[str]:
        return cls._check_subsets(value, BFCL_MULTI_TURN_SUBSETS)


class ToolArithmeticTaskConfig(Section):
    """Arithmetic through a calculator tool, multi-turn (call, tool answer, final answer): the embedded tiny
    model's agent task (oprl.tasks.tool_arithmetic documents the compact format)."""

    name: Literal["tool-arithmetic"] = "tool-arithmetic"
    """Task plug-in (see ``oprl.tasks.TASKS``)."""
    train_size: int = Field(2500, gt=0)
    """Number of training problems."""
    test_size: int = Field(500, gt=0)
    """Number of held-out test problems (evaluation)."""
    min_value: int = Field(10, ge=0)
    """Smallest operand (two-digit operands by default: beyond the tiny model's mental arithmetic)."""
    max_value: int = Field(99, gt=0)
    """Largest operand."""
    num_operands: int = Field(2, ge=2)
    """Operands per expression."""
    operators: str = "+-*"
    """Operators to draw from, a subset of '+-*'."""
    seed: int = 1234
    """Seed of problem generation; fixes both splits."""


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


class AgentTaskConfig(Section):
    """Bring your own agent: ``rollout(client, problem)`` written against an OpenAI client, run by the explorer
    against its endpoint (oprl.episodes.agents; docs/tasks.md#bring-your-own-agent)."""

    name: Literal["agent"] = "agent"
    """Task plug-in (see ``oprl.tasks.TASKS``)."""
    agent: str = ""
    """The agent: ``path/to/file.py:function`` or ``package.module:function``, a function
    ``rollout(client: openai.OpenAI, problem: dict) -> float | dict[str, float]`` (an ``async def`` gets an
    ``openai.AsyncOpenAI``); a dict's ``reward`` entry is the total, the others are logged components."""
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


class ReasoningGymTaskConfig(Section):
    """Procedurally generated reasoning problems from reasoning-gym (100+ generators, offline), scored by each
    generator's own ``score_answer`` in timed reward processes (``pip install 'oprl[reasoning-gym]'``)."""

    name: Literal["reasoning-gym"] = "reasoning-gym"
    """Task plug-in (see ``oprl.tasks.TASKS``)."""
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
