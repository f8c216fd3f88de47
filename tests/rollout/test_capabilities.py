"""Engines declare what they can do (``EngineCapabilities``), and do what they declare: every registered engine
follows a switch in exactly the ``partial_kv`` modes it declares and refuses the others in one line, takes
``prefix_reuse=`` only where declared, and seeds rows only where declared (``exact_truncation`` is checked per
declaring engine in test_truncated_sampling.py). ``capabilities(name)`` reads a built-in or a plug-in without
building it or importing vLLM, and ``make_engine`` reads it instead of the name.

Models have the shape of test_engines.py, so one vLLM engine serves these files."""

import copy
import subprocess
import sys
from pathlib import Path

import pytest

from oprl.checkpoint.board import post_weights
from oprl.config import load_config
from oprl.errors import OprlError
from oprl.explorer.switcher import KV_SETTINGS, Switcher
from oprl.models.chat import encode_prompt
from oprl.models.tiny import build_model
from oprl.rollout import (
    ENGINES,
    NO_CAPABILITIES,
    TRUNCATING_ENGINES,
    EngineCapabilities,
    Sampling,
    Switch,
    capabilities,
    engines_with,
)
from oprl.worker_parts import make_engine
from recipes import install_package

RECIPES = Path(__file__).parents[1] / "recipes.py"
SWITCH, LIMIT = 3, 8


def _prompts(tokenizer, texts=("1+2=", "35+47-9=", "7=", "123*4-56+7=")):
    return [encode_prompt(tokenizer, [{"role": "user", "content": t}]) for t in texts]


def _engine(name, model, tokenizer, **settings):
    if name == "vllm":
        pytest.importorskip("vllm")
    return ENGINES[name](model, tokenizer, **settings)


def test_the_built_in_engines_declare_this_table():
    assert {name: capabilities(name) for name in ENGINES} == {
        "lean": EngineCapabilities(
            partial_kv=("keep", "recompute"), prefix_reuse=True, exact_truncation=True, top_logprobs=True
        ),
        "hf-generate": EngineCapabilities(exact_truncation=True, top_logprobs=True),
        "vllm": EngineCapabilities(
            partial_kv=("recompute",),
            prefix_reuse=True,
            row_seeds=True,
            exact_truncation=True,
            engine_process=True,
            lora_sync=("adapter", "merged"),
            lora_sync_cpu="merged",
            lora_sync_cpu_why="its LoRA kernels sample 3.2x slower than merged weights, "
            "benchmarks/results/lora_step.json",
            lora_versions=16,
            top_logprobs=True,
        ),
    }
    assert set(engines_with(lambda c: c.exact_truncation)) == TRUNCATING_ENGINES
    assert engines_with(lambda c: c.partial) == ["lean", "vllm"]


def test_capabilities_read_the_class_without_building_it_or_importing_vllm():
    code = (
        "import sys; from oprl.rollout import capabilities; c = capabilities('vllm'); "
        "print(c.partial_kv, c.row_seeds, 'vllm' in sys.modules, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[0] == "('recompute',) True False False"


def test_capabilities_of_a_plug_in_by_import_path_and_what_is_refused(tmp_path):
    assert capabilities(f"{RECIPES}:SwitchingLoop") == EngineCapabilities(partial_kv=("keep", "recompute"))
    assert capabilities(f"{RECIPES}:OwnLoop") == NO_CAPABILITIES  # a TorchEngine declaring nothing
    assert capabilities(f"{RECIPES}:counting_engine") == NO_CAPABILITIES  # a factory function: nothing declared
    assert capabilities("oprl.rollout.lean_engine:LeanEngine") == capabilities("lean")
    (tmp_path / "engines.py").write_text("class Boasting:\n    capabilities = {'partial_kv': ('keep',)}\n")
    with pytest.raises(OprlError, match=r"^rollout.engine: Boasting.capabilities is a dict, not an oprl"):
        capabilities(f"{tmp_path / 'engines.py'}:Boasting")
    with pytest.raises(OprlError, match=r"^rollout.engine: unknown engine 'warp-drive'"):
        capabilities("warp-drive")


def test_capabilities_of_a_plug_in_by_entry_point(tmp_path, monkeypatch):
    source = (
        "from oprl.rollout import EngineCapabilities, TorchEngine\n\n"
        "class Declared(TorchEngine):\n    capabilities = EngineCapabilities(partial_kv=('keep',), row_seeds=True)\n"
    )
    install_package(tmp_path, "caps_engine", source, "[oprl.engines]\ndeclared = caps_engine:Declared\n", monkeypatch)
    assert capabilities("declared") == EngineCapabilities(partial_kv=("keep",), row_seeds=True)


@pytest.mark.parametrize("kv", KV_SETTINGS)
@pytest.mark.parametrize("name", sorted(ENGINES))
def test_an_engine_follows_a_switch_exactly_in_the_modes_it_declares(policy, name, kv, tmp_path):
    model, tokenizer = policy
    engine = _engine(name, copy.deepcopy(model), tokenizer, max_new_tokens=LIMIT)
    newer = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, seed=4)
    post_weights(tmp_path / "board", 1, dict(newer.named_parameters()))
    switch = Switcher(engine, tmp_path / "board", 0, at_step=SWITCH, target=1, kv=kv)
    assert isinstance(switch, Switch)
    declared = capabilities(name).partial_kv
    if kv not in declared:
        with pytest.raises(OprlError) as refused:
            engine.generate(_prompts(tokenizer), seed=5, switch=switch)
        message = str(refused.value)
        assert "\n" not in message
        assert ("sync.partial_kv=" if declared else "rollout.engine:") in message, message
        assert switch.version == 0  # refused before any weights were loaded
        return
    rollout = engine.generate(_prompts(tokenizer), seed=5, switch=switch)
    assert rollout.behavior_versions is not None
    for response, versions in zip(rollout.response_ids, rollout.behavior_versions, strict=True):
        assert versions == [0] * min(SWITCH, len(response)) + [1] * max(len(response) - SWITCH, 0)
    assert max(len(r) for r in rollout.response_ids) > SWITCH  # the switch happened inside the call


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_prefix_reuse_is_taken_where_declared(policy, name):
    """Declared: the engine is built with the options and counts its prefill (lean reuses a repeated call's
    prompts here; vLLM's block-sized reuse is tests/integration/test_prefix_reuse.py's). Undeclared: the
    constructor does not take them, which is why ``make_engine`` passes them only where declared."""
    model, tokenizer = policy
    if not capabilities(name).prefix_reuse:
        with pytest.raises(TypeError):
            ENGINES[name](model, tokenizer, prefix_reuse=True, kv_cache_gb=1.0)
        return
    engine = _engine(name, model, tokenizer, max_new_tokens=4, prefix_reuse=True, kv_cache_gb=1.0)
    prompts = _prompts(tokenizer)
    engine.generate(prompts, seed=1)
    engine.generate(prompts, seed=2)
    assert engine.prompt_tokens == 2 * sum(len(p) for p in prompts)
    if name == "lean":
        assert engine.prefill_tokens < engine.prompt_tokens


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_rows_are_seeded_from_row_seeds_only_where_declared(policy, name):
    model, tokenizer = policy
    engine = _engine(name, model, tokenizer, max_new_tokens=6, sampling=Sampling(2.0))
    first = _prompts(tokenizer, ["1+2=", "7="])
    other = _prompts(tokenizer, ["1+2=", "35+47-9="])
    a = engine.generate(first, seed=1, row_seeds=[11, 12]).response_ids
    b = engine.generate(other, seed=1, row_seeds=[11, 13]).response_ids
    c = engine.generate(first, seed=1, row_seeds=[21, 22]).response_ids
    if capabilities(name).row_seeds:
        assert a[0] == b[0]  # row 0's seed alone decides its sample, whatever the other rows are
        assert a != c
    else:
        assert a == c  # one generator seeded `seed` for the call: row seeds are ignored


def test_make_engine_and_the_partial_check_read_capabilities_not_names(policy, tmp_path):
    model, tokenizer = policy
    config = load_config(None, [f"rollout.engine={RECIPES}:SwitchingLoop", "rollout.prefix_reuse=true"])
    built = make_engine(config, model, tokenizer)
    assert type(built.engine).__name__ == "SwitchingLoop" and built.capabilities.partial_kv == ("keep", "recompute")
    lean = make_engine(load_config(None, ["rollout.prefix_reuse=true"]), model, tokenizer)
    assert lean.prefixes is not None and lean.prefixes.reuse  # declared: prefix_reuse handed over
    own = make_engine(
        load_config(None, [f"rollout.engine={RECIPES}:OwnLoop", "rollout.prefix_reuse=true"]), model, tokenizer
    )
    assert own.prefixes is None  # not declared: built without it (its constructor would refuse the keyword)
    partial = ["sync.partial=true", "sync.offset=1"]
    load_config(None, [*partial, f"rollout.engine={RECIPES}:SwitchingLoop"])  # declared: accepted at load
    with pytest.raises(OprlError, match=r"^sync.partial=true needs rollout.engine=lean or vllm .*OwnLoop"):
        load_config(None, [*partial, f"rollout.engine={RECIPES}:OwnLoop"])
    (tmp_path / "engines.py").write_text(
        "from recipes import SwitchingLoop\nfrom oprl.rollout import EngineCapabilities\n\n"
        "class RecomputeOnly(SwitchingLoop):\n    capabilities = EngineCapabilities(partial_kv=('recompute',))\n"
    )
    with pytest.raises(
        OprlError, match=r"RecomputeOnly needs sync.partial_kv=recompute: .* keep needs rollout.engine=lean$"
    ):
        load_config(None, [*partial, f"rollout.engine={tmp_path / 'engines.py'}:RecomputeOnly"])
