"""The least squares under every benchmark-dose fit (`bmd_models`): right on every shape of every model's grid,
and the bootstrap's resamples each fitted on their own group counts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlwb.core.measure import benchmark_dose as bd
from rlwb.core.measure import bmd_coverage as cov
from rlwb.core.measure import bmd_models as bm

X = np.array([0.0, 1e-4, 1e-3, 3e-3, 1e-2])  # 08's k3 doses: the grids' scales reach far beyond them


def _reference(e, n, y):
    """Weighted least squares of y [B, K] on [1, e] (beta >= 0) for every basis e [G, K], in long double with each
    basis centred on its own weighted mean elementwise: (RSS [B, G], fitted means [B, G, K], spread^2 [B, G], the
    basis' centred sum of squares over its uncentred one)."""
    e, n, y = (np.asarray(v, dtype=np.longdouble) for v in (e, n, y))
    n = np.broadcast_to(n, y.shape)
    N = n.sum(-1, keepdims=True)
    my = (n * y).sum(-1, keepdims=True) / N
    yc = y - my
    rss, fit, spread = [], [], []
    for i in range(y.shape[0]):
        ec = e - (e * n[i]).sum(-1, keepdims=True) / N[i]
        see, sey = (ec * ec * n[i]).sum(-1), (ec * yc[i] * n[i]).sum(-1)
        beta = np.where((sey > 0) & (see > 0), sey / np.where(see > 0, see, 1), 0)
        f = my[i] + beta[:, None] * ec
        rss.append(((y[i] - f) ** 2 * n[i]).sum(-1))
        fit.append(f)
        spread.append(see / (e * e * n[i]).sum(-1))
    return (np.array(rss, dtype=np.float64), np.array(fit, dtype=np.float64), np.array(spread, dtype=np.float64))


@pytest.mark.parametrize("model", ["linear", "power", "exp5", "hill"])
@pytest.mark.parametrize("counts", ["one design", "per data set"])
def test_least_squares_match_a_long_double_reference_on_every_grid_shape(model, counts):
    """Every basis of the model's grid (Hill's k up to 100x the top dose, Exp's b down to 0.01 / top dose: bases
    constant to 1e-30 of their size), random group means and counts: the grid's, the hot loop's and the per-row
    least squares give the reference's RSS and fitted means to 1e-9 of the data's spread. A basis flatter than
    `_MIN_SPREAD2` gets the flat fit (RSS = the centred SS), never less. Uncentred sums put RSS 0 on bases whose true
    RSS was 2% of the data's SS, and the grid's argmin picked them."""
    rng = np.random.default_rng(3)
    B = 24
    ybar = rng.normal(0.0, 0.05, (B, X.size)) + np.array([0.4, 0.39, 0.37, 0.3, 0.2])
    n = rng.integers(3, 30, (B, X.size)).astype(float) if counts == "per data set" else np.full(X.size, 8.0)
    t1, t2, _ = bm._grid(model, X[-1], bm.exponents(True))
    e = bm.basis(model, X[None, :], t1[:, None], t2[:, None])
    ref, ref_fit, spread = _reference(e, n, ybar)
    nn = np.broadcast_to(n, ybar.shape)
    syy = (((ybar - (ybar * nn).sum(1, keepdims=True) / nn.sum(1, keepdims=True)) ** 2) * nn).sum(1)[:, None]
    alpha, beta, rss = bm._ls(model, e, n, ybar)
    flat = spread < bm._MIN_SPREAD2 * (1 + 1e-6)
    assert (spread[~flat] > bm._MIN_SPREAD2).all() and (~flat).mean() > 0.5
    assert np.abs(rss - ref)[~flat].max() <= 1e-9 * syy.max()
    fitted = alpha[..., None] + beta[..., None] * e[None]
    assert np.abs(fitted - ref_fit)[~flat].max() <= 1e-9
    # where the basis is flat to rounding: the flat fit exactly, at or above the reference (a fit it allows)
    assert np.allclose(np.broadcast_to(syy, rss.shape)[flat], rss[flat], rtol=1e-12)
    assert (rss[flat] >= ref[flat] - 1e-12).all()
    np.testing.assert_allclose(bm._rss_grid(model, e, n, ybar.copy()), rss, rtol=0, atol=1e-15)
    # one basis per row: the same numbers
    g = rng.integers(0, e.shape[0], B)
    a_r, b_r, r_r = bm._ls_rows(model, e[g], n, ybar)
    rows = np.arange(B)
    np.testing.assert_allclose(r_r, rss[rows, g], rtol=0, atol=1e-15)
    np.testing.assert_allclose(a_r + b_r * e[g][:, 0], fitted[rows, g, 0], rtol=0, atol=1e-12)


def test_the_bootstraps_resamples_are_each_fitted_on_their_own_group_counts():
    """A sequential study (some doses with 24 seeds, some with 8 and a few with 3): the resamples' fits, all at once,
    must equal each resample fitted alone with its own group counts (one with a group it drew no seed of: that group
    weighs nothing). Fitting them on the study's counts, or a batch leaking across resamples, fails this."""
    c, y = cov.simulate(cov.TRUTHS["hill"][0], cov.DESIGN_08, 24, cov.SD_08, np.random.default_rng(5))
    y = cov.thinned(y, (3, 24, 8, 24))
    st = bd.study(list(cov.DESIGN_08), c, y)
    x = np.concatenate([[0.0], st.doses])
    idx = np.random.default_rng(9).integers(0, st.seeds, (40, st.seeds))
    exps = bm.exponents(False)
    models = ["linear", "exp5", "hill"]
    fits, yb, nb, _ = bd.resample_fits(st, idx, models, x, x[-1], exps)
    assert (nb != st.ns).any(1).mean() > 0.9 and (nb[:, 1] == 0).any()  # own counts; some with a group empty
    for m, f in zip(models, fits):
        for b in range(idx.shape[0]):
            alone = bm.fit_many(m, x, nb[b], yb[b:b + 1], x[-1], exps)
            assert f.rss[b] == pytest.approx(alone.rss[0], rel=1e-6, abs=1e-12), (m, b)
            mine = f.alpha[b] + f.beta[b] * bm.basis(m, x, f.t1[b], f.t2[b])
            theirs = alone.alpha[0] + alone.beta[0] * bm.basis(m, x, alone.t1[0], alone.t2[0])
            have = nb[b] > 0
            np.testing.assert_allclose(mine[have], theirs[have], rtol=0, atol=1e-5)


def test_a_sequential_studys_resamples_keep_each_doses_seed_count():
    """The bootstrap draws seeds within the groups of seeds run at the same doses: every resample has the study's
    counts per dose, each seed with all its runs, for the patterns a sequential rule leaves (8 seeds at every dose,
    14 extended at the top two doses, 2 more at the top dose only, 2 run clean only for another row's twins) and a
    failed run (a seed alone in its pattern: in every resample, once); a balanced study's resamples are the plain
    bootstrap's draws, unchanged."""
    c, y = cov.simulate(cov.TRUTHS["hill"][0], cov.DESIGN_08, 26, cov.SD_08, np.random.default_rng(2))
    y = cov.thinned(y, (8, 8, 22, 24))
    y[3, 1] = np.nan  # seed 3's run at the second dose failed: a pattern of its own
    st = bd.study(list(cov.DESIGN_08), c, y)
    idx = bd.resample_seeds(st, 500, np.random.default_rng(4))
    _, nb, _ = bd._group_means(st, idx)
    assert (nb == st.ns).all()
    strata = [[0, 1, 2, 4, 5, 6, 7], [3], list(range(8, 22)), [22, 23], [24, 25]]
    for members in strata:
        drawn = idx[:, members]
        assert set(np.unique(drawn)) == set(members), members
    assert ((idx == 3).sum(1) == 1).all()
    assert (idx[:, 22] != idx[:, 23]).any() and (idx[:, 22] == idx[:, 23]).any()
    c2, y2 = cov.simulate(cov.TRUTHS["hill"][0], cov.DESIGN_08, 30, cov.SD_08, np.random.default_rng(2))
    balanced = bd.study(list(cov.DESIGN_08), c2, y2)
    np.testing.assert_array_equal(bd.resample_seeds(balanced, 50, np.random.default_rng(4)),
                                  np.random.default_rng(4).integers(0, 30, (50, 30)))


@pytest.mark.parametrize("model", ["exp5", "hill"])
def test_the_profile_within_a_coefficient_bound_clips_it_and_never_drops_a_shape(model):
    """The profile likelihood held within BMDS's bounds on the linear coefficients (`coef_max`: the oracle check of
    tests/test_benchmark_dose.py): each shape's coefficient clipped to the bound, its exact constrained optimum, so
    the fall grows as the bound tightens and stays finite; at bound 0 only the zero curve is left (RSS = the
    uncentred sum of squares). Dropping the shapes past the bound made the fall infinite there, and any BMDL "the
    crossing"."""
    c, y = cov.simulate(cov.TRUTHS["hill"][0], cov.DESIGN_08, 10, cov.SD_08, np.random.default_rng(6))
    st = bd.study(list(cov.DESIGN_08), c, y)
    x = np.concatenate([[0.0], st.doses])
    ybar, n, _ = bd._group_means(st)
    exps = bm.exponents(True)
    D = 0.2
    free = bm._profile_rss(model, x, n[0], ybar[0], D, 0.25, x[-1], exps)
    rss = [bm._profile_rss(model, x, n[0], ybar[0], D, 0.25, x[-1], exps, coef_max=cm)
           for cm in (1e6, 1.0, 0.3, 0.1, 0.0)]
    assert rss[0] == free and np.isfinite(rss).all()
    assert all(a <= b for a, b in zip(rss, rss[1:])) and rss[-2] > free
    assert rss[-1] == pytest.approx(float((ybar[0] ** 2) @ n[0]), rel=1e-12)


def _nested_optimum(model, x, n, ybar, x_max, exps):
    """The least RSS by nested one-dimensional searches, independent of the fits' grid and optimizer: the exponent
    on a fine log grid refined by a bounded scalar search, the scale (Hill's k, Exp's b) inside it the same way."""
    from scipy import optimize

    fl = bm._floor(model, exps)

    def rss(t1, t2):
        e = bm.basis(model, x[None, :], np.atleast_1d(t1)[:, None], np.atleast_1d(t2)[:, None])
        return bm._ls_rows(model, e, n, np.repeat(ybar, e.shape[0], 0), fl)[2]

    def refine(f, grid):
        r = np.array([f(v) for v in grid])
        k = int(np.argmin(r))
        res = optimize.minimize_scalar(f, bounds=(grid[max(k - 1, 0)], grid[min(k + 1, grid.size - 1)]),
                                       method="bounded", options={"xatol": 1e-12})
        return min(float(res.fun), float(r[k]))

    if model == "power":
        return refine(lambda g: rss(np.nan, g)[0], np.geomspace(exps[0], exps[-1], 2000))
    lo, hi = bm._scale_bounds(model, x_max)
    scales = np.log(np.geomspace(lo, hi, 1500))

    def profile(d):  # the scale's best at exponent d: the grid at once, then refined
        r = rss(np.exp(scales), np.full(scales.size, d))
        k = int(np.argmin(r))
        res = optimize.minimize_scalar(lambda ls: rss(np.exp(ls), d)[0], method="bounded",
                                       bounds=(scales[max(k - 1, 0)], scales[min(k + 1, scales.size - 1)]),
                                       options={"xatol": 1e-12})
        return min(float(res.fun), float(r[k]))

    return refine(profile, np.geomspace(exps[0], exps[-1], 150))


@pytest.mark.parametrize("model", ["power", "exp3", "exp5", "hill3", "hill"])
def test_the_point_fit_reaches_the_optimum_of_a_nested_search(model):
    """The point fit (`polish`) against an independent optimum (`_nested_optimum`) on studies with unequal seeds per
    dose and BMDS's restricted exponents: never more than 1e-5 above it in RSS. L-BFGS-B from the grid's single
    lowest point stopped short on a flat ridge (Exp3 at d 9.1 where the optimum is 4.2: 0.0025 in log-likelihood
    below BMDS's on one machine, and not on another) or in a nearby optimum (Hill3, 1.3e-4)."""
    designs = [(8, 24, 24, 8), (24, 8, 8, 24), (8, 8, 24, 24), (24, 24, 8, 8)]
    exps = bm.exponents(True)
    studies = []
    for i, truth in enumerate([*cov.TRUTHS, "exponential"]):
        c, y = cov.simulate(cov.TRUTHS[truth][0], cov.DESIGN_08, 24, cov.SD_08, np.random.default_rng(30 + i))
        studies.append(bd.study(list(cov.DESIGN_08), c, cov.thinned(y, designs[i])))
    rng = np.random.default_rng(1)  # the second of these: Hill3's nearby optimum
    for truth in ("hill", "linear"):
        c, y = cov.simulate(cov.TRUTHS[truth][0], cov.DESIGN_08, 24, cov.SD_08, rng)
    studies.append(bd.study(list(cov.DESIGN_08), c, cov.thinned(y, (8, 8, 24, 10))))
    worse = []
    for i, st in enumerate(studies):
        x = np.concatenate([[0.0], st.doses])
        ybar, _, _ = bd._group_means(st)
        fit = bm.polish(model, x, st.ns, ybar, x[-1], bm.fit_many(model, x, st.ns, ybar, x[-1], exps), exps)
        best = _nested_optimum(model, x, st.ns, ybar, x[-1], exps)
        if fit.rss[0] > best * (1 + 1e-5):
            worse.append((i, float(fit.rss[0]), best))
    assert not worse, worse


def test_the_expanded_bound_widens_by_the_strata_a_group_is_drawn_in():
    """The stratified bootstrap's variance of a group's mean is (S - H)/S of the unbiased estimate's for S seeds in H
    strata (in expectation), whatever the strata's sizes (a seed alone in its pattern as much as 14 together):
    measured on resamples of iid data, and the expanded level (`expanded_alpha`) sized by it, Hesterberg's at H = 1;
    a group with fewer than 2 seeds to spare over its strata is refused."""
    rng = np.random.default_rng(11)
    c, y = cov.simulate(cov.TRUTHS["linear"][0], cov.DESIGN_08, 24, cov.SD_08, rng)
    y = cov.thinned(y, (8, 8, 24, 10))
    y[3, 1] = np.nan  # strata of 1, 7, 2, 14 seeds: dose 0 has all 24 in 4
    st = bd.study(list(cov.DESIGN_08), c, y)
    np.testing.assert_array_equal(bd.group_strata(st), [4, 2, 1, 4, 3])
    ratios = []
    for _ in range(60):
        v = rng.normal(0, 1, st.seeds)
        idx = bd.resample_seeds(st, 4000, rng)
        ratios.append(v[idx].mean(1).var() / (v.var(ddof=1) / st.seeds))
    assert np.mean(ratios) == pytest.approx((24 - 4) / 24, abs=0.015)  # the plain bootstrap: 23/24
    # Phi(-sqrt(10/9) t_{9,.95}) = Phi(-1.932) and Phi(-sqrt(10/8) t_{8,.95}) = Phi(-1.118 x 1.860) = Phi(-2.079)
    assert bd.expanded_alpha(0.05, 10, 1) == bd.expanded_alpha(0.05, 10) == pytest.approx(0.0267, abs=2e-4)
    assert bd.expanded_alpha(0.05, 10, 2) == pytest.approx(0.01881, abs=1e-4)
    assert bd.expanded_alpha(0.05, 24, 4) < bd.expanded_alpha(0.05, 24, 1)
    boot = np.random.default_rng(3).lognormal(0, 0.5, 2000)
    assert bd.bootstrap_bounds(boot, 1.0, 24, strata=4)[0] < bd.bootstrap_bounds(boot, 1.0, 24)[0]
    one = np.full((6, 4), 1.0)
    one[np.arange(4), np.arange(4)] = np.nan  # 6 seeds in 5 patterns at dose 0: 1 to spare
    assert "patterns of doses run" in bd.strata_shortfall(bd.study(list(cov.DESIGN_08), np.ones(6), one))
    assert bd.strata_shortfall(st) is None  # 24 seeds in 4 strata, 1 in 2, 7 in 1, ...: 2 or more to spare each


def test_a_study_its_strata_cannot_bound_keeps_its_point_fit_and_says_why():
    """A dose group with fewer than 2 seeds to spare over its strata (5 seeds in 5 patterns, or 6 in 5) gets no
    bootstrap bound, but the point fit stands: status "not bounded", the BMD reported, the reason in the notes (a
    refusal would drop the row's point BMD from the report). With 2 to spare the same data are bounded."""
    curve = cov.TRUTHS["linear"][0]
    for seeds, bounded in ((5, False), (6, False), (7, True)):
        c, y = cov.simulate(curve, cov.DESIGN_08, seeds, 0.01, np.random.default_rng(seeds))
        y[np.arange(4), np.arange(4)] = np.nan  # seeds 0-3 each skip one dose: 4 singleton patterns
        for st in (bd.study(list(cov.DESIGN_08), c, y), bd.Study(np.array(cov.DESIGN_08), c, y)):  # or ready-made
            r = bd.fit_bmd(st, None, None, n_boot=50, profile=False)
            assert r.bmd == pytest.approx(cov.TRUTHS["linear"][1], rel=0.2)
            if bounded:
                assert r.status == bd.BOUNDED and not any("patterns" in m for m in r.notes)
            else:
                assert r.status == bd.NOT_BOUNDED and math.isnan(r.bmdl) and math.isnan(r.bmdu)
                assert any("patterns of doses run" in m for m in r.notes), r.notes
                # the point fit's curve is drawn (no band without the bootstrap)
                assert np.isfinite(r.curve["mean"]).all() and np.isnan(r.curve["low"]).all()
    # where the point BMD lies outside the tested doses the range says so, bound or not: a flat response is "above
    # tested range" with or without the seeds for a bootstrap, the shortfall in its notes
    c, y = cov.simulate(lambda d: 0.3 + 0 * np.asarray(d), cov.DESIGN_08, 6, 0.02, np.random.default_rng(8))
    y[np.arange(4), np.arange(4)] = np.nan
    r = bd.fit_bmd(cov.DESIGN_08, c, y, n_boot=50, profile=False)
    assert r.status == bd.ABOVE_RANGE and math.isnan(r.bmdl) and any("patterns of doses run" in m for m in r.notes)


def test_the_fit_sizes_every_bound_by_the_group_its_strata_undersell_most(monkeypatch):
    """On the default ratio row's design (24 seeds at dose 0; 8, 8, 24 and 10 at the doses; strata of 8, 2 and 14) the
    top dose's 10 seeds in 2 strata set the width (tail 0.0188, not the 8-seed groups' 0.0214): every bound the fit
    takes (the average's and each model's) is sized by (10 seeds, 2 strata). A spy records the calls."""
    c, y = cov.simulate(cov.TRUTHS["linear"][0], cov.DESIGN_08, 24, cov.SD_08, np.random.default_rng(12))
    st = bd.study(list(cov.DESIGN_08), c, cov.thinned(y, (8, 8, 24, 10)))
    calls = []
    real = bd.bootstrap_bounds

    def spy(boot, estimate, seeds, alpha=bd.ALPHA, interval="expanded", strata=1):
        calls.append((seeds, strata))
        return real(boot, estimate, seeds, alpha, interval, strata)

    monkeypatch.setattr(bd, "bootstrap_bounds", spy)
    bd.fit_bmd(st, None, None, n_boot=100, profile=False)
    assert len(calls) >= 2 and set(calls) == {(10, 2)}, calls


def test_seeds_in_equal_patterns_at_different_doses_are_strata_apart():
    """Two extensions of the same size at different doses are different strata: grouping seeds by how many doses
    they ran, not which, would mix them and let both doses' counts vary."""
    c, y = cov.simulate(cov.TRUTHS["hill"][0], cov.DESIGN_08, 14, cov.SD_08, np.random.default_rng(8))
    y[8:11, [0, 2, 3]] = np.nan  # seeds 8-10 at the second dose only
    y[11:14, [0, 1, 2]] = np.nan  # seeds 11-13 at the top dose only
    st = bd.study(list(cov.DESIGN_08), c, y)
    idx = bd.resample_seeds(st, 300, np.random.default_rng(2))
    _, nb, _ = bd._group_means(st, idx)
    assert (nb == st.ns).all()
    assert set(np.unique(idx[:, 8:11])) == {8, 9, 10} and set(np.unique(idx[:, 11:14])) == {11, 12, 13}


def test_the_clipped_profile_is_the_least_squares_within_both_coefficient_bounds():
    """Hill's profile with its BMD held at D within BMDS's bounds |g| <= c and |v| <= c, against the bounded least
    squares solved by its own candidates on the same shapes: f = g + v x^n / (k^n + x^n) with v fixed by the BMD
    (f = g w), per shape g at the unbounded optimum, at 0 and on each bound, kept where both bounds hold on the
    parameters themselves. Dropping the bound on g (f(0)), the wrong quadratic, or clipping from below fails."""
    c, y = cov.simulate(cov.TRUTHS["hill"][0], cov.DESIGN_08, 10, cov.SD_08, np.random.default_rng(6))
    st = bd.study(list(cov.DESIGN_08), c, y)
    x = np.concatenate([[0.0], st.doses])
    ybar, n, _ = bd._group_means(st)
    exps = bm.exponents(True)
    D, bmr = 0.2, 0.25
    eD = np.unique(np.append(1 / (1 + np.exp(-np.linspace(-16, 16, 321))), 1 - bmr))  # the profile's shapes
    eD, ns = (v.ravel() for v in np.meshgrid(eD, exps, indexing="ij"))
    k = D * (1 / eD - 1) ** (-1 / ns)
    lo, hi = bm._scale_bounds("hill", x[-1])
    keep = (k >= lo) & (k <= hi)
    k, ns = k[keep], ns[keep]
    h = x[None, :] ** ns[:, None] / (k[:, None] ** ns[:, None] + x[None, :] ** ns[:, None])  # [shapes, K]
    hD = D ** ns / (k ** ns + D ** ns)
    w = 1 - (bmr / hD)[:, None] * h  # f(D) = (1 - bmr) f(0): v = -bmr g / hD
    g_free = (w * ybar[0] * n[0]).sum(1) / (w * w * n[0]).sum(1)
    results = []
    for cap in (10.0, 0.3, 0.1, 0.02):
        cands = np.stack([g_free, np.zeros_like(g_free), np.full_like(g_free, cap), cap * hD / bmr], 1)
        ok = (cands >= 0) & (cands <= cap * (1 + 1e-12)) & (bmr * cands / hD[:, None] <= cap * (1 + 1e-12))
        rss = (((ybar[0][None, None, :] - cands[..., None] * w[:, None, :]) ** 2) * n[0]).sum(-1)
        brute = float(np.where(ok, rss, np.inf).min())
        mine = bm._profile_rss("hill", x, n[0], ybar[0], D, bmr, x[-1], exps, coef_max=cap)
        assert mine == pytest.approx(brute, rel=1e-9), (cap, mine, brute)
        results.append(mine)
    assert results[0] < results[1] < results[2] < results[3]  # the bounds bind, tighter and tighter


@pytest.mark.parametrize("model", ["power", "exp5", "hill"])
def test_the_polishs_batched_gradient_is_scipys_own_forward_difference(model):
    """`_value_and_grad` claims scipy's L-BFGS-B default differencing to the bit, in one batched call: its gradient
    equals scipy's `approx_derivative` (what L-BFGS-B calls) inside the bounds, on each and in the corners (on an
    upper bound the step is taken backward), and from starts inside and on the bounds L-BFGS-B with it lands on the
    same parameters and RSS, bit for bit, as L-BFGS-B differencing the same function itself. On the log dose metric
    (x up to 3.5), where power's x^n is not flat at n = 18: the bound rule or a step 1e-15 off fails every model."""
    from scipy import optimize

    exps = bm.exponents(True)
    c, y = cov.simulate(cov.TRUTHS["hill"][0], cov.DESIGN_08, 12, cov.SD_08, np.random.default_rng(3))
    st = bd.study(list(cov.DESIGN_08), c, cov.thinned(y, (12, 6, 12, 8)))
    x = bd.to_metric(np.concatenate([[0.0], st.doses]), "log", float(st.doses[0]))  # up to 3.5: x^18 is not flat
    ybar, _, _ = bd._group_means(st)
    if model == "power":
        bounds, starts = [(exps[0], exps[-1])], [[1.7], [exps[-1]], [exps[0]]]

        def rss_rows(P):
            return bm._ls_rows(model, bm.basis(model, x[None, :], np.full((len(P), 1), np.nan), P[:, :1]), st.ns,
                               ybar)[2]
    else:
        bounds = [tuple(np.log(bm._scale_bounds(model, x[-1]))), (exps[0], exps[-1])]
        starts = [[np.log(0.3), 2.0], [bounds[0][1], exps[-1]], [bounds[0][0], exps[0]]]

        def rss_rows(P):
            return bm._ls_rows(model, bm.basis(model, x[None, :], np.exp(P[:, :1]), P[:, 1:2]), st.ns, ybar)[2]
    lb, ub = (np.array(v) for v in zip(*bounds))
    # the gradient itself against scipy's differencing (what L-BFGS-B calls) inside, on each bound and in the
    # corners: on an upper bound the step is taken backward
    from scipy.optimize._numdiff import approx_derivative

    mid = 0.5 * (lb + ub)
    points = [mid, ub, lb] + ([np.array([ub[0], mid[1]]), np.array([mid[0], ub[1]]), np.array([lb[0], ub[1]])]
                              if lb.size == 2 else [])
    for q in points:
        f0, g = bm._value_and_grad(q, rss_rows, lb, ub)
        theirs = approx_derivative(lambda v: float(rss_rows(np.asarray(v)[None, :])[0]), q, method="2-point",
                                   abs_step=1e-8, f0=f0, bounds=(lb, ub))
        assert np.array_equal(g, theirs), (q, g, theirs)
    for i, p0 in enumerate(starts):
        ours = optimize.minimize(bm._value_and_grad, p0, args=(rss_rows, lb, ub), jac=True, method="L-BFGS-B",
                                 bounds=bounds)
        scipys = optimize.minimize(lambda p: float(rss_rows(np.asarray(p)[None, :])[0]), p0, method="L-BFGS-B",
                                   bounds=bounds)
        assert np.array_equal(ours.x, scipys.x) and ours.fun == scipys.fun, (p0, ours, scipys)
        assert ours.nit > 0 or i > 0  # from inside the bounds it moves (on a bound the curve may be flat)


def test_the_polish_runs_blas_on_one_thread_and_fits_the_same_to_the_bit(monkeypatch):
    """scipy's L-BFGS-B calls BLAS on one- or two-element vectors at every iteration; with OpenBLAS's thread pool
    that was most of a study's fit (`bm._one_blas_thread`). With BLAS at 2 threads (set here, so the test means the
    same under OPENBLAS_NUM_THREADS=1 or on one core), every L-BFGS-B call of the polish runs at 1 and the setting
    is 2 again after; a whole fit, bootstrap and bounds included, is the same to the bit as with the pool."""
    import contextlib

    from scipy import optimize
    from threadpoolctl import threadpool_info, threadpool_limits

    def blas_threads():
        return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]

    seen, real = [], optimize.minimize

    def watched(*args, **kw):
        seen.append(blas_threads())
        return real(*args, **kw)

    c, y = cov.simulate(cov.TRUTHS["hill"][0], cov.DESIGN_08, 10, cov.SD_08, np.random.default_rng(11))
    with threadpool_limits(limits=2, user_api="blas"):
        before = blas_threads()
        assert before and min(before) >= 2, before
        monkeypatch.setattr(optimize, "minimize", watched)
        one = bd.fit_bmd(cov.DESIGN_08, c, y, n_boot=100, seed=5)
        assert seen and all(set(threads) == {1} for threads in seen), seen
        assert blas_threads() == before
        monkeypatch.setattr(bm, "_one_blas_thread", contextlib.nullcontext)
        seen.clear()
        pool = bd.fit_bmd(cov.DESIGN_08, c, y, n_boot=100, seed=5)
        assert seen and all(min(threads) >= 2 for threads in seen), seen  # the comparison is with the pool
    assert (one.status, one.bmd, one.bmdl, one.bmdu) == (pool.status, pool.bmd, pool.bmdl, pool.bmdu)
    assert np.array_equal(one.boot, pool.boot, equal_nan=True)
    assert [(m.model, m.bmd, m.weight, m.gof_p) for m in one.models] == [(m.model, m.bmd, m.weight, m.gof_p)
                                                                         for m in pool.models]
