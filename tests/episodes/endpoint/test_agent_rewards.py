"""An agent's return is checked as a dataset reward is (issue 67, items 1 and 4): a NaN, an inf or a number past
±1e6 scores 0 with one line naming the agent and the value, and never reaches the weights; anything with
``__float__`` is a number; a dict's non-numeric entries are kept with the episode."""

import logging
import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from test_agent_endpoint import EndingEngine, agent_task, run

from oprl.cli import main
from oprl.metrics import read_metrics
from oprl.models.tiny import build_tokenizer
from oprl.tasks.agent import agent_reward, load_agent
from oprl.tasks.rewards.user import MAX_ABS_REWARD


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


BAD = [float("nan"), float("inf"), -float("inf"), 1e30, -2 * MAX_ABS_REWARD, 10**400, True, "1.0", None]


@pytest.mark.parametrize("value", BAD, ids=[repr(v)[:12] for v in BAD])
def test_a_bad_number_is_a_bad_return(value):
    """9790d4b: NaN, inf and 1e30 were the reward; 10**400 raised OverflowError out of the episode loop."""
    with pytest.raises(TypeError, match="returned"):
        agent_reward(value)
    with pytest.raises(TypeError, match="'reward': returned"):
        agent_reward({"reward": value})


def test_anything_with_float_is_a_number():
    """9790d4b: ``np.float32(1.0)`` and a 0-d tensor were bad returns (the dataset path takes them)."""
    for value in (np.float32(0.5), np.float64(0.5), torch.tensor(0.5), np.int64(1) / 2):
        reward, notes = agent_reward(value)
        assert reward.total == 0.5 and reward.components == {"reward": 0.5} and notes == {}
    with pytest.raises(TypeError):  # __float__ of two numbers raises: the agent's error, named
        agent_reward(torch.tensor([0.5, 1.0]))


def test_a_dicts_text_entries_are_notes_and_its_numbers_components():
    """9790d4b: ``{"reward": 1.0, "final_answer": "forty-two"}`` stopped the run (ValueError)."""
    reward, notes = agent_reward(
        {"reward": np.float32(1.0), "correct": 1, "final_answer": "forty-two", "solved": True, "trace": [1, 2]}
    )
    assert reward.total == 1.0 and reward.components == {"reward": 1.0, "correct": 1.0}
    assert notes == {"final_answer": "forty-two", "solved": True, "trace": "[1, 2]"}
    with pytest.raises(TypeError, match="'correct': returned nan"):  # a component is bounded as the total is
        agent_reward({"reward": 1.0, "correct": float("nan")})
    with pytest.raises(TypeError, match="without a 'reward'"):
        agent_reward({"score": 1.0})


def test_bad_returns_score_zero_with_one_line_naming_the_agent_and_the_value(tokenizer, caplog):
    """Through the endpoint: NaN and 1e30 score 0 (failed, one line each naming task.agent and the value);
    np.float32 and a dict with a text entry score what they say, the text kept with the episode."""
    returns = {"0": float("nan"), "1": 1e30, "2": np.float32(1.0), "3": {"reward": 1.0, "final_answer": "forty-two"}}

    def agent(client, problem):
        client.chat.completions.create(model="policy", messages=problem["messages"])
        return returns[problem["task_id"][-1]]

    task = agent_task(agent)
    last = {p.task_id[-1]: p for p in task.problems("train")}  # one problem per kind of return
    problems = [last[k] for k in returns]
    with caplog.at_level(logging.WARNING, logger="oprl.explorer"):
        episodes = run(EndingEngine(tokenizer), tokenizer, task, problems)
    assert [e.outcome.total for e in episodes] == [0.0, 0.0, 1.0, 1.0]
    assert [e.info["agent_failed"] for e in episodes] == [1.0, 1.0, 0.0, 0.0]
    assert episodes[3].info["agent_notes"] == {"final_answer": "forty-two"}
    lines = [r.getMessage() for r in caplog.records if "scores 0" in r.getMessage()]
    assert len(lines) == 2
    assert all(task.config.agent in line for line in lines)
    assert "returned nan" in lines[0] and "returned 1e+30" in lines[1]


NAN_AGENT = '''
import itertools

COUNT = itertools.count()


def rollout(client, problem):
    """Stops at common characters (the untrained model then ends its turn); every fourth episode returns NaN."""
    reply = client.chat.completions.create(model="policy", messages=problem["messages"], stop=["1", "2", "3", "e"])
    return float("nan") if next(COUNT) % 4 == 1 else float(len(reply.choices[0].message.content) % 2)
'''


def test_a_nan_reward_never_reaches_the_weights(tmp_path):
    """A whole run in which one agent of each group returns NaN: exit 0 and finite weights (9790d4b: step 1's
    loss and grad norm NaN, the sampler's 500s, exit 1 on the checkpoint's non-finite check)."""
    save = load_agent("examples/agents/tiny_long_context.py:save")  # the documented long-context copy
    (tmp_path / "nan_agent.py").write_text(NAN_AGENT)
    model = save(str(tmp_path / "tiny-256"), 256)
    args = [
        "task.name=agent",
        f"task.agent={tmp_path / 'nan_agent.py'}:rollout",
        "task.problems.train_size=16",
        "task.problems.test_size=2",
        f"model.path={model}",
        "rollout.prompts_per_step=2",
        "rollout.group_size=4",
        "rollout.max_new_tokens=32",
        "rollout.max_turns=1",
        "rollout.max_episode_tokens=32",
        "eval.interval=0",
        "progress=false",
        "tensorboard=false",
        "runtime.torch_threads=1",
        f"output_dir={tmp_path / 'runs'}",
        "run_name=nan",
        "steps=3",
    ]
    assert main(["train", *args]) == 0
    weights = sorted((tmp_path / "runs" / "nan").rglob("*.safetensors"))
    assert weights
    for path in weights:
        for name, value in load_file(path).items():
            assert torch.isfinite(value).all(), (path, name)
    for row in read_metrics(tmp_path / "runs" / "nan" / "metrics.jsonl"):
        assert all(math.isfinite(v) for v in row.values() if isinstance(v, float)), row
