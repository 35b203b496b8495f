"""The trend test and the benchmark dose (`rlwb.core.measure.dose_response`) on hand-made dose-response curves: a
known threshold recovered, a flat curve reported as not bounded, a cost already at the smallest dose said to be
below the tested range, bad input refused."""

import numpy as np
import pytest

from rlwb.core.measure import dose_response as dr

DOSES = np.array([0.01, 0.03, 0.1, 0.3, 1.0])


def seeds_of(curve, n=8, sd=0.01, seed=0):
    """`n` seeds of `curve(doses)` each shifted by its own offset and a small per-dose wobble (paired seeds: one
    seed's doses share its offset)."""
    rng = np.random.default_rng(seed)
    return curve(DOSES)[None, :] + rng.normal(0, sd, (n, 1)) + rng.normal(0, sd / 2, (n, DOSES.size))


def test_a_known_threshold_is_recovered_with_its_lower_bound_below_it():
    # cost 0.1 per decade above k3 0.01: the cost reaches the BMR 0.15 at 10^-0.5 = 0.316
    gaps = seeds_of(lambda d: -0.1 * (np.log10(d) + 2))
    b = dr.benchmark_dose(DOSES, gaps, bmr=0.15)
    assert b.status == dr.BOUNDED
    assert b.bmd == pytest.approx(10 ** -0.5, rel=0.1)
    assert 0.1 < b.bmdl < b.bmd  # a lower bound, close to it with 8 seeds this tight
    # a weaker study (more seed spread) gives a lower BMDL, never a higher one
    weak = dr.benchmark_dose(DOSES, seeds_of(lambda d: -0.1 * (np.log10(d) + 2), sd=0.05), bmr=0.15)
    assert weak.bmdl < b.bmdl
    t = dr.dose_trend(DOSES, gaps)
    assert t.slope == pytest.approx(-0.1, abs=0.01) and t.ci_low < -0.1 < t.ci_high < 0 and t.p < 1e-6


def test_a_flat_curve_cannot_bound_the_benchmark_dose_and_shows_no_trend():
    gaps = seeds_of(lambda d: 0.0 * d)
    b = dr.benchmark_dose(DOSES, gaps, bmr=0.15)
    assert b.status == dr.NOT_BOUNDED and np.isnan(b.bmdl) and np.isnan(b.bmd) and b.dose_max == 1.0
    t = dr.dose_trend(DOSES, gaps)
    assert t.ci_low < 0 < t.ci_high and t.p > 0.05


def test_a_cost_already_at_the_smallest_dose_is_below_the_tested_range():
    b = dr.benchmark_dose(DOSES, seeds_of(lambda d: -0.3 + 0.0 * d), bmr=0.15)
    assert b.status == dr.BELOW_RANGE and b.bmdl == DOSES[0] and b.bmd == DOSES[0]


def test_no_benchmark_without_a_gain_to_lose_or_without_doses_to_fit():
    gaps = seeds_of(lambda d: -0.1 * (np.log10(d) + 2))
    assert dr.benchmark_dose(DOSES, gaps, bmr=0.0).status == dr.NO_BMR
    assert dr.benchmark_dose(DOSES, gaps, bmr=float("nan")).status == dr.NO_BMR
    assert dr.benchmark_dose(DOSES[:1], gaps[:, :1], bmr=0.1).status == dr.NO_BMR
    assert np.isnan(dr.dose_trend(DOSES[:1], gaps[:, :1]).p)


@pytest.mark.parametrize("doses,gaps,match", [([0.0, 0.1], np.zeros((3, 2)), "> 0"),
                                              ([0.1, 0.1], np.zeros((3, 2)), "distinct"),
                                              ([0.1, 1.0], np.zeros((3, 3)), "one column per dose"),
                                              ([0.1, 1.0], np.array([[0, np.nan], [0, 0]]), "paired")])
def test_bad_input_is_refused_by_name(doses, gaps, match):
    with pytest.raises(ValueError, match=match):
        dr.dose_trend(doses, gaps)


def test_a_trend_every_seed_shares_is_the_sign_flip_p_not_zero():
    """Seeds whose slopes are equal (a discrete outcome can tie) have no spread for a t test; a p of 0 would call two
    tied seeds a certain trend. The exact sign-flip p of n slopes of one sign is 2 / 2^n; slope 0 is p 1."""
    from rlwb.core.measure.dose_response import dose_trend

    doses = [0.01, 0.1, 1.0]
    tied = np.tile([0.0, -0.1, -0.2], (2, 1))  # both seeds: -0.1 per decade
    t = dose_trend(doses, tied)
    assert t.slope == pytest.approx(-0.1) and t.p == 0.5
    assert dose_trend(doses, np.tile([0.0, -0.1, -0.2], (5, 1))).p == pytest.approx(2 / 32)
    assert dose_trend(doses, np.zeros((3, 3))).p == 1.0


def test_the_trend_interval_is_the_t_interval_of_the_per_seed_slopes():
    """The slopes fitted one seed at a time (`np.polyfit`), then m -+ t_{1-a/2, n-1} sd / sqrt(n) written out: the
    trend's interval (scipy's `ttest_1samp(...).confidence_interval`) equals it to 1e-12 of |m| + h (polyfit is a
    second least-squares route to the slopes: they agree to rounding, not bitwise)."""
    from scipy import stats as st

    for seed, n in ((1, 3), (2, 8)):
        gaps = seeds_of(lambda d: -0.1 * (np.log10(d) + 2), n=n, sd=0.05, seed=seed)
        slopes = np.array([np.polyfit(np.log10(DOSES), g, 1)[0] for g in gaps])
        m, h = slopes.mean(), st.t.ppf(0.975, n - 1) * slopes.std(ddof=1) / np.sqrt(n)
        t = dr.dose_trend(DOSES, gaps)
        assert abs(t.slope - m) <= 1e-12 * abs(m)  # two least-squares routes to the same slopes
        assert abs(t.ci_low - (m - h)) <= 1e-12 * (abs(m) + h) and abs(t.ci_high - (m + h)) <= 1e-12 * (abs(m) + h)
        assert t.p == pytest.approx(st.ttest_1samp(slopes, 0.0).pvalue, rel=1e-9)


@pytest.mark.parametrize("n,sd_seed,sd_cell", [(8, 0.05, 0.05), (6, 0.1, 0.03)])
def test_the_bmdl_covers_the_true_benchmark_dose_in_a_simulation(n, sd_seed, sd_cell):
    """On hand-made curves with noise at the study's doses (k3 0.01, 0.1, 1), a true mean cost of 0.1 per
    decade above k3 0.01 (BMR 0.15: true BMD 10^-0.5), seeds with their own offsets and slopes and per-cell noise,
    the BMDL lies at or below the true BMD in >= 95% of studies (nominal 95%, one-sided; 600 studies, the bound
    3 binomial sd below), and the BMD is recovered (median within 15%). The fitted mean's crossing taken as the BMDL
    covers about half the time: this test fails it."""
    rng = np.random.default_rng(46)
    doses = np.array([0.01, 0.1, 1.0])
    x = np.log10(doses)
    true_bmd, reps = 10 ** -0.5, 600
    covered, bmds = 0, []
    for _ in range(reps):
        slope = -0.1 + rng.normal(0, sd_seed / 2, (n, 1))
        gaps = rng.normal(0, sd_seed, (n, 1)) + slope * (x + 2) + rng.normal(0, sd_cell, (n, doses.size))
        b = dr.benchmark_dose(doses, gaps, bmr=0.15)
        covered += b.status in (dr.BOUNDED, dr.BELOW_RANGE) and b.bmdl <= true_bmd
        bmds.append(b.bmd)
    cover = covered / reps
    assert 0.95 - 3 * np.sqrt(0.95 * 0.05 / reps) <= cover <= 0.999, cover
    # a BMD the fitted mean never reaches inside the doses lies above them: it counts as +inf, not as missing
    assert np.median(np.nan_to_num(bmds, nan=np.inf)) == pytest.approx(true_bmd, rel=0.15)


def test_the_audit_reads_the_study_not_a_newer_follow_up(tmp_path):
    """`study_benchmarks` (what `rlwb audit` places an engine's k3 against): per model the newest study (two doses of
    a kind at least). A newer follow-up run of one dose per kind (08's one-sided vs symmetric run) must not hide the
    study; a newer study replaces the older one, even one whose rows have no benchmark. Hand-made tables, real file
    layout."""
    import pandas as pd

    from rlwb.core.rl.mismatch_doses import dose_kinds

    def run(name: str, model: str, rows: list[tuple[str, str, float]], ratio_k3=(0.01, 0.1)) -> None:
        d = tmp_path / name
        (d / "data").mkdir(parents=True)
        (d / "params.yaml").write_text(f"model: {model}\nratio_k3: {list(ratio_k3)}\nweight_noise: []\n")
        pd.DataFrame([{"name": n, "kind": n, "arm": "none@engine", "status": st, "bmdl": b} for n, st, b in rows]
                     ).to_parquet(d / "data" / "benchmarks.parquet")

    run("20260101-000000-study", "default", [("ratio", dr.BOUNDED, 0.14), ("weights+ppo4", dr.NO_BMR, np.nan)])
    run("20260102-000000-followup", "default", [("ratio", dr.NO_BMR, np.nan)], ratio_k3=(0.0015,))
    run("20260101-000000-chat", "qwen2-chat", [("ratio", dr.BELOW_RANGE, 0.1)])
    dose_params = [k.param for k in dose_kinds()]  # what the audit passes: each kind's list of doses
    got = {r["model"]: (r["run"], list(r["benchmarks"]["name"])) for r in dr.study_benchmarks(tmp_path, dose_params)}
    assert got == {"default": ("20260101-000000-study", ["ratio"]), "qwen2-chat": ("20260101-000000-chat", ["ratio"])}
    run("20260103-000000-study2", "default", [("ratio", dr.NO_BMR, np.nan)])  # a study whose clean run gained nothing
    assert {r["model"]: r["run"] for r in dr.study_benchmarks(tmp_path, dose_params)}["default"] == (
        "20260103-000000-study2")
