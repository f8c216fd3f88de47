"""How samples are produced: rollout engines that return responses with their behaviour log-probs."""

from oprl.rollout.hf_engine import HFGenerateEngine, Rollout
from oprl.rollout.lean_engine import LeanEngine

ENGINES = {"lean": LeanEngine, "hf-generate": HFGenerateEngine}
"""``rollout.engine`` names: ``lean`` (own decode loop, prompts prefilled once per group) or ``hf-generate``."""

__all__ = ["ENGINES", "HFGenerateEngine", "LeanEngine", "Rollout"]
