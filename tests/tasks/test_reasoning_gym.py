"""task.name=reasoning-gym: two generators load with their sizes and seeds, score with their own scorers in
the reward pool (right, wrong, tagged, untagged), a bad generator is one line, and the tiny model trains."""

import pytest

from oprl.cli import main
from oprl.errors import OprlError
from oprl.metrics import read_metrics

pytest.importorskip("reasoning_gym")

from oprl.tasks.reasoning_gym import ReasoningGymTask

SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
DATASETS = [
    {"name": "basic_arithmetic", "train_size": 30, "test_size": 10, "seed": 3, "config": SMALL},
    {"name": "chain_sum", "train_size": 20, "test_size": 5, "seed": 4, "config": SMALL},
]


def test_two_datasets_load_and_score_with_their_own_scorers():
    task = ReasoningGymTask(datasets=DATASETS)
    train, test = task.problems("train"), task.problems("test")
    assert len(train) == 50 and len(test) == 15
    assert {p.task_id.split("/")[1] for p in train} == {"basic_arithmetic", "chain_sum"}
    assert len({p.task_id for p in [*train, *test]}) == 65
    assert train[0].messages[0]["role"] == "system" and "<answer>" in train[0].messages[0]["content"]
    again = ReasoningGymTask(datasets=DATASETS)
    assert [p.messages for p in again.problems("train")] == [p.messages for p in train]  # seeded
    problems = [train[0], train[0], train[0], train[-1]]
    replies = [
        f"so <answer>{train[0].answer}</answer>",
        "<answer>12345</answer>",
        train[0].answer,
        f"<answer>{train[-1].answer}</answer>",
    ]
    rewards = task.score(problems, replies)
    assert [r.total for r in rewards] == [1.0, 0.0, 0.0, 1.0]
    assert [r.components["format"] for r in rewards] == [1.0, 1.0, 0.0, 1.0]
    plain = ReasoningGymTask(datasets=DATASETS, answer_format="plain", system_prompt="")
    assert plain.problems("train")[0].messages[0]["role"] == "user"
    assert plain.score([train[0]], [f" {train[0].answer} "])[0].total == 1.0
    assert task.verdicts["scored"] == 4


def test_an_unknown_generator_is_one_line():
    with pytest.raises(OprlError, match=r"task\.datasets: reasoning-gym cannot build 'no_such'"):
        ReasoningGymTask(datasets=["no_such"])


def test_the_tiny_model_trains_on_two_generators(small_overrides, tmp_path):
    args = [
        *[a for a in small_overrides if not a.startswith("task.")],
        "task.name=reasoning-gym",
        "task.answer_format=plain",
        "task.system_prompt=",
        "task.datasets=[{name: basic_arithmetic, train_size: 300, test_size: 32, config: {min_terms: 2, max_terms: 2,"
        " min_digits: 1, max_digits: 1}}, {name: chain_sum, train_size: 300, test_size: 32, config: {min_terms: 2,"
        " max_terms: 2, min_digits: 1, max_digits: 1}}]",
        "steps=3",
        # This task's warm start is its own (not the session's cached one): 10 steps build the model the
        # assertions need (rows written, rewards scored, an evaluation), 40 cost ~20 s more.
        "warmstart.max_steps=10",
        "warmstart.check_interval=10",
        "warmstart.val_problems=16",
        "eval.num_problems=16",
        "run_name=rg",
    ]
    assert main(["train", *args]) == 0
    rows = read_metrics(tmp_path / "runs" / "rg" / "metrics.jsonl")
    assert len(rows) >= 4 and all("reward/correct" in r for r in rows[1:])
    assert "eval/accuracy" in rows[2]


def test_an_agent_gets_reasoning_gym_problems():
    from oprl.tasks import build_task
    from oprl.tasks.agent import AgentTaskConfig, problem_dict

    problems = {"name": "reasoning-gym", "datasets": DATASETS}
    task = build_task(AgentTaskConfig(agent="examples/calculator_agent.py:rollout", problems=problems))
    first = problem_dict(task.problems("train")[0])
    assert first["task_id"].startswith("reasoning-gym/basic_arithmetic/") and first["messages"][-1]["role"] == "user"
    assert task.score(task.problems("train")[:1], [f"<answer>{first['answer']}</answer>"])[0].total == 1.0
