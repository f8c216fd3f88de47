"""VCPO's per-response score norms in one pass (oprl.trainer.score_norms): the batched norms equal the
per-response loop's (``Inputs.looped_score_statistics``, one forward and backward per row) on the embedded tiny
model, on a Llama built from a config (grouped-query attention, untied head, biases), with LoRA, truncated
sampling, activation checkpointing and bfloat16 autocast; padded prompts and responses of different lengths and
loss-masked tokens included. A model the pass cannot handle exactly falls back to the loop, with a debug log."""

import logging

import pytest
import torch

from oprl.algorithms import resolve_preset
from oprl.algorithms.method import Method
from oprl.config import OptimConfig
from oprl.messages import Experience
from oprl.models.tiny import build_model, build_tokenizer
from oprl.models.truncation import Sampling
from oprl.trainer import score_norms
from oprl.trainer.inputs import loss_mask_of
from oprl.trainer.trainer import Trainer

RTOL = 1e-4


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def ragged_batch(tokenizer, seed=0, groups=3, k=4):
    """Prompts of different lengths (left padding), responses of 1-7 tokens (right padding), and rows whose
    loss mask drops tokens inside the response (a multi-turn row's environment tokens)."""
    rng = torch.Generator().manual_seed(seed)
    batch = []
    for g in range(groups):
        prompt = tokenizer(f"<|user|>{g * 37}+{g}=</s><|assistant|>", add_special_tokens=False).input_ids
        for i in range(k):
            length = int(torch.randint(0, 7, (1,), generator=rng))
            response = [*torch.randint(7, 40, (length,), generator=rng).tolist(), tokenizer.eos_token_id]
            loss_mask = None
            if i == 2 and len(response) > 2:
                loss_mask = [1] * len(response)
                loss_mask[1] = 0
            batch.append(
                Experience(
                    prompt_ids=prompt,
                    response_ids=response,
                    behavior_logprobs=(-torch.rand(len(response), generator=rng) * 3 - 1).tolist(),
                    reward=float(i == 0),
                    reward_components={},
                    group_id=g,
                    task_id=f"t{g}",
                    policy_version=0,
                    response_text="",
                    loss_mask=loss_mask,
                )
            )
    return batch


def make_trainer(model, tokenizer, micro_batch_size=256, sampling=None, **kwargs):
    return Trainer(
        model,
        pad_id=tokenizer.pad_token_id,
        method=Method.of(resolve_preset("vcpo"), max_response_tokens=8),
        optim=OptimConfig(lr=3e-4, micro_batch_size=micro_batch_size),
        sampling=sampling or Sampling(),
        **kwargs,
    )


def assert_batched_equals_loop(trainer, batch, rtol=RTOL, log_atol=1e-5):
    looped = trainer.inputs.looped_score_statistics(batch)
    batched = trainer.inputs.score_statistics(batch)
    assert trainer.inputs.scores.batched, "the batched pass fell back to the loop"
    assert trainer.inputs.scores.verified
    assert batched[0].tolist() == pytest.approx(looped[0].tolist(), abs=log_atol)
    assert batched[1].tolist() == pytest.approx(looped[1].tolist(), rel=rtol)
    assert all(p.grad is None for p in trainer.model.parameters())
    return batched


def tiny(tokenizer, **kwargs):
    return build_model(tokenizer, **({"hidden_size": 32, "num_layers": 2, "num_heads": 2, "seed": 0} | kwargs))


def test_tiny_model_in_chunks_equals_the_loop(tokenizer):
    """The embedded model (tied embedding and head: one parameter, two terms), in chunks of 5 rows."""
    trainer = make_trainer(tiny(tokenizer), tokenizer, micro_batch_size=5)
    trainer.step(ragged_batch(tokenizer))  # off the initial weights
    batch = ragged_batch(tokenizer, seed=1)
    assert len({len(e.prompt_ids) for e in batch}) > 1 and len({len(e.response_ids) for e in batch}) > 3
    _, norms = assert_batched_equals_loop(trainer, batch)
    assert (norms > 0).all()


def test_truncated_sampling_and_activation_checkpointing(tokenizer):
    """Top-k / temperature scoring as the sampler's; checkpointed layers recompute their forward in backward
    (the hooks ignore that recomputation)."""
    sampling = Sampling(temperature=0.7, top_k=9)
    trainer = make_trainer(tiny(tokenizer), tokenizer, sampling=sampling, activation_checkpointing=True)
    assert_batched_equals_loop(trainer, ragged_batch(tokenizer))


def test_bfloat16_autocast(tokenizer):
    """Under autocast both compute in bfloat16: equal to bfloat16's precision."""
    trainer = make_trainer(tiny(tokenizer), tokenizer, autocast=torch.bfloat16)
    assert_batched_equals_loop(trainer, ragged_batch(tokenizer), rtol=5e-2, log_atol=5e-2)


def test_llama_from_a_config(tokenizer):
    """A Hugging Face Llama from a config (no hub): grouped-query attention, untied head, attention and MLP
    biases (the linear layers' bias terms)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attention_bias=True,
        mlp_bias=True,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # biases start at 0: give their terms something to add
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, 0.1)
    assert_batched_equals_loop(make_trainer(model, tokenizer), ragged_batch(tokenizer))


def test_lora_adapters_only(tokenizer):
    """LoRA (peft): only the adapters train; the frozen base weights count in no norm, as in the loop."""
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        tiny(tokenizer), peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0)
    )
    with torch.no_grad():  # lora_B starts at 0, so lora_A's gradient would be 0 too
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)
    trainer = make_trainer(model, tokenizer)
    assert any(not p.requires_grad for p in model.parameters())
    assert_batched_equals_loop(trainer, ragged_batch(tokenizer))


def test_a_parameter_used_outside_its_module_falls_back_to_the_loop(tokenizer, caplog):
    """The first batch checks that the rows' gradients add up to the batch gradient: a parameter owned by a
    module whose forward the pass never sees (here the model's own, used inside the head) fails it, and the
    trainer takes the loop from then on, saying why in a debug log."""
    model = tiny(tokenizer, seed=1)
    model.register_parameter("head_scale", torch.nn.Parameter(torch.tensor(1.5)))
    head = model.lm_head
    head.forward = lambda x: torch.nn.functional.linear(x, head.weight) * model.head_scale
    trainer = make_trainer(model, tokenizer)
    batch = ragged_batch(tokenizer)
    expected = trainer.inputs.looped_score_statistics(batch)
    with caplog.at_level(logging.DEBUG, logger="oprl.trainer"):
        got = trainer.inputs.score_statistics(batch)
    assert not trainer.inputs.scores.batched
    assert "one forward and backward per response" in caplog.text and "do not add up" in caplog.text
    assert torch.equal(got[1], expected[1])


def test_a_flattened_token_layout_is_refused(tokenizer):
    """A watched module that sees tokens flattened across rows (as an MoE's expert dispatch does) is refused:
    its rows cannot be told apart."""
    model = tiny(tokenizer)
    mlp = model.model.layers[0].mlp
    inner = mlp.forward
    mlp.forward = lambda x: inner(x.reshape(-1, x.shape[-1])).reshape(x.shape)
    with pytest.raises(score_norms.Unsupported, match="first dimension is not the batch"):
        score_norms.score_statistics(model, ragged_batch(tokenizer), tokenizer.pad_token_id, Sampling(), loss_mask_of,
                                     chunk=256)  # fmt: skip
