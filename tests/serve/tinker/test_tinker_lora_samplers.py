"""LoRA sampling clients of saved checkpoints (``save_weights_for_sampler`` + ``create_sampling_client(model_path=)``)
share one base module per base model and adapter shape: the server loads the base once and switches only the adapter
tensors between samplers (``TinkerModels._path_host``). Through the SDK, each of two samplers of two versions samples
what an independently merged model of its version gives (transformers + peft ``merge_and_unload``), whatever order
their calls come in."""

import numpy as np
import pytest
import torch
from tinker_server import TINY, datum

tinker = pytest.importorskip("tinker")
types = tinker.types

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
"""Every module the server adapts by default (train_attn, train_mlp, train_unembed all on)."""


def _merged(model_dir, directory, rank):
    """The checkpoint's adapters on a fresh base, merged into its weights: W + (α/r)·B·A, α = 32."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    # The server adapts lm_head as its own delta (the input embedding it is tied to stays the base's): untie, so
    # that merging into the head leaves the embedding alone.
    base.lm_head.weight = torch.nn.Parameter(base.get_input_embeddings().weight.detach().clone())
    base.config.tie_word_embeddings = False
    config = LoraConfig(r=rank, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM")
    adapted = get_peft_model(base, config)
    missing = adapted.load_state_dict(load_file(directory / "weights.safetensors"), strict=False)
    assert not missing.unexpected_keys
    return adapted.merge_and_unload().eval()


def _logprobs(model, prompt, tokens):
    """log π(tokens[i] | prompt + tokens[:i]) under ``model``, float32."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return logits.log_softmax(-1).gather(-1, torch.tensor(tokens)[:, None])[:, 0].numpy()


def test_two_lora_samplers_share_the_base_and_sample_their_own_merged_versions(running, service):
    client = service.create_lora_training_client(base_model=TINY, rank=4, seed=3).result()
    tokens = client.get_tokenizer().encode("12+34=46")
    first = client.save_weights_for_sampler("lora-v0").result().path
    data = [datum(tokens, weights=[1.0] * (len(tokens) - 1))]
    for _ in range(3):  # the adapters' B starts at 0: a few steps make the versions differ
        client.forward_backward(data, "cross_entropy")
        client.optim_step(types.AdamParams(learning_rate=0.05)).result()
    second = client.save_weights_for_sampler("lora-v1").result().path
    samplers = [service.create_sampling_client(model_path=path).result() for path in (first, second)]

    backend = running.server.backend
    hosts_before = len(backend.hosts)
    prompt = tokens[:4]
    params = types.SamplingParams(max_tokens=6, seed=11, stop=[])
    results = {}
    for which in (1, 0, 1, 0):  # every call switches the adapters in the one host
        result = samplers[which].sample(types.ModelInput.from_ints(prompt), 2, params).result()
        if which in results:  # the same seed on the same version: the same tokens after a switch
            assert [s.tokens for s in result.sequences] == [s.tokens for s in results[which].sequences]
        results[which] = result
    assert len(backend.hosts) - hosts_before <= 1  # both versions on one base module
    assert {backend.path_keys[first]} == {backend.path_keys[second]}

    references = [_merged(running.model_dir, backend.checkpoint(path)[0], rank=4) for path in (first, second)]
    differ = 0.0
    for which, reference in enumerate(references):
        for sequence in results[which].sequences:
            expected = _logprobs(reference, prompt, sequence.tokens)
            np.testing.assert_allclose(sequence.logprobs, expected, atol=1e-4)
            other = _logprobs(references[1 - which], prompt, sequence.tokens)
            differ = max(differ, float(np.abs(other - expected).max()))
    assert differ > 1e-2  # the two versions are different policies: the check above could tell them apart
