"""One experience = one sampled response with everything an off-policy trainer needs, and its schema.

Raw rewards are stored, never advantages: advantages are recomputed per group by the trainer, so the same
experiences can be trained with any preset. ``behavior_logprobs`` are the sampler's numbers, recorded once.
``batch_metrics`` summarises a batch of them (the explorer's rows of mode=explore and the trainer's rows).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Experience:
    prompt_ids: list[int]
    """Prompt token ids (chat template applied, no padding)."""
    response_ids: list[int]
    """Sampled response token ids, EOS included when generated."""
    behavior_logprobs: list[float]
    """log pi_behaviour of each response token under the sampling distribution (temperature applied)."""
    reward: float
    """Total reward."""
    reward_components: dict[str, float]
    """Named parts of the reward (e.g. correct, format)."""
    group_id: int
    """Responses to the same prompt in the same batch share a group id (advantages are relative within it)."""
    task_id: str
    """Identifier of the problem in its task."""
    policy_version: int
    """Version of the weights that generated it (0 = initial weights; s = after trainer step s)."""
    response_text: str
    """Decoded response, special tokens removed."""
    truncated: bool = False
    """Generation hit the length limit before EOS."""
    use_count: int = 0
    """How many trainer steps have consumed it."""
    extra: dict = field(default_factory=dict)
    """Free-form annotations (e.g. the generating explorer, an episode's turns)."""
    loss_mask: list[int] | None = None
    """Multi-turn episodes: per response token, 1 if the model sampled it (trained on), 0 if the environment
    wrote it (context only; its behaviour log-prob is 0). None = every token is the model's (single turn)."""

    @property
    def model_tokens(self) -> int:
        """Response tokens the model produced (the ones the loss covers)."""
        return len(self.response_ids) if self.loss_mask is None else sum(self.loss_mask)


AGENT_COUNTS = ("segments", "dropped_tokens", "refused_requests", "agent_failed")
"""Per-episode counts of agent episodes (``task.name=agent``), logged as ``episode/<name>_mean``."""


def batch_metrics(batch: list[Experience]) -> dict[str, float]:
    """``reward/*``, ``response/*`` (and ``episode/*`` for multi-turn rows) of one batch: means over its rows
    (float32, as the trainer's tensors), reward components averaged over every row (0 where absent)."""
    rewards = torch.tensor([e.reward for e in batch], dtype=torch.float32)  # (N,)
    lengths = torch.tensor([len(e.response_ids) for e in batch], dtype=torch.float32)  # (N,)
    out = {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std(unbiased=False)),
        "response/length_mean": float(lengths.mean()),
        "response/length_max": float(lengths.max()),
        "response/truncated_frac": sum(e.truncated for e in batch) / len(batch),
        "response/tokens": float(lengths.sum()),
    }
    if any(e.loss_mask is not None for e in batch):
        out["response/model_tokens"] = float(sum(e.model_tokens for e in batch))
        out["episode/turns_mean"] = sum(e.extra.get("turns", 1) for e in batch) / len(batch)
    for name in AGENT_COUNTS:  # agent episodes (oprl.explorer.agents): means per episode
        if any(name in e.extra for e in batch):
            out[f"episode/{name}_mean"] = sum(float(e.extra.get(name, 0.0)) for e in batch) / len(batch)
    for name in dict.fromkeys(n for e in batch for n in e.reward_components):  # truncated episodes have none
        out[f"reward/{name}"] = sum(e.reward_components.get(name, 0.0) for e in batch) / len(batch)
    return out
