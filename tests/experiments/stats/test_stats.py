"""oprl.experiments.stats: each contrast with its own noise against scipy on fixed data (the paired t, Welch's df,
one-sided bounds), Holm and MCB against the formulas, Brown–Forsythe against scipy's levene; on simulated sweeps
with a known truth, that MCB keeps the true best in its tier at the nominal rate while finding a planted loss of the
MDE, and that a pooled σ̂ understates the noise of a pair with a noisy member. Pure numpy/scipy, seeded: seconds."""

import math
import statistics

import numpy as np
import pytest
from scipy import stats as distributions

from oprl.experiments import stats

SIMULATIONS = 400
METHODS, SEEDS, SIGMA = 6, 5, 0.01

A = {0: 0.61, 1: 0.55, 2: 0.70, 3: 0.52, 4: 0.66}
B = {0: 0.50, 1: 0.49, 2: 0.52, 3: 0.51, 4: 0.47}


def simulate(rng, means, seeds=SEEDS, sigma=SIGMA, lags=1, sigmas=None):
    """``{method: {(lag, seed): value}}`` and the unit -> lag map: a seed effect shared by every method of a lag
    (the pairing), plus each run's own N(0, σ_m²) noise (``sigmas``: one σ per method, default ``sigma``)."""
    values = {f"m{i}": {} for i in range(len(means))}
    strata = {}
    for lag in range(lags):
        seed_effect = rng.normal(0, 3 * sigma, seeds)
        for i, mean in enumerate(means):
            noise = rng.normal(0, (sigmas or [sigma] * len(means))[i], seeds)
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


def test_a_paired_contrast_is_scipys_paired_t():
    reference = distributions.ttest_rel(list(A.values()), list(B.values()))
    d = stats.contrast(A, B)
    assert d.procedure == stats.PAIRED and d.n == 5 and d.df == 4
    assert d.p == pytest.approx(reference.pvalue)
    interval = reference.confidence_interval(0.95)
    assert (d.low, d.high) == pytest.approx((interval.low, interval.high))
    # One-sided, the claim a − b > −0.05: scipy's 'greater' test of the differences shifted by the margin.
    one = stats.contrast(A, B, alpha=0.01, tails=1, threshold=-0.05)
    shifted = distributions.ttest_rel(np.add(list(A.values()), 0.05), list(B.values()), alternative="greater")
    assert one.p == pytest.approx(shifted.pvalue)
    lower = distributions.ttest_rel(list(A.values()), list(B.values()), alternative="greater")
    assert one.low == pytest.approx(lower.confidence_interval(0.99).low)
    assert one.high == pytest.approx(2 * one.mean - one.low)  # the other one-sided bound, mirrored


def test_cells_without_two_shared_seeds_get_welchs_test_and_its_df():
    a, b = {0: 0.61, 1: 0.55, 2: 0.70}, {5: 0.50, 6: 0.49, 7: 0.52, 8: 0.40}
    d = stats.contrast(a, b)
    reference = distributions.ttest_ind(list(a.values()), list(b.values()), equal_var=False)
    assert d.procedure == stats.WELCH and d.n == 7
    assert d.p == pytest.approx(reference.pvalue) and d.df == pytest.approx(reference.df)
    interval = reference.confidence_interval(0.95)
    assert (d.low, d.high) == pytest.approx((interval.low, interval.high))
    va, vb = np.var(list(a.values()), ddof=1) / 3, np.var(list(b.values()), ddof=1) / 4
    assert d.df == pytest.approx((va + vb) ** 2 / (va**2 / 2 + vb**2 / 3))  # Welch–Satterthwaite by hand


def test_a_contrast_does_not_depend_on_which_other_methods_ran():
    """The issue's M2PO − M2PO-AReaL: one collapsed seed makes a pair noisy; a pooled σ̂ over quiet methods hid it
    (narrower interval, smaller p), and moved when a method outside the pair left the pool."""
    rng = np.random.default_rng(5)
    values, _ = simulate(rng, [0.55, 0.50, 0.5, 0.5, 0.5], sigmas=[0.005, 0.005, 0.005, 0.005, 0.005])
    values["m1"][(0, 2)] -= 0.25  # a collapsed seed
    own = stats.contrast(values["m0"], values["m1"])
    pooled = stats.difference(values["m0"], values["m1"], stats.residual_noise(values))
    assert own.half_width > 1.5 * pooled.half_width and own.p > pooled.p
    fewer = {m: v for m, v in values.items() if m != "m4"}
    assert stats.contrast(fewer["m0"], fewer["m1"]) == own
    assert stats.difference(fewer["m0"], fewer["m1"], stats.residual_noise(fewer)).se != pooled.se
    # Brown–Forsythe sees the unequal noise that the pooled σ̂ assumes away: scipy's levene on the same residuals.
    w, p, k = stats.spread_test(values)
    units = list(values["m0"])
    y = np.array([[values[m][u] for u in units] for m in values])
    reference = distributions.levene(*(y - y.mean(axis=0)), center="median")
    assert (w, p, k) == pytest.approx((reference.statistic, reference.pvalue, 5))


def test_holm_by_hand():
    # sorted 0.01, 0.02, 0.04, nan: 3 finite -> 0.03, max(0.03, 0.04), max(0.04, 0.04)
    assert stats.holm([0.04, 0.01, math.nan, 0.02]) == pytest.approx([0.04, 0.03, math.nan, 0.04], nan_ok=True)
    assert stats.holm([0.5, 0.9]) == [1.0, 1.0]


def test_holm_over_a_family_of_scipy_tests_is_the_step_down():
    """Holm over every method's one-sided paired test against a control, by its definition: reject H_(1..i) while
    p_(j) ≤ α/(m − j + 1); the adjusted p's say the same."""
    rng = np.random.default_rng(8)
    control = rng.normal(0.5, 0.02, 6)
    family = [control - shift + rng.normal(0, 0.01, 6) for shift in (0.0, 0.01, 0.02, 0.03, 0.05, 0.08)]
    p = [distributions.ttest_rel(control, x, alternative="greater").pvalue for x in family]
    adjusted = stats.holm(p)
    order, rejected = np.argsort(p), set()
    for rank, index in enumerate(order):
        if p[index] > 0.05 / (len(p) - rank):
            break
        rejected.add(int(index))
    assert {i for i, q in enumerate(adjusted) if q < 0.05} == rejected and 0 < len(rejected) < len(p)


def test_mcb_puts_a_method_below_by_its_strongest_rival_at_bonferronis_level():
    """With the fixed data of four methods, MCB against a brute force over scipy's one-sided paired tests: method i
    is below when min_j p(j > i) · (k − 1) < α, and the difference named is that j's."""
    values = {
        "best": {0: 0.60, 1: 0.62, 2: 0.58, 3: 0.61, 4: 0.63},
        "noisy": {0: 0.90, 1: 0.30, 2: 0.70, 3: 0.50, 4: 0.75},  # the highest mean, and a wide spread
        "close": {0: 0.59, 1: 0.61, 2: 0.57, 3: 0.61, 4: 0.60},
        "low": {0: 0.50, 1: 0.52, 2: 0.49, 3: 0.50, 4: 0.53},
    }
    comparison = stats.compare(values)
    k = len(values)

    def above(j, i):
        return distributions.ttest_rel(list(values[j].values()), list(values[i].values()), alternative="greater")

    for i in values:
        p = {j: above(j, i).pvalue for j in values if j != i}
        rival = min(p, key=p.get)
        below = min(1.0, (k - 1) * p[rival]) < 0.05
        assert (i in {d.b for d in comparison.below}) == below, i
        if below:
            (d,) = [d for d in comparison.below if d.b == i]
            assert d.a == rival and d.p_adjusted == pytest.approx((k - 1) * p[rival])
            assert d.low == pytest.approx(above(rival, i).confidence_interval(1 - 0.05 / (k - 1)).low) and d.low > 0
    # "low" is below the quiet "best", though not below the noisy top mean: the noisy one cannot put it below.
    assert comparison.best == "noisy" and {d.b: d.a for d in comparison.below}["low"] in ("best", "close")
    assert "noisy" in comparison.tier and "best" in comparison.tier


def test_leave_one_out_names_what_flips_a_verdict():
    """A constructed fragile verdict: four seeds agree on +5 points, the fifth says −5; with all five a − b > 0 is
    not shown, without the fifth it is. The flip names seed 4 and no other."""
    b = dict.fromkeys(range(5), 0.5)
    a = {u: 0.5 + d for u, d in enumerate([0.05, 0.06, 0.04, 0.05, -0.05])}

    def verdict(x, y):
        return "above" if stats.contrast(x, y, tails=1).low > 0 else "not shown"

    def without(seed):
        return verdict({u: v for u, v in a.items() if u != seed}, {u: v for u, v in b.items() if u != seed})

    assert verdict(a, b) == "not shown"
    assert stats.flips(verdict(a, b), without, list(a)) == [(4, "above")]


def test_identical_runs_are_one_measurement_and_a_tie():
    rng = np.random.default_rng(1)
    values, _ = simulate(rng, [0.5, 0.5, 0.45], seeds=3)
    values["copy"] = dict(values["m0"])  # the same runs under another name (ρ ≡ 1 on-policy)
    comparison = stats.compare(values)
    assert ["copy", "m0"] in comparison.identical and comparison.noise is None
    pair = comparison.between("copy", "m0")
    assert pair is not None and pair.mean == 0 and pair.p == 1.0
    assert {"copy", "m0"} <= set(comparison.tier) or {"copy", "m0"} <= {d.b for d in comparison.below}
    # With the pooled σ̂ the copy adds no degrees of freedom: 3 distinct methods x 3 seeds -> (3 - 1)(3 - 1).
    assert stats.compare(values, pooled=True).noise.df == 4


def test_a_clear_difference_is_below_the_tier_with_its_size():
    values, _ = simulate(np.random.default_rng(2), [0.50, 0.50, 0.40])
    comparison = stats.compare(values)
    assert comparison.tier == ["m0", "m1"]
    (below,) = comparison.below
    assert below.b == "m2" and below.low < below.mean < below.high and abs(below.mean - 0.10) < 3 * below.se


def test_pooled_sd_weighs_each_group_by_its_degrees_of_freedom():
    sd, df = stats.pooled_sd([[1.0, 3.0], [0.0, 1.0, 2.0], [5.0]])
    assert df == 3 and sd == pytest.approx(math.sqrt((2.0 + 2.0) / 3))


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
    values["new"] = {u: v + 0.1 + 0.01 * i for i, (u, v) in enumerate(values["m0"].items())}
    assert stats.residual_noise(values).df == 8
    assert stats.difference(values["new"], values["m2"], noise).n == 3


def mde_against_the_best(seeds=SEEDS):
    """The MDE of one method against the best at MCB's level, from the design's pair SD σ·√2 (no seed effect)."""
    se = SIGMA * math.sqrt(2) / math.sqrt(seeds)
    return stats.mde(se, seeds - 1, comparisons=METHODS - 1, tails=1)


def test_mcb_finds_a_planted_loss_of_the_mde_at_least_80_percent_of_the_time():
    delta = mde_against_the_best()
    rng = np.random.default_rng(4)
    found = 0
    for _ in range(SIMULATIONS):
        values, _ = simulate(rng, [0.5] * (METHODS - 1) + [0.5 - delta])
        found += f"m{METHODS - 1}" in {d.b for d in stats.compare(values, robust=False).below}
    rate = found / SIMULATIONS
    # At least 80 %: the MDE is for one comparison against the true best; MCB may find it through any of them.
    assert rate >= 0.8 - 2 * math.sqrt(0.8 * 0.2 / SIMULATIONS), rate


def test_mcb_puts_the_true_best_below_at_most_at_the_nominal_rate():
    """The best ties with two others and leads the rest by a little; the three tied are each the best, and none of
    them may be put below more than α of the time (Hsu's guarantee, with Bonferroni's value: fewer)."""
    rng = np.random.default_rng(11)
    wrong = 0
    for _ in range(SIMULATIONS):
        values, _ = simulate(rng, [0.5, 0.5, 0.5, 0.49, 0.48, 0.47])
        below = {d.b for d in stats.compare(values, robust=False).below}
        wrong += bool(below & {"m0", "m1", "m2"})
    rate = wrong / SIMULATIONS
    assert rate <= stats.ALPHA + 2 * math.sqrt(stats.ALPHA * (1 - stats.ALPHA) / SIMULATIONS), rate


def test_seeds_needed_inverts_the_mde():
    for seeds in (3, 5, 10):
        delta = stats.mde(SIGMA / math.sqrt(seeds), seeds - 1, comparisons=5, tails=1)
        assert stats.seeds_needed(delta * 1.0001, SIGMA, comparisons=5, tails=1) == seeds
        assert stats.seeds_needed(delta * 0.99, SIGMA, comparisons=5, tails=1) == seeds + 1
    assert stats.seeds_needed(1e-9, SIGMA, most=64) is None


def test_power_at_the_mde_is_the_target_and_2_se_is_about_a_coin_flip():
    se, df = stats.design_se(SIGMA, 3), stats.design_df(18, 3)
    assert stats.power(stats.mde(se, df), se, df) == pytest.approx(stats.POWER)
    assert 0.45 < stats.power(2 * se, se, df) < 0.55
    assert stats.mde(se, 0) == math.inf
    # One-sided: the noncentral t's upper tail beyond t_{1−α}: scipy's nct directly.
    critical = distributions.t.ppf(1 - 0.05, 7)
    assert stats.power(0.02, 0.01, 7, tails=1) == pytest.approx(distributions.nct.sf(critical, 7, 2.0))
