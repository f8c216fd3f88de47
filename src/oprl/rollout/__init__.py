"""How samples are produced: rollout engines that return responses with their behaviour log-probs.

The contract is ``oprl.rollout.base`` (``Rollout``, the ``Engine`` protocol); ``ENGINES`` is the registry the
``rollout.engine`` config option names (its values are derived from these keys).
"""

from collections.abc import Callable

from oprl.rollout.base import Engine, Rollout, TorchEngine
from oprl.rollout.hf_engine import HFGenerateEngine
from oprl.rollout.lean_engine import LeanEngine
from oprl.rollout.vllm_engine import VLLMEngine

ENGINES: dict[str, Callable[..., Engine]] = {"lean": LeanEngine, "hf-generate": HFGenerateEngine, "vllm": VLLMEngine}
"""``rollout.engine`` names: ``lean`` (own decode loop, prompts prefilled once per group), ``hf-generate``, or
``vllm`` (an in-process vLLM engine; vLLM is imported only when one is built)."""

TRUNCATING_ENGINES = frozenset(ENGINES)
"""Engines that sample with ``rollout.top_k`` / ``rollout.top_p < 1`` by ``oprl.models.truncation``'s rule and
record log-probs renormalised over its kept set, so the trainer can rebuild that set exactly (training with
truncation is refused for any other engine: a plug-in's rule is unknown)."""

__all__ = [
    "ENGINES",
    "TRUNCATING_ENGINES",
    "Engine",
    "HFGenerateEngine",
    "LeanEngine",
    "Rollout",
    "TorchEngine",
    "VLLMEngine",
]
