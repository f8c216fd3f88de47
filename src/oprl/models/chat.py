"""Prompt encoding through the tokenizer's own chat template (never a hand-written format)."""

from __future__ import annotations


def encode_prompt(tokenizer, messages) -> list[int]:
    """Token ids of ``messages`` rendered with the chat template plus the assistant generation prompt.

    The template output already contains the model's special tokens, so the tokenizer must not add more.
    """
    text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False).input_ids
