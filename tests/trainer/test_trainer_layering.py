"""The trainer runs an algorithm without knowing it (#69): trainer/trainer.py names no method, no registry key and no
algorithm setting, so a method is a change in ``oprl.algorithms`` (its ``Method`` and stages), never in the trainer.
And ``Method`` says what a step computes for it."""

import ast
from dataclasses import fields
from pathlib import Path

import pytest

from oprl.algorithms import ADVANTAGE_KEYS, ALGORITHM_DEFAULTS, PRESETS, REGISTRIES, resolve_preset
from oprl.algorithms.method import AdvantageParams, Method
from oprl.config import AlgorithmConfig

TRAINER = Path(__file__).resolve().parents[2] / "src" / "oprl" / "trainer" / "trainer.py"

METHOD_WORDS = {
    "vcpo", "ess", "weighted", "baseline", "distill", "teacher", "kl", "entropy_coef", "proximal", "reference",
    "red", "kondo", "delight", "gate", "window", "score", "scores", "advantage_kwargs", "distill_kwargs", "settings",
}  # fmt: skip
"""Words of an identifier (split at ``_``) that name a method, one of its terms or a settings dict."""


def names_and_strings(tree: ast.AST) -> tuple[set[str], set[str]]:
    names, strings = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, (ast.arg, ast.keyword)) and node.arg:
            names.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[-1])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            strings.add(node.value)
    return names, strings


def test_the_trainer_names_no_method_registry_key_or_setting():
    tree = ast.parse(TRAINER.read_text())
    for node in ast.walk(tree):  # docstrings are prose, not code
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            body.pop(0)
    names, strings = names_and_strings(tree)
    settings = set(ALGORITHM_DEFAULTS) | set(AlgorithmConfig.model_fields)
    keys = set(PRESETS) | {key for registry in REGISTRIES.values() for key in registry}
    assert not names & settings, f"trainer.py names algorithm settings: {sorted(names & settings)}"
    worded = sorted(name for name in names if set(name.lower().split("_")) & METHOD_WORDS or name in METHOD_WORDS)
    assert not worded, f"trainer.py names a method or one of its terms: {worded}"
    assert not strings & (keys | settings), f"trainer.py holds registry keys or settings: {sorted(strings & keys)}"


def test_the_advantage_settings_are_group_advantages_keywords():
    assert tuple(f.name for f in fields(AdvantageParams)) == ADVANTAGE_KEYS


@pytest.mark.parametrize(
    ("preset", "overrides", "needs"),
    [
        ("grpo", {}, {}),
        ("decoupled-ppo", {}, {"proximal": True}),
        ("vcpo", {}, {"score_statistics": True, "log_weights": True}),
        ("distill", {}, {"teacher": True}),
        ("dg-kondo", {}, {"screen": True}),
        ("reinforce-sc", {}, {"top_k": True}),
        ("dppo-tv-topk", {}, {"top_k": True}),
        ("grpo", {"kl_coef": 0.1}, {"reference_every": 1}),
        ("grpo", {"log_ref_kl_every": 3}, {"reference_every": 3}),
        ("grpo", {"entropy_coef": 0.01}, {"entropy_grad": True}),
    ],
)
def test_a_method_says_what_a_step_computes_for_it(preset, overrides, needs):
    method = Method.of(resolve_preset(preset), max_response_tokens=8, **overrides)
    expected = {"proximal": False, "screen": False, "score_statistics": False, "teacher": False, "reference_every": 0,
                "entropy_grad": False, "log_weights": False} | needs  # fmt: skip
    assert {name: getattr(method.needs, name) for name in expected} == expected
    assert method.needs.reference(3) == (expected["reference_every"] in (1, 3))
    assert not method.needs.reference(2) or expected["reference_every"] == 1


def test_an_unknown_knob_is_refused_by_name():
    with pytest.raises(TypeError, match="kl_coeff"):
        Method.of(resolve_preset("grpo"), kl_coeff=0.1)


def test_dr_grpo_gets_the_response_budget_as_its_fixed_normaliser():
    assert Method.of(resolve_preset("dr-grpo"), max_response_tokens=48).loss.normalizer == 48.0
    assert Method.of(resolve_preset("grpo"), max_response_tokens=48).loss.normalizer is None
