"""How samples are produced: rollout engines that return responses with their behaviour log-probs.

The contract is ``oprl.rollout.base`` (``Rollout``, the ``Engine`` protocol, ``EngineCapabilities``, ``Switch``)
and the ``Sampling`` every engine is built with (``oprl.models.truncation``, re-exported here);
``ENGINES`` is the registry the ``rollout.engine`` config option names (its values are derived from these keys),
and ``capabilities(name)`` what the engine a name resolves to declares.
"""

from collections.abc import Callable

from oprl import plugins
from oprl.models.truncation import Sampling
from oprl.rollout.base import (
    NO_CAPABILITIES,
    Engine,
    EngineCapabilities,
    Rollout,
    Switch,
    TorchEngine,
    capabilities_of,
)
from oprl.rollout.hf_engine import HFGenerateEngine
from oprl.rollout.lean_engine import LeanEngine
from oprl.rollout.vllm_engine import VLLMEngine

ENGINES: dict[str, Callable[..., Engine]] = {"lean": LeanEngine, "hf-generate": HFGenerateEngine, "vllm": VLLMEngine}
"""``rollout.engine`` names: ``lean`` (own decode loop, prompts prefilled once per group), ``hf-generate``, or
``vllm`` (an in-process vLLM engine; vLLM is imported only when one is built)."""


def capabilities(name: str) -> EngineCapabilities:
    """What the engine ``rollout.engine=name`` declares (``EngineCapabilities``): a key of ``ENGINES``, an
    ``oprl.engines`` entry point or an import path, resolved as ``oprl.worker_parts.make_engine`` resolves it
    (``oprl.plugins``) but nothing is built, and vLLM is not imported. A plug-in that declares nothing gets
    ``NO_CAPABILITIES``; an unknown name is one ``OprlError`` line naming ``rollout.engine``."""
    return capabilities_of(plugins.resolve("engine", name, ENGINES, key="rollout.engine"))


def engines_with(capability: Callable[[EngineCapabilities], bool]) -> list[str]:
    """The built-in engine names whose capabilities satisfy ``capability`` (for error messages)."""
    return [name for name, engine in ENGINES.items() if capability(capabilities_of(engine))]


TRUNCATING_ENGINES = frozenset(engines_with(lambda c: c.exact_truncation))
"""The built-in engines declaring ``exact_truncation``: they sample with a truncating ``Sampling``
(``rollout.top_k``, ``rollout.top_p < 1``) by ``oprl.models.truncation``'s rule and record log-probs
renormalised over its kept set, so the trainer can rebuild that set exactly. Kept for the config check;
``capabilities(name).exact_truncation`` also answers for plug-ins."""

__all__ = [
    "ENGINES",
    "NO_CAPABILITIES",
    "TRUNCATING_ENGINES",
    "Engine",
    "EngineCapabilities",
    "HFGenerateEngine",
    "LeanEngine",
    "Rollout",
    "Sampling",
    "Switch",
    "TorchEngine",
    "VLLMEngine",
    "capabilities",
    "engines_with",
]
