"""The evaluator role: the worker of ``mode=eval`` (one model, or a checkpoint's weights, evaluated once)."""
