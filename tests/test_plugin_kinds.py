"""Every plug-in kind beside tasks and engines (tests/tasks/test_plugins.py): loss variants (clip mode, weight,
the other choice settings) and rewards resolve through oprl.plugins: the live registry, an installed entry
point, an import path; anything else is one line naming the key."""

import json
import textwrap
from pathlib import Path

import pytest
import torch

from oprl.algorithms import REGISTRIES, LossParams, policy_loss
from oprl.cli import main
from oprl.config import algorithm_of, load_config
from oprl.errors import OprlError
from oprl.tasks import DatasetTask
from oprl.tasks.rewards.user import canonical_spec
from recipes import install_package

ARITHMETIC_TRAIN = Path(__file__).resolve().parents[1] / "examples" / "arithmetic_train.jsonl"

VARIANTS = textwrap.dedent(
    '''
    def only_positive(ratio, advantages, params):
        """M = 1 on the tokens of responses with A > 0."""
        return (advantages > 0).expand_as(ratio)


    def halved(ratio, advantages, params):
        """w = 1/2 on every token."""
        return 0.5 * ratio.new_ones(ratio.shape)


    def exact(prompt, completion, reference, **row):
        return float(completion.strip() == str(reference))


    NOT_A_FUNCTION = 3
    '''
)


@pytest.fixture(autouse=True)
def _registries_restored():
    """A plug-in joins its registry in the process that resolves it: put the built-ins back after each test."""
    saved = {key: dict(registry) for key, registry in REGISTRIES.items()}
    yield
    for key, registry in REGISTRIES.items():
        registry.clear()
        registry.update(saved[key])


@pytest.fixture
def variants(tmp_path):
    path = tmp_path / "variants.py"
    path.write_text(VARIANTS)
    return path


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """``variants_pkg`` on sys.path (and PYTHONPATH, for the reward processes) with a dist-info declaring an entry
    point in ``oprl.weights`` and one in ``oprl.rewards``."""
    entry = "[oprl.weights]\nhalf = variants_pkg:halved\n\n[oprl.rewards]\nexact-answer = variants_pkg:exact\n"
    site = install_package(tmp_path / "site", "variants_pkg", VARIANTS, entry, monkeypatch)
    monkeypatch.setenv("PYTHONPATH", str(site))
    return site


def _grad(**settings) -> torch.Tensor:
    logprobs = torch.full((2, 3), -1.0, requires_grad=True)
    loss, _ = policy_loss(
        logprobs, logprobs.detach(), torch.tensor([1.0, -1.0]), torch.ones(2, 3), LossParams.of(settings)
    )
    loss.backward()
    assert logprobs.grad is not None
    return logprobs.grad


def test_a_clip_mode_by_file_path_validates_and_reaches_policy_loss(variants):
    spec = f"{variants}:only_positive"
    config = load_config(None, [f"algorithm.clip_mode={spec}"])
    assert config.algorithm.clip_mode == spec  # the name as given: config.yaml records it, a resume resolves it
    grad = _grad(**{k: v for k, v in algorithm_of(config).settings().items() if k in ("clip_mode", "weight")})
    assert torch.all(grad[0] != 0) and torch.all(grad[1] == 0)  # the negative response is masked


def test_a_weight_by_entry_point_validates_and_reaches_policy_loss(installed):
    config = load_config(None, ["algorithm.weight=half", "algorithm.clip_mode=none"])
    assert config.algorithm.weight == "half"
    assert torch.allclose(_grad(weight="half"), 0.5 * _grad(weight="none"))


def test_a_variant_registered_at_run_time_passes_the_config():
    REGISTRIES["ratio_level"]["flat"] = lambda log_ratio, mask: log_ratio * 0  # what a notebook would do
    assert load_config(None, ["algorithm.ratio_level=flat"]).algorithm.ratio_level == "flat"


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("algorithm.weight=importance-sampl", "algorithm.weight: unknown weight 'importance-sampl' (did you mean"),
        ("algorithm.clip_mode=nowhere/v.py:f", "algorithm.clip_mode: file 'nowhere/v.py' not found"),
        ("algorithm.loss_agg=oprl.algorithms:nothing", "algorithm.loss_agg: 'oprl.algorithms' has no function"),
        ("algorithm.drop=oprl.algorithms:policy_loss", "algorithm.drop: 'oprl.algorithms:policy_loss' is not an"),
    ],
)
def test_an_unknown_or_broken_variant_is_one_line_exit_2(setting, expected, tmp_path, capsys):
    assert main(["train", setting, f"output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err, err


def test_a_variant_that_is_not_a_function_is_one_line(variants):
    with pytest.raises(OprlError, match=r"algorithm\.clip_mode: .*NOT_A_FUNCTION' is not a function"):
        load_config(None, [f"algorithm.clip_mode={variants}:NOT_A_FUNCTION"])


def test_a_plugin_clip_mode_trains_in_worker_processes(small_overrides, variants, tmp_path):
    """The trainer process receives the config, not this process's registry: it resolves the name again."""
    spec = f"{variants}:only_positive"
    run = ["train", *small_overrides, "steps=2", "run_name=variant", "runtime.workers=processes"]
    assert main([*run, f"algorithm.clip_mode={spec}"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "runs" / "variant" / "metrics.jsonl").read_text().splitlines()]
    assert len([r for r in rows if "loss/total" in r]) == 2


def test_a_reward_by_entry_point_scores_and_keys_like_its_import_path(installed):
    task = DatasetTask(train_file=str(ARITHMETIC_TRAIN), train_size=2, reward="exact-answer")
    try:
        problems = task.problems("train")
        scored = task.score(problems, [problems[0].answer, "no"])
    finally:
        task.rewards.close()
    assert [r.total for r in scored] == [1.0, 0.0]
    assert task.rewards.specs == ["variants_pkg:exact"] and "exact" in scored[0].components
    assert canonical_spec("exact-answer") == canonical_spec("variants_pkg:exact")
    with pytest.raises(OprlError, match=r"task\.reward: unknown reward 'exact-answr' \(did you mean 'exact-answer'"):
        DatasetTask(train_file=str(ARITHMETIC_TRAIN), train_size=2, reward="exact-answr")
