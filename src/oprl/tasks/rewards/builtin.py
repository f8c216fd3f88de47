"""Reward functions of the reasoning tasks: the paper's GSM8k reward and the boxed-answer reward of MATH.

**R1 reward** (docs/paper.md#reward, used by ``gsm8k``): ``correct + format_bonus`` where ``correct`` is 1 when the
content of the *last* ``<answer>...</answer>`` equals the reference under math-verify, and ``format_bonus``
is ``+0.1`` when the whole response has the form ``<think>...</think> <answer>...</answer>`` (exactly one of
each, nothing around them but whitespace) and ``-0.1`` otherwise. The prompt is the DeepSeek-R1 system
prompt (``R1_SYSTEM_PROMPT``).

**Last-number reward** (``gsm8k`` with ``task.reward=last-number``, for models too small to follow the R1
format, such as SmolLM2-135M): the same shape with a format such a model can learn. ``correct`` is 1 when
the last number in the response equals the reference, and the format term is ``+0.1`` when the response
ends with a number (a final period allowed), ``-0.1`` otherwise, under the prompt ``NUMBER_SYSTEM_PROMPT``.
The number is read with a regular expression and compared as a decimal: no parser, no worker.

**Boxed reward** (``math``): 1 when the content of the last ``\\boxed{...}`` in the response equals the
reference under math-verify, else 0; ``format`` records whether a boxed answer was found.

Every reward carries the same components, so the trainer logs each as ``reward/<name>``: ``correct``,
``format``, ``verify_timeout`` and ``verify_error`` (1.0 when checking this answer timed out or crashed; it
then scores as wrong). Before checking, digits of any script (``٧٢``, fullwidth ``７２``) are mapped to ASCII
and answers longer than ``MAX_ANSWER_CHARS`` are wrong without being parsed.

Not here: how checking is isolated and timed out (``oprl.tasks.rewards.verify``), where problems come from.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation

import numpy as np

from oprl.tasks.base import Reward
from oprl.tasks.rewards.verify import Job, VerifierPool

# DeepSeek-AI, "DeepSeek-R1" (arXiv 2501.12948), Table 1 template, as the system message.
R1_SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with "
    "the answer. The reasoning process and answer are enclosed within <think> </think> and <answer> "
    "</answer> tags, respectively, i.e., <think> reasoning process here </think> <answer> answer here "
    "</answer>."
)
NUMBER_SYSTEM_PROMPT = (
    "Solve the math word problem. Think briefly, then end your reply with the final answer as a number."
)
BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
MAX_ANSWER_CHARS = 1000
"""An "answer" longer than this is wrong without being parsed: no reference answer is that long."""

_R1_FORMAT = re.compile(r"\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*", re.DOTALL)
_TAGS = re.compile(r"</?(?:think|answer)>")
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def overlong_penalty(length: int, max_tokens: int, buffer: int, penalty: float = 1.0) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, eq. 13) of a reply of ``length``
    tokens under the limit ``max_tokens`` with a buffer of ``buffer`` tokens, added to its reward:

        0                                            if length <= max_tokens - buffer
        -penalty * (length - (max_tokens - buffer)) / buffer   up to length = max_tokens (-penalty: a cut reply)

    ``buffer = 0`` = off (always 0)."""
    if buffer <= 0:
        return 0.0
    over = min(max(length - (max_tokens - buffer), 0), buffer)
    return -penalty * over / buffer


def ascii_digits(text: str) -> str:
    """``text`` with every Unicode decimal digit (Arabic-Indic, Devanagari, fullwidth, ...) made ASCII."""
    if text.isascii():
        return text  # the common case, without a Python-level pass over every character
    return "".join(str(unicodedata.decimal(ch)) if not ch.isascii() and ch.isdecimal() else ch for ch in text)


def answer_tag(response: str) -> str | None:
    """Content of the last ``<answer>...</answer>`` (stripped), or None when there is none.

    The pairs ``re.findall(r"<answer>(.*?)</answer>")`` would find, found with ``str.find`` in one pass: the
    regular expression retries from every later ``<answer>`` once no ``</answer>`` follows, which is
    quadratic in the response length (``"<answer>" * 8000`` took 2 s)."""
    found, position = None, 0
    while (start := response.find("<answer>", position)) >= 0:
        end = response.find("</answer>", start + len("<answer>"))
        if end < 0:
            break  # no later <answer> can be closed either
        found, position = response[start + len("<answer>") : end], end + len("</answer>")
    return found.strip() if found is not None else None


def has_r1_format(response: str) -> bool:
    """Exactly ``<think>...</think> <answer>...</answer>`` with one tag of each kind and nothing outside.
    Tags are counted first: with exactly four, the pattern below cannot backtrack more than linearly."""
    return len(_TAGS.findall(response)) == 4 and _R1_FORMAT.fullmatch(response) is not None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces; None if there is none.

    With ``depth[i]`` = (``{`` minus ``}`` in ``text[:i + 1]``), the ``{`` ending at ``start`` closes at the first
    ``i >= start`` with ``depth[i] < depth[start - 1]``, so it closes at all iff the minimum of ``depth[start:]``
    is below that: a cumulative sum and a suffix minimum, linear and vectorised (scanning forward from each
    ``\\boxed{`` was quadratic: ``"\\boxed{" * 4000`` took 2 s)."""
    starts = np.array([m.end() for m in _BOXED.finditer(text)], dtype=np.int64)
    if not len(starts):
        return None
    chars = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)  # one element per character
    depth = np.cumsum((chars == ord("{")).astype(np.int64) - (chars == ord("}")))
    lowest_after = np.minimum.accumulate(np.append(depth, depth[-1])[::-1])[::-1]  # min(depth[i:]), i <= len
    closes = np.flatnonzero(lowest_after[starts] < depth[starts - 1])
    if not len(closes):
        return None
    start = int(starts[closes[-1]])
    end = start + int(np.argmax(depth[start:] < depth[start - 1]))
    return text[start:end].strip()


def ends_with_number(response: str) -> bool:
    """The reply ends with a digit, a final period and whitespace allowed around it. String methods, not the
    pattern ``\\d\\s*\\.?\\s*$``: its two adjacent ``\\s*`` try every split of a whitespace run, which is
    quadratic (a digit then 20,000 spaces and a letter took 1 s)."""
    tail = response.rstrip().removesuffix(".").rstrip()
    return tail[-1:].isdecimal()


def last_number(response: str) -> str | None:
    """The last number in ``response`` (any script's digits, thousands commas dropped), or None."""
    found = _NUMBER.findall(ascii_digits(response))
    return found[-1].replace(",", "") if found else None


def gsm8k_reference(answer_field: str) -> str | None:
    """The GSM8k reference: the number after the last ``####``, commas removed; None if there is no number."""
    if "####" not in answer_field:
        return None
    tail = answer_field.rsplit("####", 1)[1].strip().replace(",", "")
    tail = tail.removeprefix("$").rstrip(".")
    return tail if re.fullmatch(r"-?\d+(?:\.\d+)?", tail) else None


def r1_rewards(
    pool: VerifierPool, references: Sequence[str], responses: Sequence[str], *, format_bonus: float = 0.1
) -> list[Reward]:
    """The paper's GSM8k reward (docs/paper.md#reward) for each ``(reference, response)`` pair."""
    answers = [answer_tag(r) for r in responses]
    verdicts = _check(pool, references, answers, mode="plain")
    rewards = []
    for response, verdict in zip(responses, verdicts, strict=True):
        well_formed = has_r1_format(response)
        correct = float(verdict == "match")
        bonus = format_bonus if well_formed else -format_bonus
        rewards.append(_reward(correct + bonus, correct, float(well_formed), verdict))
    return rewards


def last_number_rewards(
    references: Sequence[str], responses: Sequence[str], *, format_bonus: float = 0.1
) -> list[Reward]:
    """``correct + format_bonus`` when the reply ends with a number, ``correct - format_bonus`` otherwise;
    ``correct`` is 1 when the last number of the reply equals the reference as a decimal."""
    rewards = []
    for reference, response in zip(references, responses, strict=True):
        number = last_number(response)
        correct = float(number is not None and len(number) <= MAX_ANSWER_CHARS and _same_number(number, reference))
        ends = ends_with_number(response)
        bonus = format_bonus if ends else -format_bonus
        rewards.append(_reward(correct + bonus, correct, float(ends), "match" if correct else "mismatch"))
    return rewards


def _same_number(a: str, b: str) -> bool:
    try:
        return Decimal(a) == Decimal(ascii_digits(b).replace(",", ""))
    except InvalidOperation:
        return False


def boxed_rewards(pool: VerifierPool, references: Sequence[str], responses: Sequence[str]) -> list[Reward]:
    """1 when the last ``\\boxed{}`` of the response matches the reference, else 0."""
    answers = [last_boxed(r) for r in responses]
    verdicts = _check(pool, references, answers, mode="latex")
    return [
        _reward(float(v == "match"), float(v == "match"), float(a is not None), v)
        for a, v in zip(answers, verdicts, strict=True)
    ]


def _check(pool: VerifierPool, references, answers, *, mode: str) -> list[str]:
    """Verdict per answer; missing, empty or over-long answers are ``mismatch`` without a worker round trip."""
    verdicts = ["mismatch"] * len(answers)
    jobs, where = [], []
    for index, (reference, answer) in enumerate(zip(references, answers, strict=True)):
        if answer and len(answer) <= MAX_ANSWER_CHARS:
            jobs.append(Job(ascii_digits(reference), ascii_digits(answer), mode))
            where.append(index)
    for index, verdict in zip(where, pool.check(jobs) if jobs else [], strict=True):
        verdicts[index] = verdict
    return verdicts


def _reward(total: float, correct: float, well_formed: float, verdict: str) -> Reward:
    return Reward(
        total=total,
        components={
            "correct": correct,
            "format": well_formed,
            "verify_timeout": float(verdict == "timeout"),
            "verify_error": float(verdict == "error"),
        },
    )
