"""One experience = one sampled response with everything an off-policy trainer needs, and its schema.

Raw rewards are stored, never advantages: advantages are recomputed per group by the trainer, so the same
experiences can be trained with any preset. ``behavior_logprobs`` are the sampler's numbers, recorded once.
``batch_metrics`` summarises a batch of them (the explorer's rows of mode=explore and the trainer's rows).

Also what else travels between the roles: ``ExploreResult`` (an explorer's report next to a batch, with its
``Timing``), ``ScoreResult`` (the teacher's report next to a scored batch), ``Verdicts`` (the judge's answer to
an explorer's rows), ``TrainResult`` (the trainer's report of a step) and ``FlatWeights`` (the trainer's weights
snapshot on its way to the explorers). The driver reads control values (versions, clocks) from their
attributes; dicts of ``name -> float`` are only ever columns of ``metrics.jsonl``.
"""

from __future__ import annotations

import math
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
    """Version of the weights that generated it (0 = initial weights; s = after trainer step s); under partial
    rollouts the version it started with (its oldest token)."""
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
    behavior_versions: list[int] | None = None
    """Partial rollouts (``oprl.explorer.switcher``, ``oprl.trainer.staleness``): per response token, the policy
    version that sampled it (weights can change between two decode steps). None: every token is
    ``policy_version``'s."""
    teacher_logprobs: list[float] | None = None
    """Distillation (``oprl.teacher``): per response token, log pi_teacher of the sampled token under the sampling
    temperature (as ``behavior_logprobs``). None = no teacher scored this row."""
    top_k_ids: list[list[int]] | None = None
    """``rollout.record_top_k=K``: per response token, the ids of the K most likely tokens of the distribution it
    was drawn from, most likely first (``oprl.rollout.base.top_logprobs``). None = not recorded."""
    top_k_logprobs: list[list[float]] | None = None
    """Their log-probs under that distribution (the one of ``behavior_logprobs``: temperature, top-k and top-p
    applied; ``-inf`` outside the kept set), aligned with ``top_k_ids``."""

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
    for name in AGENT_COUNTS:  # agent episodes (oprl.episodes.agents): means per episode
        if any(name in e.extra for e in batch):
            out[f"episode/{name}_mean"] = sum(float(e.extra.get(name, 0.0)) for e in batch) / len(batch)
    for name in dict.fromkeys(n for e in batch for n in e.reward_components):  # truncated episodes have none
        out[f"reward/{name}"] = sum(e.reward_components.get(name, 0.0) for e in batch) / len(batch)
    return out


@dataclass
class Timing:
    """How one batch was generated (``Explorer.explore``)."""

    generate_s: float
    """Wall seconds of sampling (multi-turn: of the whole episodes, environment and scoring included)."""
    reward_s: float
    """Wall seconds of scoring the responses (0 for episodes: their rewards come with them)."""
    generated_tokens: float
    """Response tokens sampled (episodes: the tokens the policy wrote, ``sum(loss_mask)``)."""
    shaping: dict[str, float] = field(default_factory=dict)
    """Counts of the batch, summed over sampling rounds: ``dynamic/*`` under dynamic sampling
    (``oprl.explorer.shaping``), ``episode/lost`` for episodic tasks (``oprl.explorer.explorer``)."""
    switch_wait_s: float | None = None
    """Partial rollouts: wall seconds the batch waited at a scheduled switch for its version (inside
    ``generate_s``); None without ``sync.partial``."""
    judge_s: float | None = None
    """``judge.path``: seconds the judge computed the batch's verdicts (inside ``reward_s``); None without one."""

    def __add__(self, other: Timing) -> Timing:
        """Two sampling rounds of one batch together."""
        waits = [w for w in (self.switch_wait_s, other.switch_wait_s) if w is not None]
        judged = [j for j in (self.judge_s, other.judge_s) if j is not None]
        return Timing(
            self.generate_s + other.generate_s,
            self.reward_s + other.reward_s,
            self.generated_tokens + other.generated_tokens,
            {k: self.shaping.get(k, 0.0) + other.shaping.get(k, 0.0) for k in self.shaping | other.shaping},
            sum(waits) if waits else None,
            sum(judged) if judged else None,
        )


@dataclass(frozen=True)
class SwitchPlan:
    """How one batch may change weights mid-generation under partial rollouts, as the synchronizer decided it
    (``Synchronizer.switch_plan``); sent with the batch, carried out by ``oprl.explorer.switcher.Switcher``.

    Scheduled (``free=False``): wait for ``target`` at global decode step ``at_step`` (``target=None``: no
    switch). Free-running (``free=True``, ``sync.mode=async``): take any newer posted version, never past
    ``newest`` (= batch - 1: the trainer's weights when the batch's step trains)."""

    board: str
    target: int | None = None
    at_step: int = 0
    free: bool = False
    newest: int | None = None
    kv: str = "keep"
    """``sync.partial_kv``: the cache after a switch (``oprl.explorer.switcher.KV_SETTINGS``)."""


@dataclass
class ExploreResult:
    """What ``ExplorerWorker.explore`` reports next to a batch's experiences."""

    explorer: int
    batch: int
    version: int
    """The policy version the batch was sampled from."""
    timing: Timing
    sync_s: float
    """Seconds spent loading the weights sent with the call (0 when none were sent)."""
    summary: dict[str, float]
    """``batch_metrics`` of the experiences: the ``reward/*`` and ``response/*`` columns."""
    busy_s: float
    idle_s: float
    """The explorer's clock (``worker.Clock``) since it started: busy inside calls, idle between them."""


@dataclass
class ScoreResult:
    """What ``TeacherWorker.score`` reports next to a scored batch."""

    batch: int
    score_s: float
    """Seconds of this call's prefill (0 when every row already had its teacher log-probs)."""
    busy_s: float
    idle_s: float
    """The teacher's clock (``worker.Clock``) since it started: busy inside calls, idle between them."""


JudgeRow = tuple[str, str, str | None]
"""One reply as the judge reads it: ``(prompt, completion, reference)`` (``judge.template``'s placeholders)."""


@dataclass
class Verdicts:
    """What the judge (``JudgeWorker.judge``) answers for a batch of ``JudgeRow``s, one entry per row."""

    scores: list[float]
    """The judge's score s of each row (0.0 where the verdict had no number)."""
    unparsed: list[bool]
    """Whether each row's verdict had no number (``reward/<name>_unparsed``)."""
    seconds: float
    """Seconds the judge computed this batch (``perf/judge_s``)."""


@dataclass
class TrainResult:
    """What the trainer worker reports after a step (``TrainerRole.train``)."""

    metrics: dict[str, float]
    """The step's trainer columns of ``metrics.jsonl`` (``loss/*``, ``adv/*``, ``batch/*``, ``lag/*``, ...)."""
    version: int
    """The trainer's policy version after the step (= the step)."""
    start_version: int
    """The newest policy version a response of the batch started with (in scheduled mode the driver checks
    it is the version the schedule assigned: ``Synchronizer.scheduled_version``)."""
    busy_s: float
    idle_s: float
    """The trainer's clock (``worker.Clock``) since it started: busy inside calls, idle between them."""


class FlatWeights(dict):
    """``name -> tensor``, every tensor a view of one flat buffer per dtype; pickles as those buffers plus
    the layout. Through a process pipe that is one shared-memory segment per dtype instead of one per tensor
    (torch hands each segment's file descriptor over with a round trip of its own: ~15 ms per snapshot of the
    20-tensor tiny model, on the critical path of every overlapped step)."""

    buffers: dict[torch.dtype, torch.Tensor]
    layout: list[tuple[str, torch.dtype, int, tuple[int, ...]]]
    """(name, dtype, offset into that dtype's buffer, shape) per tensor."""

    @classmethod
    def copy_of(cls, tensors: dict[str, torch.Tensor], device=None) -> FlatWeights:
        layout: list[tuple[str, torch.dtype, int, tuple[int, ...]]] = []
        sizes: dict[torch.dtype, int] = {}
        for name, tensor in tensors.items():
            layout.append((name, tensor.dtype, sizes.get(tensor.dtype, 0), tuple(tensor.shape)))
            sizes[tensor.dtype] = sizes.get(tensor.dtype, 0) + tensor.numel()
        first = next(iter(tensors.values()), None)
        device = device or (first.device if first is not None else "cpu")
        buffers = {dtype: torch.empty(size, dtype=dtype, device=device) for dtype, size in sizes.items()}
        weights = cls.from_buffers(buffers, layout)
        for name, tensor in tensors.items():
            weights[name].copy_(tensor)
        return weights

    @classmethod
    def from_buffers(cls, buffers: dict, layout: list) -> FlatWeights:
        weights = cls(
            (name, buffers[dtype][offset : offset + math.prod(shape)].view(shape))
            for name, dtype, offset, shape in layout
        )
        weights.buffers, weights.layout = buffers, layout
        return weights

    def __reduce__(self):
        return FlatWeights.from_buffers, (self.buffers, self.layout)
