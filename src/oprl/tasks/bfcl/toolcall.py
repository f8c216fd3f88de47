"""Tool-call responses: parsing ``<tool_call>{json}</tool_call>`` blocks, the format rules of the paper's tool
task, and correctness against BFCL-style ground truth. Pure functions on strings; no I/O.

A response calls tools with one block per call (several blocks = parallel calls, the Hermes / Qwen form); a
block may also hold a JSON list of calls (the form of Trinity-RFT's tool-call workflow, after Tool-N1)::

    <think>The user wants the area.</think>
    <tool_call>{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5}}</tool_call>

**Format** (Trinity-RFT's ``toolcall_workflow`` rules; ``think=False`` drops the first three):
exactly one ``<think>`` and one ``</think>``, in that order; ``</think>`` before the first ``<tool_call>``;
at least one call; every block closed, not nested, and valid JSON of ``{"name": str, "arguments": object}``
(or a non-empty list of those).

**Correctness** (BFCL's ground truth, ``possible_answer/*.json``): the ground truth is a list of calls
``{function name: {argument: [acceptable values]}}``; ``""`` among the acceptable values means the argument
may be omitted. A call matches a ground-truth call when the names are equal, every argument it passes is
one the ground truth lists with a value among the acceptable ones, and every argument without ``""`` is
passed. Values compare as BFCL compares them: strings case-insensitively with spaces and ``,./-_*^``
removed, an integer where a float is expected (not the reverse), booleans only as booleans, lists
element-wise, dicts key by key (a dict of acceptable-value lists is matched like arguments). Parallel calls
match when there is a one-to-one pairing of calls to ground-truth calls, in any order.

**Hostile outputs.** Responses longer than ``MAX_RESPONSE_CHARS``, with brackets nested deeper than
``MAX_DEPTH`` or with more than ``MAX_CALLS`` calls are malformed before any JSON parser sees them, so every
check here is linear in the response; the reward still runs in a timed reward process
(``oprl.tasks.rewards.verify``, ``mode="tool-call"``) like the math rewards, as a second line of defence.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_RESPONSE_CHARS = 20_000
"""A response longer than this is malformed unread (no tool call of these tasks is a fraction of it)."""
MAX_DEPTH = 16
"""Deepest bracket nesting a call may have (BFCL arguments nest 3-4 levels)."""
MAX_CALLS = 32
"""Most calls one response may make."""

OPEN, CLOSE = "<tool_call>", "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_STRIP = re.compile(r"[ ,./\-_*^]")

MATCH, MISMATCH, MALFORMED = "match", "mismatch", "malformed"


def tool_call_blocks(text: str) -> list[str] | None:
    """Contents of the ``<tool_call>...</tool_call>`` blocks in order; None when a block is unclosed, nested,
    or a closing tag has no opening one."""
    blocks: list[str] = []
    position = 0
    while True:
        start = text.find(OPEN, position)
        stray = text.find(CLOSE, position)
        if start == -1:
            return blocks if stray == -1 else None
        if stray != -1 and stray < start:
            return None
        end = text.find(CLOSE, start + len(OPEN))
        if end == -1 or OPEN in text[start + len(OPEN) : end]:
            return None
        blocks.append(text[start + len(OPEN) : end])
        position = end + len(CLOSE)


def nesting_depth(text: str) -> int:
    """Deepest ``[``/``{`` nesting of ``text`` (string contents included: an over-estimate is safe)."""
    depth = deepest = 0
    for char in text:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def parse_calls(text: str) -> list[dict] | None:
    """The calls of ``text`` as ``[{"name": str, "arguments": dict}]``; None when any block is malformed
    (see the module docstring) or there is none."""
    if len(text) > MAX_RESPONSE_CHARS:
        return None
    blocks = tool_call_blocks(text)
    if not blocks:
        return None
    calls: list[dict] = []
    for block in blocks:
        if nesting_depth(block) > MAX_DEPTH:
            return None
        try:
            value = json.loads(block)
        except (ValueError, RecursionError):  # ValueError covers integers past Python's digit limit
            return None
        items = value if isinstance(value, list) and value else [value]
        for item in items:
            if not (
                isinstance(item, dict)
                and isinstance(item.get("name"), str)
                and isinstance(item.get("arguments"), dict)
                and set(item) <= {"name", "arguments"}
            ):
                return None
            calls.append(item)
    return calls if len(calls) <= MAX_CALLS else None


def think_rules_hold(text: str) -> bool:
    """Exactly one ``<think>`` and one ``</think>``, in that order, and ``</think>`` before any ``<tool_call>``."""
    if text.count(THINK_OPEN) != 1 or text.count(THINK_CLOSE) != 1:
        return False
    close = text.find(THINK_CLOSE)
    first_call = text.find(OPEN)
    return text.find(THINK_OPEN) < close and (first_call == -1 or close < first_call)


def check_format(text: str, *, think: bool = True) -> list[dict] | None:
    """The response's calls when it obeys the format rules (``think``: the think-tag rules too), else None."""
    if len(text) > MAX_RESPONSE_CHARS or (think and not think_rules_hold(text)):
        return None
    return parse_calls(text)


def standardize(text: str) -> str:
    """BFCL's string normalisation: lower case, spaces and ``,./-_*^`` removed, single quotes as double."""
    return _STRIP.sub("", text).lower().replace("'", '"')


def value_matches(value: Any, acceptable: Any) -> bool:
    """Whether the model's ``value`` equals one acceptable ground-truth value (see the module docstring)."""
    if isinstance(acceptable, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(acceptable, bool) and value == acceptable
    if isinstance(acceptable, float):
        return isinstance(value, (int, float)) and value == acceptable
    if isinstance(acceptable, int):
        return isinstance(value, int) and value == acceptable
    if isinstance(acceptable, str):
        return isinstance(value, str) and standardize(value) == standardize(acceptable)
    if isinstance(acceptable, list):
        return (
            isinstance(value, list)
            and len(value) == len(acceptable)
            and all(value_matches(v, a) for v, a in zip(value, acceptable, strict=True))
        )
    if isinstance(acceptable, dict):
        if not isinstance(value, dict):
            return False
        if acceptable and all(isinstance(a, list) for a in acceptable.values()):
            return arguments_match(value, acceptable)  # a nested {key: [acceptable values]} spec
        return set(value) == set(acceptable) and all(value_matches(value[k], acceptable[k]) for k in acceptable)
    return value == acceptable


def value_acceptable(value: Any, options: list) -> bool:
    """Whether a passed argument's ``value`` is one of its ground-truth ``options`` (``""`` there marks the
    argument optional; it is a value only when the model passed ``""`` itself)."""
    return any(value_matches(value, a) for a in options if a != "" or value == "")


def arguments_match(arguments: dict, spec: dict[str, list]) -> bool:
    """Every passed argument is listed with an acceptable value; every argument without ``""`` is passed."""
    for key, value in arguments.items():
        if key not in spec or not value_acceptable(value, spec[key]):
            return False
    return all(key in arguments for key, options in spec.items() if "" not in options)


def call_matches(call: dict, truth: dict[str, dict]) -> bool:
    """``call`` (``{"name", "arguments"}``) against one ground-truth call ``{name: {argument: [values]}}``."""
    ((name, spec),) = truth.items()
    return call["name"] == name and arguments_match(call["arguments"], spec)


def calls_match(calls: list[dict], ground_truth: list[dict]) -> bool:
    """A one-to-one pairing of ``calls`` with ``ground_truth`` exists (order-insensitive; Kuhn's matching)."""
    if len(calls) != len(ground_truth):
        return False
    fits = [[j for j, truth in enumerate(ground_truth) if call_matches(call, truth)] for call in calls]
    owner: dict[int, int] = {}

    def assign(i: int, seen: set[int]) -> bool:
        for j in fits[i]:
            if j not in seen:
                seen.add(j)
                if j not in owner or assign(owner[j], seen):
                    owner[j] = i
                    return True
        return False

    return all(assign(i, set()) for i in range(len(calls)))


def argument_credit(arguments: dict, spec: dict[str, list]) -> tuple[float, float]:
    """(key score, value score) of one call's ``arguments`` against its ground truth ``spec``, each in [0, 1]
    over the keys that matter, K = required keys | passed keys: key score = |passed keys the spec lists| / |K|
    (ToolRL's parameter-name Jaccard, with BFCL's optional arguments free to omit), value score = |passed keys
    with an acceptable value| / |K|. Both are 1 exactly when ``arguments_match`` holds."""
    required = {key for key, options in spec.items() if "" not in options}
    keys = required | set(arguments)
    if not keys:
        return 1.0, 1.0
    known = [key for key in arguments if key in spec]
    right = [key for key in known if value_acceptable(arguments[key], spec[key])]
    return len(known) / len(keys), len(right) / len(keys)


def call_credit(call: dict, truth: dict[str, dict]) -> float:
    """ToolRL's fine-grained correctness of one call (Qian et al. 2025, name + parameter names + values),
    scaled to [0, 1]: 0 for another function's name, else (1 + key score + value score) / 3
    (``argument_credit``); 1 exactly when ``call_matches``."""
    ((name, spec),) = truth.items()
    if call["name"] != name:
        return 0.0
    keys, values = argument_credit(call["arguments"], spec)
    return (1.0 + keys + values) / 3.0


def calls_credit(calls: list[dict], ground_truth: list[dict]) -> float:
    """Partial credit in [0, 1] of well-formed ``calls`` against ``ground_truth``: calls and ground-truth calls
    are paired best first (greedy on ``call_credit``, ties to the earlier ones; at most ``MAX_CALLS`` squared
    pairs), and the sum of the paired credits is divided by max(|calls|, |ground truth|), so missing and extra
    calls both cost. 1 exactly for a matching set (``calls_match``)."""
    if calls_match(calls, ground_truth):
        return 1.0
    pairs = sorted(
        ((call_credit(call, truth), i, j) for i, call in enumerate(calls) for j, truth in enumerate(ground_truth)),
        key=lambda pair: (-pair[0], pair[1], pair[2]),
    )
    used_calls: set[int] = set()
    used_truths: set[int] = set()
    total = 0.0
    for credit, i, j in pairs:
        if i not in used_calls and j not in used_truths:
            used_calls.add(i)
            used_truths.add(j)
            total += credit
    return total / max(len(calls), len(ground_truth), 1)


def verdict(ground_truth: str, response: str, *, think: bool = True) -> str:
    """``match`` (well formed and correct), ``mismatch`` (well formed, wrong) or ``malformed``.
    ``ground_truth`` is the JSON list of BFCL ground-truth calls."""
    calls = check_format(response, think=think)
    if calls is None:
        return MALFORMED
    return MATCH if calls_match(calls, json.loads(ground_truth)) else MISMATCH


def check_request(request: dict) -> dict:
    """The verifier pool's ``tool-call`` checker (``oprl.tasks.rewards.verify.CHECKERS``): ``{"verdict": ..., "credit":
    ...}`` of one ``Job`` (``mode`` ``tool-call``, or ``tool-call-nothink`` without the think rules); ``credit``
    is ``calls_credit`` of a well-formed response, 0 of a malformed one."""
    gold, response = json.loads(str(request["gold"])), str(request["pred"])
    calls = check_format(response, think=request.get("mode") == "tool-call")
    if calls is None:
        return {"verdict": MALFORMED, "credit": 0.0}
    credit = calls_credit(calls, gold)
    return {"verdict": MATCH if calls_match(calls, gold) else MISMATCH, "credit": credit}


def reference_value(acceptable: list) -> Any:
    """One value a ground-truth argument accepts: the first of its acceptable values other than ``""``, with
    nested ``{key: [acceptable values]}`` specs (dict arguments, or elements of list ones) resolved the same
    way, key by key (optional keys left out); it matches the chosen value under ``value_matches`` (tested on
    every BFCL row). ValueError when there is none (two live_simple rows list ``[]`` for a required argument:
    no call matches them)."""
    for value in acceptable:
        if value != "":
            return _instantiate(value)
    raise ValueError("no acceptable value")


def _instantiate(value: Any) -> Any:
    """An acceptable value as a model would write it: nested specs (dicts of acceptable-value lists, also as
    list elements) resolved by ``reference_arguments``, as ``value_matches`` reads them."""
    if isinstance(value, dict) and value and all(isinstance(a, list) for a in value.values()):
        return reference_arguments(value)
    if isinstance(value, list):
        return [_instantiate(v) for v in value]
    return value


def reference_arguments(spec: dict[str, list]) -> dict:
    """Arguments of a minimal correct call for ``spec`` (``{argument: [acceptable values]}``): every required
    argument (its list lacks ``""``) with ``reference_value``; optional ones omitted, which is always correct."""
    return {key: reference_value(options) for key, options in spec.items() if "" not in options}


def reference_response(ground_truth: list[dict], *, think: bool = True) -> str:
    """A response that scores ``match`` against ``ground_truth`` (BFCL's list of ``{name: {argument:
    [values]}}`` calls), in the task's own format: a short ``<think>`` naming the functions (``think``), then
    one ``<tool_call>`` block per call. The target of supervised warm starts on demonstrations. ValueError
    when no response matches (``reference_value``)."""
    calls = [
        {"name": name, "arguments": reference_arguments(spec)} for call in ground_truth for name, spec in call.items()
    ]
    blocks = "".join(f"{OPEN}{json.dumps(call)}{CLOSE}" for call in calls)
    if not think:
        return blocks
    names = ", ".join(dict.fromkeys(call["name"] for call in calls))
    return (
        f"{THINK_OPEN}The request is answered by calling {names} with arguments from the question.{THINK_CLOSE}{blocks}"
    )


def tool_call_rewards(
    pool,
    ground_truths: list[str],
    responses: list[str],
    *,
    think: bool = True,
    format_bonus: float = 0.0,
    partial_credit: float = 0.0,
) -> list:
    """The paper's tool-call reward per response: 1 when well formed and correct, else 0 (Trinity-RFT's rule),
    with components ``format``, ``correct``, ``verify_timeout``, ``verify_error``. ``pool`` is a
    ``VerifierPool(kind="tool-call")``: every check runs in its reward processes under its timeout.

    ``format_bonus`` b > 0 makes the reward format-aware (ToolRL's separate format term, Qian et al. 2025):
    total = correct + b when well formed, correct - b otherwise, so a well-formed wrong call beats a broken one.
    ``partial_credit`` w in [0, 1) adds ToolRL's fine-grained correctness to a well-formed *wrong* call:
    total += w * ``calls_credit`` (right function name, right argument names, right values), so a group of
    wrong calls still ranks its replies and a correct call (1) still beats every wrong one (< w + b < 1 + b).
    The ``correct`` component, which evaluation reports as accuracy, is unchanged; ``credit`` is logged."""
    from oprl.tasks.base import Reward
    from oprl.tasks.rewards.verify import Job

    mode = "tool-call" if think else "tool-call-nothink"
    scored = pool.check_scored(
        [Job(truth, response, mode) for truth, response in zip(ground_truths, responses, strict=True)]
    )
    return [
        Reward(
            total=float(v == MATCH)
            + (format_bonus if v in (MATCH, MISMATCH) else -format_bonus)
            + (partial_credit * credit if v == MISMATCH else 0.0),
            components={
                "correct": float(v == MATCH),
                "format": float(v in (MATCH, MISMATCH)),
                "credit": credit,
                "verify_timeout": float(v == "timeout"),
                "verify_error": float(v == "error"),
            },
        )
        for v, credit in scored
    ]
