import pytest

from oprl.errors import OprlError
from oprl.tasks import ArithmeticTask, Task
from oprl.tasks.arithmetic import _evaluate, score_integer_answer


def test_splits_are_disjoint_seeded_and_sized():
    task = ArithmeticTask(train_size=1000, test_size=200, seed=7)
    train, test = task.problems("train"), task.problems("test")
    assert len(train) == 1000 and len(test) == 200
    assert not {p.messages[0]["content"] for p in train} & {p.messages[0]["content"] for p in test}
    again = ArithmeticTask(train_size=1000, test_size=200, seed=7)
    assert again.problems("test") == test
    assert ArithmeticTask(train_size=1000, test_size=200, seed=8).problems("test") != test
    # Growing the train split never changes the test split.
    assert ArithmeticTask(train_size=2000, test_size=200, seed=7).problems("test") == test
    assert isinstance(task, Task)


def test_answers_are_exact_and_respect_precedence():
    assert _evaluate("3+4*5") == 23
    assert _evaluate("9-2-3") == 4
    assert _evaluate("2*3-4*5") == -14
    task = ArithmeticTask(train_size=300, test_size=50, max_value=20, operators="+-*", num_operands=3)
    for p in task.problems("test"):
        expression = p.messages[0]["content"].rstrip("=")
        assert int(p.answer) == _evaluate(expression)


@pytest.mark.parametrize(
    "response, total, well_formed",
    [("12", 1.0, 1.0), (" 12 ", 1.0, 1.0), ("13", 0.0, 1.0), ("-12", 0.0, 1.0), ("12a", 0.0, 0.0), ("", 0.0, 0.0)],
)
def test_reward_components(response, total, well_formed):
    reward = score_integer_answer("12", response)
    assert reward.total == total
    assert reward.components == {"correct": total, "format": well_formed}


def test_difficulty_knobs_and_bad_sizes():
    task = ArithmeticTask(train_size=100, test_size=20, max_value=5, num_operands=4, operators="*")
    assert all(p.messages[0]["content"].count("*") == 3 for p in task.problems("train"))
    with pytest.raises(OprlError, match=r"task\.train_size"):
        ArithmeticTask(train_size=0)
    with pytest.raises(OprlError, match="too large"):
        ArithmeticTask(train_size=10_000, test_size=500, max_value=9, num_operands=2)
    with pytest.raises(OprlError, match="operators"):
        ArithmeticTask(operators="/")


def test_replies_past_the_digit_cap_are_wrong_not_a_crash():
    """int() raises on more than 4,300 digits; a 20,000-digit reply is a well-formed, wrong integer."""
    for answer in ("83", "-5"):
        reward = score_integer_answer(answer, "9" * 20_000)
        assert reward.total == 0.0 and reward.components["format"] == 1.0
    assert score_integer_answer("83", "0083").total == 1.0


def test_tool_arithmetic_final_reply_past_the_digit_cap():
    from oprl.tasks.base import Problem
    from oprl.tasks.tool_arithmetic import CalculatorEnvironment

    env = CalculatorEnvironment(Problem(task_id="t/0", messages=({"role": "user", "content": "2*3="},), answer="6"))
    step = env.step("-" + "1" * 5000)
    assert step.done and step.reward.total == 0.0 and step.reward.components["format"] == 0.0
