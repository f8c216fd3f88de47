"""Signal health: one warning when a run's first steps carry nothing to learn from.

Group-relative advantages are ``A = r − baseline(group)``: a group whose K rewards are all equal gives
every response A = 0 (with ``std_normalize`` the same 0), so it adds no gradient. The trainer logs the
share of such groups per step (``adv/zero_groups_frac``) and the share of responses cut at
``rollout.max_new_tokens`` (``response/truncated_frac``). When, over the first ``WINDOW`` trainer steps,
the mean of either reaches ``THRESHOLD``, the run is almost surely not learning; ``SignalHealth`` writes
one line naming the cause and the setting to change, once per run. It reads the rows only: the numbers
come from the trainer, this never recomputes them.
"""

from __future__ import annotations

from collections.abc import Callable

WINDOW = 5
"""Trainer steps looked at (the first ones of the run, or of a resumed run)."""
THRESHOLD = 0.9
"""Mean share of zero-advantage groups, or of truncated responses, that triggers the warning."""


class SignalHealth:
    """``observe(row)`` for each metrics row in step order; ``warn`` gets at most one line."""

    def __init__(self, max_new_tokens: int, warn: Callable[[str], object], *, warm_started: bool):
        self.max_new_tokens, self.warn, self.warm_started = max_new_tokens, warn, warm_started
        self.zero: list[float] = []
        self.truncated: list[float] = []
        self.rewards: list[float] = []
        self.message: str | None = None
        """The warning written, if any."""

    def observe(self, row: dict) -> None:
        if "adv/zero_groups_frac" not in row or len(self.zero) >= WINDOW:
            return
        self.zero.append(row["adv/zero_groups_frac"])
        self.truncated.append(row.get("response/truncated_frac", 0.0))
        self.rewards.append(row.get("reward/mean", 0.0))
        if len(self.zero) == WINDOW:
            self.message = self.diagnose()
            if self.message:
                self.warn(self.message)

    def diagnose(self) -> str | None:
        """The warning for the steps seen, or None when they carry signal."""
        n = len(self.zero)
        zero, truncated = sum(self.zero) / n, sum(self.truncated) / n
        reward = sum(self.rewards) / n
        head = f"warning: no learning signal in the first {n} steps: "
        if truncated >= THRESHOLD:
            return (
                f"{head}{truncated:.0%} of responses were cut at rollout.max_new_tokens={self.max_new_tokens} "
                f"({zero:.0%} of groups had equal rewards, mean reward {reward:.3f}); raise rollout.max_new_tokens "
                "so that answers fit"
            )
        if zero >= THRESHOLD:
            start = "" if self.warm_started else ", or warm-start the model first (warmstart.pretrained=true)"
            return (
                f"{head}{zero:.0%} of groups had equal rewards (mean reward {reward:.3f}), so their advantages "
                f"are 0; check that the model's replies match the task's answer format (reward/format), "
                f"rollout.max_new_tokens={self.max_new_tokens}{start}"
            )
        return None
