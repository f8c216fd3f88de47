"""A reward for examples/arithmetic_*.jsonl, written the way you would write your own (see docs/tasks.md).

oprl calls it in worker processes as ``reward(prompt, completion, reference, **row)``: ``prompt`` is the
row's ``prompt`` column, ``completion`` the model's response, ``reference`` the row's ``reference`` column,
``row`` any other columns. It returns named components; the reward is their sum, and each is logged as
``reward/<name>`` (``correct`` is also what evaluation reports as accuracy).

    oprl train task.name=dataset task.train_file=examples/arithmetic_train.jsonl \
        task.test_file=examples/arithmetic_test.jsonl task.reward=examples/arithmetic_reward.py:reward
"""

import re


def reward(prompt: str, completion: str, reference: str, **row) -> dict[str, float]:
    """1 for the exact integer answer, plus 0.1 for answering with an integer at all."""
    answer = completion.strip()
    is_integer = re.fullmatch(r"-?\d+", answer) is not None
    return {"correct": float(is_integer and int(answer) == int(reference)), "format": 0.1 * is_integer}
