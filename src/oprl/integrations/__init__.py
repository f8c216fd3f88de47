"""oprl's algorithms inside other trainers: ``oprl.integrations.trl`` (TRL's ``GRPOTrainer``).

Each integration imports its library lazily and only the pure math of ``oprl.algorithms``: the losses, and the
learning-rate schedule's formulas (``oprl.algorithms.lr_schedule``), which ``grpo_schedule`` / ``verl_schedule`` map
to theirs.
"""
