"""The ``sync`` section of the run config: the off-policy schedule (docs/paper.md#lag-rule) and its modes, with
the rule that a setting the chosen mode does not read is refused rather than dropped.

Every field carries its default and meaning in the docstring under it (``oprl config --help`` prints them).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from oprl.errors import OprlError
from oprl.tasks.section import Section as _Section


class SyncConfig(_Section):
    """The off-policy schedule (docs/paper.md#lag-rule): step t trains on data from policy version
    v(t) = k*floor((t-1-m)/k) when t-1 >= m+k, else 0."""

    interval: int = Field(1, gt=0)
    """k: the rollout weights are refreshed every k trainer steps (1 = every step)."""
    offset: int = Field(0, ge=0)
    """m: the rollout side runs m steps ahead before its first refresh (0 = none)."""
    mode: Literal["scheduled", "async"] = "scheduled"
    """``scheduled`` = the deterministic schedule above (same seed => same metrics, on any backend);
    ``async`` = free-running: each batch is generated with the newest weights published so far (every k
    steps), and the explorer is paced (never ahead of what max_staleness allows; nothing is discarded)."""
    max_staleness: int = Field(1, ge=0)
    """sync.mode=async only: no batch is trained more than this many versions after the weights that made it
    (lag <= max_staleness). Must be >= interval - 1, since weights are published only every k steps. Default
    1: "one-step off-policy", the usual asynchronous setting (Trinity-RFT's fully async mode bounds it too).
    Under partial rollouts it bounds a response's oldest token (the version it started with)."""
    partial: bool = False
    """Partial rollouts (docs/runtime.md#partial-rollouts): the explorer takes newer weights between two decode
    steps and continues every unfinished response with them; each token records its version. mode=scheduled:
    version v(b)+k takes over batch b at decode step ``switch_step`` when the trainer reaches it before step b
    (deterministic); mode=async: the newest published version is taken as soon as it is posted. Needs an engine
    that declares the ``partial_kv`` mode (lean: keep or recompute; vllm: recompute; a plug-in: its
    ``capabilities``) and runtime.overlap=true."""
    switch_step: int = Field(8, gt=0)
    """partial, mode=scheduled: the decode step of a batch (counted over its generate calls: an episode's turns
    add up) at which the next version becomes active; the explorer waits there for it."""
    partial_kv: Literal["keep", "recompute"] = "keep"
    """partial: the cache of the tokens sampled before a switch: ``keep`` the stale keys/values (default, as
    slime/prime-rl/PipelineRL; no extra compute) or ``recompute`` the prefix under the new weights (one prefill)."""
    max_token_lag: int | None = Field(None, ge=0)
    """Tokens sampled more than this many versions before the trainer's weights leave the loss (context only);
    0 = on-policy tokens only (slime's --mask-offpolicy-in-partial-rollout). None = every token is trained."""

    @model_validator(mode="after")
    def _staleness_covers_interval(self) -> SyncConfig:
        if self.mode == "async" and self.max_staleness < self.interval - 1:
            raise OprlError(
                f"sync.max_staleness={self.max_staleness} must be >= sync.interval - 1 = {self.interval - 1}: "
                f"weights are published only every {self.interval} steps"
            )
        return self

    @model_validator(mode="after")
    def _every_setting_is_read(self) -> SyncConfig:
        """A setting that says what the lag or the switch is, and that the chosen mode ignores, is refused, never
        dropped: a staleness study whose lag silently is not the one it names is the worst result this project can
        give (issue #53: ``sync.mode=async sync.offset=4`` ran with lag <= 1). Inert leftovers are accepted:
        ``switch_step`` / ``partial_kv`` with ``sync.partial=false`` change nothing (an A/B of partial rollouts
        turns only ``partial`` off)."""
        ignored = self.ignored()
        if ignored:
            key, why = ignored[0]
            raise OprlError(f"sync.{key}={getattr(self, key)} is not read {why}")
        return self

    def effective_max_ready(self, max_ready: int | None) -> int:
        """How many batches explorers may work ahead of the trainer's next step, from ``buffer.max_ready``
        (None = this mode's default). Scheduled: 4; pacing only, since the schedule fixes every batch's version.
        Async: batch b is dispatched only while b <= completed + max_ready, with the newest version v <= completed,
        and trained at step b, so its lag b - 1 - v reaches at most max_ready - 1 (one step after a publication):
        the default follows, max_staleness + 1, and a smaller value is refused (issue #71: the old default 4
        silently held ``sync.max_staleness=8`` at lag 3)."""
        if self.mode != "async":
            return 4 if max_ready is None else max_ready
        needed = self.max_staleness + 1
        if max_ready is not None and max_ready < needed:
            raise OprlError(
                f"buffer.max_ready={max_ready} holds an async run's lag at {max_ready - 1}, below "
                f"sync.max_staleness={self.max_staleness}: set buffer.max_ready >= {needed} (or leave it unset: it "
                f"follows sync.max_staleness), or sync.max_staleness={max_ready - 1}"
            )
        return needed if max_ready is None else max_ready

    def describe(self) -> str:
        """The schedule as it is read, for headlines: ``k=1 m=4`` (scheduled), ``k=1 async, lag <= 1``."""
        if self.mode == "async":
            return f"k={self.interval} async, lag <= {self.max_staleness}"
        return f"k={self.interval} m={self.offset}"

    def label(self) -> str:
        """The schedule in a run's default name: ``k1-m4`` (scheduled), ``k1-async1`` (lag <= 1)."""
        return f"k{self.interval}-" + (f"async{self.max_staleness}" if self.mode == "async" else f"m{self.offset}")

    def ignored(self) -> list[tuple[str, str]]:
        """The settings changed from their defaults that this mode does not read: (key, why) pairs."""
        fields = type(self).model_fields
        changed = {key for key in fields if getattr(self, key) != fields[key].default}
        rules = [
            (
                "offset",
                self.mode == "async",
                "with sync.mode=async: an async run's lag is bounded by sync.max_staleness (set "
                f"sync.max_staleness={self.offset} for lag <= {self.offset}), or keep sync.mode=scheduled for an "
                f"exact lag of {self.offset} on every step",
            ),
            (
                "max_staleness",
                self.mode == "scheduled",
                "with sync.mode=scheduled: its lag is set exactly by sync.interval and sync.offset "
                "(docs/paper.md#lag-rule); set sync.mode=async for a bound",
            ),
            (
                "switch_step",
                self.partial and self.mode == "async",
                "with sync.mode=async: a partial async run takes each version as soon as it is posted",
            ),
        ]
        return [(key, why) for key, applies, why in rules if applies and key in changed]
