"""Run health from the trainer's rows: one warning when a run's first steps carry nothing to learn from
(``SignalHealth``), one when the data drifts out of reach of the policy (``EssWatch``, below).

Group-relative advantages are ``A = r − baseline(group)``: a group whose K rewards are all equal gives
every response A = 0 (with ``std_normalize`` the same 0), so it adds no gradient. The trainer logs the
share of such groups per step (``adv/zero_groups_frac``) and the share of responses cut at
``rollout.max_new_tokens`` (``response/truncated_frac``).

The rule: over the first ``WINDOW`` trainer steps, the mean share of zero-advantage groups reaches
``THRESHOLD`` (fewer than 1 group in 10 carries a gradient), and the run does not distil (a teacher's per-token
signal does not depend on the rewards). Then ``SignalHealth`` writes one line, once per run, naming the cause
and the setting to change: replies cut at ``rollout.max_new_tokens`` when most are cut (``TRUNCATED``), else
the answer format, the length and the warm start. Truncation alone is no warning: a run whose replies are
mostly cut but whose groups still differ learns (measured in #53: 90 % cut, 72 % of groups with signal,
0.125 -> 0.450). It reads the rows only: the numbers come from the trainer, this never recomputes them.
"""

from __future__ import annotations

from collections.abc import Callable

WINDOW = 5
"""Trainer steps looked at (the first ones of the run, or of a resumed run)."""
THRESHOLD = 0.9
"""Mean share of zero-advantage groups that triggers the warning."""
TRUNCATED = 0.5
"""Mean share of cut responses above which the warning names rollout.max_new_tokens as the cause."""


class SignalHealth:
    """``observe(row)`` for each metrics row in step order; ``warn`` gets at most one line."""

    def __init__(
        self,
        max_new_tokens: int,
        warn: Callable[[str], object],
        *,
        warm_started: bool,
        distills: bool = False,
        ess_advice: str = "a lower optim.lr",
    ):
        """``distills``: the run learns from a teacher's per-token log-probs (``algorithm.distill_coef > 0``),
        which carry signal whatever the rewards: no warning. ``ess_advice``: the end of ``EssWatch``'s line."""
        self.max_new_tokens, self.warn, self.warm_started = max_new_tokens, warn, warm_started
        self.distills = distills
        self.zero: list[float] = []
        self.truncated: list[float] = []
        self.rewards: list[float] = []
        self.message: str | None = None
        """The warning written, if any."""
        self.ess = EssWatch(warn, ess_advice)
        """The second rule: the importance weights' effective sample size (``EssWatch``)."""

    def observe(self, row: dict) -> None:
        self.ess.observe(row)
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
        """The warning for the steps seen (the module docstring's rule), or None when they carry signal."""
        n = len(self.zero)
        zero, truncated = sum(self.zero) / n, sum(self.truncated) / n
        reward = sum(self.rewards) / n
        if zero < THRESHOLD or self.distills:
            return None
        head = f"warning: no learning signal in the first {n} steps: {zero:.0%} of groups had equal rewards "
        if truncated >= TRUNCATED:
            return (
                f"{head}(mean reward {reward:.3f}), so their advantages are 0, and {truncated:.0%} of responses "
                f"were cut at rollout.max_new_tokens={self.max_new_tokens}; raise rollout.max_new_tokens so that "
                "answers fit"
            )
        start = "" if self.warm_started else ", or warm-start the model first (warmstart.pretrained=true)"
        return (
            f"{head}(mean reward {reward:.3f}), so their advantages are 0; check that the model's replies match "
            f"the task's answer format (reward/format), rollout.max_new_tokens={self.max_new_tokens}{start}"
        )


ESS_LEVEL = 0.7
"""The mean of ``rho/ess`` over the last ``ESS_STEPS`` trainer steps below which ``EssWatch`` warns."""
ESS_STEPS = 5
"""Steps averaged: one step's ESS is noisy (a few stale tokens move it), five are not."""


class EssWatch:
    """A sign of an off-policy collapse: ``rho/ess``, the normalised effective sample size (Σρ)²/(N·Σρ²)
    of the batch's token importance weights (``oprl.algorithms.effective_sample_size``), averaged over the last
    ``ESS_STEPS`` steps, falls below ``ESS_LEVEL``. On-policy it is 1 (an fp32 sampler); it falls as the trained
    policy drifts from the one that sampled the data, which an unregularised loss lets happen without bound (VCPO,
    arXiv 2602.17616, watches the same signal). One line, once per run; ``first_step`` records when.

    The level was set on the arena's runs (docs/metrics.md, "rho/ess"): on the embedded task the 5-step mean stays
    above 0.83 for GRPO at lags 4, 16 and offline and for REINFORCE at lag 4 (0.78 for OAPL at lag 4, whose
    loss of accuracy there is not a drift of the weights), and falls below 0.7 by step 17 for
    REINFORCE at lag 16 and offline and OAPL at lag 16 and offline. The token-level ESS, not the sequence one: a
    response's ratio Π_t ρ_t spreads with its length even on a healthy run (SmolLM2 at lag 4: ~0.5 per sequence,
    ~0.97 per token). It is not early there: the embedded model's collapses show in an evaluation every 2 steps
    3-5 steps before it (docs/metrics.md, "The ESS warning")."""

    def __init__(self, warn: Callable[[str], object], advice: str = "a lower optim.lr"):
        """``advice``: what keeps the ESS up in this run (``ess_advice``), ending the warning."""
        self.warn, self.advice = warn, advice
        self.recent: list[float] = []
        self.first_step: int | None = None

    def observe(self, row: dict) -> None:
        if "rho/ess" not in row or self.first_step is not None:
            return
        self.recent = [*self.recent[-(ESS_STEPS - 1) :], row["rho/ess"]]
        mean = sum(self.recent) / len(self.recent)
        if len(self.recent) == ESS_STEPS and mean < ESS_LEVEL:
            self.first_step = int(row.get("step", 0))
            self.warn(
                f"warning: the importance weights' effective sample size rho/ess averaged {mean:.2f} over the last "
                f"{ESS_STEPS} steps (step {self.first_step}, below {ESS_LEVEL}): the trained policy has drifted far "
                f"from the one that sampled the data, as in an off-policy collapse; {self.advice} keeps it up"
            )


def ess_advice(config) -> str:
    """What keeps ``rho/ess`` up in the run of ``config`` (a ``RunConfig``, its algorithm resolved), for
    ``EssWatch``'s line: a remedy for its loss (a clipped loss for an unclipped one, a narrower band for a clipped
    one), for its data (fresher: a smaller offset, interval or staleness; mode=offline's data never refresh, so
    fewer steps on them) and always a lower learning rate; never a setting the run already has (issue #71: an
    offline REC-OneSide-NoIS run was told to use rec-oneside-nois and a smaller sync.offset)."""
    from oprl.runtime.synchronizer import Synchronizer

    algorithm, sync = config.algorithm, Synchronizer.of(config, explorers=0)  # the schedule as the run reads it
    schedule = {"offset": (sync.offset, 0), "interval": (sync.interval, 1)}  # (value, its on-policy value)
    stale = [f"sync.{key}={value}" for key, (value, fresh) in schedule.items() if value > fresh]
    remedies = []
    if algorithm.clip_mode in (None, "none"):
        remedies.append(f"a clipped loss (algorithm.preset=rec-oneside-nois or grpo; this run: {algorithm.preset})")
    elif algorithm.clip_mode in ("one-side", "two-side", "ring"):
        remedies.append(
            f"a narrower clip band (algorithm.eps_low={algorithm.eps_low:g}, algorithm.eps_high={algorithm.eps_high:g})"
        )
    elif algorithm.clip_mode == "mask":
        remedies.append(
            f"a narrower mask (algorithm.mask_low={algorithm.mask_low:g}, mask_high={algorithm.mask_high:g})"
        )
    if config.mode == "offline":
        remedies.append("fewer steps on this fixed data (mode=offline: every step moves away from its sampler)")
    elif sync.free_running:
        remedies.append(f"a smaller sync.max_staleness={sync.max_staleness}")
    elif stale:
        remedies.append("a smaller " + " or ".join(stale))
    else:  # on-policy: the ratio is the sampler's log-probs against the trainer's, not a drift
        remedies.append("a sampler whose log-probs match the trainer's (this run is on-policy: k=1, m=0)")
    remedies.append(f"a lower optim.lr={config.optim.lr:g}")
    return ", ".join(remedies[:-1]) + " or " + remedies[-1]
