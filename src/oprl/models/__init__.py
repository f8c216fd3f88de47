"""Hugging Face glue: the embedded tiny model, model loading, and trainer-side log-probs."""

TINY_MAX_POSITIONS = 128
"""The embedded tiny model's context (``max_position_embeddings``): prompt plus reply, in characters. Here, not
in ``oprl.models.tiny``, so that config validation and the checks made before a run starts read it without
importing transformers."""
