"""The embedded model is an ordinary Hugging Face model: Auto* classes load it, the chat template works."""

from transformers import AutoModelForCausalLM, AutoTokenizer

from oprl.models.tiny import build_model, build_tokenizer


def test_tokenizer_is_character_level_with_chat_template():
    tokenizer = build_tokenizer()
    ids = tokenizer("12+3=", add_special_tokens=False).input_ids
    assert len(ids) == 5 and tokenizer.decode(ids) == "12+3="
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "1+1="}], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert tokenizer.convert_ids_to_tokens(ids) == ["<|user|>", "1", "+", "1", "=", "</s>", "<|assistant|>"]


def test_save_and_load_with_auto_classes(tmp_path):
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    assert 1e5 <= sum(p.numel() for p in model.parameters()) <= 2e6
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    loaded_tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.config.model_type == "llama"
    assert (
        loaded_tokenizer("7*8=", add_special_tokens=False).input_ids
        == tokenizer("7*8=", add_special_tokens=False).input_ids
    )
    assert loaded_tokenizer.chat_template == tokenizer.chat_template
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert (a == b).all(), name
