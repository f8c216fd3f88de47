"""Loading a trainable policy (model + tokenizer) from ``model.path``.

``tiny`` is the embedded model (built and warm-started by ``oprl.runtime.warmstart``, passed in here as a
directory); anything else must be a local Hugging Face model directory.
"""

from __future__ import annotations

from pathlib import Path

import torch

from oprl.errors import OprlError


def load_pretrained(path: str | Path, *, dtype: str = "float32"):
    """``(model, tokenizer)`` from a Hugging Face directory, tokenizer set up for left-padded generation."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not Path(path).is_dir():
        raise OprlError(f"model.path: {str(path)!r} is neither 'tiny' nor a local model directory")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    return model, tokenizer
