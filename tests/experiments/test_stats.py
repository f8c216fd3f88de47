"""oprl.experiments.stats on simulated sweeps with a known truth: the sample SD and t-intervals, Holm, the tier,
and that the minimum detectable difference it prints is found at least 80 % of the time while a null is declared
different at most at the nominal rate. Pure numpy/scipy, seeded: seconds."""

import math
import statistics

import numpy as np
import pytest
from scipy import stats as distributions

from oprl.experiments import stats

SIMULATIONS = 600
METHODS, SEEDS, SIGMA = 6, 3, 0.01


def simulate(rng, means, seeds=SEEDS, sigma=SIGMA, lags=1):
    """``{method: {(lag, seed): value}}`` and the unit -> lag map: a seed effect shared by every method of a lag
    (the pairing), plus each run's own N(0, σ²) noise."""
    values = {f"m{i}": {} for i in range(len(means))}
    strata = {}
    for lag in range(lags):
        seed_effect = rng.normal(0, 3 * sigma, seeds)
        for i, mean in enumerate(means):
            noise = rng.normal(0, sigma, seeds)
            for s in range(seeds):
                values[f"m{i}"][(lag, s)] = mean + seed_effect[s] + noise[s]
                strata[(lag, s)] = lag
    return values, strata


def test_describe_is_the_sample_sd_and_the_t_interval():
    values = [0.50, 0.52, 0.47]
    cell = stats.describe(values)
    assert cell.n == 3 and cell.mean == pytest.approx(statistics.mean(values))
    assert cell.sd == pytest.approx(statistics.stdev(values)) and cell.sd > statistics.pstdev(values)
    half = distributions.t.ppf(0.975, 2) * statistics.stdev(values) / math.sqrt(3)
    assert (cell.low, cell.high) == pytest.approx((cell.mean - half, cell.mean + half))
    one = stats.describe([0.5, math.nan])
    assert one.n == 1 and one.mean == 0.5 and math.isnan(one.sd) and math.isnan(one.low)


def test_pooled_sd_weighs_each_group_by_its_degrees_of_freedom():
    sd, df = stats.pooled_sd([[1.0, 3.0], [0.0, 1.0, 2.0], [5.0]])
    assert df == 3 and sd == pytest.approx(math.sqrt((2.0 + 2.0) / 3))


def test_holm_by_hand():
    # sorted 0.01, 0.02, 0.04, nan: 3 finite -> 0.03, max(0.03, 0.04), max(0.04, 0.04)
    assert stats.holm([0.04, 0.01, math.nan, 0.02]) == pytest.approx([0.04, 0.03, math.nan, 0.04], nan_ok=True)
    assert stats.holm([0.5, 0.9]) == [1.0, 1.0]


def test_residual_noise_recovers_sigma_without_the_seed_effect():
    values, strata = simulate(np.random.default_rng(0), [0.5] * 8, seeds=40, lags=3)
    noise = stats.residual_noise(values, strata)
    assert noise.df == 3 * 7 * 39 and noise.sd == pytest.approx(SIGMA, rel=0.08)


def test_a_method_missing_seeds_does_not_cut_the_others_noise_estimate():
    """A sweep in progress: 4 methods x 3 seeds and one with 2. The complete 4 x 3 block (df 6) is σ̂'s, not the
    5 x 2 block that every method shares (df 4); the newcomer's own contrasts still pair over its 2 seeds."""
    values, _ = simulate(np.random.default_rng(3), [0.5, 0.5, 0.45, 0.4], seeds=3)
    whole = stats.residual_noise(values)
    values["new"] = {u: v + 0.1 for u, v in list(values["m0"].items())[:2]}
    noise = stats.residual_noise(values)
    assert (noise.df, noise.sd) == (whole.df, whole.sd) == (6, whole.sd)
    # Once it has every seed it joins: (5 - 1)(3 - 1).
    values["new"] = {u: v + 0.1 + 0.01 * i for i, (u, v) in enumerate(values["m0"].items())}
    assert stats.residual_noise(values).df == 8
    pair = stats.difference(values["new"], values["m2"], noise)
    assert pair.n == 3


def test_identical_runs_are_one_measurement_and_a_tie():
    rng = np.random.default_rng(1)
    values, _ = simulate(rng, [0.5, 0.5, 0.45])
    values["copy"] = dict(values["m0"])  # the same runs under another name (ρ ≡ 1 on-policy)
    comparison = stats.compare(values)
    assert ["copy", "m0"] in comparison.identical
    pair = comparison.between("copy", "m0")
    assert pair is not None and pair.mean == 0 and pair.p == 1.0
    assert {"copy", "m0"} <= set(comparison.tier) or {"copy", "m0"} <= {d.b for d in comparison.below}
    # The copy adds no degrees of freedom: 3 distinct methods x 3 seeds -> (3 - 1)(3 - 1).
    assert comparison.noise.df == 4


def test_a_clear_difference_is_below_the_tier_with_its_size():
    values, _ = simulate(np.random.default_rng(2), [0.50, 0.50, 0.40])
    comparison = stats.compare(values)
    assert comparison.tier == ["m0", "m1"]
    (below,) = comparison.below
    assert below.b == "m2" and below.low < below.mean < below.high and abs(below.mean - 0.10) < 3 * below.se


def mde_of_design(lags=1):
    se = stats.design_se(SIGMA, SEEDS, lags)
    return stats.mde(se, stats.design_df(METHODS, SEEDS, lags), comparisons=METHODS * (METHODS - 1) // 2)


@pytest.mark.parametrize("lags", [1, 4])
def test_a_planted_difference_of_the_mde_is_found_at_least_80_percent_of_the_time(lags):
    delta = mde_of_design(lags)
    rng = np.random.default_rng(3 + lags)
    found = 0
    for _ in range(SIMULATIONS):
        values, strata = simulate(rng, [0.5 + delta] + [0.5] * (METHODS - 1), lags=lags)
        comparison = stats.compare(values, strata if lags > 1 else None)
        found += "m1" in {d.b for d in comparison.below}
    rate = found / SIMULATIONS
    assert rate >= 0.8 - 2 * math.sqrt(0.8 * 0.2 / SIMULATIONS), rate


@pytest.mark.parametrize("lags", [1, 4])
def test_a_null_is_declared_different_at_most_at_the_nominal_rate(lags):
    rng = np.random.default_rng(10 + lags)
    false = 0
    for _ in range(SIMULATIONS):
        values, strata = simulate(rng, [0.5] * METHODS, lags=lags)
        false += bool(stats.compare(values, strata if lags > 1 else None).below)
    rate = false / SIMULATIONS
    assert rate <= stats.ALPHA + 2 * math.sqrt(stats.ALPHA * (1 - stats.ALPHA) / SIMULATIONS), rate


def test_ties_are_reported_as_ties():
    """Methods equal in truth share the tier (not ranked) in nearly every dataset."""
    rng = np.random.default_rng(20)
    together = sum(
        set(stats.compare(simulate(rng, [0.5, 0.5, 0.5, 0.3])[0]).tier) == {"m0", "m1", "m2"} for _ in range(200)
    )
    assert together >= 190


def test_seeds_needed_inverts_the_mde():
    for seeds in (3, 5, 10):
        se = stats.design_se(SIGMA, seeds)
        delta = stats.mde(se, stats.design_df(METHODS, seeds), comparisons=15)
        assert stats.seeds_needed(delta * 1.0001, SIGMA, METHODS) == seeds
        assert stats.seeds_needed(delta * 0.99, SIGMA, METHODS) == seeds + 1
    assert stats.seeds_needed(1e-9, SIGMA, METHODS, most=64) is None
    # More lags pool more pairs: fewer seeds for the same difference.
    assert stats.seeds_needed(0.01, SIGMA, METHODS, strata=8) < stats.seeds_needed(0.01, SIGMA, METHODS)


def test_power_at_the_mde_is_the_target_and_2_se_is_about_a_coin_flip():
    se, df = stats.design_se(SIGMA, 3), stats.design_df(18, 3)
    assert stats.power(stats.mde(se, df), se, df) == pytest.approx(stats.POWER)
    assert 0.45 < stats.power(2 * se, se, df) < 0.55
    assert stats.mde(se, 0) == math.inf
