"""The trend test across doses (`rlwb.core.measure.dose_response`) on hand-made dose-response curves: a known slope
recovered, a flat curve shows none, bad input refused; and which study run of record the audit reads. The benchmark
dose itself: tests/test_benchmark_dose.py."""

import numpy as np
import pytest

from rlwb.core.measure import benchmark_dose as bd
from rlwb.core.measure import dose_response as dr

DOSES = np.array([0.01, 0.03, 0.1, 0.3, 1.0])


def seeds_of(curve, n=8, sd=0.01, seed=0):
    """`n` seeds of `curve(doses)` each shifted by its own offset and a small per-dose wobble (paired seeds: one
    seed's doses share its offset)."""
    rng = np.random.default_rng(seed)
    return curve(DOSES)[None, :] + rng.normal(0, sd, (n, 1)) + rng.normal(0, sd / 2, (n, DOSES.size))


def test_a_trend_across_doses_is_recovered_with_its_interval():
    # cost 0.1 per decade above k3 0.01
    gaps = seeds_of(lambda d: -0.1 * (np.log10(d) + 2))
    t = dr.dose_trend(DOSES, gaps)
    assert t.slope == pytest.approx(-0.1, abs=0.01) and t.ci_low < -0.1 < t.ci_high < 0 and t.p < 1e-6


def test_a_flat_curve_shows_no_trend():
    t = dr.dose_trend(DOSES, seeds_of(lambda d: 0.0 * d))
    assert t.ci_low < 0 < t.ci_high and t.p > 0.05


def test_no_trend_without_doses_to_fit():
    gaps = seeds_of(lambda d: -0.1 * (np.log10(d) + 2))
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


def test_the_audit_reads_the_study_not_a_newer_follow_up(tmp_path):
    """`study_benchmarks` (what `rlwb audit` places an engine's k3 against): per model the broadest studies (two
    doses of a kind at least; the most benchmark rows), newest first. A newer follow-up run of one dose per kind
    (08's one-sided vs symmetric run), or of several doses of one kind and one arm (08's horizon run), must not hide
    the study; a newer study as broad counts beside it, even one whose rows have no benchmark. Hand-made tables,
    real file layout."""
    import pandas as pd

    from rlwb.core.rl.mismatch_doses import dose_kinds

    def run(name: str, model: str, rows: list[tuple[str, str, float]], ratio_k3=(0.01, 0.1), doses: int = 4) -> None:
        d = tmp_path / name
        (d / "data").mkdir(parents=True)
        (d / "params.yaml").write_text(f"model: {model}\nratio_k3: {list(ratio_k3)}\nweight_noise: []\n")
        pd.DataFrame([{"name": n, "kind": n, "arm": "none@engine", "status": st, "bmdl": b, "doses": doses}
                      for n, st, b in rows]).to_parquet(d / "data" / "benchmarks.parquet")

    # an older study of more rows on 2-3 doses each, then the study of 4 doses a row
    run("20251201-000000-first", "default", [(k, bd.BOUNDED, 0.2) for k in ("ratio", "stale", "weights")], doses=3)
    run("20260101-000000-study", "default", [("ratio", bd.BOUNDED, 0.14), ("stale", bd.ABOVE_RANGE, 0.01),
                                             ("weights+ppo4", bd.NO_BENCHMARK, np.nan)])
    run("20260102-000000-followup", "default", [("ratio", bd.NO_BENCHMARK, np.nan)], ratio_k3=(0.0015,))
    run("20260102-000000-horizon", "default", [("ratio", bd.BOUNDED, 0.03), ("ratio+long", bd.BOUNDED, 0.01)],
        ratio_k3=(0.01, 0.03, 0.1, 1.0))
    run("20260101-000000-chat", "qwen2-chat", [("ratio", bd.BELOW_RANGE, 0.1)])
    dose_params = [k.param for k in dose_kinds()]  # what the audit passes: each kind's list of doses
    got = [(r["model"], r["run"], list(r["benchmarks"]["name"]))
           for r in dr.study_benchmarks(tmp_path, dose_params, min_doses=4)]
    assert got == [("default", "20260101-000000-study", ["ratio", "stale"]),
                   ("qwen2-chat", "20260101-000000-chat", ["ratio"])]
    # no row on 4 doses (breadth 0): a newer follow-up replaces the older run, no tie of follow-ups
    run("20260101-000000-small", "other", [("ratio", bd.BOUNDED, 0.1)], doses=3)
    run("20260102-000000-small2", "other", [("ratio", bd.BOUNDED, 0.1)], doses=2)
    assert [r["run"] for r in dr.study_benchmarks(tmp_path, dose_params, 4) if r["model"] == "other"] == [
        "20260102-000000-small2"]
    # a study as broad on fresh seeds (here one whose clean run gained nothing): both count, newest first
    run("20260103-000000-study2", "default", [("ratio", bd.NO_BENCHMARK, np.nan), ("stale", bd.NO_BENCHMARK, np.nan)])
    assert [r["run"] for r in dr.study_benchmarks(tmp_path, dose_params, 4) if r["model"] == "default"] == [
        "20260103-000000-study2", "20260101-000000-study"]
