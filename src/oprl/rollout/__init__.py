"""How samples are produced: rollout engines that return responses with their behaviour log-probs."""

from oprl.rollout.hf_engine import HFGenerateEngine, Rollout

__all__ = ["HFGenerateEngine", "Rollout"]
