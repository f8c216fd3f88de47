"""The reasoning rewards, table-driven: the paper's R1 reward (GSM8k) and the boxed reward (MATH), plus the
process pool that checks answers under a hard timeout."""

import os
import time

import pytest

pytest.importorskip("math_verify")

from oprl.tasks.rewards.builtin import (
    MAX_ANSWER_CHARS,
    answer_tag,
    ascii_digits,
    boxed_rewards,
    gsm8k_reference,
    has_r1_format,
    last_boxed,
    r1_rewards,
)
from oprl.tasks.rewards.verify import Job, VerifierPool

TIMEOUT = 3.0
SLOW = "9^9^9^9"  # sympy computes 9^387420489 (370 million digits) when comparing it: minutes, not ms


@pytest.fixture(scope="module")
def pool():
    pool = VerifierPool(processes=1, timeout=TIMEOUT)
    yield pool
    pool.close()


def r1(think: str, answer: str) -> str:
    return f"<think>{think}</think> <answer>{answer}</answer>"


# (case, reference, response, total, correct, format)
R1_TABLE = [
    ("correct", "72", r1("48+24=72", "72"), 1.1, 1, 1),
    ("correct, newlines between tags", "72", "<think>\n48+24\n</think>\n<answer>\n72\n</answer>\n", 1.1, 1, 1),
    ("wrong", "72", r1("48+24=71", "71"), 0.1, 0, 1),
    ("correct, answer tag only", "72", "<answer>72</answer>", 0.9, 1, 0),
    ("correct, text before the tags", "72", "Sure! " + r1("easy", "72"), 0.9, 1, 0),
    ("correct, text after the tags", "72", r1("easy", "72") + " Hope this helps", 0.9, 1, 0),
    ("unclosed think", "72", "<think>easy <answer>72</answer>", 0.9, 1, 0),
    ("nested think", "72", "<think><think>a</think></think> <answer>72</answer>", 0.9, 1, 0),
    ("no answer tag", "72", "<think>48+24</think> The answer is 72.", -0.1, 0, 0),
    ("empty answer tag", "72", r1("hmm", ""), 0.1, 0, 1),
    ("two answer tags, last right", "72", "<think>a</think> <answer>5</answer> <answer>72</answer>", 0.9, 1, 0),
    ("two answer tags, last wrong", "72", "<think>a</think> <answer>72</answer> <answer>5</answer>", -0.1, 0, 0),
    ("two think blocks", "72", "<think>a</think><think>b</think> <answer>72</answer>", 0.9, 1, 0),
    ("units and currency", "72", r1("x", "$72 dollars"), 1.1, 1, 1),
    ("thousands separator", "1000000", r1("x", "1,000,000"), 1.1, 1, 1),
    ("sentence in the tag", "72", r1("x", "She has 72 apples."), 1.1, 1, 1),
    ("decimal equal to integer", "72", r1("x", "72.0"), 1.1, 1, 1),
    ("negative", "-3", r1("x", "-3"), 1.1, 1, 1),
    ("huge equal integers", "123456789012345678901234567890", r1("x", "123456789012345678901234567890"), 1.1, 1, 1),
    ("huge wrong integer", "72", r1("x", "1" + "0" * 5000), 0.1, 0, 1),
    ("arabic-indic digits", "72", r1("x", "٧٢"), 1.1, 1, 1),
    ("fullwidth digits", "72", r1("x", "７２"), 1.1, 1, 1),
    ("devanagari digits, wrong", "72", r1("x", "७३"), 0.1, 0, 1),
    ("latex fraction", "0.5", r1("x", "\\frac{1}{2}"), 1.1, 1, 1),
    ("latex dfrac in math mode", "0.5", r1("x", "$\\dfrac{1}{2}$"), 1.1, 1, 1),
    ("plain fraction", "0.5", r1("x", "1/2"), 1.1, 1, 1),
    ("boxed inside the tag", "72", r1("x", "\\boxed{72}"), 1.1, 1, 1),
    ("empty output", "72", "", -0.1, 0, 0),
    ("whitespace output", "72", "  \n ", -0.1, 0, 0),
    ("code is text, never run", "72", r1("x", "__import__('os').system('touch /tmp/oprl-pwned')"), 0.1, 0, 1),
    ("over-long answer", "72", r1("x", "7" * (MAX_ANSWER_CHARS + 1)), 0.1, 0, 1),
]


@pytest.mark.parametrize(
    "case, reference, response, total, correct, well_formed", R1_TABLE, ids=[r[0] for r in R1_TABLE]
)
def test_r1_reward_table(pool, case, reference, response, total, correct, well_formed):
    (reward,) = r1_rewards(pool, [reference], [response])
    assert reward.total == pytest.approx(total)
    assert reward.components == {
        "correct": correct,
        "format": well_formed,
        "verify_timeout": 0.0,
        "verify_error": 0.0,
    }
    assert not os.path.exists("/tmp/oprl-pwned")


def test_pathological_answer_is_cut_by_the_timeout_and_counted(pool):
    before = dict(pool.counts)
    start = time.monotonic()
    slow, fine = r1_rewards(pool, ["72", "72"], [r1("x", SLOW), r1("x", "72")])
    elapsed = time.monotonic() - start
    assert elapsed < TIMEOUT + 30  # the answer's worker was killed at TIMEOUT; a replacement started
    assert slow.total == pytest.approx(0.1) and slow.components["verify_timeout"] == 1.0
    assert slow.components["correct"] == 0.0 and slow.components["verify_error"] == 0.0
    assert fine.total == pytest.approx(1.1) and fine.components["verify_timeout"] == 0.0
    assert pool.counts["timeout"] == before["timeout"] + 1
    # A timeout is never cached: the same job is tried (and timed out) again.
    (again,) = r1_rewards(pool, ["72"], [r1("x", SLOW)])
    assert again.components["verify_timeout"] == 1.0


def test_the_format_bonus_is_configurable(pool):
    good, bad = r1_rewards(pool, ["7", "7"], [r1("x", "7"), "7"], format_bonus=0.0)
    assert (good.total, bad.total) == (1.0, 0.0)


# (case, reference, response, total, found a boxed answer)
BOXED_TABLE = [
    ("correct", "\\frac{3}{4}", "So the answer is $\\boxed{\\frac{3}{4}}$.", 1.0, 1),
    ("equivalent decimal", "\\frac{3}{4}", "$\\boxed{0.75}$", 1.0, 1),
    ("equivalent radical", "2\\sqrt{3}", "\\boxed{\\sqrt{12}}", 1.0, 1),
    ("nested braces", "\\frac{1}{2}", "first \\boxed{3} then \\boxed{\\frac{1}{2}}", 1.0, 1),
    ("last boxed counts", "3", "\\boxed{3} no wait \\boxed{4}", 0.0, 1),
    ("wrong", "5", "\\boxed{6}", 0.0, 1),
    ("fbox", "5", "\\fbox{5}", 1.0, 1),
    ("no boxed answer", "5", "The answer is 5.", 0.0, 0),
    ("unbalanced braces", "5", "\\boxed{5", 0.0, 0),
    ("interval", "(1, 2]", "\\boxed{(1,2]}", 1.0, 1),
    ("text answer", "\\text{even}", "\\boxed{\\text{even}}", 1.0, 1),
    ("empty output", "5", "", 0.0, 0),
]


@pytest.mark.parametrize("case, reference, response, total, found", BOXED_TABLE, ids=[r[0] for r in BOXED_TABLE])
def test_boxed_reward_table(pool, case, reference, response, total, found):
    (reward,) = boxed_rewards(pool, [reference], [response])
    assert reward.total == total
    assert reward.components["correct"] == total and reward.components["format"] == found
    assert reward.components["verify_timeout"] == 0.0


def test_extractors():
    assert answer_tag("<answer> 1 </answer> x <answer>2</answer>") == "2"
    assert answer_tag("<answer>1") is None
    assert has_r1_format("<think>a</think><answer>b</answer>")
    assert not has_r1_format("<think>a</think><answer>b</answer><answer>c</answer>")
    assert last_boxed("\\boxed{a{b}c} \\boxed {d}") == "d"
    assert last_boxed("\\boxed{a{b}c}") == "a{b}c"
    assert gsm8k_reference("so 3+4=7\n#### 7") == "7"
    assert gsm8k_reference("#### 1,234") == "1234"
    assert gsm8k_reference("#### -5") == "-5"
    assert gsm8k_reference("no marker 7") is None
    assert gsm8k_reference("#### seven") is None
    assert ascii_digits("٧٢ and ７２ and ²") == "72 and 72 and ²"


def test_identical_jobs_are_checked_once_and_verdicts_keep_order():
    pool = VerifierPool(processes=2, timeout=TIMEOUT)
    try:
        jobs = [Job("1", str(i % 3)) for i in range(9)]
        verdicts = pool.check(jobs)
        assert verdicts == ["match" if i % 3 == 1 else "mismatch" for i in range(9)]
        assert sum(pool.counts.values()) == 9
        processes = [w.process for w in pool._processes]
    finally:
        pool.close()
    assert all(p.poll() is not None for p in processes)  # close() leaves no worker behind
