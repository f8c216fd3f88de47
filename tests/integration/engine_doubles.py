"""A stand-in for an engine whose model runs in a process of its own (``rollout.engine_process=true``), for the
driver's side of a dead engine process without vLLM's start-up (tens of seconds per engine on CPU).

``DyingEngine`` samples exactly as the lean engine does. When the worker's call carries an ``engine`` fault
(``OPRL_FAULT=engine@step=N``: ``oprl.backends.faults`` sets ``OPRL_KILL_ENGINE`` in the explorer's process), its
next ``generate`` raises ``EngineDeadError`` as vLLM's client does once its engine process is gone: the worker
lives on, its engine is dead. The driver knows vLLM's error by its class name (``oprl.backends.failure.engine_died``),
so the class here carries that name without importing vLLM (a 10 s import in each worker process);
tests/backends/test_restart.py checks the same rule on vLLM's own class, and
tests/integration/test_self_healing.py kills a real vLLM engine process (``-m slow``)."""

import dataclasses
import os

from oprl.rollout.lean_engine import LeanEngine


class EngineDeadError(RuntimeError):
    """vLLM's ``vllm.v1.engine.exceptions.EngineDeadError``, by name."""


class DyingEngine(LeanEngine):
    capabilities = dataclasses.replace(LeanEngine.capabilities, engine_process=True)

    def __init__(self, model, tokenizer, *, engine_process: bool = False, **settings):
        super().__init__(model, tokenizer, **settings)
        self.dead = False

    def generate(self, *args, **kwargs):
        if os.environ.pop("OPRL_KILL_ENGINE", None):
            self.dead = True
        if self.dead:  # as vLLM's: every call after the death raises
            raise EngineDeadError("EngineCore encountered an issue. See stack trace (above) for the root cause.")
        return super().generate(*args, **kwargs)
