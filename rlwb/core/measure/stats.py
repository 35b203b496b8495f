"""Uncertainty on reported numbers: sequence-level bootstrap intervals, reward-distribution tests, seed CIs, paired
gap tests across seeds with their Holm adjustment, power and minimal detectable gap.

Why resample *sequences*, not tokens: the tokens of one completion share a context (and, for an engine
bug, a cause), so they are correlated; a token-level bootstrap treats ~20 correlated tokens as 20
independent draws and gives intervals that are too narrow. Resampling whole sequences (the cluster
bootstrap; Davison & Hinkley 1997, sec. 3.8; Field & Welsh 2007, https://doi.org/10.1111/j.1467-9868.2007.00593.x)
keeps the within-sequence dependence. Intervals are percentile intervals.

Reward equivalence between engines follows the advice to compare reward *distributions* of many
rollouts of the same prompts (Mann-Whitney U for a shift, a permutation test on the mean difference,
Cliff's delta as the effect size: https://doi.org/10.1037/0033-2909.114.3.494).

Functions of arrays (numpy, scipy, statsmodels); nothing here touches an engine or a model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

ALPHA = 0.05  # two-sided: 95% intervals
N_BOOT = 2000
CI_METRICS = ("abs_dlogp_mean", "k3_mean", "clip_frac")  # the headline mismatch metrics that get intervals


def _bootstrap_draws(groups: Sequence[np.ndarray], stat: Callable[[np.ndarray], float], n_boot: int,
                     rng: np.random.Generator) -> np.ndarray:
    """`n_boot` values of `stat(concatenated tokens)`, each over whole sequences drawn with replacement."""
    return _draws_at(groups, stat, [rng.integers(0, len(groups), len(groups)) for _ in range(n_boot)])


def _draws_at(groups: Sequence[np.ndarray], stat: Callable[[np.ndarray], float],
              picks: Sequence[np.ndarray]) -> np.ndarray:
    """`stat(concatenated tokens)` of the sequences each row of `picks` names (indices into `groups`)."""
    groups = [np.asarray(g, dtype=np.float64) for g in groups]
    flat = np.concatenate(groups)
    lengths = np.array([len(g) for g in groups])
    starts = np.cumsum(lengths) - lengths
    vals = np.empty(len(picks))
    for b, pick in enumerate(picks):
        lens = lengths[pick]
        # token indices of the picked sequences, back to back, without a Python loop over sequences
        idx = np.repeat(starts[pick] - (np.cumsum(lens) - lens), lens) + np.arange(lens.sum())
        vals[b] = stat(flat[idx])
    return vals


def _percentile_interval(vals: np.ndarray, alpha: float) -> tuple[float, float]:
    vals = vals[np.isfinite(vals)]
    if vals.size == 0:
        return float("nan"), float("nan")
    lo, hi = np.quantile(vals, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def sequence_bootstrap_ci(groups: Sequence[np.ndarray], stat: Callable[[np.ndarray], float], n_boot: int = N_BOOT,
                          alpha: float = ALPHA, seed: int = 0) -> tuple[float, float]:
    """Percentile interval of `stat(concatenated tokens)` when whole sequences (`groups`) are resampled
    with replacement. `stat` is any token-level metric (e.g. `rlwb.core.measure.metrics.k3` of the log ratios)."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if not groups:
        return float("nan"), float("nan")
    return _percentile_interval(_bootstrap_draws(groups, stat, n_boot, np.random.default_rng(seed)), alpha)


def difference_ci(a: Sequence[np.ndarray], b: Sequence[np.ndarray], stat: Callable[[np.ndarray], float],
                  n_boot: int = N_BOOT, alpha: float = ALPHA, seed: int = 0) -> tuple[float, float]:
    """Percentile interval of stat(a) - stat(b) for two *independent* samples of sequences (e.g. two engines'
    rollouts of different prompts), each resampled by whole sequences as in `sequence_bootstrap_ci`. Samples
    that pair up (same prompts, same seeds) take `paired_difference_ci`."""
    if not a or not b:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    return _percentile_interval(_bootstrap_draws(a, stat, n_boot, rng) - _bootstrap_draws(b, stat, n_boot, rng),
                                alpha)


def paired_difference_ci(a: Sequence[np.ndarray], b: Sequence[np.ndarray], stat: Callable[[np.ndarray], float],
                         n_boot: int = N_BOOT, alpha: float = ALPHA, seed: int = 0) -> tuple[float, float]:
    """Percentile interval of stat(a) - stat(b) when sequence i of `a` and sequence i of `b` are a *pair*: the
    same prompt sampled with the same seed under two engine settings (notebook 06's knob and its baseline). Each
    draw resamples pair indices and takes both members of every pair drawn (the paired cluster bootstrap), so
    what the prompt contributes to both sides cancels instead of widening the interval, as it does when the two
    are resampled independently (`difference_ci`)."""
    if len(a) != len(b):
        raise ValueError(f"paired samples need one sequence of each side per pair, got {len(a)} and {len(b)}")
    if not a:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    picks = [rng.integers(0, len(a), len(a)) for _ in range(n_boot)]
    return _percentile_interval(_draws_at(a, stat, picks) - _draws_at(b, stat, picks), alpha)


def mean_ci(x: np.ndarray, n_boot: int = N_BOOT, alpha: float = ALPHA, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of independent samples (e.g. one reward per rollout)."""
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, (n_boot, x.size))].mean(axis=1)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def proportion_ci(successes: int, n: int, alpha: float = ALPHA, method: str = "wilson") -> tuple[float, float]:
    """Interval of a rate, scipy's (`binomtest(k, n).proportion_ci`). `method` "wilson": the Wilson score interval
    (Wilson 1927, https://doi.org/10.1080/01621459.1927.10502953): unlike the normal approximation it stays inside
    [0, 1] and is not degenerate at 0/n or n/n, where a validator's pass rate usually sits; exactly 0 at k = 0 and
    1 at k = n. "exact": Clopper-Pearson (never below its level; what a coverage or false-positive rate claims,
    where a too-short interval would flatter it). No trials (n = 0) have no interval: (nan, nan)."""
    from scipy import stats as st

    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if n < 1:
        return float("nan"), float("nan")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, n={n}], got {successes}")
    if method not in ("wilson", "exact"):
        raise ValueError(f"method must be 'wilson' or 'exact', got {method!r}")
    ci = st.binomtest(int(successes), int(n)).proportion_ci(confidence_level=1 - alpha, method=method)
    return float(ci.low), float(ci.high)


def shared_control_rate_ci(rejections: int, seeds: int, clusters: Sequence[int], alpha: float = ALPHA,
                           reps: int = 20000, seed: int = 0) -> tuple[float, float]:
    """Exact-style 95% interval of a rejection rate over paired t tests that share their control runs: `clusters`
    gives how many tests share one control (notebook 08's placebo streams, each tested against the same clean run
    of each of its `seeds` seeds: [20] for 20 streams on one arm; [1] * n for independent tests), `rejections` of
    sum(clusters) tests rejected.

    Why not Clopper-Pearson: tests sharing a control are correlated (their gaps share its noise: correlation 1/2
    when the runs are exchangeable, as a placebo and its clean twin are), so their rejections come in bunches and a
    count of 0 of 20 says less than 20 independent trials would (with 20 streams on one control, the count's
    variance is ~3x the binomial's). The interval inverts the count's distribution under the design instead, as
    Clopper-Pearson inverts the binomial's: the tests' |t| simulated under the null (normal runs, `reps` studies of
    `seeds` seeds, each cluster on its own control), a rate pi being rejection at |t| > t_{S-1}(1 - pi/2), and
    (low, high) the rates at which the observed count is in a tail of alpha/2 (Monte Carlo error ~0.002 on the ends
    at `reps`; `seed` fixes them). Tests each on their own control (every cluster 1) get Clopper-Pearson itself.

    Assumes what the design makes true under no effect: a test's runs and its control are exchangeable (a placebo
    and its clean twin: the same code on another sampling stream), so two tests' gaps correlate 1/2. A control
    noisier than the runs tested against it correlates them more and the interval is too short (a review measured
    92-93% coverage with a control of 2-3x the sd). The miscalibration it represents is a shifted threshold on these
    |t| (tests/test_stats.py checks its coverage under another, heavier-tailed, noise too). A count of Holm-adjusted
    rejections is read with the same model, approximately: Holm's thresholds move with the family's other tests."""
    from scipy import stats as st

    sizes = [int(m) for m in clusters]
    n = sum(sizes)
    if not sizes or min(sizes) < 1:
        raise ValueError(f"clusters must be sizes >= 1, got {clusters}")
    if seeds < 2:
        raise ValueError(f"need at least 2 seeds for a t test, got {seeds}")
    if not 0 <= rejections <= n:
        raise ValueError(f"rejections must be in [0, {n}], got {rejections}")
    if max(sizes) == 1:  # independent tests: the binomial, exactly
        return proportion_ci(rejections, n, alpha, method="exact")
    rng = np.random.default_rng(seed)
    t = []
    for m in sizes:
        g = rng.normal(size=(reps, seeds, m)) - rng.normal(size=(reps, seeds, 1))
        t.append(np.abs(g.mean(1) / (g.std(1, ddof=1) / np.sqrt(seeds))))
    t = np.sort(np.concatenate(t, 1), axis=1)  # each study's |t| ascending: K >= k iff its k-th largest exceeds c

    def at_least(pi: float, k: int) -> float:  # P_pi(K >= k)
        return float((t[:, n - k] > st.t.isf(pi / 2, seeds - 1)).mean())

    def solve(tail) -> float:  # the rate where the (monotone) tail probability crosses alpha / 2, by bisection
        lo, hi = 0.0, 1.0
        for _ in range(40):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if tail(mid) else (lo, mid)
        return lo

    low = 0.0 if rejections == 0 else solve(lambda pi: at_least(pi, rejections) < alpha / 2)
    high = 1.0 if rejections == n else solve(lambda pi: 1 - at_least(pi, rejections + 1) >= alpha / 2)
    return low, high


def seed_ci(values: Sequence[float], alpha: float = ALPHA) -> tuple[float, float]:
    """Student-t interval of the mean across seeds (few seeds: a bootstrap would be degenerate), scipy's
    `ttest_1samp(...).confidence_interval`. One seed gives (nan, nan): no interval can be claimed; no spread across
    seeds gives the point (m, m) (scipy would warn about the zero variance)."""
    from scipy import stats as st

    v = np.asarray(values, dtype=np.float64)
    if v.size < 2:
        return float("nan"), float("nan")
    if v.std(ddof=1) == 0:
        return float(v.mean()), float(v.mean())
    ci = st.ttest_1samp(v, 0.0).confidence_interval(1 - alpha)
    return float(ci.low), float(ci.high)


def fixed_items_mean_se(draws: np.ndarray) -> float:
    """The standard error of the mean of `draws` ([items, k]: k independent draws of each of a fixed set of items,
    e.g. k completions of each held-out problem) over the draws alone, the items held fixed: sqrt(sum_i s_i^2 / k) / n
    with s_i^2 each item's sample variance (ddof 1, unbiased for p_i (1 - p_i) on a 0/1 reward). Why not the spread of
    all n k draws: problems differ in difficulty, and that spread counts it as noise, while a policy scored again on
    the same problems meets the same difficulties. The binomial sqrt(b (1 - b) / (n k)) bounds the true standard
    error; this estimate of it can exceed that bound by chance, by up to sqrt(k / (k - 1)) (every item split evenly),
    and as the square root of an unbiased variance it runs slightly low. Needs k >= 2 (one draw per item says nothing
    about its own variance)."""
    d = np.asarray(draws, dtype=np.float64)
    if d.ndim != 2 or d.shape[0] < 1 or d.shape[1] < 2:
        raise ValueError(f"draws must be [items, k] with k >= 2 draws of each item, got shape {d.shape}")
    if not np.isfinite(d).all():
        raise ValueError("draws must be finite")
    n, k = d.shape
    return float(np.sqrt(d.var(axis=1, ddof=1).sum() / k) / n)


@dataclass(frozen=True)
class RewardComparison:
    mean_a: float
    mean_b: float
    mean_diff: float  # mean_a - mean_b
    diff_ci: tuple[float, float]  # bootstrap interval of mean_a - mean_b
    mw_pvalue: float  # Mann-Whitney U, two-sided
    perm_pvalue: float  # permutation test on the mean difference, two-sided
    cliffs_delta: float  # P(a > b) - P(a < b), in [-1, 1]
    n_a: int
    n_b: int


def permutation_pvalue(a: np.ndarray, b: np.ndarray, n_perm: int = 5000, seed: int = 0) -> float:
    """Two-sided permutation test of mean(a) - mean(b) (scipy's `permutation_test`, independent samples):
    twice the smaller one-sided p, capped at 1. Exact where it can be: when `n_perm` is at least the number of
    distinct ways to split the pooled values into the two samples, C(n_a + n_b, n_a), every split is enumerated
    and p is the exact permutation p-value (a random draw of splits would only estimate it, and could draw the
    same split twice); otherwise `n_perm` random splits from `seed`, each one-sided p counting the observed split
    with them, (k + 1) / (n_perm + 1), so p is never 0 (Phipson & Smyth 2010,
    https://doi.org/10.2202/1544-6115.1585). Identical constant samples give 1."""
    from scipy import stats as st

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.size < 1 or b.size < 1:
        raise ValueError(f"a permutation test needs at least 1 value per side, got {a.size} and {b.size}")
    if n_perm < 1:
        raise ValueError(f"n_perm must be >= 1, got {n_perm}")
    res = st.permutation_test((a, b), _mean_difference, permutation_type="independent", vectorized=True,
                              n_resamples=n_perm, alternative="two-sided", rng=np.random.default_rng(seed))
    return float(res.pvalue)


def _mean_difference(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    return x.mean(axis=axis) - y.mean(axis=axis)


def compare_rewards(a: np.ndarray, b: np.ndarray, n_boot: int = N_BOOT, n_perm: int = 5000,
                    seed: int = 0) -> RewardComparison:
    """Are two engines' reward distributions the same? Means, difference with CI, Mann-Whitney and
    permutation p-values, Cliff's delta."""
    from scipy import stats as st

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.size < 2 or b.size < 2:
        raise ValueError(f"need at least 2 rewards per side, got {a.size} and {b.size}")
    rng = np.random.default_rng(seed)
    diffs = (a[rng.integers(0, a.size, (n_boot, a.size))].mean(1)
             - b[rng.integers(0, b.size, (n_boot, b.size))].mean(1))
    lo, hi = np.quantile(diffs, [ALPHA / 2, 1 - ALPHA / 2])
    if np.all(a == a[0]) and np.all(b == a[0]):
        mw_p = 1.0  # identical constant samples: scipy's U test is undefined, there is no difference
    else:
        mw_p = float(st.mannwhitneyu(a, b, alternative="two-sided").pvalue)
    u = st.mannwhitneyu(a, b, alternative="two-sided").statistic if mw_p < 1.0 else a.size * b.size / 2
    return RewardComparison(mean_a=float(a.mean()), mean_b=float(b.mean()), mean_diff=float(a.mean() - b.mean()),
                            diff_ci=(float(lo), float(hi)), mw_pvalue=mw_p,
                            perm_pvalue=permutation_pvalue(a, b, n_perm, seed),
                            cliffs_delta=float(2 * u / (a.size * b.size) - 1), n_a=int(a.size), n_b=int(b.size))


def token_statistics(clip_eps: float = 0.2) -> dict[str, Callable[[np.ndarray], float]]:
    """The mismatch metrics that are a function of the pooled token log-ratios, by name (what the bootstrap
    can resample)."""
    from rlwb.core.measure import metrics as M

    return {"abs_dlogp_mean": M.abs_mean, "k3_mean": M.k3, "clip_frac": lambda lr: M.clip_frac(lr, clip_eps),
            "k1_mean": M.k1, "ess_frac": M.ess_frac, "ess_tis": M.ess_tis, "chi2_token": M.chi2_token,
            "mult_prob_error": M.mult_prob_error}


def mismatch_cis(log_ratios: Sequence[np.ndarray], clip_eps: float = 0.2, n_boot: int = N_BOOT,
                 seed: int = 0, names: Sequence[str] = CI_METRICS) -> dict[str, float]:
    """`<metric>_ci_low` / `<metric>_ci_high` for each of `names` (default `CI_METRICS`), resampling sequences.
    `log_ratios`: one array of log r = logp_trainer - logp_engine per completion."""
    fns = token_statistics(clip_eps)
    out = {}
    for k in names:
        lo, hi = sequence_bootstrap_ci(log_ratios, fns[k], n_boot=n_boot, seed=seed)
        out[f"{k}_ci_low"], out[f"{k}_ci_high"] = lo, hi
    return out


def holm(pvalues: Sequence[float]) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values (Holm 1979, https://www.jstor.org/stable/4615733), statsmodels'
    `multipletests(method="holm")`: the i-th smallest of m is multiplied by (m - i), running maxima keep the order,
    capped at 1. Rejecting where adjusted < alpha holds the family-wise error rate at alpha for any dependence
    between the tests. NaNs stay NaN and do not count in m (statsmodels has no NaN policy: only the finite ones go
    in)."""
    from statsmodels.stats.multitest import multipletests

    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    ok = np.isfinite(p)
    if ok.any():
        out[ok] = multipletests(p[ok], method="holm")[1]
    return out


@dataclass(frozen=True)
class PairedGapTest:
    """One paired gap (per-seed differences of the same configuration pair) tested two ways, unadjusted."""

    n: int
    mean: float
    p_diff: float  # two-sided t test of mean gap = 0
    p_equiv: float  # TOST of |mean gap| >= margin (small: the gap is shown inside +-margin)
    sd: float


def paired_gap_test(gaps: Sequence[float], margin: float, resolution: float = 0.0) -> PairedGapTest:
    """Difference and equivalence (two one-sided tests, Schuirmann 1987; https://doi.org/10.1007/BF01068419)
    t tests of per-seed gaps.

    `resolution`: the step q of the discrete outcome each gap is a difference of (a mean of N rewards of 0 or 1:
    1 / N). A variance floor, not a correction: outcomes quantised at step q cannot resolve differences finer than
    q, so n seeds that tie do not show zero variance; the t tests use sd^2 + q^2 / 6 (`floored_sd`: the variance
    of a difference of two uniform errors of width q, q^2 / 12 each, added as a floor, where Sheppard's correction
    would instead subtract h^2 / 12 from a grouped-data variance). So p is continuous in the gaps through ties (two
    seeds both +0.023 and two at +0.023 / +0.0231 get nearby p's), and a tie is never read as infinite precision
    (p_diff and p_equiv -> 0). Where the spread is far above q (the usual case) the floor changes nothing
    measurable; it makes the test a little conservative near ties, never anti-conservative.

    Without a resolution (0: a continuous outcome) zero spread has no t statistic: p_diff is 1 for a common gap of 0
    (bitwise twins) and otherwise the exact sign-flip (randomization) test's 2 / 2^n (Fisher 1935, The Design of
    Experiments, sec. 21: n gaps all of one sign), and p_equiv inside the margin the sign-flip p of each one-sided
    test, 1 / 2^n (1 outside): the smallest p n seeds can give without a spread, never 0."""
    from scipy import stats as st

    if not (np.isfinite(resolution) and resolution >= 0):
        raise ValueError(f"resolution must be finite and >= 0, got {resolution}")
    g = np.asarray(gaps, dtype=np.float64)
    n = g.size
    if n < 2:
        return PairedGapTest(n, float(g.mean()) if n else float("nan"), float("nan"), float("nan"), float("nan"))
    m, sd = float(g.mean()), float(g.std(ddof=1))
    if sd <= 1e-12 * max(1.0, abs(m)):  # every seed's gap the same (to rounding)
        sd = 0.0
    se = floored_sd(sd, resolution) / float(np.sqrt(n))
    if se == 0:  # a tie of a continuous outcome: the exact sign-flip p's
        return PairedGapTest(n, m, 1.0 if m == 0 else min(1.0, 2.0 ** (1 - n)),
                             2.0 ** -n if abs(m) < margin else 1.0, 0.0)
    df = n - 1
    p_diff = float(2 * st.t.sf(abs(m) / se, df))
    p_lo = float(st.t.sf((m + margin) / se, df))  # H0: mean <= -margin
    p_hi = float(st.t.cdf((m - margin) / se, df))  # H0: mean >= +margin
    return PairedGapTest(n, m, p_diff, max(p_lo, p_hi), sd)


def floored_sd(sd: float, resolution: float = 0.0) -> float:
    """The per-seed spread `paired_gap_test` tests with: sqrt(sd^2 + q^2 / 6) for gaps of an outcome quantised at
    step q = `resolution` (a floor: n seeds that tie cannot show zero variance). What `minimal_detectable_gap` takes,
    so a row's MDE is that of the test its p comes from (a tie's is not 0)."""
    return float(np.sqrt(sd * sd + resolution * resolution / 6))


def paired_t_power(gap: float, sd: float, n: int, alpha: float = ALPHA) -> float:
    """The exact power of a two-sided one-sample (paired) t test at level `alpha` against a true mean gap `gap`
    with per-seed spread `sd`: P(|T| > t_{1-alpha/2, n-1}) where T is noncentral t with n - 1 degrees of freedom
    and noncentrality gap * sqrt(n) / sd (Cohen 1988, Statistical Power Analysis, ch. 2; scipy.stats.nct)."""
    from scipy import stats as st

    if n < 2 or not (np.isfinite(sd) and sd > 0):
        return float("nan")
    df, nc = n - 1, abs(gap) * np.sqrt(n) / sd
    tc = st.t.ppf(1 - alpha / 2, df)
    upper = st.nct.sf(tc, df, nc)
    lower = st.nct.sf(tc, df, -nc)  # P(T < -tc) by symmetry; nct.cdf(-tc) returns NaN far in the tail
    return float(np.nan_to_num(upper) + np.nan_to_num(lower))


def minimal_detectable_gap(sd: float, n: int, alpha: float = ALPHA, power: float = 0.8) -> float:
    """The smallest true mean gap a two-sided paired t test at level `alpha` detects with probability `power`,
    given the per-seed spread `sd`: `paired_t_power` (the noncentral t) solved for the gap. What a "no effect"
    at this budget can and cannot rule out.

    Why not the textbook shortcut (t_{1-alpha/2} + t_{power}) * sd / sqrt(n): it treats the test statistic under
    the alternative as a shifted central t. At alpha = 0.05 that is close, but at the strict levels of a Holm
    family (alpha / m with m ~ 40) and few seeds its power is 0.72-0.76, not 0.80 (tests/test_stats.py checks both
    against a simulation).

    Why not statsmodels' `TTestPower().solve_power`: its power takes the lower tail from scipy's noncentral t cdf,
    which is NaN far in that tail (a large effect at a strict level), and its root finder reads NaN as "too far"
    and returns another effect size without a warning: 47% below this one at n = 5, alpha = 0.05 / 200, where the
    power of its answer is far below 0.8. Where it works its tolerance (1e-5 on the effect size) is looser than
    this one's. `paired_t_power` equals statsmodels' power wherever that is defined (tests/test_stats.py)."""
    from scipy import optimize
    from scipy import stats as st

    if n < 2 or not np.isfinite(sd):
        return float("nan")
    if not 0 < alpha < 1 or not 0 < power < 1:
        raise ValueError(f"alpha and power must be in (0, 1), got {alpha} and {power}")
    if sd == 0:
        return 0.0
    df = n - 1
    lo = 1e-9 * sd
    hi = (st.t.ppf(1 - alpha / 2, df) + st.norm.ppf(power)) * sd / np.sqrt(n)
    while paired_t_power(hi, sd, n, alpha) < power:  # the central shortcut under-shoots: widen until it brackets
        hi *= 2
    return float(optimize.brentq(lambda g: paired_t_power(g, sd, n, alpha) - power, lo, hi, xtol=1e-12 * sd))


def equivalence_sd_max(margin: float, n: int, alpha: float = ALPHA) -> float:
    """The largest per-seed spread (sd) at which a TOST at level `alpha` could still show a zero mean gap inside
    +-`margin` with `n` seeds: margin * sqrt(n) / t_{1-alpha, n-1}. A budget whose spread exceeds it cannot call
    anything equivalent, whatever the truth."""
    from scipy import stats as st

    if n < 2:
        return float("nan")
    return float(margin * np.sqrt(n) / st.t.ppf(1 - alpha, n - 1))
