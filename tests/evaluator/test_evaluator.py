"""``Evaluator`` (mode=eval) evaluates with the trainer's function, on ``model.path`` or a checkpoint's weights."""

import json

import pytest
import torch
from safetensors.torch import save_model

from oprl.config import load_config
from oprl.episodes.evaluation import evaluation_row
from oprl.evaluator.evaluator import Evaluator
from oprl.models.tiny import build_model, build_tokenizer
from oprl.tasks import build_task
from oprl.worker_parts import load_model, make_engine

OVERRIDES = ["eval.num_problems=6", "eval.batch_size=6", "rollout.max_new_tokens=6"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A small random model saved as a Hugging Face directory (what ``model.path`` takes)."""
    path = tmp_path_factory.mktemp("model")
    tokenizer = build_tokenizer()
    build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=5).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def _numbers(row: dict[str, float]) -> dict[str, float]:
    return {key: value for key, value in row.items() if key != "perf/eval_s"}  # timing is not a result


def test_evaluator_gives_the_numbers_of_evaluation_row_on_the_same_model(model_dir):
    config = load_config(None, OVERRIDES)
    evaluator = Evaluator(config, model_dir)
    model, tokenizer = load_model(config, model_dir)
    engine = make_engine(config, model, tokenizer)
    expected = evaluation_row(config, engine, build_task(config.task), tokenizer, 3)
    got = evaluator.evaluate(3)
    assert got.keys() == expected.keys() and "eval/accuracy" in got
    assert _numbers(got) == _numbers(expected)
    assert _numbers(evaluator.evaluate(3)) == _numbers(got)  # seeded by the step: the same step, the same numbers


def _checkpoint(directory, model, step: int):
    (directory / "trainer").mkdir(parents=True)
    save_model(model, str(directory / "trainer" / "model.safetensors"))
    (directory / "state.json").write_text(json.dumps({"step": step}))
    return directory


def test_load_checkpoint_loads_the_trainer_weights_and_returns_the_step(model_dir, tmp_path):
    config = load_config(None, OVERRIDES)
    evaluator = Evaluator(config, model_dir)
    before = _numbers(evaluator.evaluate(1))
    other, _ = load_model(config, model_dir)
    with torch.no_grad():  # another policy: every weight moved
        for parameter in other.parameters():
            parameter.add_(torch.randn_like(parameter, generator=torch.Generator().manual_seed(0)) * 0.5)
    assert evaluator.load_checkpoint(str(_checkpoint(tmp_path / "step-000007", other, 7))) == 7
    for name, tensor in other.state_dict().items():
        assert torch.equal(evaluator.model.state_dict()[name], tensor), name
    after = _numbers(evaluator.evaluate(1))
    assert after != before  # the engine samples from the loaded weights (a random model: response_length moves)
    same, _ = load_model(config, model_dir)
    assert evaluator.load_checkpoint(str(_checkpoint(tmp_path / "step-000002", same, 2))) == 2
    assert _numbers(evaluator.evaluate(1)) == before  # back to the original weights: the original numbers
