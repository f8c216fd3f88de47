"""oprl's algorithms inside other trainers: ``oprl.integrations.trl`` (TRL's ``GRPOTrainer``).

Each integration imports its library lazily and only the pure math of ``oprl.algorithms``.
"""
