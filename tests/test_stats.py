"""rlwb.core.measure.stats against known distributions: interval coverage, p-value calibration, power, hand-made
values."""

import numpy as np
import pytest
from scipy import stats as st

from rlwb.core.measure import stats


def _clustered(rng, n_seq=40, mean=0.5):
    """Sequences whose tokens share a per-sequence effect: token-level resampling would be overconfident."""
    return [mean + rng.normal(0, 1.0) + rng.normal(0, 0.3, rng.integers(5, 15)) for _ in range(n_seq)]


def _token_mean(x):
    return float(np.mean(x))


def test_sequence_bootstrap_covers_the_true_mean_and_token_bootstrap_does_not():
    rng = np.random.default_rng(0)
    seq_hits = tok_hits = 0
    n = 200
    for i in range(n):
        groups = _clustered(rng)
        # the estimand: the expected token mean (sequence lengths are independent of the effects)
        lo, hi = stats.sequence_bootstrap_ci(groups, _token_mean, n_boot=400, seed=i)
        seq_hits += lo <= 0.5 <= hi
        flat = np.concatenate(groups)
        lo, hi = stats.sequence_bootstrap_ci(list(flat[:, None]), _token_mean, n_boot=400, seed=i)
        tok_hits += lo <= 0.5 <= hi
    assert 0.88 <= seq_hits / n <= 0.99, seq_hits / n
    assert tok_hits / n < 0.6, "resampling correlated tokens must undercover (why rlwb resamples sequences)"


def test_sequence_bootstrap_resamples_whole_sequences():
    # two sequences: [0, 0, 0] and [1]; any resample's token mean is one of 0, 1/4... exactly these values
    seen = set()
    for s in range(30):
        lo, hi = stats.sequence_bootstrap_ci([np.zeros(3), np.ones(1)], _token_mean, n_boot=50, seed=s)
        seen.update((round(lo, 6), round(hi, 6)))
    assert seen <= {0.0, 0.25, 1.0}
    with pytest.raises(ValueError, match="alpha"):
        stats.sequence_bootstrap_ci([np.zeros(3)], _token_mean, alpha=1.5)
    assert all(np.isnan(stats.sequence_bootstrap_ci([], _token_mean)))


def test_paired_difference_ci_cancels_what_a_pair_shares():
    """Pairs that share a large per-prompt effect (sd 1) and differ by 0.05: the paired interval covers 0.05 at its
    nominal rate and excludes 0, the unpaired one (`difference_ci`) cannot see the shift through the prompts'
    spread. Sides of unequal size are refused: they cannot be pairs."""
    rng = np.random.default_rng(1)
    hits = excludes_zero = unpaired_excludes_zero = 0
    n = 100
    for i in range(n):
        levels = rng.normal(0, 1.0, 40)
        b = [lv + rng.normal(0, 0.05, 10) for lv in levels]
        a = [lv + 0.05 + rng.normal(0, 0.05, 10) for lv in levels]
        lo, hi = stats.paired_difference_ci(a, b, _token_mean, n_boot=400, seed=i)
        hits += lo <= 0.05 <= hi
        excludes_zero += lo > 0
        lo, hi = stats.difference_ci(a, b, _token_mean, n_boot=400, seed=i)
        unpaired_excludes_zero += lo > 0
    assert 0.88 <= hits / n <= 1.0, hits / n
    assert excludes_zero / n > 0.95 and unpaired_excludes_zero / n < 0.1
    with pytest.raises(ValueError, match="one sequence of each side per pair"):
        stats.paired_difference_ci([np.zeros(2)], [np.zeros(2), np.ones(2)], _token_mean)
    assert all(np.isnan(stats.paired_difference_ci([], [], _token_mean)))


def test_mean_ci_coverage_on_bernoulli_rewards():
    rng = np.random.default_rng(1)
    hits = sum(lo <= 0.3 <= hi for lo, hi in (stats.mean_ci(rng.random(200) < 0.3, n_boot=500, seed=i)
                                               for i in range(200)))
    assert 0.9 <= hits / 200 <= 0.985


def test_a_rate_over_tests_sharing_a_control_is_clopper_pearson_when_independent_and_wider_when_shared():
    """`shared_control_rate_ci`: tests on their own controls give Clopper-Pearson (to Monte Carlo error); 20 tests on
    one control (notebook 08's placebo streams) a wider interval, 0 of 20 reaching ~29% where Clopper-Pearson says
    17%; the ends move with the count; bad input is refused by name."""
    for k in (0, 2, 5):
        assert stats.shared_control_rate_ci(k, 8, [1] * 20) == stats.proportion_ci(k, 20, method="exact")
    # the simulation itself, where the tests barely share (clusters of 2 of 40): within Monte Carlo error of it
    assert stats.shared_control_rate_ci(2, 8, [2] * 20)[1] == pytest.approx(
        stats.proportion_ci(2, 40, method="exact")[1], abs=0.04)
    lo0, hi0 = stats.shared_control_rate_ci(0, 8, [20])
    assert lo0 == 0 and 0.25 < hi0 < 0.33 and hi0 > stats.proportion_ci(0, 20, method="exact")[1] + 0.08
    ends = [stats.shared_control_rate_ci(k, 8, [10, 10]) for k in (0, 1, 3, 20)]
    assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(ends, ends[1:])) and ends[-1][1] == 1
    assert hi0 > ends[0][1] > stats.shared_control_rate_ci(0, 8, [1] * 20)[1]  # two references: between the two
    with pytest.raises(ValueError, match="rejections"):
        stats.shared_control_rate_ci(21, 8, [20])
    with pytest.raises(ValueError, match="clusters"):
        stats.shared_control_rate_ci(0, 8, [20, 0])
    with pytest.raises(ValueError, match="seeds"):
        stats.shared_control_rate_ci(0, 1, [20])


@pytest.mark.parametrize("case", ["a lax threshold", "heavier tails"])
def test_a_rate_over_tests_sharing_a_control_is_covered_where_clopper_pearson_is_not(case):
    """Simulated placebo studies as notebook 08 runs them (20 streams, 8 seeds, each stream's gaps against the same
    clean run of a seed, a two-sided paired t test per stream): the shared-control interval covers the true rate in
    >= 95% of 1,500 studies, both where the tests reject too often (|t| > 1.5: rate ~18%, where Clopper-Pearson, taking
    the 20 calls as independent, covers it in ~77%) and where the runs' noise is t(3), not the normal the interval
    simulates."""
    S, n, studies = 8, 20, 1500
    rng = np.random.default_rng(21)
    if case == "a lax threshold":
        thr, draw = 1.5, (lambda shape: rng.normal(size=shape))
    else:
        thr, draw = st.t.isf(0.025, S - 1), (lambda shape: rng.standard_t(3, shape))

    def abs_t(g):
        return np.abs(g.mean(1) / (g.std(1, ddof=1) / np.sqrt(S)))

    true = float((abs_t(draw((200000, S, 1)) - draw((200000, S, 1))) > thr).mean())
    calls = (abs_t(draw((studies, S, n)) - draw((studies, S, 1))) > thr).sum(1)
    ours = {k: stats.shared_control_rate_ci(int(k), S, [n]) for k in np.unique(calls)}
    cp = {k: stats.proportion_ci(int(k), n, method="exact") for k in np.unique(calls)}
    cover = np.mean([ours[k][0] <= true <= ours[k][1] for k in calls])
    cover_cp = np.mean([cp[k][0] <= true <= cp[k][1] for k in calls])
    assert cover >= (0.965 if case == "a lax threshold" else 0.95), (true, cover)  # ~0.98 measured; alpha 0.1: 0.945
    if case == "a lax threshold":
        assert cover_cp < 0.85, (true, cover_cp)


def test_proportion_ci_wilson_coverage_and_edges():
    """Exact coverage over all outcomes of Binomial(50, p): Wilson stays near 95% where the Wald interval
    (p +- z*se) collapses; at 50/50 the interval is not degenerate and stays inside [0, 1]."""
    n = 50
    for p in (0.05, 0.5, 0.9):
        pmf = st.binom.pmf(np.arange(n + 1), n, p)
        cover = sum(w for k, w in enumerate(pmf) if (lambda ci: ci[0] <= p <= ci[1])(stats.proportion_ci(k, n)))
        assert 0.92 <= cover <= 0.99, (p, cover)
    lo, hi = stats.proportion_ci(n, n)
    assert hi == 1.0 and 0.9 < lo < 1.0  # 50/50 passes: the pass rate is >= ~0.93, not exactly 1
    assert stats.proportion_ci(0, n)[0] == 0.0
    assert stats.proportion_ci(7, 20) == pytest.approx((0.1812, 0.5671), abs=1e-4)  # Wilson's, by hand
    with pytest.raises(ValueError, match="successes"):
        stats.proportion_ci(21, 20)


def test_seed_ci_is_the_student_t_interval():
    v = [0.61, 0.72, 0.66]
    lo, hi = stats.seed_ci(v)
    ref = st.t.interval(0.95, 2, loc=np.mean(v), scale=st.sem(v))
    assert (lo, hi) == pytest.approx(ref)
    assert all(np.isnan(stats.seed_ci([0.5])))
    assert stats.seed_ci([0.25, 0.25, 0.25]) == (0.25, 0.25)  # no spread: the point, no interval around it


@pytest.mark.parametrize("n", [2, 3, 5, 8, 16])
def test_seed_ci_is_mean_plus_minus_the_t_quantile_times_the_standard_error(n):
    """scipy's `ttest_1samp(...).confidence_interval` against m -+ t_{1-a/2, n-1} sd / sqrt(n) written out, on
    continuous and quantised (ties) seeds at two levels: equal to 1e-15 of |m| + h (scipy divides the variance by
    n before the square root: the last bit can differ, never more)."""
    rng = np.random.default_rng(n)
    for alpha in (0.05, 0.01):
        for _ in range(50):
            v = rng.normal(rng.normal(0, 3), rng.exponential(), n)
            if rng.random() < 0.3:
                v = np.round(v * 64) / 64
            m, h = v.mean(), st.t.ppf(1 - alpha / 2, n - 1) * v.std(ddof=1) / np.sqrt(n)
            if h == 0:
                continue
            lo, hi = stats.seed_ci(v, alpha)
            assert abs(lo - (m - h)) <= 1e-15 * (abs(m) + h) and abs(hi - (m + h)) <= 1e-15 * (abs(m) + h), v


def test_p_values_are_uniform_under_the_null():
    rng = np.random.default_rng(2)
    perm, mw = [], []
    for i in range(150):
        a, b = rng.normal(0, 1, 30), rng.normal(0, 1, 30)
        c = stats.compare_rewards(a, b, n_boot=100, n_perm=300, seed=i)
        perm.append(c.perm_pvalue)
        mw.append(c.mw_pvalue)
    for p in (np.array(perm), np.array(mw)):
        assert 0.01 <= np.mean(p < 0.05) <= 0.11
        assert 0.38 <= np.mean(p < 0.5) <= 0.62
        assert st.kstest(p, "uniform").pvalue > 0.01


def test_compare_rewards_detects_a_real_difference():
    rng = np.random.default_rng(3)
    a, b = (rng.random(300) < 0.8).astype(float), (rng.random(300) < 0.6).astype(float)
    c = stats.compare_rewards(a, b, seed=0)
    assert c.mean_diff == pytest.approx(a.mean() - b.mean())
    assert c.diff_ci[0] > 0 and c.perm_pvalue < 1e-3 and c.mw_pvalue < 1e-3 and c.cliffs_delta > 0


def test_cliffs_delta_hand_computed_and_identical_samples():
    assert stats.compare_rewards(np.array([3.0, 4.0]), np.array([1.0, 2.0]), n_perm=10).cliffs_delta == 1.0
    assert stats.compare_rewards(np.array([1.0, 2.0, 3.0]), np.array([2.0, 2.0]), n_perm=10).cliffs_delta == 0.0
    same = stats.compare_rewards(np.ones(5), np.ones(5), n_perm=10)
    assert same.mw_pvalue == 1.0 and same.perm_pvalue == 1.0 and same.cliffs_delta == 0.0
    with pytest.raises(ValueError, match="at least 2"):
        stats.compare_rewards(np.ones(1), np.ones(5))


def test_reward_equivalence_with_one_engine_has_means_and_no_pairs():
    from rlwb.experiments import logprob_mismatch as mismatch
    from rlwb.experiments.wording.logprob_mismatch import reward_lines

    m = mismatch.reward_equivalence({"hf": np.array([1.0, 0.0, 1.0, 1.0])})
    assert m["hf/reward_mean"] == 0.75 and not any("_vs_" in k for k in m)
    text = "\n".join(reward_lines(m, ["hf"], 4))
    assert "`hf` 0.750" in text and "No pair" not in text and "differ" not in text


def _wilson_by_formula(k: int, n: int, alpha: float) -> tuple[float, float]:
    """Wilson's interval written out (Wilson 1927, eq. for the score interval): center (p + z²/2n) / (1 + z²/n),
    half-width z / (1 + z²/n) * sqrt(p(1 - p)/n + z²/4n²), clipped to [0, 1]."""
    z = st.norm.ppf(1 - alpha / 2)
    ph = k / n
    center = (ph + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * np.sqrt(ph * (1 - ph) / n + z * z / (4 * n * n))
    return max(0.0, center - half), min(1.0, center + half)


def test_wilson_interval_equals_the_formula_on_a_grid():
    """`proportion_ci` (scipy's `binomtest(k, n).proportion_ci(method="wilson")`) against Wilson's formula written
    out here: the same to the last bits (<= 5e-16; scipy rounds differently in the last bit for about two thirds of
    (k, n)), at three levels, so a level passed the wrong way round (alpha for 1 - alpha) or another method fails."""
    for n in [*range(1, 61), 97, 200, 1000]:
        for k in range(0, n + 1, max(1, n // 40)):
            for alpha in (0.05, 0.1, 0.01):
                ref_lo, ref_hi = _wilson_by_formula(k, n, alpha)
                lo, hi = stats.proportion_ci(k, n, alpha)
                assert abs(lo - ref_lo) <= 5e-16 and abs(hi - ref_hi) <= 5e-16, (k, n, alpha)


def test_wilson_interval_edges():
    """n = 0: no trials, no interval (nan, nan); k = 0 starts at exactly 0 and k = n ends at exactly 1 (never
    beyond); k outside [0, n] and alpha outside (0, 1) are refused naming what is wrong."""
    assert all(np.isnan(stats.proportion_ci(0, 0)))
    for n in (1, 2, 7, 50):
        lo, hi = stats.proportion_ci(0, n)
        assert lo == 0.0 and 0 < hi < 1
        lo, hi = stats.proportion_ci(n, n)
        assert 0 < lo < 1 and hi == 1.0
    with pytest.raises(ValueError, match="successes"):
        stats.proportion_ci(-1, 5)
    with pytest.raises(ValueError, match="alpha"):
        stats.proportion_ci(1, 5, alpha=0.0)


def _mean_diff(x, y, axis=-1):
    return x.mean(axis=axis) - y.mean(axis=axis)


def _exact_two_sided_p(a: np.ndarray, b: np.ndarray) -> float:
    """Every split of the pooled values into |a| and |b| enumerated by hand: twice the smaller one-sided share of
    splits at least as extreme as the observed mean difference, capped at 1."""
    from itertools import combinations

    pooled, obs = np.concatenate([a, b]), a.mean() - b.mean()
    diffs = []
    for idx in combinations(range(pooled.size), a.size):
        mask = np.zeros(pooled.size, bool)
        mask[list(idx)] = True
        diffs.append(pooled[mask].mean() - pooled[~mask].mean())
    diffs = np.array(diffs)
    tol = 1e-12
    return min(1.0, 2 * min(np.mean(diffs <= obs + tol), np.mean(diffs >= obs - tol)))


def test_permutation_pvalue_is_exact_when_every_split_fits_in_n_perm():
    """With n_perm >= C(n_a + n_b, n_a) the test enumerates every split: p is the exact permutation p-value,
    checked against the enumeration written out here (not against scipy, which computes it). On hand values:
    a = (1, 1, 1) vs b = (0, 0, 0) is the most extreme of C(6, 3) = 20 splits, p = 2 / 20."""
    from math import comb

    assert stats.permutation_pvalue(np.ones(3), np.zeros(3), n_perm=100) == pytest.approx(0.1, abs=1e-15)
    rng = np.random.default_rng(5)
    for _ in range(6):
        a, b = rng.normal(0.5, 1.0, int(rng.integers(2, 6))), rng.normal(0.0, 1.0, int(rng.integers(2, 6)))
        assert comb(a.size + b.size, a.size) <= 999
        assert stats.permutation_pvalue(a, b, n_perm=999, seed=1) == pytest.approx(_exact_two_sided_p(a, b),
                                                                                   abs=1e-12)


def test_permutation_pvalue_samples_when_the_splits_outnumber_n_perm():
    """Above C(n_a + n_b, n_a) > n_perm, random splits from `seed`: each one-sided p is (k + 1) / (n_perm + 1), so
    p (n_perm + 1) / 2 is a whole number and p > 0; the same seed gives the same p; and p is within Monte Carlo
    error of the exact p-value enumerated by hand (C(16, 8) = 12870 splits)."""
    rng = np.random.default_rng(3)
    for seed in range(4):
        a, b = rng.normal(0.6, 1.0, 8), rng.normal(0.0, 1.0, 8)
        p = stats.permutation_pvalue(a, b, n_perm=2000, seed=seed)
        assert p == stats.permutation_pvalue(a, b, n_perm=2000, seed=seed) and p > 0
        assert (p * 2001 / 2) == pytest.approx(round(p * 2001 / 2), abs=1e-9) or p == 1.0
        exact = _exact_two_sided_p(a, b)
        assert abs(p - exact) <= 4 * np.sqrt(exact * (1 - exact) / 2000) * 2 + 2 / 2001, (p, exact)


def test_permutation_pvalue_edges():
    """Identical constant samples: no difference, p = 1. An empty side has no mean and is refused by name."""
    assert stats.permutation_pvalue(np.full(4, 0.5), np.full(6, 0.5), n_perm=50) == 1.0
    assert stats.permutation_pvalue(np.full(40, 0.5), np.full(60, 0.5), n_perm=50) == 1.0
    with pytest.raises(ValueError, match="at least 1 value per side"):
        stats.permutation_pvalue(np.array([]), np.ones(3))
    with pytest.raises(ValueError, match="n_perm"):
        stats.permutation_pvalue(np.ones(3), np.zeros(3), n_perm=0)


def test_holm_against_the_textbook_example():
    """Holm's procedure on the usual worked example (four hypotheses, p = 0.01, 0.04, 0.03, 0.005; e.g. Wikipedia's
    Holm-Bonferroni article): adjusted 0.03, 0.06, 0.06, 0.02; at alpha 0.05 H1 and H4 are rejected. And R's
    `p.adjust(c(.01, .02, .03, .04, .05), "holm")`: 0.05, 0.08, 0.09, 0.09, 0.09."""
    np.testing.assert_allclose(stats.holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02], rtol=1e-12)
    assert list(stats.holm([0.01, 0.04, 0.03, 0.005]) < 0.05) == [True, False, False, True]
    np.testing.assert_allclose(stats.holm([0.01, 0.02, 0.03, 0.04, 0.05]), [0.05, 0.08, 0.09, 0.09, 0.09],
                               rtol=1e-12)


def _holm_step_down(p):
    """Holm's adjustment written out (the i-th smallest of m finite p's times m - i, running maxima, capped at 1)."""
    p = np.asarray(p, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    running = 0.0
    for i, j in enumerate(ok[np.argsort(p[ok], kind="stable")]):
        running = max(running, min(1.0, (len(ok) - i) * p[j]))
        out[j] = running
    return out


def test_holm_is_bitwise_the_step_down_procedure_through_ties_ones_and_nans():
    """statsmodels' `multipletests` gives exactly (bitwise) the step-down values written out by hand, on random
    families of 0 to 90 p-values with ties (rounded p's), p = 1 and NaNs (which stay NaN and are not counted), each
    case in every fourth family (multipletests takes ~50 ms a family: 40 families, not hundreds)."""
    rng = np.random.default_rng(7)
    for k in range(40):
        p = rng.random(rng.integers(1, 90)) ** rng.uniform(0.2, 5)
        if k % 4 == 1:
            p = np.round(p, 2)
        if k % 4 in (2, 3):
            p[rng.integers(0, p.size, 3)] = 1.0 if k % 4 == 2 else np.nan
        got, want = stats.holm(p), _holm_step_down(p)
        assert np.array_equal(got, want, equal_nan=True), p
    assert stats.holm([]).shape == (0,) and np.isnan(stats.holm([np.nan])).all()


def test_tost_rejects_exactly_when_the_90_percent_interval_lies_inside_the_margin():
    """Schuirmann (1987): TOST at level alpha is equivalent to the (1 - 2 alpha) t interval of the mean lying
    inside +-margin; and at sd = equivalence_sd_max with a zero mean gap its p-value is alpha exactly."""
    from scipy import stats as st

    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(3, 12))
        g = rng.normal(rng.normal(0, 0.05), rng.uniform(0.01, 0.1), n)
        margin = float(rng.uniform(0.02, 0.1))
        t = st.t.ppf(0.95, n - 1) * g.std(ddof=1) / np.sqrt(n)
        inside = -margin < g.mean() - t and g.mean() + t < margin
        assert (stats.paired_gap_test(g, margin).p_equiv < 0.05) == inside
    n, margin = 8, 0.05
    z = rng.normal(size=n)
    g = (z - z.mean()) / z.std(ddof=1) * stats.equivalence_sd_max(margin, n)  # mean 0, sd = the maximum
    assert abs(stats.paired_gap_test(g, margin).p_equiv - 0.05) < 1e-12


def test_minimal_detectable_gap_against_the_noncentral_t_and_the_normal_formula():
    """The MDE's power computed exactly (noncentral t, two-sided, Cohen 1988's definition) is 0.8 (it is solved from
    it: to 1e-6); for large n it is the normal formula (z_{0.975} + z_{0.8}) * sd / sqrt(n)."""
    from scipy import stats as st

    for n, tol in ((2, 1e-6), (5, 1e-6), (10, 1e-6), (30, 1e-6), (100, 1e-6)):
        d, df = stats.minimal_detectable_gap(1.0, n), n - 1
        tc, nc = st.t.ppf(0.975, df), d * np.sqrt(n)
        assert abs(st.nct.sf(tc, df, nc) + st.nct.cdf(-tc, df, nc) - 0.8) < tol, n
    n = 100_000
    normal = (st.norm.ppf(0.975) + st.norm.ppf(0.8)) / np.sqrt(n)
    assert abs(stats.minimal_detectable_gap(1.0, n) / normal - 1) < 1e-4
    assert np.isnan(stats.minimal_detectable_gap(1.0, 1)) and stats.minimal_detectable_gap(0.0, 5) == 0


def test_paired_t_power_is_statsmodels_power_where_that_is_defined_and_finite_where_it_is_not():
    """statsmodels' `TTestPower().power` (two-sided one-sample t, its own noncentral t route: 1 - nctdtr above,
    nctdtr below) is an independent implementation of the same power: equal to 1e-12 wherever it is finite. Far in
    the lower tail scipy's noncentral t cdf is NaN, and so is statsmodels' power; ours takes that tail as the upper
    tail of -T (symmetry) and stays a probability."""
    from statsmodels.stats.power import TTestPower

    compared = 0
    for n in (2, 3, 5, 8, 16):
        for alpha in (0.05, 0.05 / 12, 0.05 / 80, 0.05 / 200):
            for d in (0.0, 0.1, 0.5, 1.0, 3.0, 30.0):
                ours = stats.paired_t_power(d * 0.7, 0.7, n, alpha)
                assert 0 <= ours <= 1
                theirs = TTestPower().power(effect_size=d, nobs=n, alpha=alpha, alternative="two-sided")
                if np.isfinite(theirs):
                    assert abs(ours - theirs) < 1e-12, (n, alpha, d, ours, theirs)
                    compared += 1
    assert compared >= 60


@pytest.mark.parametrize("n,m", [(8, 40), (4, 30), (6, 10)])
def test_minimal_detectable_gap_has_its_power_in_a_simulation_and_the_central_shortcut_does_not(n, m):
    """Simulated paired t tests (40,000 studies of n seeds, gap sd 1) at a Holm family's strictest level alpha/m
    reject at the MDE with rate 0.80 within Monte Carlo error (4 standard errors, 0.008), and the central-t shortcut
    (t_{1-a/2} + t_{0.8}) sd / sqrt(n) falls below 0.80 there (0.72-0.76 at m ~ 40)."""
    from scipy import stats as st

    alpha, reps = 0.05 / m, 40_000
    rng = np.random.default_rng(n * 100 + m)
    z = rng.normal(size=(reps, n))
    tc = st.t.ppf(1 - alpha / 2, n - 1)

    def rejection_rate(gap):
        x = z + gap
        t = x.mean(1) / (x.std(1, ddof=1) / np.sqrt(n))
        return float((np.abs(t) > tc).mean())

    se = 4 * np.sqrt(0.8 * 0.2 / reps)
    assert abs(rejection_rate(stats.minimal_detectable_gap(1.0, n, alpha)) - 0.8) < se
    central = (tc + st.t.ppf(0.8, n - 1)) / np.sqrt(n)
    assert rejection_rate(central) < 0.8 - se


def test_a_common_nonzero_gap_is_tested_by_sign_flips_not_called_certain():
    """Every seed's gap the same: no t statistic. Zero: p 1 (bitwise twins). Nonzero: the exact sign-flip test's
    2 / 2^n (2 seeds 0.5, 8 seeds 1/128), not 0."""
    assert stats.paired_gap_test([0.0, 0.0], 1.0).p_diff == 1.0
    assert stats.paired_gap_test([0.023, 0.023], 1.0).p_diff == 0.5
    assert stats.paired_gap_test([-0.1] * 8, 1.0).p_diff == 1 / 128


def test_paired_gap_test_is_continuous_through_ties_of_a_discrete_outcome():
    """With the outcome's resolution q, a tie and a near-tie get nearby p's (no jump from the sign-flip
    p to the t test's ~0), a tie is never read as infinite precision (p_equiv > 0), and the tie's p is the t test
    with sd^2 = q^2 / 6 (a variance floor for outcomes quantised at step q: a tie of n seeds cannot give zero
    variance; not Sheppard's correction, which subtracts h^2 / 12 from grouped-data variances)."""
    from scipy import stats as st

    q = 1 / 256
    tie = stats.paired_gap_test([0.023] * 8, 1.0, resolution=q)
    near = stats.paired_gap_test([0.023] * 7 + [0.0231], 1.0, resolution=q)
    assert abs(tie.p_diff - near.p_diff) < 1e-6 and tie.p_diff > 0
    t = 0.023 / np.sqrt(q * q / 6 / 8)
    assert tie.p_diff == pytest.approx(2 * st.t.sf(t, 7), rel=1e-9)
    small = stats.paired_gap_test([0.001, 0.001], 0.01, resolution=q)
    assert 0 < small.p_equiv < 1 and small.p_equiv == pytest.approx(
        stats.paired_gap_test([0.001, 0.0010001], 0.01, resolution=q).p_equiv, abs=1e-4)
    # far from ties the resolution changes nothing measurable
    g = np.array([0.05, -0.02, 0.11, 0.03, 0.07, -0.01])
    assert stats.paired_gap_test(g, 0.1, resolution=q).p_diff == pytest.approx(st.ttest_1samp(g, 0).pvalue,
                                                                                rel=2e-3)
    # without a resolution a tie gets the sign-flip p's, never 0
    assert stats.paired_gap_test([0.001] * 4, 0.01).p_equiv == 1 / 16
    assert stats.paired_gap_test([0.5] * 4, 0.01).p_equiv == 1.0
    with pytest.raises(ValueError, match="resolution"):
        stats.paired_gap_test([0.1, 0.2], 1.0, resolution=-1)


def test_fixed_items_mean_se_is_unbiased_over_draws_and_below_the_binomial_bound_on_mixed_items():
    """128 problems of mixed difficulty (some always solved, some never, the rest in between), 2 draws each, as
    notebook 08 samples its initial policy: the estimated variance averages to the true sampling variance of the mean
    with the problems fixed, sum p_i (1 - p_i) / (n^2 k), which lies well below the binomial bound b (1 - b) / (n k)
    that counts the problems' spread in difficulty as noise."""
    rng = np.random.default_rng(5)
    n, k = 128, 2
    p = np.concatenate([np.zeros(40), np.ones(30), rng.uniform(0.1, 0.9, n - 70)])
    true_var = float((p * (1 - p)).sum() / (n * n * k))
    est = np.array([stats.fixed_items_mean_se((rng.random((n, k)) < p[:, None]).astype(float)) ** 2
                    for _ in range(4000)])
    assert est.mean() == pytest.approx(true_var, rel=0.03)
    b = p.mean()
    assert np.sqrt(true_var) < 0.7 * np.sqrt(b * (1 - b) / (n * k))
    # an estimate, not the bound: every problem split 1-1 gives sqrt(2) x the binomial bound at b = 0.5
    split = np.tile([0.0, 1.0], (n, 1))
    assert stats.fixed_items_mean_se(split) == pytest.approx(np.sqrt(2) * np.sqrt(0.25 / (n * k)))
    # deterministic problems carry no sampling noise; one draw per problem cannot measure it
    assert stats.fixed_items_mean_se(np.repeat([[0.0], [1.0]], 2, axis=1)) == 0.0
    with pytest.raises(ValueError, match="k >= 2"):
        stats.fixed_items_mean_se(np.ones((5, 1)))
    with pytest.raises(ValueError, match="finite"):
        stats.fixed_items_mean_se(np.array([[0.0, np.nan]]))
