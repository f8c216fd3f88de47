"""The algorithm as one typed value (``oprl.algorithms.spec``): every knob is declared once, as a ``knob(...)`` field
of a stage dataclass, and the defaults table, the range checks, the config's fields, help text and groups, and the
formulas' keyword defaults all come from that one declaration."""

import ast
import inspect
import math
import re
from pathlib import Path

import pytest

import oprl
from oprl.algorithms import ALGORITHM_DEFAULTS, KNOBS, PRESETS, Algorithm, SettingError, resolve_preset
from oprl.algorithms import spec as spec_module
from oprl.algorithms.spec import FIELDS, STAGES, knob_names
from oprl.config import load_config
from oprl.config.algorithm import AlgorithmConfig
from oprl.errors import OprlError

SRC = Path(oprl.__file__).parent
OUTSIDE = {  # a number outside each declared range
    spec_module.POSITIVE.text: 0.0,
    spec_module.NON_NEGATIVE.text: -1.0,
    spec_module.SHARE.text: 1.5,
    spec_module.RATE.text: 0.0,
    spec_module.ABOVE_ONE.text: 1.0,
    spec_module.COUNT.text: 0,
    spec_module.NON_NEGATIVE_INT.text: -1,
}


def test_every_config_field_default_and_range_comes_from_the_spec():
    """AlgorithmConfig is ``preset`` plus one field per knob: its help text is the knob's meaning, its default None
    (the preset's value) or, for a run knob, the knob's default; the defaults table is the knobs' defaults."""
    assert list(AlgorithmConfig.model_fields) == ["preset", *KNOBS]
    for name, knob in KNOBS.items():
        field = AlgorithmConfig.model_fields[name]
        assert field.description == " ".join(knob.meaning.split()), name
        assert field.default == (None if knob.in_preset else FIELDS[name].default), name
    assert {name: FIELDS[name].default for name, knob in KNOBS.items() if knob.in_preset} == ALGORITHM_DEFAULTS
    assert all(set(settings) == set(ALGORITHM_DEFAULTS) for settings in PRESETS.values())
    grouped = [name for heading, names in AlgorithmConfig.GROUPS.items() if heading != "preset" for name in names]
    assert sorted(grouped) == sorted(KNOBS) and len(grouped) == len(set(grouped))


def test_each_knob_is_a_field_of_exactly_one_stage():
    names = [name for stage in STAGES for name in knob_names(stage)]
    assert len(names) == len(set(names)) == len(KNOBS)
    assert Algorithm().settings() == {name: FIELDS[name].default for name in KNOBS}


def _class_fields(tree: ast.Module) -> list[tuple[str, str]]:
    return [
        (node.name, item.target.id)
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        for item in node.body
        if isinstance(item, ast.AnnAssign)
        and isinstance(item.target, ast.Name)
        and "Tensor" not in ast.unparse(item.annotation)  # a result (GroupAdvantages.baseline), not a setting
    ]


def test_no_module_declares_a_knob_again():
    """The places that used to repeat a knob (a config field, a second dataclass, a defaults dict, a keyword default
    written as a literal) declare none: in ``oprl.algorithms`` and the config's algorithm part the only class
    fields named like a knob are the stages', and a formula's keyword named like a knob takes its default from the
    stage (``Advantages.tau``), never a literal."""
    stage_names = {stage.__name__ for stage in STAGES}
    config = [SRC / "config" / name for name in ("algorithm.py", "run.py", "loading.py", "choices.py")]
    for path in [*sorted((SRC / "algorithms").glob("*.py")), *config]:  # (other sections have a judge's weight)
        tree = ast.parse(path.read_text())
        for owner, name in _class_fields(tree):
            assert name not in KNOBS or (path.name == "spec.py" and owner in stage_names), (path.name, owner, name)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and path.parent.name == "algorithms":
                keywords = zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True)
                for arg, value in keywords:
                    literal = isinstance(value, ast.Constant) and arg.arg in KNOBS and value.value is not None
                    assert not literal, (path.name, node.name, arg.arg)
    assert not (SRC / "algorithms" / "defaults.py").read_text().count("knob(")


@pytest.mark.parametrize("name", [name for name, knob in KNOBS.items() if knob.range is not None])
def test_each_declared_range_is_checked_by_the_resolver_and_the_config(name):
    bad = OUTSIDE[KNOBS[name].range.text]
    preset = "bapo" if name == "dual_clip" else "aspo" if name == "entropy_eps" else "grpo"
    with pytest.raises(SettingError, match=f"{name} must be {re.escape(KNOBS[name].range.text)}") as caught:
        Algorithm.of(preset, {name: bad})
    assert caught.value.key == name
    with pytest.raises(OprlError, match=f"algorithm.{name}"):
        load_config(None, [f"algorithm.preset={preset}", f"algorithm.{name}={bad}"])


@pytest.mark.parametrize("name", [name for name in KNOBS if FIELDS[name].type == "bool"])
def test_a_boolean_knob_refuses_anything_else(name):
    with pytest.raises(SettingError, match=f"{name} must be true or false"):
        Algorithm.of("grpo", {name: "yes"})


def test_an_optional_knob_may_be_unset_and_says_so():
    assert Algorithm.of("bapo-dual", {"dual_clip": None}).loss.dual_clip is None
    with pytest.raises(SettingError, match=r"dual_clip must be > 1 or unset, got 0.5"):
        Algorithm.of("bapo-dual", {"dual_clip": 0.5})
    with pytest.raises(SettingError, match="kondo_window must be an integer >= 1"):
        Algorithm.of("dg-kondo", {"kondo_window": 2.5})
    with pytest.raises(SettingError, match="eps_low must be >= 0"):
        Algorithm.of("grpo", {"eps_low": math.nan})


def test_algorithm_of_is_the_one_resolver():
    """The preset's values, the overrides on top, the run knobs' defaults; every former entry point agrees."""
    algorithm = Algorithm.of("rec-oneside-nois", {"eps_high": 2.0, "kl_coef": 0.1})
    assert (algorithm.loss.clip_mode, algorithm.loss.eps_high, algorithm.loss.weight) == ("one-side", 2.0, "none")
    assert algorithm.reference.kl_coef == 0.1 and algorithm.needs.reference_every == 1
    for preset in PRESETS:
        assert Algorithm.of(preset).settings(in_preset=True) == PRESETS[preset] == resolve_preset(preset)
    config = load_config(None, ["algorithm.preset=rec-oneside-nois", "algorithm.eps_high=2.0", "algorithm.kl_coef=0.1"])
    assert {name: getattr(config.algorithm, name) for name in KNOBS} == algorithm.settings()
    with pytest.raises(SettingError, match="unknown preset 'grpoo'"):
        Algorithm.of("grpoo")
    with pytest.raises(SettingError, match="unknown algorithm setting 'kl_coef'"):
        resolve_preset("grpo", kl_coef=0.1)  # the integrations' dict has no run knobs, as before
    with pytest.raises(TypeError, match="kl_coeff"):
        Algorithm.of("grpo", kl_coeff=0.1)


def test_dr_grpo_and_the_teacher_fill_the_stages_fields_that_are_not_knobs():
    assert Algorithm.of("dr-grpo", max_response_tokens=48).loss.normalizer == 48.0
    assert Algorithm.of("grpo", max_response_tokens=48).loss.normalizer is None
    assert Algorithm.of("distill", teacher_logprob_floor=-5.0).distill.logprob_floor == -5.0


def test_the_spec_imports_no_other_module_of_oprl_at_import_time():
    """The formula modules read their defaults from it, so it sits at the bottom of the package."""
    tree = ast.parse(inspect.getsource(spec_module))
    top = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
    assert not [node for node in top if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("oprl")]
