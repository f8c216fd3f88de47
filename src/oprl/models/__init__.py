"""Hugging Face glue: the embedded tiny model, model loading, and trainer-side log-probs."""
