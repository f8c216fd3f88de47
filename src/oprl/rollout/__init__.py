"""How samples are produced: rollout engines that return responses with their behaviour log-probs."""

from oprl.rollout.hf_engine import HFGenerateEngine, Rollout
from oprl.rollout.lean_engine import LeanEngine
from oprl.rollout.vllm_engine import VLLMEngine

ENGINES = {"lean": LeanEngine, "hf-generate": HFGenerateEngine, "vllm": VLLMEngine}
"""``rollout.engine`` names: ``lean`` (own decode loop, prompts prefilled once per group), ``hf-generate``, or
``vllm`` (an in-process vLLM engine; vLLM is imported only when one is built)."""

__all__ = ["ENGINES", "HFGenerateEngine", "LeanEngine", "Rollout", "VLLMEngine"]
