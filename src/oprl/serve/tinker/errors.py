"""What the Tinker server's modules share: ``UserError`` (a request the client must fix), ``WireError`` (a body
``wire.py`` cannot decode), ``NotFound`` (an id the caller may not see) and the checks of token ids and context
length that training and sampling both make."""

from __future__ import annotations


class UserError(ValueError):
    """A request the server refuses; the message starts with the field (HTTP 400, or a failed future)."""


class WireError(ValueError):
    """A request body the server cannot use (``wire.py``); the message starts with the field it is about."""


class NotFound(LookupError):
    """An id this caller may not see (unknown, or another key's): HTTP 404 naming the field."""


def check_tokens(tokens: list[int], vocab: int, where: str) -> None:
    bad = next((t for t in tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise UserError(f"{where}: token id {bad} is outside the vocabulary [0, {vocab})")


def base_of(model):
    """The transformers model under a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def context_of(model) -> int | None:
    """The model's context length (``max_position_embeddings``), None when it declares none."""
    return getattr(base_of(model).config, "max_position_embeddings", None)
