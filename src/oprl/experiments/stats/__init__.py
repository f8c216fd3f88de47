"""What the seeds of a sweep can and cannot tell apart: the statistics of ``oprl report``.

Pure functions on numbers (no runs, no files), the distributions from ``scipy.stats``. A sweep's design is
method × setting × seed; runs with the same seed label share their prompts and their evaluation samples (common
random numbers: ``eval.seed``), so two cells are compared *paired*, seed by seed. One module a question, each
with its formulas in its docstring:

- ``difference``: one cell (mean, sample SD, t-interval) and one contrast a − b with its own noise (paired t,
  Welch t), tested two- or one-sided: the default of every finding, tier and loss against lag 0.
- ``pooled``: the pooled σ̂ of the additive model method + seed, a declared choice only (``report.noise:
  pooled``), and Brown–Forsythe's test of its one-noise-level assumption printed beside it.
- ``comparison``: many methods at once: Holm over a family, the tier of the best (Hsu's MCB), leave-one-out
  robustness.
- ``design``: what a design can detect: power, the minimum detectable difference, the seeds a difference needs.
- ``proportion``: a fraction of runs (k of n collapsed) with its exact Clopper–Pearson interval.

Every name is importable from here (``stats.contrast``, ``from oprl.experiments.stats import compare``).

Not here: reading runs (``results``), laying the numbers out (``report``, ``tiers``, ``findings``).
"""

import importlib.util

from oprl.errors import OprlError

# scipy is an extra (the default job never needs it, and it is 35 MB of a fresh install): whatever imports these
# statistics (oprl sweep, report, the findings) stops here with one line instead of a traceback.
if importlib.util.find_spec("scipy") is None:
    raise OprlError("oprl sweep / report need scipy for their statistics: pip install 'oprl[stats]'")

from oprl.experiments.stats.comparison import Comparison, compare, flips, holm, identical_groups, with_the_best
from oprl.experiments.stats.design import POWER, design_df, design_se, mde, power, seeds_needed
from oprl.experiments.stats.difference import (
    ALPHA,
    PAIRED,
    POOLED,
    WELCH,
    Cell,
    Difference,
    contrast,
    describe,
    paired,
    welch,
)
from oprl.experiments.stats.pooled import PooledSigma, difference, pooled_sd, residual_noise, spread_test
from oprl.experiments.stats.proportion import Proportion, proportion

__all__ = [
    "ALPHA",
    "PAIRED",
    "POOLED",
    "POWER",
    "WELCH",
    "Cell",
    "Comparison",
    "Difference",
    "PooledSigma",
    "Proportion",
    "compare",
    "contrast",
    "describe",
    "design_df",
    "design_se",
    "difference",
    "flips",
    "holm",
    "identical_groups",
    "mde",
    "paired",
    "pooled_sd",
    "power",
    "proportion",
    "residual_noise",
    "seeds_needed",
    "spread_test",
    "welch",
    "with_the_best",
]
