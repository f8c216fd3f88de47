"""evaluate(): k samples per test problem, and the pass@1 / pass@k / majority it reports (closed form)."""

import pytest

from oprl.episodes.evaluation import evaluate
from oprl.models.tiny import build_tokenizer
from oprl.rollout.base import Rollout, Sampling
from oprl.tasks.arithmetic import ArithmeticTask


class ScriptedEngine:
    """Answers row r right iff ``right(r)``; records the prompts of each call."""

    def __init__(self, problems, right):
        self.problems, self.right, self.calls = problems, right, []

    def weights_changed(self):
        pass

    def generate(self, prompt_ids, *, seed, sampling=None, batch_size=None):
        self.calls.append(prompt_ids)
        k = len(prompt_ids) // len(self.problems)
        texts = [self.problems[r // k].answer if self.right(r) else "-1" for r in range(len(prompt_ids))]
        ids = [[1, 2, 3]] * len(texts)
        return Rollout(ids, [[0.0] * 3] * len(texts), texts, [False] * len(texts))


@pytest.fixture(scope="module")
def setup():
    task = ArithmeticTask(train_size=20, test_size=4, seed=3)
    return task, list(task.problems("test")), build_tokenizer()


# rows of 4 problems x 3 samples: problem 0 all right, 1 two of three, 2 one of three, 3 none
RIGHT = {0, 1, 2, 3, 4, 6}


def test_k_samples_per_problem_give_mean_pass_at_k_and_majority(setup):
    task, problems, tokenizer = setup
    engine = ScriptedEngine(problems, lambda r: r in RIGHT)
    result = evaluate(engine, task, tokenizer, num_problems=4, sampling=Sampling(), seed=0, samples=3)
    assert result["accuracy"] == pytest.approx(6 / 12)  # (3 + 2 + 1 + 0) / 12
    assert result["pass_at_k"] == pytest.approx(3 / 4)  # problems 0, 1, 2
    assert result["majority"] == pytest.approx(2 / 4)  # problems 0 (3/3) and 1 (2/3)
    assert result["num_problems"] == 4.0
    (prompts,) = engine.calls
    assert len(prompts) == 12 and prompts[0] == prompts[1] == prompts[2] != prompts[3]  # problem-major rows


def test_one_sample_is_the_plain_pass_at_1(setup):
    task, problems, tokenizer = setup
    engine = ScriptedEngine(problems, lambda r: r in {0, 2})
    result = evaluate(engine, task, tokenizer, num_problems=4, sampling=Sampling(), seed=0)
    assert result["accuracy"] == pytest.approx(2 / 4)
    assert "pass_at_k" not in result and "majority" not in result
    assert len(engine.calls[0]) == 4
