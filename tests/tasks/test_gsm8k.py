"""The GSM8k task on its offline source: the seeded GSM8k-format word-problem generator."""

import re
import time

import pytest

pytest.importorskip("math_verify")

from oprl.config import load_config
from oprl.errors import OprlError
from oprl.tasks import GSM8kTask, Task, build_task
from oprl.tasks.rewards.builtin import gsm8k_reference
from oprl.tasks.word_problems import generate_rows

STEP = re.compile(r"(\d+)([+\-*/])(\d+) = <<\1\2\3=(\d+)>>\4")


def test_generated_rows_are_gsm8k_format_and_arithmetically_right():
    rows = generate_rows(300, seed=3, min_steps=1, max_steps=4, max_value=30)
    assert len({r["question"] for r in rows}) == 300
    for row in rows:
        lines = row["answer"].splitlines()
        assert lines[-1].startswith("#### ") and row["question"].endswith("have now?")
        value = None
        for line in lines[:-1]:
            match = STEP.search(line)
            if match is None:  # the opening line of a "has N items" problem
                value = int(re.search(r"\d+", line).group())
                continue
            a, op, b, result = int(match[1]), match[2], int(match[3]), int(match[4])
            assert result == {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op] >= 0
            assert op != "/" or a % b == 0
            value = result
        assert gsm8k_reference(row["answer"]) == str(value)


def test_generator_is_seeded_and_respects_the_step_range():
    assert generate_rows(20, seed=1) == generate_rows(20, seed=1)
    assert generate_rows(20, seed=1) != generate_rows(20, seed=2)
    for row in generate_rows(50, seed=0, min_steps=1, max_steps=1, max_value=10):
        assert len(row["answer"].splitlines()) == 3  # opening line, one change, the #### line
    with pytest.raises(OprlError, match="synthetic_min_steps"):
        generate_rows(5, seed=0, min_steps=3, max_steps=2)
    with pytest.raises(OprlError, match="distinct word problems"):
        generate_rows(20_000, seed=0, min_steps=1, max_steps=1, max_value=2)


def test_synthetic_source_gives_disjoint_seeded_splits_through_the_config():
    config = load_config(None, ["task.name=gsm8k", "task.source=synthetic", "task.train_size=200", "task.test_size=50"])
    task = build_task(config.task)
    assert isinstance(task, GSM8kTask) and isinstance(task, Task)
    train, test = task.problems("train"), task.problems("test")
    assert (len(train), len(test)) == (200, 50)
    assert not {p.messages[1]["content"] for p in train} & {p.messages[1]["content"] for p in test}
    assert task.problems("test") == GSM8kTask(source="synthetic", train_size=400, test_size=50).problems("test")
    assert train[0].task_id == "gsm8k/train/000001"
    with pytest.raises(OprlError, match="unknown split"):
        task.problems("validation")


def test_scoring_generated_problems_end_to_end():
    task = GSM8kTask(source="synthetic", train_size=4, test_size=2, verify_timeout=3.0)
    problem = task.problems("train")[0]
    responses = [
        f"<think>work</think> <answer>{problem.answer}</answer>",
        f"<think>work</think> <answer>{int(problem.answer) + 1}</answer>",
        f"The answer is {problem.answer}",
    ]
    rewards = task.score([problem] * 3, responses)
    assert [round(r.total, 6) for r in rewards] == [1.1, 0.1, -0.1]
    assert all(set(r.components) == {"correct", "format", "verify_timeout", "verify_error"} for r in rewards)
    assert task.verifier.counts["match"] == 1


def test_last_number_reward_for_small_models():
    task = GSM8kTask(source="synthetic", train_size=4, test_size=2, reward="last-number")
    problem = task.problems("train")[0]
    assert "final answer as a number" in problem.messages[0]["content"]
    n = int(problem.answer)
    responses = [
        f"So she has {n}.",
        f"{n} apples, no wait, {n + 1}",
        "no number",
        f"{n:,}.0",
        "٠" * 3 + str(n),
        "",
        f"She has {n} apples.",
    ]
    rewards = task.score([problem] * len(responses), responses)
    assert [round(r.total, 6) for r in rewards] == [1.1, 0.1, -0.1, 1.1, 1.1, -0.1, 0.9]
    assert [r.components["format"] for r in rewards] == [1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    assert [r.components["correct"] for r in rewards] == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    assert task._pool is None  # no worker process is started for this reward
    with pytest.raises(OprlError, match=r"task\.reward"):
        GSM8kTask(source="synthetic", reward="boxed")


@pytest.mark.parametrize(
    "reply",
    ["1" + " " * 20_000 + "x", ("7 \t " * 5000)[:20_000] + "?", "9" * 20_000, "1." + "\n" * 19_998 + "a"],
)
def test_last_number_reward_is_linear_on_20k_character_replies(reply):
    """The explorer scores these in-process: each must take < 50 ms (the old ``\\d\\s*\\.?\\s*$`` search
    took 1 s on the first, trying every split of the spaces between its two ``\\s*``)."""
    task = GSM8kTask(source="synthetic", train_size=1, test_size=1, reward="last-number")
    problem = task.problems("train")[0]
    task.score([problem], [reply])  # warm
    started = time.perf_counter()
    (reward,) = task.score([problem], [reply])
    assert time.perf_counter() - started < 0.05
    assert reward.components["correct"] == 0.0 and reward.components["format"] == float(reply[-1].isdigit())


def test_ends_with_number_matches_the_documented_format():
    from oprl.tasks.rewards.builtin import ends_with_number

    cases = {"42": True, "42.": True, "42 . \n": True, "x ٤٢": True, "42..": False, "42a": False, "": False}
    assert {text: ends_with_number(text) for text in cases} == cases


def test_operations_restrict_the_kinds_of_change():
    rows = generate_rows(200, seed=5, min_steps=1, max_steps=3, max_value=10, operations="+-")
    text = " ".join(r["answer"] for r in rows)
    assert "+" in text and "-" in text and "*" not in text and "/" not in text
    with pytest.raises(OprlError, match=r"task\.synthetic_operations"):
        generate_rows(5, seed=0, operations="-/")
    with pytest.raises(OprlError, match=r"task\.synthetic_operations"):
        generate_rows(5, seed=0, operations="+x")


def test_every_task_is_registered_once_and_built_from_its_section():
    from oprl.config import load_config
    from oprl.tasks import TASKS

    for name, task in TASKS.items():
        assert task.Config().name == name
        section = load_config(None, [f"task.name={name}"]).task
        assert type(section) is task.Config  # the config's task union is derived from TASKS
