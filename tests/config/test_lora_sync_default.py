"""The default of ``model.lora_sync`` (issue #72): unset under LoRA, vllm on a CPU device serves the policy merged
(its CPU LoRA kernels sampled 3.2x slower than merged weights over a SmolLM2 step: benchmarks/results/lora_step.json),
every other engine and vllm on CUDA as adapters; a value given always wins; the adapter-slot refusal applies only
when adapter is what resolves; the run announces a CPU default in one line. Config only: nothing is built."""

import pytest

from oprl.config import load_config
from oprl.config.sections import LoraConfig, ModelConfig
from oprl.errors import OprlError
from oprl.worker_parts import lora_serving

NOTICE = (
    "model.lora_sync: merged (rollout.engine=vllm on CPU: its LoRA kernels sample 3.2x slower than merged weights, "
    "benchmarks/results/lora_step.json); set model.lora_sync=adapter to override"
)

# (engine, device, model.lora_sync given) -> the mode a LoRA policy is served in.
TABLE = [
    ("lean", "cpu", None, "adapter"),
    ("lean", "cuda", None, "adapter"),
    ("hf-generate", "cpu", None, "adapter"),
    ("hf-generate", "cuda:1", None, "adapter"),
    ("vllm", "cpu", None, "merged"),
    ("vllm", "cuda", None, "adapter"),
    ("vllm", "cuda:0", None, "adapter"),
    # A value given wins on every engine and device (lean and hf-generate refuse merged when built: tested in
    # tests/rollout/test_lora_sync.py).
    ("vllm", "cpu", "adapter", "adapter"),
    ("vllm", "cuda", "merged", "merged"),
    ("vllm", "cuda", "adapter", "adapter"),
    ("vllm", "cpu", "merged", "merged"),
    ("lean", "cpu", "merged", "merged"),
    ("hf-generate", "cuda", "adapter", "adapter"),
]


@pytest.mark.parametrize(("engine", "device", "given", "resolved"), TABLE)
def test_each_engine_and_device_resolves_the_mode(engine, device, given, resolved):
    model = ModelConfig(device=device, lora=LoraConfig(r=4), lora_sync=given)
    assert model.lora_sync_for(engine) == resolved
    expected = NOTICE if (engine, device, given) == ("vllm", "cpu", None) else None
    assert model.lora_sync_notice(engine) == expected  # announced only where the CPU default replaced adapter


def test_a_full_fine_tune_has_no_mode_and_no_notice():
    model = ModelConfig(device="cpu")
    assert model.lora_sync_for("vllm") is None and model.lora_sync_notice("vllm") is None


@pytest.mark.parametrize("cuda", [True, False])
def test_device_auto_resolves_as_the_model_loader_does(cuda, monkeypatch):
    """``auto`` is cuda when torch sees a CUDA device (``oprl.models.loading.resolve_device``), else cpu."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    model = ModelConfig(device="auto", lora=LoraConfig(r=4))
    assert model.on_cuda() is cuda
    assert model.lora_sync_for("vllm") == ("adapter" if cuda else "merged")
    assert model.lora_sync_for("vllm", cuda=not cuda) == ("merged" if cuda else "adapter")  # the caller's device wins


def test_the_worker_resolves_by_the_device_its_engine_samples_on():
    """``make_engine`` passes the model's own device; the config's device is the fallback."""
    config = load_config(None, ["model.lora.r=4", "rollout.engine=vllm", "sync.offset=2"])
    assert lora_serving(config) == ("merged", 3)
    assert lora_serving(config, cuda=False) == ("merged", 3)
    assert lora_serving(config, cuda=True) == ("adapter", 3)
    assert lora_serving(load_config(None, ["model.lora.r=4", "sync.offset=2"]), cuda=False) == ("adapter", 3)


def test_the_slot_refusal_applies_only_where_adapter_resolves():
    """vLLM holds 16 adapters: sync.offset=16 keeps 17 versions live. Unset on a CPU resolves to merged (one model:
    no bound); given, or on CUDA, adapter is refused in one line."""
    lag = ["model.lora.r=4", "rollout.engine=vllm", "sync.offset=16"]
    assert load_config(None, lag).model.lora_sync is None  # merged on this CPU: nothing to refuse
    line = r"^model\.lora_sync=adapter: sync\.offset=16 keeps 17 policy versions live .* at most 16 adapters"
    with pytest.raises(OprlError, match=line):
        load_config(None, [*lag, "model.lora_sync=adapter"])
    with pytest.raises(OprlError, match=line):
        load_config(None, [*lag, "model.device=cuda"])
    load_config(None, [*lag, "model.device=cuda", "model.lora_sync=merged"])
    # The same check on the section, for each device: CUDA resolves adapter, CPU merged.
    config = load_config(None, lag)
    with pytest.raises(OprlError, match=line):
        config.model.check_lora_serving(config.sync, "vllm", 16, cuda=True)
    config.model.check_lora_serving(config.sync, "vllm", 16, cuda=False)


def test_the_option_help_states_the_default_and_its_measurement():
    from oprl.config.loading import help_lines

    text = "\n".join(help_lines(["model.lora_sync"]))
    assert "merged" in text and "on a CPU" in text and "benchmarks/results/lora_step.json" in text


def test_a_plug_in_engine_declares_its_own_cpu_default(tmp_path):
    """The rule reads ``EngineCapabilities``, not engine names: a plug-in that declares ``lora_sync_cpu`` gets it
    on a CPU (its line without a reason when it gives none), one that serves merged only defaults to merged."""
    (tmp_path / "engines.py").write_text(
        "from oprl.rollout import EngineCapabilities, LeanEngine\n\n"
        "class CpuMerged(LeanEngine):\n"
        "    capabilities = EngineCapabilities(lora_sync=('adapter', 'merged'), lora_sync_cpu='merged')\n\n"
        "class MergedOnly(LeanEngine):\n"
        "    capabilities = EngineCapabilities(lora_sync=('merged',))\n"
    )
    cpu_merged, merged_only = (f"{tmp_path / 'engines.py'}:{name}" for name in ("CpuMerged", "MergedOnly"))
    model = ModelConfig(device="cpu", lora=LoraConfig(r=4))
    assert model.lora_sync_for(cpu_merged) == "merged" and model.lora_sync_for(cpu_merged, cuda=True) == "adapter"
    assert model.lora_sync_notice(cpu_merged) == (
        f"model.lora_sync: merged (rollout.engine={cpu_merged} on CPU); set model.lora_sync=adapter to override"
    )
    assert model.lora_sync_for(merged_only) == "merged" and model.lora_sync_notice(merged_only) is None
