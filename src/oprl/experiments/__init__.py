"""Experiments: grids of runs (``sweep``), paper-style figures (``curves``) and markdown reports (``report``).

These sit on top of the runtime and talk to it only through run directories (``config.yaml``,
``metrics.jsonl``, ``summary.json``) and the ``oprl train`` command, so they work on any run ever made.
"""
