"""Notebook 08's statistics on hand-made curves (`rlwb.experiments.mismatch_cost`): which rows form the Holm family,
the verdicts a known cost, a known null and a broken control get, the MDE beside them, and held-out problems that
no run trains on. Pure functions on synthetic data: the notebook's smoke test runs the real engines."""

import re
from collections import namedtuple
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from rlwb.experiments import mismatch_cost as mc
from rlwb.experiments.mismatch_study import analysis, design, execution
from rlwb.experiments.wording import mismatch_cost as words_08
from rlwb.params.schemas.mismatch_cost import MismatchCostParams

SEEDS, STEPS = range(6), range(10)


def curves(costs: dict[tuple[str, str], float]) -> pd.DataFrame:
    """Reward curves for (label, arm): the clean arm learns 0.5 -> 0.8 with a per-seed offset; a dosed row is its
    clean twin minus `cost` (plus a small per-seed wobble where the cost is not 0, so a t test has a spread)."""
    rows = []
    for (label, arm), cost in costs.items():
        kind = label.split("@")[0]
        for s in SEEDS:
            wobble = 0.0 if cost == 0 else 0.01 * np.sin(3.0 * s + 1)
            for t in STEPS:
                base = 0.5 + 0.03 * t + 0.02 * s
                rows.append({"step": t, "kind": kind, "label": label, "dose": 0.0 if kind == "clean" else 0.1,
                             "temperature": 0.7, "arm": arm, "seed": s, "reward_mean": base - cost - wobble,
                             "grad_norm": 1.0, "clip_frac": 0.0, "mismatch_k3": 0.1 if kind != "clean" else 0.0,
                             "mismatch_k1": 0.0, "entropy": 0.5, "raw_logprobs": False,
                             "heldout_greedy_acc": 0.6 - cost, "engine": "vllm-v1-fixed"})
    return pd.DataFrame(rows)


def kl_zero(c: pd.DataFrame) -> dict:
    """kl_to_clean 0 for every dosed run (as a ratio-blind twin measures)."""
    runs = c[c["kind"] != "clean"][["label", "arm", "seed"]].drop_duplicates()
    run = namedtuple("run", "label arm seed")
    return {run(r.label, r.arm, r.seed): 0.0 for r in runs.itertuples()}


def table(costs):
    c = curves(costs)
    return analysis.dose_table(c, MismatchCostParams(), kl_zero(c)).set_index(["label", "arm"])


CLEAN = {("clean", "none@engine"): 0.0, ("clean", "none@trainer"): 0.0}


def test_a_known_cost_is_claimed_a_known_null_is_not_and_the_control_passes():
    t = table({**CLEAN, ("ratio@0.1", "none@engine"): 0.2, ("ratio@0.1", "none@trainer"): 0.0,
               ("weights@0.1", "none@engine"): 0.0, ("weights@0.1", "none@trainer"): 0.0})
    cost = t.loc[("ratio@0.1", "none@engine")]
    assert cost["verdict"] == "costs" and cost["gap"] == pytest.approx(-0.2 - np.mean(0.01 * np.sin(3.0 * np.arange(6)
                                                                                                    + 1)))
    assert cost["gap_ci_low"] < cost["gap"] < cost["gap_ci_high"] < 0 and 0 < cost["mde"] < 0.2
    assert cost["heldout_gap"] == pytest.approx(-0.2)
    # the family: dosed rows that are not controls (ratio none@engine, weights x 2), Holm over 3
    fam = t[t["p_holm"].notna()]
    assert sorted(fam.index) == sorted([("ratio@0.1", "none@engine"), ("weights@0.1", "none@engine"),
                                        ("weights@0.1", "none@trainer")])
    for arm in ("none@engine", "none@trainer"):  # identical to the clean twin: no cost shown, not "costs"
        assert t.loc[("weights@0.1", arm), "verdict"] == "no cost shown" and t.loc[("weights@0.1", arm), "gap"] == 0
    ctl = t.loc[("ratio@0.1", "none@trainer")]
    assert ctl["control"] == "ratio-blind" and ctl["identical"] and ctl["verdict"] == "null (passes)"
    assert np.isnan(ctl["p_holm"])  # tested alone, never in the family


def test_a_control_that_shows_an_effect_fails():
    t = table({**CLEAN, ("ratio@0.1", "none@engine"): 0.0, ("ratio@0.1", "none@trainer"): 0.05})
    ctl = t.loc[("ratio@0.1", "none@trainer")]
    assert not ctl["identical"] and ctl["verdict"] == "fails"


def test_a_ratio_dose_far_from_its_intended_k3_is_flagged():
    row = SimpleNamespace(label="ratio@0.1", k3_intended=0.1, k3_achieved=0.03)
    assert not analysis.dose_achieved(row)
    assert analysis.dose_achieved(SimpleNamespace(k3_intended=0.1, k3_achieved=0.11))


@pytest.mark.parametrize("kw", [{}, {"num_seeds": 8}, {"max_digits": 2, "model": "qwen2-chat"}])
def test_held_out_problems_are_never_trained_on(kw):
    p = MismatchCostParams(**kw)
    trained = design.trained_problems(p)
    problems, what = design.held_out(p, design.HELDOUT_PROBLEMS, design.HELDOUT_SEED)
    assert len(problems) >= design.HELDOUT_PROBLEMS // 4 and "held-out" in what
    assert not {(q.a, q.b) for q in problems} & trained and len({(q.a, q.b) for q in problems}) == len(problems)


def test_a_task_too_small_to_hold_out_is_named_as_such():
    p = MismatchCostParams(max_digits=1, num_seeds=6)  # 100 problems, all of them drawn in training
    problems, what = design.held_out(p, design.HELDOUT_PROBLEMS, design.HELDOUT_SEED)
    assert len(problems) == 100 and "not held out" in what


@pytest.mark.parametrize("kw,match", [({"stale_steps": [2, 2]}, "'stale_steps' lists an entry twice"),
                                      ({"ratio_k3": [0.1, 0.1000000001]}, "print alike"),
                                      ({"weight_noise": [0.03, 0.03]}, "'weight_noise' lists an entry twice")])
def test_doses_that_would_share_a_label_are_refused(kw, match):
    from rlwb.errors import ParamError

    with pytest.raises(ParamError, match=match):
        MismatchCostParams(**kw)


def test_a_standard_error_check_without_a_standard_error_is_refused():
    """`se_check_sets` checks the se measured from each problem's repeated draws: one draw a problem has none."""
    from rlwb.errors import ParamError

    with pytest.raises(ParamError, match=r"'se_check_sets' \(4\) needs 'policy_samples' >= 2"):
        MismatchCostParams(se_check_sets=4, policy_samples=1)
    assert MismatchCostParams(se_check_sets=4, policy_samples=2).hash() != MismatchCostParams(policy_samples=2).hash()


def test_placebo_rows_are_tested_in_the_family_and_a_false_positive_is_reported():
    from rlwb.experiments.wording import mismatch_cost as wording

    c = curves({**CLEAN, ("ratio@0.1", "none@engine"): 0.2, ("placebo", "none@engine"): 0.0})
    t = analysis.dose_table(c, MismatchCostParams(), kl_zero(c))
    m = analysis.dose_metrics(t, c)
    plc = t.set_index(["label", "arm"]).loc[("placebo", "none@engine")]
    assert np.isfinite(plc["p_holm"]) and plc["verdict"] == "no cost shown" and plc["control"] == ""
    assert m["placebo/rows"] == 1 and m["placebo/streams"] == 1 and m["placebo/false_positive_rate"] == 0
    # 0 of 1: the exact interval reaches 97.5%, and the line says how little one stream bounds
    assert m["placebo/false_positive_rate_ci_low"] == 0 and m["placebo/false_positive_rate_ci_high"] == (
        pytest.approx(0.975, abs=0.005))
    assert "(passes" in wording.placebo_line(m) and "[0%, 98%]" in wording.placebo_line(m)
    assert "bounds its rate after Holm only below 98%" in wording.placebo_line(m)
    # two arms' placebo runs that are the same numbers (arms that train alike without a dose) are one stream
    c = curves({**CLEAN, ("ratio@0.1", "none@engine"): 0.2, ("placebo", "none@engine"): 0.0,
                ("placebo", "none@trainer"): 0.0})
    m = analysis.dose_metrics(analysis.dose_table(c, MismatchCostParams(), kl_zero(c)), c)
    assert m["placebo/rows"] == 2 and m["placebo/streams"] == 1
    assert "1 row the same run as another, counted once" in wording.placebo_line(m)
    # where runs record their sampling stream, rows on the same stream are one stream even if their gaps differ
    # (two arms sampling with the same seeds), and rows on different streams are two
    c = curves({**CLEAN, ("ratio@0.1", "none@engine"): 0.2, ("placebo", "none@engine"): 0.01,
                ("placebo", "none@trainer"): 0.03})
    c["stream"] = np.where(c["kind"] == "placebo", 1, 0)
    m = analysis.dose_metrics(analysis.dose_table(c, MismatchCostParams(), kl_zero(c)), c)
    assert m["placebo/rows"] == 2 and m["placebo/streams"] == 1
    c["stream"] = np.where(c["kind"] != "placebo", 0, np.where(c["arm"] == "none@engine", 1, 2))
    m = analysis.dose_metrics(analysis.dose_table(c, MismatchCostParams(), kl_zero(c)), c)
    assert m["placebo/streams"] == 2
    # a placebo that differs from its clean twin as much as a real cost does is a false positive, and says so
    c = curves({**CLEAN, ("ratio@0.1", "none@engine"): 0.2, ("placebo", "none@engine"): 0.2})
    t = analysis.dose_table(c, MismatchCostParams(), kl_zero(c))
    m = analysis.dose_metrics(t, c)
    assert m["placebo/false_positive_rate_holm"] == 1 and "**fails**" in wording.placebo_line(m)


RATIO_DOSES = (0.03, 0.1, 0.3, 1.0)


def ratio_curves(loss_scale: float, doses=RATIO_DOSES) -> pd.DataFrame:
    """The clean none@engine run learns 0.5 -> 0.77 over 10 steps (gain 0.27 in the final training reward over the
    first steps'); at ratio doses k3 d it keeps exp(-d / loss_scale) of that gain (loss_scale 0: no loss), with a
    small per-seed wobble. The dose acts from step 0, so its k3 there (`k3_initial`) is d."""
    rows = []
    for d in (0.0, *doses):
        label = "clean" if d == 0 else f"ratio@{d:g}"
        kept = np.exp(-d / loss_scale) if loss_scale else 1.0
        for s in SEEDS:
            wobble = 0.004 * np.sin(3.0 * s + 7 * d)
            for t in STEPS:
                rows.append({"step": t, "kind": label.split("@")[0], "label": label, "dose": d, "temperature": 0.7,
                             "arm": "none@engine", "seed": s, "reward_mean": 0.5 + 0.03 * t * kept + 0.02 * s
                             + (wobble if d else 0.0), "grad_norm": 1.0, "clip_frac": 0.0, "mismatch_k3": d,
                             "mismatch_k1": 0.0, "entropy": 0.5, "raw_logprobs": False, "heldout_greedy_acc": 0.6,
                             "engine": "vllm-v1-fixed"})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("loss_scale", [0.5, 0.0])
def test_the_benchmark_dose_of_a_hand_made_dose_response_and_its_sentence(loss_scale):
    """An exponential loss of the clean gain, exp(-k3 / 0.5): at BMR 25% of the gain the true BMD is
    0.5 ln(4/3) = 0.144, inside the tested doses: recovered, bracketed by BMDL and BMDU, "keep k3 below" said
    only where the row is quotable (bounded, and the log dose scale agreeing). No loss: the curve never loses the
    BMR, the status says the BMD lies above the tested doses and no level is quoted. One dose: a saturated fit,
    never a bound. The figure's table carries dose 0 as its own group, the fitted curve over the tested doses only,
    and the BMR mark."""
    from rlwb.experiments.mismatch_study import benchmarks
    from rlwb.experiments.wording import mismatch_cost as wording

    p = MismatchCostParams(arms=["none@engine"], placebo_arms=[], ratio_k3=list(RATIO_DOSES))
    c = ratio_curves(loss_scale)
    t = analysis.dose_table(c, p, {})
    b, fits = benchmarks.benchmark_table(t, c, p.bmr_fraction)
    assert len(b) == 1
    r = next(b.itertuples())
    assert 0.2 < r.clean_gain < 0.3  # the final window's reward over the first window's (the untrained policy)
    assert r.bmr == pytest.approx(p.bmr_fraction * r.clean_gain) and r.k3_min == 0.03 and r.k3_max == 1.0
    line = wording.benchmark_line(r, p.bmr_fraction)
    if loss_scale:
        assert r.status == "bounded" and r.bmd == pytest.approx(0.5 * np.log(4 / 3), rel=0.1)
        assert r.bmdl < r.bmd < r.bmdu and r.models_passing
        assert ("keep k3 below" in line and f"{r.keep_below:.1e}" in line) == wording.quotable(r)
        assert wording.quotable(r) == (r.scale_agree and r.keep_below == min(r.bmdl, r.bmdl_log))
        assert r.trend_slope < 0 and r.trend_p_holm < 0.05
    else:
        assert r.status == "above tested range" and not wording.quotable(r)
        assert "keep k3 below" not in line and "no level to quote" in line and "larger doses" in line
    m = benchmarks.benchmark_metrics(b)
    assert m["ratio/none@engine/bmdl_bounded"] == float(r.status == "bounded")
    assert m["ratio/none@engine/bmd_log_k3"] == r.bmd_log or np.isnan(r.bmd_log)
    assert m["ratio/none@engine/bmdl_log_k3"] == r.bmdl_log or np.isnan(r.bmdl_log)
    assert m["ratio/none@engine/baseline_se"] == r.baseline_se and m["ratio/none@engine/baseline_se_measured"] == 0
    groups = fits[fits["part"] == "group"]
    assert groups["dose"].to_numpy() == pytest.approx([0.0, *RATIO_DOSES], rel=1e-9)
    fitted = fits[fits["part"] == "fit"]
    assert fitted["dose"].iloc[0] == 0.0 and fitted["dose"].iloc[1:].between(0.03, 1.0).all()
    assert (fitted["low"] <= fitted["y"] + 1e-12).all() and (fitted["y"] <= fitted["high"] + 1e-12).all()
    one = benchmarks.benchmark_table(t[t["label"].isin(["clean", "ratio@1"])], c, p.bmr_fraction)[0]
    assert one["status"].iloc[0] == "saturated" and "no level to quote" in wording.benchmark_line(
        next(one.itertuples()), p.bmr_fraction)


def test_the_wording_knows_every_benchmark_status_the_estimator_gives():
    """The wording layer imports no core module, so it spells the benchmark's statuses itself: they must be the
    estimator's, every one of them (a renamed or new status would otherwise fall through to a bare status)."""
    from rlwb.core.measure import benchmark_dose as bd
    from rlwb.experiments.wording import mismatch_cost as wording

    spelt = {wording.BMD_BOUNDED, wording.BMD_ABOVE, wording.BMD_BELOW, wording.BMD_NO_FIT, wording.BMD_SATURATED,
             wording.BMD_NO_BENCHMARK, wording.BMD_NOT_BOUNDED}
    assert spelt == set(bd.STATUSES)
    from rlwb.experiments.mismatch_study import benchmarks

    assert (wording.SE_MEASURED, wording.SE_BOUND) == (benchmarks.MEASURED, benchmarks.BOUND)
    for status in bd.STATUSES:  # each has its own reason, never the bare status
        r = SimpleNamespace(status=status, doses=2, k3_min=0.01, k3_max=1.0, bmd=2.0, bmdl=0.5, bmdl_log=0.4,
                            status_log=status, clean_gain=0.3)
        assert wording.benchmark_reason(r) != status
    # "not bounded" says why, from the fit's own notes (the benchmark table's `fit_notes`): a study whose seeds'
    # patterns of doses leave the bootstrap too few degrees of freedom keeps its point BMD and says so
    from rlwb.core.measure import bmd_coverage as cov

    c, y = cov.simulate(cov.TRUTHS["linear"][0], cov.DESIGN_08, 6, 0.01, np.random.default_rng(6))
    y[np.arange(4), np.arange(4)] = np.nan
    f = bd.fit_bmd(cov.DESIGN_08, c, y, n_boot=20, profile=False)
    r = SimpleNamespace(status=f.status, fit_notes="; ".join(f.notes), bmd=f.bmd)
    assert f.status == bd.NOT_BOUNDED and np.isfinite(f.bmd)
    assert "patterns of doses run" in wording.benchmark_reason(r)
    assert f"the point BMD is {f.bmd:.1e}" in wording.benchmark_reason(r)
    assert "beyond the tested doses" in wording.benchmark_reason(SimpleNamespace(status=f.status))  # older tables
    # a row placed above the tested doses without a bootstrap says why it has no bound too
    flat = bd.fit_bmd(cov.DESIGN_08, np.full(6, 0.3) + 0.01 * np.arange(6), np.where(np.isnan(y), np.nan, 0.3),
                      n_boot=20, profile=False)
    r = SimpleNamespace(status=flat.status, fit_notes="; ".join(flat.notes), bmd=flat.bmd, k3_max=1.0)
    assert flat.status == bd.ABOVE_RANGE and "patterns of doses run" in wording.benchmark_reason(r)


def test_the_dose_answer_reads_the_first_regime_at_the_studys_horizon():
    """A `+ppo<k>` or `+long` row of the largest dose must not stand in for the first regime's largest dose in the
    one-line answer (the sort by dose is not stable across rows of one dose)."""
    t = pd.DataFrame({"label": ["clean", "ratio@1", "ratio@1+ppo4", "ratio@1+long", "clean+ppo4"],
                      "dose": [0.0, 1.0, 1.0, 1.0, 0.0]})
    assert design.first_regime(t)["label"].tolist() == ["clean", "ratio@1"]


def study_params(**kw):
    from rlwb.params.validation import load

    return load("08_mismatch_cost", ["params/08_mismatch_cost/study.yaml"], kw)


def test_the_study_trains_v1s_point_with_every_arm_and_the_length_scaled_geo_rs():
    """V1's real point with every arm of `arms` (`point_arms` is all of them), the length-scaled Geo-RS
    among the arms, and `row_arms` trimming only the rows the study.yaml header names."""
    p = study_params()
    js = design.training_runs(p)
    assert "geo_rs_len@trainer" in p.arm_labels and set(p.point_arm_labels) == set(p.arm_labels)
    arms_at = lambda label: {j.arm for j in js if j.label == label}  # noqa: E731
    assert arms_at("vllm-v1") == set(p.arm_labels)
    assert arms_at("vllm-v1@T1") == {"none@engine"} and arms_at("clean@T1") == {"none@engine"}
    assert "icepop@trainer" not in arms_at("ratio@0.01") and "none@trainer" in arms_at("ratio@1")
    assert "geo_rs_len@trainer" not in arms_at("stale@4") and arms_at("weights@0.1") == set(p.arm_labels)
    assert arms_at("clean") == set(p.arm_labels)
    # every dosed or point row has its clean twin (same arm, temperature, regime, horizon)
    twins = {j.twin for j in js if j.kind == "clean"}
    assert all(j.twin in twins for j in js if j.kind != "clean")
    assert {(j.label, j.arm) for j in js if j.updates > 1} == {
        (lab, a) for lab in ("clean+ppo4", "weights@0.1+ppo4") for a in ("none@engine", "none@trainer")}


def test_row_arms_restricts_a_row_and_refuses_what_is_not_a_row_or_an_arm():
    from rlwb.errors import ParamError

    p = MismatchCostParams(arms=["none@engine", "none@trainer", "tis@trainer"], num_seeds=2,
                                   engine_points=["vllm-v1", "vllm-v1@T1.0"],
                                   point_arms=["none@engine", "tis@trainer"],
                                   row_arms=["ratio@0.1 tis@trainer", "vllm-v1@T1.0 none@engine",
                                             "ratio@5 tis@trainer"])
    js = design.training_runs(p)
    assert {j.arm for j in js if j.label == "ratio@0.1"} == {"tis@trainer"}
    assert {j.arm for j in js if j.label == "ratio@1"} == set(p.arm_labels)  # unlisted: every arm
    assert {j.arm for j in js if j.label == "vllm-v1"} == {"none@engine", "tis@trainer"}  # point_arms
    assert {j.arm for j in js if j.label == "vllm-v1@T1"} == {"none@engine"}
    assert {j.arm for j in js if j.label == "clean@T1"} == {"none@engine"}  # no twin nobody pairs with
    with pytest.raises(ParamError, match="neither a dose row"):
        MismatchCostParams(row_arms=["vllm-v2 none@engine"])
    with pytest.raises(ParamError, match="not in 'arms'"):
        MismatchCostParams(row_arms=["ratio@0.1 icepop@trainer"])
    with pytest.raises(ParamError, match="twice"):
        MismatchCostParams(row_arms=["ratio@0.1 none@engine", "ratio@0.1 none@trainer"])
    with pytest.raises(ParamError, match="row_arms"):
        MismatchCostParams(row_arms=["ratio@0.1"])


class FakeEngine:
    def __init__(self, name):
        self.name = name


def test_every_outcome_is_sampled_by_the_clean_base_engine_at_the_studys_temperature(monkeypatch):
    """An engine point's trained policy is scored by a base-preset engine (not its own bf16 / raw-logprob
    engine) at the study's temperature (not the point's); a base-preset run by its own lane engine, the same
    preset. The scorer's engine starts once, on the first point run, is recorded (`on_start`: run.json's engines)
    under its own key beside the base engine's, and closes. Catches a scorer engine missing from run.json."""
    import rlwb.engines.worker as worker

    started, calls = [], []

    class Worker(FakeEngine):
        def __init__(self, preset, model, dtype="float32"):
            super().__init__(f"scorer:{preset}:{dtype}")
            started.append(self)
            self.closed = False

        def close(self):
            self.closed = True

        def info(self):
            return {"preset": "vllm-v1-fixed", "vllm_version": "0.11.0"}

    monkeypatch.setattr(worker, "EngineWorker", Worker)
    monkeypatch.setattr(execution, "policy_rewards",
                        lambda m, engine, codec, probs, p, t: calls.append((engine.name, t)) or np.full((1, 2), 0.5))
    p = MismatchCostParams(engine_points=["vllm-v1-fixed@bf16", "vllm-v1@T1.0"], temperature=0.7)
    recorded = []
    scorer = execution.CleanScorer(p.engines[0], "model", p.dtype, recorded.append)
    base_job = design.TrainingRun("ratio", 0.1, "none@engine", 0, p.engines[0], 0.7, "ratio@0.1")
    point = design.TrainingRun("engine", float("nan"), "none@engine", 0, "vllm-v1-fixed@bf16", 0.7,
                               "vllm-v1-fixed@bf16")
    t1 = design.TrainingRun("engine", float("nan"), "none@engine", 0, "vllm-v1", 1.0, "vllm-v1@T1")
    clean_t1 = design.TrainingRun("clean", 0.0, "none@engine", 0, p.engines[0], 1.0, "clean@T1")
    for job, lane in ((base_job, "lane"), (point, "bf16 lane"), (t1, "v1 lane"), (clean_t1, "lane")):
        scorer.policy_draws(None, job, FakeEngine(lane), None, [], p)
    assert calls == [("lane", 0.7), ("scorer:vllm-v1-fixed:float32", 0.7), ("scorer:vllm-v1-fixed:float32", 0.7),
                     ("lane", 0.7)]
    assert len(started) == 1 and [(r["preset"], r["role"]) for r in recorded] == [
        ("vllm-v1-fixed#clean-scorer", "clean scorer")]
    scorer.close()
    assert started[0].closed


def test_the_analysis_is_a_function_of_the_archived_curves():
    """`analyze` redoes the study's tables from the curves alone: `kl_to_clean` is a column of them, so an
    archived run's analysis needs no retraining (and gives what a KL dict gave)."""
    c = curves({**CLEAN, ("ratio@0.1", "none@engine"): 0.2, ("weights@0.1", "none@trainer"): 0.05})
    kl = {k: 0.01 * (1 + k.seed) for k in kl_zero(c)}
    c["kl_to_clean"] = [kl.get((lab, a, s), 0.0) if lab != "clean" else 0.0
                        for lab, a, s in zip(c["label"], c["arm"], c["seed"])]
    c["policy_reward"] = 0.7 - c["label"].map({"clean": 0.0, "ratio@0.1": 0.2, "weights@0.1": 0.05})
    p = MismatchCostParams(arms=["none@engine", "none@trainer"], engine_points=[], num_seeds=6)
    res = mc.analyze(c, p)
    old = analysis.dose_table(c.drop(columns="kl_to_clean"), p, kl)
    pd.testing.assert_frame_equal(res.doses.drop(columns="kl_to_clean"), old.drop(columns="kl_to_clean"))
    assert res.doses.set_index(["label", "arm"]).loc[("ratio@0.1", "none@engine"), "kl_to_clean"] == pytest.approx(
        0.035)
    assert res.doses.set_index(["label", "arm"])["kl_to_clean"].drop("clean").tolist() == pytest.approx(
        old.set_index(["label", "arm"])["kl_to_clean"].drop("clean").tolist())


def with_policy(c: pd.DataFrame, pr: dict, initial: float = 0.3) -> pd.DataFrame:
    """The tested outcome on hand-made curves: each run's `policy_reward` = pr[(label, arm)] + a per-seed offset
    (shared by every row of that seed: paired) + a small per-(row, seed) wobble; the initial policy's one value."""
    c = c.copy()
    wob = {k: 0.004 * np.sin(1.7 * i + 1) for i, k in enumerate(pr)}
    c["policy_reward"] = [pr[(lab, a)] + 0.01 * s + (wob[(lab, a)] * np.cos(s) if lab != "clean" else 0.0)
                          for lab, a, s in zip(c["label"], c["arm"], c["seed"])]
    c["initial_policy_reward"] = initial
    return c


def test_the_benchmark_response_is_a_fraction_of_the_clean_gain_in_the_tested_outcome():
    """The fit is of the policy reward, so the BMR is 25% of the clean run's policy-reward gain over the initial
    policy (0.6 + mean seed offset - 0.3), not of its training-reward gain (0.27): a dose keeping exp(-k3 / 0.5)
    of the policy-reward gain has its BMD at 0.5 ln(4/3) = 0.144."""
    from rlwb.experiments.mismatch_study import benchmarks

    c = ratio_curves(0.0)
    c = with_policy(c, {(lab, a): 0.6 if lab == "clean" else 0.3 + 0.3 * np.exp(-float(lab[6:]) / 0.5)
                        for lab, a in c[["label", "arm"]].drop_duplicates().itertuples(index=False)})
    p = MismatchCostParams(arms=["none@engine"], placebo_arms=[], ratio_k3=list(RATIO_DOSES))
    res = mc.analyze(c, p)
    gain = 0.6 + 0.01 * np.mean(SEEDS) - 0.3
    assert res.metrics["clean/none@engine/outcome_gain"] == pytest.approx(gain)
    assert res.metrics["clean/none@engine/reward_gain"] == pytest.approx(0.27)  # the training reward's: not used
    b = res.benchmarks.iloc[0]
    assert b["clean_gain"] == pytest.approx(gain, rel=0.02) and b["bmr"] == pytest.approx(0.25 * b["clean_gain"])
    assert b["bmd"] == pytest.approx(0.5 * np.log(4 / 3), rel=0.15) and b["status"] == "bounded"
    # the baseline's sampling noise is in the bounds (its binomial bound, policy_samples x the held-out problems),
    # and the report says so, not the opposite
    assert b["baseline_se"] == pytest.approx(np.sqrt(0.3 * 0.7 / benchmarks.baseline_draws(p)))
    assert "its sampling noise drawn in every resample" in res.conclusion() and "noise not in" not in res.conclusion()
    # an archived run without the initial policy's outcome has no benchmark response in that outcome: said so
    old = mc.analyze(c.drop(columns="initial_policy_reward"), p)
    assert np.isnan(old.benchmarks["bmr"].iloc[0]) and old.benchmarks["status"].iloc[0].startswith("no benchmark")
    assert "not measured" in old.benchmarks["status"].iloc[0]


def test_a_measured_baseline_noise_replaces_the_binomial_bound_in_the_bounds_and_the_words():
    """A run that kept the initial policy's measured standard error (`analysis.INITIAL_SE`) is bounded with it, not
    with the binomial bound, and its report says which: the bounds move with it (each resample draws the baseline)."""
    from rlwb.experiments.mismatch_study.analysis import INITIAL_SE

    c = ratio_curves(0.0)
    c = with_policy(c, {(lab, a): 0.6 if lab == "clean" else 0.3 + 0.3 * np.exp(-float(lab[6:]) / 0.5)
                        for lab, a in c[["label", "arm"]].drop_duplicates().itertuples(index=False)})
    p = MismatchCostParams(arms=["none@engine"], placebo_arms=[], ratio_k3=list(RATIO_DOSES))
    bound = mc.analyze(c, p).benchmarks.iloc[0]
    measured = mc.analyze(c.assign(**{INITIAL_SE: 0.011}), p)
    b = measured.benchmarks.iloc[0]
    assert bound["baseline_se_source"] == "binomial bound" and bound["baseline_se"] > 0.011
    assert b["baseline_se"] == 0.011 and b["baseline_se_source"] == "measured"
    assert b["bmdl"] != bound["bmdl"] and b["bmd"] == pytest.approx(bound["bmd"])  # the bounds, not the fit
    assert "measured from each scored problem's repeated draws (0.011)" in measured.conclusion()
    assert "binomial" not in measured.conclusion() and "one shared sampling seed" in measured.conclusion()
    # a measured noise of 0 is a measurement, not a noise left out; a table analysed before the source was kept
    # (a standard error, no source) had the bound; several studies' curves mixed are refused
    zero = pd.DataFrame({"baseline_se": [0.0], "baseline_se_source": ["measured"]})
    assert "measured" in words_08.baseline_noise_words(zero) and "not in" not in words_08.baseline_noise_words(zero)
    assert "binomial upper bound" in words_08.baseline_noise_words(pd.DataFrame({"baseline_se": [0.02]}))
    assert "not in the bounds" in words_08.baseline_noise_words(pd.DataFrame({"baseline_se": [0.0]}))
    mixed = c.assign(**{INITIAL_SE: np.where(c["seed"] == c["seed"].iloc[0], 0.011, 0.012)})
    with pytest.raises(ValueError, match="one value per study"):
        mc.analyze(mixed, p)


def test_the_initial_policys_sampling_noise_is_measured_from_its_repeated_draws(engine, default_model):
    """Real engine (vLLM V1, fp32): the initial policy's tested outcome keeps, beside its mean, the standard error of
    that mean over its draws with the problems fixed, computed from the very draws (the engine samples them again
    bitwise under the fixed seed), not the binomial bound."""
    from rlwb.core.data import tokenizer
    from rlwb.core.measure import stats
    from rlwb.experiments.grpo_grid import load_trainer
    from rlwb.experiments.mismatch_study.analysis import INITIAL_SE, SET_COLUMN
    from rlwb.experiments.mismatch_study.design import HELDOUT_SEED, held_out

    p = MismatchCostParams(policy_samples=2, max_tokens=16)
    problems, _ = held_out(p, 48, HELDOUT_SEED)
    w, (model, initial) = engine("vllm-v1-fixed"), load_trainer(default_model.path)
    codec = tokenizer.PromptCodec(default_model.path, p.chat_template)
    out = execution.initial_outcomes(model, w, initial, codec, problems, p)
    draws = execution.policy_rewards(model, w, codec, problems, p, p.temperature)
    assert draws.shape == (48, 2) and set(np.unique(draws)) <= {0.0, 1.0}
    assert 0 < draws.mean() < 1 and (draws[:, 0] != draws[:, 1]).any()  # some problems split: a noise to measure
    assert out["initial_policy_reward"] == draws.mean()
    assert out[INITIAL_SE] == stats.fixed_items_mean_se(draws) > 0
    # each draw index's mean over the problems, kept as every trained run's are (`outcome_columns`)
    assert [out[f"initial_policy_reward_sample{j}"] for j in range(2)] == list(draws.mean(axis=0))
    one = execution.initial_outcomes(model, w, initial, codec, problems,
                                     MismatchCostParams(policy_samples=1, max_tokens=16))
    assert INITIAL_SE not in one  # one draw per problem measures no noise of its own
    # `se_check_sets`: the same policy and problems on other seed sets, each reproducible and none the study's own
    checked = MismatchCostParams(policy_samples=2, max_tokens=16, se_check_sets=3)
    sets = execution.seed_set_scores(model, w, codec, problems, checked)
    assert sorted(sets) == sorted(f"{SET_COLUMN}{k}{e}" for k in (1, 2, 3) for e in ("", "_se"))
    again = execution.policy_rewards(model, w, codec, problems, checked, p.temperature,
                                     seed=execution.POLICY_SEED + 2 * execution.SEED_SET_STRIDE)
    assert sets[f"{SET_COLUMN}2"] == again.mean() and sets[f"{SET_COLUMN}2_se"] == stats.fixed_items_mean_se(again)
    assert (again != draws).any()  # another seed set draws otherwise
    assert execution.initial_outcomes(model, w, initial, codec, problems, checked) == {**out, **sets}


def family_curves() -> pd.DataFrame:
    """Two arms x three ratio doses (a trend each), weights@0.1 in two PPO regimes (a mode contrast in each, and the
    regime contrast between them), a placebo row: every kind of test the study's family holds."""
    arms = ("none@engine", "none@trainer")
    costs = {("clean", a): 0.0 for a in arms} | {("clean+ppo4", a): 0.0 for a in arms}
    costs |= {(f"ratio@{d:g}", "none@engine"): 0.05 * (np.log10(d) + 2) + 0.01 for d in (0.01, 0.1, 1.0)}
    costs |= {("weights@0.1", "none@engine"): 0.2, ("weights@0.1", "none@trainer"): 0.02,
              ("weights@0.1+ppo4", "none@engine"): 0.05, ("weights@0.1+ppo4", "none@trainer"): 0.03,
              ("placebo", "none@engine"): 0.0}
    c = curves(costs)
    c["updates"] = np.where(c["label"].str.contains("ppo4"), 4, 1)
    c["kind"] = c["kind"].str.replace("+ppo4", "", regex=False)
    c["dose"] = [float(lab.split("@")[1].split("+")[0]) if "@" in lab else 0.0 for lab in c["label"]]
    c["mismatch_k3"] = c["dose"]  # the achieved k3: distinct per dose, as the trend needs
    plc = c["label"] == "placebo"
    c.loc[plc, "reward_mean"] += 0.003 * np.cos(c.loc[plc, "seed"] * 2.1)
    return with_policy(c, {k: 0.6 - v for k, v in costs.items()} | {("placebo", "none@engine"): 0.6})


def test_every_test_of_the_study_is_in_one_holm_family():
    """Dosed rows (placebo included, controls not), trend tests, contrasts and the horizon test are
    adjusted together: each p_holm is Holm over all m p's at once, and the MDE is at alpha / m."""
    from rlwb.core.measure import stats

    p = MismatchCostParams(arms=["none@engine", "none@trainer"], placebo_arms=["none@engine"],
                                   weight_noise=[0.1], updates_per_batch=[1, 4], regime_doses=["weights@0.1"],
                                   num_seeds=6)
    res = mc.analyze(family_curves(), p)
    t, b, con, m = res.doses, res.benchmarks, res.contrasts, res.metrics
    rows = t[t["p_holm"].notna()]
    assert ("placebo" in set(rows["label"])) and not (rows["control"] != "").any()
    assert "ratio@0.1" not in set(rows.loc[rows["arm"] == "none@trainer", "label"])  # the blind control: apart
    trends = b[b["trend_p"].notna()]
    ps = np.concatenate([rows["p"], trends["trend_p"], con["p"]])
    assert m["family/tests"] == len(ps) == m["family/rows"] + m["family/trends"] + m["family/contrasts"]
    assert m["family/trends"] >= 1 and m["family/contrasts"] >= 3
    adj = stats.holm(ps)
    assert np.allclose(np.concatenate([rows["p_holm"], trends["trend_p_holm"], con["p_holm"]]), adj)
    for r in rows.itertuples():  # the MDE of the test each p comes from: the spread floored by the outcome's step
        assert r.q_eff > 0 and r.mde == pytest.approx(stats.minimal_detectable_gap(
            stats.floored_sd(r.gap_sd, r.q_eff), r.seeds, 0.05 / len(ps)))
    for r in con.itertuples():
        assert r.q_eff > rows["q_eff"].iloc[0] and r.mde == pytest.approx(stats.minimal_detectable_gap(
            stats.floored_sd(r.sd, r.q_eff), r.seeds, 0.05 / len(ps)))
    assert "one family" in res.conclusion() and f"{len(ps)} tests" in res.conclusion()


def test_a_row_whose_seeds_tie_reports_the_mde_of_its_test_not_zero():
    """A dosed row whose seeds' gaps tie (sd 0) is tested with the spread floored by the outcome's step
    (`stats.floored_sd`); its MDE is that test's, > 0, in the study's family and in `dose_table` alone. Catches an
    MDE from the raw spread (a tie read as "MDE 0": any cost would have been detected)."""
    from rlwb.core.measure import stats

    p = MismatchCostParams(arms=["none@engine", "none@trainer"], weight_noise=[0.1], num_seeds=6)
    costs = {**CLEAN, ("ratio@0.1", "none@engine"): 0.2, ("ratio@0.1", "none@trainer"): 0.0,
             ("weights@0.1", "none@engine"): 0.0, ("weights@0.1", "none@trainer"): 0.05}
    c = with_policy(curves(costs), {k: 0.6 - v for k, v in costs.items()})
    tie = c["label"] == "weights@0.1"
    twin = c[c["label"] == "clean"].set_index(["arm", "seed", "step"])["policy_reward"]
    c.loc[tie, "policy_reward"] = [twin[(a, s_, t)] - 0.05 for a, s_, t in zip(c.loc[tie, "arm"], c.loc[tie, "seed"],
                                                                                c.loc[tie, "step"])]
    res, alone = mc.analyze(c, p), analysis.dose_table(c, p)
    for t, m in ((res.doses, res.metrics["family/tests"]), (alone, int(alone["p_holm"].notna().sum()))):
        t = t.set_index(["label", "arm"])
        for arm in ("none@engine", "none@trainer"):
            r = t.loc[("weights@0.1", arm)]
            assert r["gap_sd"] == 0 and r["gap"] == pytest.approx(-0.05) and r["q_eff"] > 0 and m >= 3
            assert r["mde"] > 0 and r["mde"] == pytest.approx(stats.minimal_detectable_gap(
                stats.floored_sd(0.0, r["q_eff"]), 6, 0.05 / m))


def test_the_regime_contrast_is_the_bypass_vs_decoupled_contrast_across_ppo_regimes():
    """At weights@0.1 bypass loses 0.18 more than decoupled with one update per batch, 0.02 more with
    four: the regime contrast (four minus one, seed by seed) is +0.16, with its interval, in the family."""
    p = MismatchCostParams(arms=["none@engine", "none@trainer"], placebo_arms=["none@engine"],
                                   weight_noise=[0.1], updates_per_batch=[1, 4], regime_doses=["weights@0.1"],
                                   num_seeds=6)
    con = mc.analyze(family_curves(), p).contrasts.set_index(["contrast", "label"])
    mode1 = con.loc[("mode", "weights@0.1")]
    mode4 = con.loc[("mode", "weights@0.1+ppo4")]
    reg = con.loc[("regime", "weights@0.1+ppo4")]
    assert mode1["diff"] == pytest.approx(-0.18, abs=0.01) and mode4["diff"] == pytest.approx(-0.02, abs=0.01)
    assert reg["diff"] == pytest.approx(mode4["diff"] - mode1["diff"]) and reg["ci_low"] > 0
    assert reg["verdict"] == "differs" and "minus at weights@0.1" in reg["what"]


def test_the_pipeline_is_calibrated_where_the_null_holds():
    """Rows whose runs differ from their clean twins by noise alone (as a placebo: an independent
    sampling stream) are called a cost or gain at the unadjusted 5% level about 5% of the time (400 rows through
    dose_table's test; the binomial 3-sd band), and after the study's Holm almost never."""
    rng = np.random.default_rng(46)
    n_rows, seeds = 400, range(6)
    rows = []
    for s in seeds:
        base = 0.5 + 0.02 * s
        rows.append({"label": "clean", "kind": "clean", "seed": s, "pr": base})
        rows += [{"label": f"placebo{i}", "kind": "placebo", "seed": s, "pr": base + rng.normal(0, 0.03)}
                 for i in range(n_rows)]
    c = pd.DataFrame([{**r, "step": t, "dose": 0.0, "temperature": 0.7, "arm": "none@engine",
                       "reward_mean": r["pr"], "grad_norm": 1.0, "clip_frac": 0.0, "mismatch_k3": 0.0,
                       "mismatch_k1": 0.0, "entropy": 0.5, "raw_logprobs": False, "heldout_greedy_acc": 0.5,
                       "engine": "vllm-v1-fixed", "policy_reward": r["pr"], "initial_policy_reward": 0.3}
                      for r in rows for t in range(2)])
    p = MismatchCostParams(arms=["none@engine"], placebo_arms=[], engine_points=[], num_seeds=6)
    t = analysis.dose_table(c, p)
    plc = t[t["kind"] == "placebo"]
    assert len(plc) == n_rows
    rate = float((plc["p"] < 0.05).mean())
    assert abs(rate - 0.05) < 3 * np.sqrt(0.05 * 0.95 / n_rows), rate
    assert (plc["p_holm"] < 0.05).mean() <= 0.01


def test_the_audit_places_an_engines_k3_against_the_studys_benchmark_doses(tmp_path):
    """`rlwb audit`'s report puts a raw-logprob engine's k3 against the ratio kind's BMDLs and another
    engine's against the distribution kinds', from the broadest study runs of record per model, as a multiple of each
    quotable BMDL (bounded, the dose scale agreeing), saying they were measured on small embedded models; a row
    without a level says why; a study analysed before the benchmark-dose fit quotes nothing; a model with two studies
    as broad is read from both, the reader told to act on the lower, and given it per row (the lowest level, its run
    and how many of the studies give one); without a run of record it says so."""
    from rlwb.experiments import audit
    from rlwb.experiments.wording import audit as wording

    metrics = {"raw-engine/k3_mean": 0.01, "bf16-engine/k3_mean": 2e-4}
    none = audit.study_context(metrics, {"raw-engine": True}, runs_dir=tmp_path / "nothing")
    assert none["runs"] == [] and "no study run of record yet" in "\n".join(wording.study_lines(none))

    def study(run_id, bmdl, fitted=True, model="default", weights_level=np.nan, weights_arm="none@engine"):
        d = tmp_path / run_id
        (d / "data").mkdir(parents=True)
        (d / "params.yaml").write_text(f"model: {model}\n")
        rows = pd.DataFrame([
            {"kind": "ratio", "arm": "none@engine", "name": "ratio", "status": "bounded", "bmdl": bmdl, "bmd": 0.2,
             "scale_agree": True, "keep_below": bmdl, "k3_min": 0.01, "k3_max": 1.0},
            {"kind": "ratio", "arm": "none@engine", "name": "ratio+ppo4", "status": "bounded", "bmdl": 9.0,
             "bmd": 9.5, "scale_agree": True, "keep_below": 9.0, "k3_min": 0.01, "k3_max": 1.0},
            {"kind": "weights", "arm": weights_arm, "name": "weights", "status": "bounded", "bmdl": 1e-3,
             "bmd": 2e-3, "scale_agree": weights_level == weights_level, "keep_below": weights_level,
             "k3_min": 1e-3, "k3_max": 0.02},
            {"kind": "stale", "arm": "tis@trainer", "name": "stale", "status": "above tested range",
             "bmdl": 0.01, "bmd": 0.05, "scale_agree": True, "keep_below": np.nan, "k3_min": 5e-3, "k3_max": 0.03}]
        ).assign(doses=4)
        rows = rows if fitted else rows.drop(columns=["scale_agree", "bmd", "keep_below"])
        rows.to_parquet(d / "data" / "benchmarks.parquet")

    # as broad: both, newest first; the older quotes the lower ratio level and the only weights level for bypass
    # (the newer has a decoupled weights row instead: as broad, another row); and a study as broad analysed before
    # the benchmark-dose fit, whose lower level counts nowhere
    study("20261101-000000-aaaa", 0.05, weights_level=1e-3)
    study("20261115-000000-ffff", 0.01, fitted=False)
    study("20261201-000000-bbbb", 0.5, weights_arm="none@trainer")
    study("20261101-000000-cccc", 0.14, fitted=False, model="qwen2-chat")
    ctx = audit.study_context(metrics, {"raw-engine": True, "bf16-engine": False}, runs_dir=tmp_path)
    assert ctx["runs"] == ["20261201-000000-bbbb", "20261115-000000-ffff", "20261101-000000-aaaa",
                           "20261101-000000-cccc"]
    raw, dist = ctx["engines"]
    assert [x["kind"] for x in raw["runs"][0]["rows"]] == ["ratio"]  # the first regime's row only
    assert {x["kind"] for x in dist["runs"][2]["rows"]} == {"weights", "stale"}
    text = "\n".join(wording.study_lines(ctx))
    assert "small embedded models" in text
    assert "ratio `none@engine` keep k3 below 5.0e-02 (BMD 2.0e-01; yours is 0.2x the BMDL)" in text
    assert "weights `none@trainer` no level (the dose scale decides it; tested k3 1.0e-03 to 2.0e-02" in text
    assert "stale `tis@trainer` no level (above tested range;" in text and "model `default`" in text
    assert "keep k3 below 1.4e-01" not in text and "analysed before rlwb fitted benchmark doses" in text
    assert "below 1.0e-02" not in text  # the unfitted default study's level, nowhere
    assert "keep k3 below 5.0e-01" in text and ctx["models_twice"] == ["default"]  # the older study too
    assert "Model(s) `default` have more than one study as broad" in text and "act on the lower level" in text
    # the advice computed per row: the lower of the two fitted ratio levels (the older study's, read last; not the
    # unfitted study's lower one), and the bypass weights level the older study alone gives, 1 of the model's 2
    # fitted studies (the newer has no such row); rows with no level in either (stale, decoupled weights) left out
    assert [(x["kind"], x["keep_below"], x["run"], x["quoting"], x["studies"]) for x in raw["act_on"]] == \
        [("ratio", 0.05, "20261101-000000-aaaa", 2, 2)]
    assert [(x["kind"], x["arm"], x["keep_below"], x["run"], x["quoting"], x["studies"]) for x in dist["act_on"]] == \
        [("weights", "none@engine", 1e-3, "20261101-000000-aaaa", 1, 2)]
    assert ("**act on**, model `default` (the lower level per row of its studies): ratio `none@engine` keep k3 "
            "below 5.0e-02 (run `20261101-000000-aaaa`; 2 of its 2 fitted studies give a level; yours is 0.2x it)"
            ) in text
    assert "weights `none@engine` keep k3 below 1.0e-03 (run `20261101-000000-aaaa`; 1 of its 2 fitted studies gives " \
        "a level" in text
    study("one/20261101-000000-dddd", 0.5)  # a single study per model: nothing to choose between
    one = audit.study_context(metrics, {"raw-engine": True}, runs_dir=tmp_path / "one")
    assert one["runs"] == ["20261101-000000-dddd"] and "act on" not in "\n".join(wording.study_lines(one))
    study("one/20261201-000000-eeee", 0.5, fitted=False)  # as broad, but no level to compare: no advice
    one = audit.study_context(metrics, {"raw-engine": True}, runs_dir=tmp_path / "one")
    assert len(one["runs"]) == 2 and one["models_twice"] == []


def test_entropy_collapse_is_against_the_clean_run_at_the_same_step_not_its_first():
    """A run that learns sharpens its policy: the long clean run's entropy halves by step 20 here, and a dosed run
    that tracks it has not collapsed (the detector once compared with the clean run's first step, and flagged runs
    that cost nothing). A dosed run whose entropy falls below half the clean run's at the same step has, from the first
    such step."""
    from rlwb.experiments.mismatch_study.comparisons import horizon_table

    rows = []
    for label, kind in (("clean+long", "clean"), ("weights@0.01+long", "weights"), ("weights@0.1+long", "weights")):
        for seed in range(3):
            for t in range(40):
                e = 1.0 * 0.96 ** t  # below half the first step's from step 17
                if label == "weights@0.1+long" and t >= 30:
                    e *= 0.3  # collapses against the clean run from step 30
                rows.append({"step": t, "label": label, "kind": kind, "arm": "none@engine", "seed": seed,
                             "reward_mean": 0.5, "grad_norm": 1.0, "entropy": e})
    _, out = horizon_table(pd.DataFrame(rows), block=10)
    assert np.isnan(out["clean+long/none@engine/entropy_collapse_step"])
    assert np.isnan(out["weights@0.01+long/none@engine/entropy_collapse_step"])
    assert out["weights@0.1+long/none@engine/entropy_collapse_step"] == 30


def test_the_horizon_figure_draws_each_blocks_gap_with_its_interval_and_the_collapse_step():
    """One error-bar series per long row (block gaps with their 95% intervals) and a vertical line at
    the step its collapse starts; a run without long rows says so."""
    import matplotlib.pyplot as plt

    from rlwb.plots import mismatch_cost as plots

    hz = pd.DataFrame({"label": ["ratio@1+long"] * 2, "arm": ["none@engine"] * 2, "block_start": [0, 30],
                       "block_end": [29, 59], "gap": [-0.01, -0.05], "ci_low": [-0.03, -0.09],
                       "ci_high": [0.01, -0.01], "seeds": [8, 8], "grad_spike_step": [41.0] * 2,
                       "entropy_collapse_step": [np.nan] * 2})
    fig = plots.horizon_gaps(hz)
    ax = fig.axes[0]
    assert len(ax.containers) == 1 and list(ax.containers[0].lines[0].get_ydata()) == [-0.01, -0.05]
    assert any(list(ln.get_xdata()) == [41.0, 41.0] for ln in ax.get_lines())
    assert "no entropy collapse in any row" in " ".join(t.get_text() for t in fig.texts)
    # four rows, none collapsing: what none showed is said once per kind, inside the figure (a note per row ran
    # 2.5 figure-widths off its edge in qwen2-chat's horizon run)
    many = pd.concat([hz.assign(label=f"weights@{d}+long", grad_spike_step=np.nan) for d in (0.001, 0.003, 0.01, 0.03)])
    fig = plots.horizon_gaps(many)
    words = " ".join(t.get_text() for t in fig.texts)
    assert words.count("no grad-norm spikes") == 1 and "no entropy collapse in any row" in words
    renderer = fig.canvas.get_renderer()
    assert all(t.get_window_extent(renderer).x1 <= fig.bbox.x1 for t in fig.texts)
    empty = plots.horizon_gaps(hz.iloc[:0])
    assert "no long-horizon rows" in empty.axes[0].texts[0].get_text()
    plt.close("all")
    assert plots.FIGURES["horizon_gaps"][0] == "horizon"


def test_the_answer_leads_with_the_finding():
    """The index's answer column: a follow-up's one-sided contrast first, then the first arm's tolerable k3 per kind
    (BMDL, or where the bound lies), then the dose-by-dose verdicts; hand-made tables."""
    import pandas as pd

    from rlwb.core.measure import dose_response as dr

    bench = pd.DataFrame([
        {"kind": "ratio", "name": "ratio", "arm": "none@engine", "status": "bounded", "bmdl": 0.2, "bmd": 0.3,
         "scale_agree": True, "keep_below": 0.142, "k3_min": 0.01, "k3_max": 1.0},
        {"kind": "weights", "name": "weights", "arm": "none@engine", "status": "bounded", "bmdl": 1e-3,
         "bmd": 3e-3, "scale_agree": False, "keep_below": np.nan, "k3_min": 1e-3, "k3_max": 2e-2},
        {"kind": "weights", "name": "weights+ppo4", "arm": "none@engine", "status": "saturated",
         "bmdl": float("nan"), "bmd": float("nan"), "scale_agree": False, "keep_below": np.nan, "k3_min": 1e-3,
         "k3_max": 1e-3},
        {"kind": "ratio", "name": "ratio", "arm": "tis@trainer", "status": "above tested range",
         "bmdl": 0.5, "bmd": 2.0, "scale_agree": True, "keep_below": np.nan, "k3_min": 0.01, "k3_max": 1.0}])
    contrasts = pd.DataFrame([{"contrast": "one-sided vs symmetric", "label": "vllm-v1", "arm": "none@engine",
                               "diff": -0.06, "p_holm": 0.047, "mde": 0.08, "verdict": "differs"}])
    bullets = ["ratio mismatch, `none@engine`: no dose ...", "ratio mismatch, `tis@trainer`: no dose ..."]
    text = words_08.answer_line("none@engine", dr.first_regime_benchmarks(bench), contrasts, bullets)
    assert text.startswith("One-sided (vllm-v1) vs symmetric ratio error at matched k3, `none@engine`: worse by "
                           "-0.060 (Holm p 0.047). Tolerable k3 for `none@engine` (BMDL): ratio < 1.4e-01 (BMD "
                           "3.0e-01); weights no level (the dose scale decides it).")
    assert text.endswith("ratio mismatch, `none@engine`: no dose ...") and "tis@trainer" not in text
    # another arm's level is said too where it has one (tis here is above its tested range: none to say)
    leveled = bench.assign(keep_below=np.where(bench["arm"] == "tis@trainer", 0.02, bench["keep_below"]),
                           status=np.where(bench["arm"] == "tis@trainer", "bounded", bench["status"]))
    text = words_08.answer_line("none@engine", dr.first_regime_benchmarks(leveled), contrasts, bullets)
    assert "Other arms' levels: `tis@trainer` ratio < 2.0e-02." in text
    assert words_08.answer_line("none@engine", pd.DataFrame(), pd.DataFrame(), bullets) == bullets[0]


def test_ppo_epoch_regimes_pair_with_their_mini_batches_and_keep_the_one_epoch_labels():
    """`ppo_epochs` pairs with `updates_per_batch` by position: matched optimizer steps as 4 mini-batches x 1 epoch,
    2 x 2 and 1 x 4 are three further regimes, labelled `+ppo4` (a one-epoch regime keeps its label), `+ppo2x2`,
    `+ppo1x4`, each run configured with its mini-batches and epochs and paired with its own regime's clean twin. A
    single entry applies to every regime; lists that do not pair, a regime listed twice, or 0 epochs are refused,
    each naming the problem. The study's own params keep their hash (one epoch everywhere is what they ran)."""
    from rlwb.errors import ParamError

    p = study_params(updates_per_batch=[1, 4, 2, 1], ppo_epochs=[1, 1, 2, 4])
    assert [r.name for r in p.grammar.regimes] == ["1x1", "4x1", "2x2", "1x4"]
    js = design.training_runs(p)
    regime = {j.label: (j.updates, j.epochs) for j in js if j.arm == "none@trainer"}
    assert regime["clean"] == (1, 1) and regime["clean+ppo4"] == (4, 1) and regime["weights@0.1+ppo2x2"] == (2, 2)
    assert regime["clean+ppo1x4"] == (1, 4) and regime["weights@0.1+ppo1x4"] == (1, 4)
    twins = {j.twin for j in js if j.kind == "clean"}
    assert all(j.twin in twins for j in js if j.kind != "clean")
    cfg = design.config(p, next(j for j in js if j.label == "weights@0.1+ppo1x4"))
    assert (cfg.updates_per_batch, cfg.ppo_epochs) == (1, 4)
    assert design.regime_suffix(4, 1) == "+ppo4" and design.kind_label("ratio", (2, 2), (1, 1)) == "ratio+ppo2x2"
    assert [r.name for r in study_params(ppo_epochs=[2]).grammar.regimes] == ["1x2", "4x2"]
    assert study_params().hash() == study_params(ppo_epochs=[1]).hash() != study_params(ppo_epochs=[2]).hash()
    for bad, match in (({"ppo_epochs": [1, 2, 3]}, r"'ppo_epochs' \[1, 2, 3\] must hold one entry per regime"),
                       ({"updates_per_batch": [1, 2, 2], "ppo_epochs": [1, 2, 2]}, r"lists a regime twice.*2x2"),
                       ({"ppo_epochs": [1, 0]}, r"'ppo_epochs\[1\]' must be >= 1")):
        with pytest.raises(ParamError, match=match):
            study_params(**bad)


def test_a_declared_confirmation_labels_its_tests_and_needs_fresh_seeds():
    """`confirms` names, before the run, the kinds of test the run confirms: those contrasts are labelled
    confirmatory and every other exploratory, in the table and the conclusion; a confirmation on a study's seeds
    (from 0) is refused, and so is a kind of test that does not exist, by name."""
    from rlwb.errors import ParamError
    from rlwb.experiments.mismatch_study import comparisons, grammar

    c = curves({**CLEAN, ("ratio@0.1", "none@engine"): 0.2, ("ratio@0.1", "none@trainer"): 0.0,
                ("weights@0.03", "none@engine"): 0.2, ("weights@0.03", "none@trainer"): 0.05})
    explore = mc.analyze(c, MismatchCostParams(arms=["none@engine", "none@trainer"], placebo_arms=[]))
    assert len(explore.contrasts) and (explore.contrasts["standing"] == "exploratory").all()
    p = MismatchCostParams(arms=["none@engine", "none@trainer"], placebo_arms=[], confirms=["mode"], seed=1000)
    con = mc.analyze(c, p).contrasts
    assert set(con.loc[con["contrast"] == "mode", "standing"]) == {"confirmatory"}
    assert set(con.loc[con["contrast"] != "mode", "standing"]) <= {"exploratory"}
    assert "*(confirmatory)*" in "\n".join(words_08.contrast_lines(con))
    # a declared kind these runs cannot test (no raw-logprob engine here) is said missing, not passed over
    both = MismatchCostParams(arms=["none@engine", "none@trainer"], placebo_arms=[], seed=1000,
                              confirms=["mode", "one-sided vs symmetric"])
    done = mc.analyze(c, both)
    assert words_08.untested_confirmations(both.confirms, done.contrasts, done.horizon) == ["one-sided vs symmetric"]
    said = "not tested in these data** (params `confirms`): `one-sided vs symmetric` (needs a raw-logprob"
    assert said in done.conclusion()
    assert "not tested in these data" not in mc.analyze(c, p).conclusion()
    with pytest.raises(ParamError, match="fresh seeds: 'seed' must be >= 1000"):
        MismatchCostParams(confirms=["mode"], seed=0)
    from rlwb.params.validation import validate

    with pytest.raises(ParamError, match="confirms"):  # the params' validation (what `rlwb run` and the notebook do)
        validate(MismatchCostParams, {"confirms": ["modes"], "seed": 1000})
    # every kind of contrast the table makes is one a study can declare
    import inspect
    made = set(re.findall(r'add\("([^"]+)"', inspect.getsource(comparisons.contrast_table)))
    assert made == set(grammar.CONTRASTS) and set(grammar.CONTRASTS) < set(grammar.CONFIRMABLE)


def test_a_dose_that_leaves_the_policy_below_where_it_started_is_said_so():
    """The trained policy's outcome against the untrained one's (0.3 here): a row whose upper 95% limit over seeds
    lies below it is listed in the conclusion's "ends below where it started"; a row that only falls short of its
    clean twin is not."""
    c = ratio_curves(0.0)
    c = with_policy(c, {(lab, a): {"clean": 0.6, "ratio@1": 0.1}.get(lab, 0.5)
                        for lab, a in c[["label", "arm"]].drop_duplicates().itertuples(index=False)})
    res = mc.analyze(c, MismatchCostParams(arms=["none@engine"], placebo_arms=[], ratio_k3=list(RATIO_DOSES)))
    t = res.doses.set_index("label")
    assert t.loc["ratio@1", "below_initial"] and not t.loc["ratio@0.3", "below_initial"]
    assert t.loc["ratio@1", "initial_outcome"] == pytest.approx(0.3)
    line = words_08.below_initial_line(res.doses)
    assert "ratio@1 `none@engine`" in line and "ratio@0.3" not in line and line in res.conclusion()
    # the number listed is the row's mean, and the line says so (it read as the upper limit)
    assert f"`none@engine` {t.loc['ratio@1', 'policy_reward']:.3f}" in line and "its mean over seeds" in line


def test_a_level_is_quoted_only_from_four_doses_bounded_with_the_dose_scales_agreeing():
    """`keep_below`: NaN unless the row has MIN_DOSES doses, is bounded on the linear scale with its BMD inside the
    tested doses and the log scale agrees; then the lower of the two scales' BMDLs (or the linear one where the log
    scale is not bounded). The wording layer spells MIN_DOSES itself: it must be the analysis's."""
    from rlwb.experiments.mismatch_study import benchmarks

    lin = SimpleNamespace(status="bounded", bmdl=0.02, bmd=0.05)
    log = SimpleNamespace(status="bounded", bmdl=0.01)
    assert benchmarks.keep_below(lin, log, True, 4) == 0.01 == benchmarks.keep_below(lin, log, True, 4, 0.05)
    # a BMD below the smallest tested dose (bounded by BMDS's 10x rule): its bound rests on untested curve, no level
    # (seen on qwen2-chat's bracketing run: BMD 7.7e-03 below its smallest dose 1.9e-02, linear BMDL 4.9e-05)
    assert np.isnan(benchmarks.keep_below(lin, log, True, 4, 0.06))
    below = SimpleNamespace(status="bounded", doses=4, bmd=0.0077, bmdl=4.9e-05, k3_min=0.019, k3_max=1.5,
                            scale_agree=True, bmdl_log=2.1e-03, status_log="bounded")
    assert "below the smallest tested k3 1.9e-02" in words_08.benchmark_reason(below)
    assert words_08.short_reason(below) == "its BMD below the tested doses"
    assert benchmarks.keep_below(lin, SimpleNamespace(status="above tested range", bmdl=0.5), True, 4) == 0.02
    assert np.isnan(benchmarks.keep_below(lin, log, False, 4))  # the dose scale decides it
    assert np.isnan(benchmarks.keep_below(lin, log, True, 3))  # too few doses: only the line is tested
    assert np.isnan(benchmarks.keep_below(SimpleNamespace(status="above tested range", bmdl=0.02), log, True, 5))
    assert words_08.MIN_DOSES == benchmarks.MIN_DOSES
    r = SimpleNamespace(status="bounded", doses=2, bmdl=0.02, k3_min=0.01, k3_max=1.0, scale_agree=True)
    assert "only the straight line is tested" in words_08.benchmark_reason(r)


def test_a_lags_dose_is_placed_at_each_arms_k3_when_the_lag_is_first_whole():
    """A lag's k3 at the step it is first whole (stale@2: step 2) differs by arm, since their first updates
    differ: each arm's row keeps its own `k3_initial`, not the mean over arms and not the k3 achieved over the run."""
    c = curves({**CLEAN, ("stale@2", "none@engine"): 0.1, ("stale@2", "none@trainer"): 0.1})
    c["kind"] = c["label"].str.split("@").str[0]
    c["dose"] = np.where(c["kind"] == "stale", 2.0, 0.0)
    own = {"none@engine": 0.004, "none@trainer": 0.009}
    c["mismatch_k3"] = [0.0 if k == "clean" else (own[a] if t == 2 else 0.05) for k, a, t in
                        zip(c["kind"], c["arm"], c["step"])]
    t = analysis.dose_table(c, MismatchCostParams(stale_steps=[2]), kl_zero(c)).set_index(["label", "arm"])
    for arm, k3 in own.items():
        assert t.loc[("stale@2", arm), "k3_initial"] == pytest.approx(k3)
        assert t.loc[("stale@2", arm), "k3_achieved"] > 0.04  # the run's mean: mostly the later steps'


def test_placebo_streams_are_rows_of_their_own_with_sampling_seeds_no_other_run_draws():
    """`placebo_streams` N: each placebo arm's clean run trained again on N streams, rows `placebo` (stream 1, the
    name every run before the param had), `placebo#2`, ...; every request of every run of the study draws its own
    sampling seed. Catches stream k passed to the loop as is: `sampling_seed`'s seed stride is twice its stream
    stride less 3, so stream k + 2 of seed s would draw seed s + 1's stream-k seeds (request i that of i + 3)."""
    from rlwb.core.rl.grpo_config import sampling_seed
    from rlwb.job_store import job_key

    p = MismatchCostParams(placebo_arms=["none@engine", "none@trainer"], placebo_streams=4, num_seeds=6)
    runs = design.training_runs(p)
    plc = [j for j in runs if j.kind == "placebo"]
    assert len(plc) == 4 * 2 * 6 and len({job_key(j) for j in runs}) == len(runs)
    assert sorted({(j.label, j.stream) for j in plc}) == [("placebo", 1), ("placebo#2", 2), ("placebo#3", 3),
                                                          ("placebo#4", 4)]
    assert {design.config(p, j).sampling_stream for j in plc} == {1, 1001, 2001, 3001}
    assert all(design.config(p, j).sampling_stream == 0 for j in runs if j.kind != "placebo")
    requests = p.prompts_per_step * p.group_size

    def draws(stream_of) -> np.ndarray:
        """Every (seed, stream) pair's request seeds over the study's steps."""
        pairs = {(j.seed, stream_of(j)) for j in runs}
        return np.array([sampling_seed(s, t, k) + i for s, k in pairs for t in range(p.steps)
                         for i in range(requests)])

    seeds = draws(lambda j: design.config(p, j).sampling_stream)
    assert len(np.unique(seeds)) == len(seeds)
    naive = draws(lambda j: j.stream)  # the stream index itself: streams meet
    assert len(np.unique(naive)) < len(naive)
    one = MismatchCostParams()  # the default: one stream, its runs as before the param (stream 1, `placebo`)
    assert [(j.label, j.stream) for j in design.training_runs(one) if j.kind == "placebo"] == [
        ("placebo", 1)] * one.num_seeds
    from rlwb.errors import ParamError

    with pytest.raises(ParamError, match="'placebo_streams' \\(3\\) needs 'placebo_arms'"):
        MismatchCostParams(placebo_arms=[], placebo_streams=3)


def test_n_placebo_streams_are_n_rows_of_the_false_positive_rate():
    """Three placebo streams of one arm on hand-made curves: three rows in the family, three independent streams
    in `placebo_metrics`, the rate and its interval over three streams sharing one clean reference; a stream whose
    gap is a real cost is one false positive of three (unadjusted and after Holm)."""
    from rlwb.core.measure import stats
    from rlwb.experiments.wording import mismatch_cost as wording

    costs = {**CLEAN, ("ratio@0.1", "none@engine"): 0.2, ("placebo", "none@engine"): 0.0,
             ("placebo#2", "none@engine"): 0.0, ("placebo#3", "none@engine"): 0.0}
    c = curves(costs)
    c["kind"] = np.where(c["label"].str.startswith("placebo"), "placebo", c["kind"])
    for k, lab in enumerate(("placebo", "placebo#2", "placebo#3")):  # each stream its own noise
        at = c["label"] == lab
        c.loc[at, "reward_mean"] += 0.003 * np.cos(c.loc[at, "seed"] * (2.1 + k))
    c = with_policy(c, {k: 0.6 - v for k, v in costs.items()})
    p = MismatchCostParams(placebo_streams=3)
    t = analysis.dose_table(c, p, kl_zero(c))
    m = analysis.dose_metrics(t, c)
    assert m["placebo/rows"] == 3 and m["placebo/streams"] == 3 and m["placebo/false_positive_rate"] == 0
    # the three are tested against the same clean runs: the interval is the shared-control one, wider than
    # Clopper-Pearson's for three independent trials, and the line says so
    assert m["placebo/shared_controls"] == 1
    assert (m["placebo/false_positive_rate_ci_low"], m["placebo/false_positive_rate_ci_high"]) == (
        stats.shared_control_rate_ci(0, int(t.loc[t["kind"] == "placebo", "seeds"].iloc[0]), [3]))
    assert m["placebo/false_positive_rate_ci_high"] > stats.proportion_ci(0, 3, method="exact")[1] + 0.02
    assert "3 independent streams" in wording.placebo_line(m)
    assert "95% intervals for 3 streams tested against the same clean reference" in wording.placebo_line(m)
    hit = c["label"] == "placebo#3"
    c.loc[hit, "policy_reward"] -= 0.2
    t = analysis.dose_table(c, p, kl_zero(c))
    m = analysis.dose_metrics(t, c)
    assert m["placebo/streams"] == 3 and m["placebo/false_positive_rate"] == pytest.approx(1 / 3)
    assert m["placebo/false_positive_rate_holm"] == pytest.approx(1 / 3) and "**fails**" in wording.placebo_line(m)


SEQ_DOSES = {0.03: (0.0, 0.004), 0.1: (-0.02, 0.004), 0.3: (-0.07, 0.15), 1.0: (-0.25, 0.004)}  # mean gap, sd


def sequential_curves(seeds=range(6), doses=SEQ_DOSES) -> pd.DataFrame:
    """One arm's clean run and ratio doses on hand-made curves whose tested outcome (policy reward) is the clean run's
    (0.6 + 0.01 x seed, over an initial policy at 0.3: a gain of ~0.3, a BMR of ~0.076 at 25%) plus each dose's gap,
    drawn per seed with the dose's mean and sd (a fixed generator per dose and seed: a seed's gap is the same
    whatever seeds the study has)."""
    rows = []
    for d in (0.0, *doses):
        label = "clean" if d == 0 else f"ratio@{d:g}"
        for s in seeds:
            mean, sd = doses.get(d, (0.0, 0.0))
            gap = mean + sd * np.random.default_rng([s, int(d * 1000)]).standard_normal() if d else 0.0
            for t in range(4):
                rows.append({"step": t, "kind": label.split("@")[0], "label": label, "dose": d, "temperature": 0.7,
                             "arm": "none@engine", "seed": s, "reward_mean": 0.5 + 0.03 * t, "grad_norm": 1.0,
                             "clip_frac": 0.0, "mismatch_k3": d, "mismatch_k1": 0.0, "entropy": 0.5,
                             "raw_logprobs": False, "heldout_greedy_acc": 0.6, "engine": "vllm-v1-fixed",
                             "policy_reward": 0.6 + 0.01 * s + gap, "initial_policy_reward": 0.3})
    return pd.DataFrame(rows)


def seq_params(**kw) -> MismatchCostParams:
    return MismatchCostParams(**{"arms": ["none@engine"], "placebo_arms": [], "engine_points": [],
                                 "ratio_k3": list(SEQ_DOSES), "weight_noise": [], "stale_steps": [], "num_seeds": 6,
                                 "max_seeds": 60, **kw})


def test_the_sequential_rule_gives_seeds_where_the_benchmark_is_decided_and_none_elsewhere():
    """The first pass (6 seeds): ratio@0.3's gap interval holds -BMR (mean -0.07, sd 0.15): it gets the seeds that
    detect the BMR with 80% power at alpha / m (noncentral t on its floored sd), and so does its clean twin; the
    dose far from the BMR with a tight gap (0.03) gets none; the other dose bracketing the BMD has a tight gap the
    first pass's seeds already detect: called, none more. A cap below that count holds (and says capped); the
    study's second pass trains exactly those rows at seeds 6 ... n - 1; `analyze` redoes the decision from the first
    pass's seeds of the whole curves (the second pass's seeds change nothing), records it and says it."""
    from rlwb.core.measure import stats
    from rlwb.experiments.mismatch_study import sequential

    p = seq_params()
    calls, m = sequential.first_pass(sequential_curves(), p)
    by = {c.label: c for c in calls}
    assert "ratio@0.3" in by and "ratio@0.03" not in by and len(by) == 2 and m >= 4
    mid, (tight,) = by["ratio@0.3"], [c for c in calls if c.label != "ratio@0.3"]
    assert sequential.STRADDLES in mid.why and tight.why == (sequential.BRACKETS,) and tight.seeds == p.num_seeds
    level = 0.05 / m
    assert 0.05 < mid.bmr < 0.1 and mid.power_first < 0.8 <= mid.power
    assert mid.seeds > p.num_seeds and stats.paired_t_power(mid.bmr, mid.sd, mid.seeds - 1, level) < 0.8
    assert mid.power == pytest.approx(stats.paired_t_power(mid.bmr, mid.sd, mid.seeds, level))
    t = analysis.dose_table(sequential.first_pass_curves(sequential_curves(), p), p).set_index(["label", "arm"])
    assert mid.sd == pytest.approx(stats.floored_sd(t.loc[("ratio@0.3", "none@engine"), "gap_sd"],
                                                    t.loc[("ratio@0.3", "none@engine"), "q_eff"]))
    capped = sequential.first_pass(sequential_curves(), seq_params(max_seeds=mid.seeds - 3))[0]
    cm = next(c for c in capped if c.label == "ratio@0.3")
    assert cm.seeds == mid.seeds - 3 and cm.capped and cm.power < 0.8 and not mid.capped
    # the what-if of scripts/two_look_size.py --row-level: sized at two-sided 0.1 (one row's one-sided 5%), fewer seeds
    row, m2 = sequential.first_pass(sequential_curves(), p, level=0.1)
    rm = next(c for c in row if c.label == "ratio@0.3")
    least = next(n for n in range(p.num_seeds, 200) if stats.paired_t_power(rm.bmr, rm.sd, n, 0.1) >= 0.8)
    assert m2 == m and rm.seeds == max(least, p.num_seeds + 2) < mid.seeds  # a second pass: 2 seeds at least
    assert rm.power == pytest.approx(stats.paired_t_power(rm.bmr, rm.sd, rm.seeds, 0.1))
    runs = sequential.second_pass_runs(calls, design.training_runs(p), p)
    assert [(j.label, j.seed) for j in runs] == [("clean", s) for s in range(6, mid.seeds)] + [
        ("ratio@0.3", s) for s in range(6, mid.seeds)]
    assert all(j.twin[:4] == runs[0].twin[:4] for j in runs)
    # the whole study's curves: the extended rows carry the second pass's seeds
    whole = sequential_curves(range(mid.seeds))
    whole = whole[whole["label"].isin(["clean", "ratio@0.3"]) | (whole["seed"] < 6)]
    assert sequential.first_pass(whole, p) == (calls, m)
    res = mc.analyze(whole, p)
    mt = res.metrics
    assert mt["sequential/ratio@0.3/none@engine/seeds"] == mt["sequential/clean/none@engine/seeds"] == mid.seeds
    assert mt[f"sequential/{tight.label}/none@engine/seeds"] == 6
    assert "sequential/ratio@0.03/none@engine/seeds" not in mt
    assert mt["sequential/rows"] == 1 and mt["sequential/runs"] == 2 * (mid.seeds - 6)
    gaps = analysis.seed_gaps(analysis.per_seed(whole)).set_index("seed")
    mid_gaps = gaps.loc[gaps["label"] == "ratio@0.3", "gap"]
    d = res.doses.set_index(["label", "arm"])
    assert d.loc[("ratio@0.3", "none@engine"), "p"] == pytest.approx(  # two looks, not one pooled t test
        analysis.two_look_p(mid_gaps, p.seeds, p.max_seeds, d.loc[("ratio@0.3", "none@engine"), "q_eff"]))
    assert d.loc[("ratio@0.3", "none@engine"), "p"] != pytest.approx(
        stats.paired_gap_test(mid_gaps.to_numpy(), margin=1.0, resolution=d["q_eff"].iloc[0]).p_diff)
    rows = res.doses.set_index(["label", "arm"])["seeds"]
    assert rows[("ratio@0.3", "none@engine")] == mid.seeds and rows[("ratio@1", "none@engine")] == 6
    # the fit takes every seed a dose has: the extended dose's and the clean twin's all, the others the first pass's
    assert res.benchmarks["seeds"].iloc[0] == mid.seeds
    assert sorted(map(int, res.benchmarks["dose_seeds"].iloc[0].split())) == [6, 6, 6, mid.seeds]
    assert f"`ratio@0.3` `none@engine` 6 → {mid.seeds}" in res.conclusion()
    assert "max_seeds" not in res.conclusion() and "sequential rule" in res.conclusion()
    off = mc.analyze(sequential_curves(), seq_params(max_seeds=0))
    assert not any(k.startswith("sequential/") for k in off.metrics) and "sequential rule" not in off.conclusion()


def test_the_sequential_rule_on_a_hand_made_first_pass_table():
    """`decide` alone: a row with no spread and no outcome step gets no seeds (nothing to size by), a row with a
    spread that straddles gets the count that reaches the target, capped at max_seeds, a benchmark row without a
    BMR (the clean arm did not learn) calls nothing, and a BMD outside the tested doses brackets with its nearest
    dose only."""
    from rlwb.core.measure import stats
    from rlwb.experiments.mismatch_study import sequential

    table = pd.DataFrame({"label": ["ratio@0.1", "ratio@1"], "arm": "a", "gap_ci_low": [-0.2, -0.3],
                          "gap_ci_high": [0.0, -0.3], "gap_sd": [0.1, 0.0], "q_eff": [0.0, 0.0]})
    studies = [SimpleNamespace(name="ratio", arm="a", labels=["ratio@0.1", "ratio@1"], doses=[0.1, 1.0])]

    def decide(bmr=0.1, bmd=np.nan, cap=100, m=10, futility=0.0, rule="fixed-n"):
        bench = pd.DataFrame({"name": ["ratio"], "arm": ["a"], "bmr": [bmr], "bmd": [bmd]})
        return {c.label: c for c in sequential.decide(table, bench, studies, m, num_seeds=4, max_seeds=cap,
                                                       target_power=0.8, futility_power=futility, seed_power=rule)}

    calls = decide()
    assert set(calls) == {"ratio@0.1"} and calls["ratio@0.1"].why == (sequential.STRADDLES,)
    n = calls["ratio@0.1"].seeds
    assert stats.paired_t_power(0.1, 0.1, n, 0.005) >= 0.8 > stats.paired_t_power(0.1, 0.1, n - 1, 0.005)
    assert decide(cap=n - 1)["ratio@0.1"].seeds == n - 1 and decide(cap=n - 1)["ratio@0.1"].capped
    tie = decide(bmd=2.0)["ratio@1"]  # beyond the doses: the largest brackets it alone; its gaps tie
    assert tie.why == (sequential.BRACKETS,) and tie.seeds == 4 and np.isnan(tie.power)
    assert set(decide(bmd=0.5)) == {"ratio@0.1", "ratio@1"}
    assert decide(bmr=np.nan) == {} and decide(bmr=-0.05) == {}
    assert decide(cap=0)["ratio@0.1"].seeds == 4  # no second pass: the first pass's seeds
    # the futility bound: a cap whose power lies below it leaves the row at the first pass (said: `futile`); a cap
    # at or above it extends the row as without the bound, capped or not
    at = {c: stats.paired_t_power(0.1, 0.1, c, 0.005) for c in (n - 1, n - 3)}
    short = decide(cap=n - 3, futility=at[n - 3] + 0.01)["ratio@0.1"]
    assert short.futile and short.seeds == 4 and not short.capped and short.power == pytest.approx(short.power_first)
    kept = decide(cap=n - 1, futility=at[n - 1] - 0.01)["ratio@0.1"]
    assert not kept.futile and kept.seeds == n - 1 and kept.capped
    assert not decide(futility=0.79)["ratio@0.1"].futile and decide(futility=0.79)["ratio@0.1"].seeds == n
    # a row that brackets the BMD keeps its seeds whatever its test's power: they narrow the fit's bounds
    both = decide(bmd=0.5, cap=n - 3, futility=at[n - 3] + 0.01)["ratio@0.1"]
    assert both.why == (sequential.STRADDLES, sequential.BRACKETS) and not both.futile and both.seeds == n - 3
    # sized by the two-look test, the bound reads that test's power at the cap
    cap = decide(rule="two-look")["ratio@0.1"].seeds - 4
    cap_power = analysis.two_look_power(0.1, 0.1, 4, cap, cap, 0.005)  # its weights are the cap's
    assert cap >= 6 and cap_power < 0.8
    assert decide(rule="two-look", cap=cap, futility=cap_power + 0.01)["ratio@0.1"].futile
    assert not decide(rule="two-look", cap=cap, futility=cap_power - 0.01)["ratio@0.1"].futile


@pytest.mark.parametrize("kw,match", [
    ({"num_seeds": 8, "max_seeds": 6}, "'max_seeds' \\(6\\) must be 0 .* 'num_seeds' \\+ 2 \\(8 \\+ 2\\)"),
    ({"num_seeds": 8, "max_seeds": 9}, "'max_seeds' \\(9\\) must be 0"),
    ({"target_power": 1.0}, "target_power"), ({"max_seeds": 501}, "max_seeds"),
    ({"futility_power": 0.5}, "'futility_power' \\(0.5\\) needs a second pass \\(max_seeds > 0, got 0\\)"),
    ({"num_seeds": 8, "max_seeds": 24, "futility_power": 0.8}, "must lie below 'target_power' \\(0.8\\)")])
def test_the_sequential_rule_is_refused_where_it_cannot_mean_anything(kw, match):
    """Validated before any kernel starts (`params.load`), naming the parameter (and both, for the cap below the
    first pass)."""
    from rlwb.errors import ParamError
    from rlwb.params.validation import load

    with pytest.raises(ParamError, match=match):
        load("08_mismatch_cost", [], kw)


def test_the_new_params_keep_every_params_files_hash():
    """`placebo_streams` 1, `max_seeds` 0 and `target_power` 0.8 compute what every run before them computed: the
    params files' hashes are what they were (the index's one row per parameter set, readme-check's newer run of the
    same computation); another value is another computation."""
    from rlwb.params.validation import load

    before = {"default": "6cc106bb", "study": "bd4c1e74", "one_sided": "fc7e6a6d",
              "smoke": "4ca9f5cc"}  # smoke.yaml as it is since its PPO-epochs regime (08f6e00c before)
    for name, h in before.items():
        p = load("08_mismatch_cost", [f"params/08_mismatch_cost/{name}.yaml"])
        assert p.hash() == h, name
        assert len({p.hash(), replace_hash(p, placebo_streams=2), replace_hash(p, max_seeds=20),
                    replace_hash(p, max_seeds=20, target_power=0.9),
                    replace_hash(p, max_seeds=20, futility_power=0.3)}) == 5


def replace_hash(p, **kw) -> str:
    from dataclasses import replace

    return replace(p, **kw).hash()



def rule_rows(rng, gap: float, n_rows: int, n1: int = 8, cap: int = 40, bmr: float = 0.03):
    """`n_rows` rows of true `gap` (sd 0.085) through the rule: 8 seeds, then where the gap's 95% interval holds -BMR
    the seeds `seeds_for` sizes (at 0.05 / 40, up to 40), drawn fresh. (each row's gaps, its seed count)"""
    from scipy import stats as st

    from rlwb.experiments.mismatch_study import sequential

    x = rng.normal(gap, 0.085, (n_rows, cap))
    mu, sd = x[:, :n1].mean(1), x[:, :n1].std(1, ddof=1)
    hw = st.t.ppf(0.975, n1 - 1) * sd / np.sqrt(n1)
    n = [sequential.seeds_for(bmr, s, n1, cap, 0.05 / 40, 0.8) if m - h <= -bmr <= m + h else n1
         for m, s, h in zip(mu, sd, hw)]
    return x, n


def test_a_study_with_a_second_pass_tests_its_dose_rows_at_their_level():
    """Null rows through the rule (most extended, each to a count of its own): one t test pooling both passes calls
    a cost at 5% well above 5% of the time (the first pass's seeds were picked by their own mean), the two-look test
    (`analysis.two_look_p`) at most 5% (binomial 3-sd band, 2000 rows, BMR 0.01). Rows with a cost the BMR's size:
    the second look finds more of them than the first look alone. Catches an extended row tested by the pooled t
    test, or a two-look p that is not a p (above its level under no cost)."""
    from scipy import stats as st

    from rlwb.core.measure import stats

    rng = np.random.default_rng(58)
    x, n = rule_rows(rng, 0.0, 2000, bmr=0.01)
    assert 0.8 < np.mean(np.array(n) > 8) < 0.99
    pooled = np.array([2 * st.t.sf(abs(r[:k].mean()) / r[:k].std(ddof=1) * np.sqrt(k), k - 1) for r, k in zip(x, n)])
    looks = np.array([analysis.two_look_p(pd.Series(r[:k]), range(8), 40, 0.0) for r, k in zip(x, n)])
    band = 3 * np.sqrt(0.05 * 0.95 / len(n))
    assert (pooled < 0.05).mean() > 0.05 + band and (looks < 0.05).mean() < 0.05 + band
    x, n = rule_rows(rng, -0.04, 300)
    first = np.array([analysis.two_look_p(pd.Series(r[:8]), range(8), 40, 0.0) for r in x])
    looks = np.array([analysis.two_look_p(pd.Series(r[:k]), range(8), 40, 0.0) for r, k in zip(x, n)])
    assert (looks < 0.05).mean() > (first < 0.05).mean() + 0.2
    # no second look (fewer than 2 seeds beyond the first pass): the first look's p against the two-look boundary
    r = pd.Series(x[0, :9])
    assert analysis.two_look_p(r, range(8), 40, 0.0) == analysis.two_look_p(r[:8], range(8), 40, 0.0)
    assert analysis.two_look_p(r[:8], range(8), 40, 0.0) > stats.paired_gap_test(r[:8].to_numpy(), margin=1.0).p_diff


def test_a_benchmark_row_places_each_dose_at_the_k3_of_the_seeds_it_fits():
    """The fitted outcomes are the seeds with a clean twin, so the dose each group sits at must be those seeds'
    k3_initial, not the mean over every seed run at it (the default study of 2026-11-27 placed bypass's weights
    0.03 x rms 1.5x to the right that way). Extra seeds at ratio@0.3 without their clean twins, with a k3 ten times
    the dose, move the table's k3_initial, not the row's."""
    from rlwb.experiments.mismatch_study import benchmarks

    base = sequential_curves()
    extra = sequential_curves(seeds=range(6, 12))
    extra = extra[extra["label"] == "ratio@0.3"].assign(mismatch_k3=3.0)
    c = pd.concat([base, extra], ignore_index=True)
    p = seq_params()
    t = analysis.dose_table(c, p)
    assert t.set_index(["label", "arm"]).loc[("ratio@0.3", "none@engine"), "k3_initial"] == pytest.approx(1.65)
    (row,) = benchmarks.row_studies(c, t)
    assert row.seeds == list(range(6))
    assert dict(zip(row.labels, row.doses))["ratio@0.3"] == pytest.approx(0.3)
    assert list(row.doses) == sorted(row.doses)


def test_a_second_passs_seeds_enter_the_benchmark_fit_at_the_doses_it_extended():
    """A second pass extends ratio@0.3 and its clean twin to 12 seeds: the row fits 12 seeds at dose 0 and at
    ratio@0.3 and the first pass's 6 at the other doses (NaN where a seed was not run), the table says so
    (`dose_seeds`, `seeds`), and the quoted line says what it was fitted on; the per-seed trend keeps the seeds
    every dose has."""
    from rlwb.experiments.mismatch_study import benchmarks
    from rlwb.experiments.wording import mismatch_cost as words

    extra = sequential_curves(seeds=range(6, 12))
    c = pd.concat([sequential_curves(), extra[extra["label"].isin(["clean", "ratio@0.3"])]], ignore_index=True)
    t = analysis.dose_table(c, seq_params())
    (row,) = benchmarks.row_studies(c, t)
    assert row.seeds == list(range(12)) and row.clean.size == 12
    have = dict(zip(row.labels, np.isfinite(row.dosed).sum(0)))
    assert have == {lab: (12 if lab == "ratio@0.3" else 6) for lab in row.labels}
    b, _ = benchmarks.benchmark_table(t, c, 0.25)
    assert b["seeds"].iloc[0] == 12
    assert b["dose_seeds"].iloc[0] == " ".join("12" if lab == "ratio@0.3" else "6" for lab in row.labels)
    r = next(b.itertuples())
    per_dose = b["dose_seeds"].iloc[0].replace(" ", "/")
    assert words.fitted_seeds(r) == f"; fitted on 12 seeds at dose 0 and {per_dose} at its doses"
    assert words.fitted_seeds(r._replace(dose_seeds="12 12 12 12", seeds=12)) == ""
    m = benchmarks.benchmark_metrics(b)
    key = f"{r.name}/{r.arm}"
    assert (m[f"{key}/seeds_clean"], m[f"{key}/seeds_dose_min"], m[f"{key}/seeds_dose_max"]) == (12, 6, 12)
    # a seed with two clean runs in the row's cell (another label) would enter dose 0 twice: refused by name
    again = c[(c["label"] == "clean") & (c["seed"] == 3)].assign(label="clean again")
    with pytest.raises(ValueError, match=r"seeds \[3\] have more than one clean run"):
        benchmarks.row_studies(pd.concat([c, again], ignore_index=True), t)


def test_the_declared_confirmation_loads_on_the_study_with_fresh_seeds_and_its_counted_runs():
    """params/08_mismatch_cost/confirm_study.yaml, declared before it runs, layered on the benchmark study: it
    validates, confirms on seeds no study used (from 1000) at a fixed n, keeps the PPO-epochs regimes exploratory
    (new there: nothing to confirm; a declared `mode` confirms its first-regime rows, not the regimes' ones), and
    trains the 385 runs its header counts (its budget rests on them). Catches a declaration that no longer loads, a
    design changed without its budget, or a further regime's contrast labelled confirmatory."""
    from rlwb import params
    from rlwb.experiments.mismatch_study import design
    from rlwb.experiments.mismatch_study.grammar import CONFIRM_SEED_BASE

    folder = Path(__file__).resolve().parent.parent / "params" / "08_mismatch_cost"
    p = params.load("08_mismatch_cost", [folder / "benchmark_study.yaml", folder / "confirm_study.yaml"])
    assert p.seed >= CONFIRM_SEED_BASE and p.max_seeds == 0 and "regime" not in p.confirms
    assert set(p.confirms) == {"mode", "one-sided vs symmetric", "horizon"}
    runs = design.training_runs(p)
    assert len(runs) == 385 and "385 runs" in (folder / "confirm_study.yaml").read_text()
    assert {(r.updates, r.epochs) for r in runs} == {(1, 1), (4, 1), (2, 2), (1, 4)}
    # confirmatory: the declared kinds at their first-regime rows; the epochs regimes' contrasts stay exploratory
    from rlwb.experiments.mismatch_study.comparisons import standing

    assert standing("mode", p, "stale@4") == standing("mode", p, "weights@0.1") == "confirmatory"
    assert standing("one-sided vs symmetric", p, "vllm-v1") == "confirmatory"
    for test, label in (("mode", "stale@4+ppo1x4"), ("mode", "stale@4+ppo2x2"), ("regime", "stale@4+ppo4")):
        assert standing(test, p, label) == "exploratory", (test, label)
    # qwen2-chat's, on the same study file: its model, 209 runs (32 of 120 steps), one TIS row, the mode rows
    q = params.load("08_mismatch_cost", [folder / "benchmark_study.yaml", folder / "confirm_study_qwen2.yaml"])
    assert q.model == "qwen2-chat" and q.seed >= CONFIRM_SEED_BASE and q.max_seeds == 0
    assert set(q.confirms) == {"mode", "correction", "horizon"}
    runs = design.training_runs(q)
    assert len(runs) == 209 and "209 runs" in (folder / "confirm_study_qwen2.yaml").read_text()
    assert sum(r.label.endswith("+long") for r in runs) == 32
    assert {r.label for r in runs if r.arm == "tis@trainer"} == {"clean", "weights@0.1"}


def test_the_horizon_run_and_the_second_one_sided_confirmation_load_as_declared():
    """params/08_mismatch_cost/horizon_study*.yaml and confirm_onesided.yaml, declared before they ran, layered on the
    benchmark study: each validates, trains the runs its header counts (its budget rests on them) on seeds no other
    run of record used, the horizon run four weights doses at both horizons (a level per horizon needs 4), the
    confirmation its one contrast alone in a family of 3 at a fixed n."""
    from rlwb import params
    from rlwb.experiments.mismatch_study import design
    from rlwb.experiments.mismatch_study.comparisons import standing

    folder = Path(__file__).resolve().parent.parent / "params" / "08_mismatch_cost"
    study = folder / "benchmark_study.yaml"
    h = params.load("08_mismatch_cost", [study, folder / "horizon_study.yaml"])
    runs = design.training_runs(h)
    assert len(runs) == 81 and "81 runs" in (folder / "horizon_study.yaml").read_text()
    assert h.confirms == [] and h.max_seeds == 0 and h.seeds == list(range(2000, 2008))
    for horizon in ("", "+long"):
        assert {r.label for r in runs if r.kind == "weights" and r.label.endswith(horizon)} >= {
            f"weights@{d:g}{horizon}" for d in (0.003, 0.01, 0.03, 0.1)}
    q = params.load("08_mismatch_cost", [study, folder / "horizon_study_qwen2.yaml"])
    runs = design.training_runs(q)
    assert len(runs) == 81 and "81 runs" in (folder / "horizon_study_qwen2.yaml").read_text()
    assert (q.model, q.max_digits, q.lr) == ("qwen2-chat", 1, 4e-5)  # the sweep's qwen2-chat cell
    assert q.confirms == [] and q.max_seeds == 0 and q.seeds == list(range(4000, 4008)) and q.policy_samples >= 2
    for horizon in ("", "+long"):
        assert {r.label for r in runs if r.kind == "weights" and r.label.endswith(horizon)} >= {
            f"weights@{d:g}{horizon}" for d in (0.001, 0.003, 0.01, 0.03)}
    g = params.load("08_mismatch_cost", [study, folder / "horizon_gap_qwen2.yaml"])  # the 12x gap's doses
    runs = design.training_runs(g)
    assert len(runs) == 81 and "81 runs" in (folder / "horizon_gap_qwen2.yaml").read_text()
    assert (g.model, g.max_digits, g.lr, g.policy_samples) == (q.model, q.max_digits, q.lr, q.policy_samples)
    assert g.confirms == [] and g.max_seeds == 0 and g.seeds == list(range(5000, 5008))
    assert {r.label for r in runs if r.kind == "weights"} == {
        f"weights@{d:g}{horizon}" for d in (0.003, 0.005, 0.007, 0.01) for horizon in ("", "+long")}
    c = params.load("08_mismatch_cost", [study, folder / "confirm_onesided.yaml"])
    runs = design.training_runs(c)
    assert len(runs) == 73 and "73 runs" in (folder / "confirm_onesided.yaml").read_text()
    assert c.confirms == ["one-sided vs symmetric"] and c.max_seeds == 0 and c.seeds == list(range(3000, 3024))
    assert standing("one-sided vs symmetric", c, "vllm-v1") == "confirmatory"
    assert {r.label for r in runs} == {"clean", "ratio@0.0015", "vllm-v1", "rerun"}


def test_the_two_look_power_is_the_power_of_the_test_the_rows_get():
    """`analysis.two_look_power` (what each sequential call reports beside the fixed-n power it was sized by) against
    simulation: the rejection rate of `two_look_p` itself on synthetic paired gaps (400 studies, within 4 standard
    errors), and of the same statistic vectorised (100,000 studies, within 0.01); the level at no effect; a row left
    at the first pass has the first look only. Catches a normal approximation (at 8 seeds and alpha / 97 it
    overstates the power by ~0.2), weights not fixed by the cap, or the second pass's seeds miscounted."""
    from scipy.optimize import brentq
    from scipy.stats import norm
    from scipy.stats import t as student

    from rlwb.core.measure import stats

    eff, sd, first, seeds, cap = 0.085, 0.085, 8, 16, 24
    got = analysis.two_look_power(eff, sd, first, seeds, cap, 0.01)
    rng = np.random.default_rng(7)
    hits = [analysis.two_look_p(pd.Series(rng.normal(-eff, sd, seeds)), range(first), cap, 0.0) < 0.01
            for _ in range(400)]
    assert abs(np.mean(hits) - got) < 4 * np.sqrt(got * (1 - got) / 400)
    w = np.sqrt(first / cap)
    c = brentq(lambda v: analysis.two_look_reject(v, w) - 0.01, 0.5, 12)

    def z(x):
        k = x.shape[1]
        return norm.ppf(student.cdf(x.mean(1) / x.std(1, ddof=1) * np.sqrt(k), k - 1))

    z1, z2 = z(rng.normal(-eff, sd, (100_000, first))), z(rng.normal(-eff, sd, (100_000, seeds - first)))
    assert abs(np.mean((abs(z1) >= c) | (abs(w * z1 + np.sqrt(1 - w * w) * z2) >= c)) - got) < 0.01
    assert analysis.two_look_power(0.0, sd, first, seeds, cap, 0.01) == pytest.approx(0.01, abs=1e-6)
    level = 0.05 / 97  # the default study's family
    assert analysis.two_look_power(eff, sd, first, cap, cap, level) < stats.paired_t_power(eff, sd, cap, level)
    assert analysis.two_look_power(eff, sd, first, first, cap, level) == analysis.two_look_power(
        eff, sd, first, first + 1, cap, level) < stats.paired_t_power(eff, sd, first, level)


def test_the_rule_can_size_by_the_two_look_tests_own_power():
    """`seed_power: two-look` sizes each row by the power of the test it gets (`analysis.two_look_power`), which at
    the family's level needs more seeds than the fixed-n plan; the default stays fixed-n (what every study before
    the param computed: its HASH_NEUTRAL value, so a reanalysis of one redoes its decision). Catches the option
    ignored, or sizing that stops short of the target where the cap allows it."""
    from rlwb.experiments.mismatch_study import sequential
    from rlwb.params.schemas.mismatch_cost import MismatchCostParams

    level, bmr, sd = 0.05 / 97, 0.085, 0.085
    fixed = sequential.seeds_for(bmr, sd, 8, 40, level, 0.8)
    two = sequential.seeds_for(bmr, sd, 8, 40, level, 0.8, "two-look")
    assert fixed < two < 40
    assert analysis.two_look_power(bmr, sd, 8, two, 40, level) >= 0.8 > analysis.two_look_power(
        bmr, sd, 8, two - 1, 40, level)
    assert MismatchCostParams().seed_power == MismatchCostParams.HASH_NEUTRAL["seed_power"] == "fixed-n"
    from rlwb import params
    from rlwb.errors import ParamError

    with pytest.raises(ParamError, match="seed_power"):
        params.load("08_mismatch_cost", [], {"seed_power": "bayes"})


def test_a_reanalysis_stops_where_the_rules_decision_is_not_the_datas():
    """`sequential.unmatched` compares the rule's decision, redone on a study's first pass, with the seeds its curves
    hold, both ways: a row the rule extends that the data do not, and a row the data extend that the rule does not
    name. Catches a one-way check (a rule changed since that extends fewer rows passes)."""
    from rlwb.experiments.mismatch_study import sequential

    curves = pd.DataFrame([{"label": lab, "arm": "none@engine", "seed": s}
                           for lab, n in (("clean", 12), ("ratio@1", 12), ("ratio@0.1", 8)) for s in range(n)])
    said = {"sequential/ratio@1/none@engine/seeds": 12.0, "sequential/clean/none@engine/seeds": 12.0,
            "sequential/ratio@0.1/none@engine/seeds": 8.0, "sequential/runs": 8.0}
    assert sequential.unmatched(said, curves, 8) == []
    assert sequential.unmatched({**said, "sequential/ratio@0.1/none@engine/seeds": 10.0}, curves, 8) == [
        "ratio@0.1 none@engine: the rule gives 10 seeds, the data hold 8"]
    fewer = {k: v for k, v in said.items() if "ratio@1" not in k}
    assert sequential.unmatched(fewer, curves, 8) == ["ratio@1 none@engine: the data hold 12 seeds, the rule gives "
                                                      "none beyond 8"]


def test_run_reanalyzing_with_a_changed_rule_reports_the_recorded_decision(tmp_path, monkeypatch):
    """`mismatch_cost.run(reanalyzing=)` end to end from the source's metrics.json: where this code's redone rule
    extends other rows than the data hold, the result's sequential metrics are the recorded ones (flagged), not a
    mix, and every other metric is this code's. A mock (`reanalyze`), because a rule changed since the study cannot
    be caused without changing the code under test."""
    import json
    from types import SimpleNamespace

    rows = [{"engine": "e", "kind": k, "label": lab, "dose": 0.0, "arm": "none@engine", "seed": s, "temperature": 0.7,
             "updates": 1, "epochs": 1, "stream": 0}
            for k, lab, n in (("clean", "clean", 12), ("ratio", "ratio@1", 12), ("ratio", "ratio@0.1", 8))
            for s in range(n)]
    took = {"sequential/ratio@1/none@engine/seeds": 12.0, "sequential/clean/none@engine/seeds": 12.0,
            "sequential/ratio@1/none@engine/power": 0.81, "sequential/rows": 1.0, "sequential/runs": 8.0,
            "sequential/family_tests": 97.0}
    (tmp_path / "metrics.json").write_text(json.dumps({**took, "gap": -0.2}))
    redone = {"sequential/ratio@1/none@engine/seeds": 10.0, "sequential/clean/none@engine/seeds": 10.0,
              "sequential/ratio@1/none@engine/power_two_look": 0.5, "sequential/rows": 1.0,
              "sequential/family_tests": 101.0, "gap": -0.1}
    monkeypatch.setattr(mc, "reanalyze", lambda d, p: SimpleNamespace(metrics=dict(redone),
                                                                      curves=pd.DataFrame(rows)))
    p = MismatchCostParams(num_seeds=8, max_seeds=24)
    out = mc.run(p, None, reanalyzing=tmp_path).metrics
    assert {k: v for k, v in out.items() if k.startswith("sequential/")} == {
        **took, "sequential/decision_recorded": 1.0, "sequential/rule_differs": 2.0}
    assert out["gap"] == -0.1 and out["resume/trained_jobs"] == 0.0
    assert out["resume/reused_jobs"] == 12 + 12 + 8  # one job per run
    (tmp_path / "metrics.json").write_text(json.dumps({"gap": -0.2}))  # no decision recorded: it stops
    with pytest.raises(ValueError, match="no sequential decision recorded"):
        mc.run(p, None, reanalyzing=tmp_path)


def test_a_reanalysis_reports_the_decision_the_study_took():
    """`sequential.reanalysis_decision`: this code's redone decision where it is the data's; the study's recorded one
    (flagged, with the rows this code's rule would change) where only that is; a stop where neither is. The case it
    exists for: a Holm family grown since the study sizes the redone rule at another level, so it extends fewer rows."""
    from rlwb.experiments.mismatch_study import sequential

    curves = pd.DataFrame([{"label": lab, "arm": "none@engine", "seed": s}
                           for lab, n in (("clean", 12), ("ratio@1", 12), ("ratio@0.1", 8)) for s in range(n)])
    took = {"sequential/ratio@1/none@engine/seeds": 12.0, "sequential/ratio@1/none@engine/power": 0.81,
            "sequential/clean/none@engine/seeds": 12.0, "sequential/ratio@0.1/none@engine/seeds": 8.0,
            "sequential/rows": 1.0, "sequential/runs": 8.0, "sequential/family_tests": 97.0}
    same, differs = sequential.reanalysis_decision({**took, "gap": -0.1}, took, curves, 8)
    assert same == took and differs == []  # this code's own, and only the sequential keys
    grown = {**took, "sequential/ratio@1/none@engine/seeds": 10.0, "sequential/clean/none@engine/seeds": 10.0,
             "sequential/family_tests": 101.0}
    kept, differs = sequential.reanalysis_decision(grown, took, curves, 8)
    assert kept == {**took, "sequential/decision_recorded": 1.0, "sequential/rule_differs": 2.0}
    assert differs == ["ratio@1 none@engine: the rule gives 10 seeds, the data hold 12",
                       "clean none@engine: the rule gives 10 seeds, the data hold 12"]
    from rlwb.experiments.wording.mismatch_cost import sequential_line

    assert "would give 2 row(s), clean twins counted, other seeds" in sequential_line(kept, 8, 24, 0.8)
    assert "other seeds" not in sequential_line(same, 8, 24, 0.8) and "`ratio@1` `none@engine` 8 → 12" in \
        sequential_line(same, 8, 24, 0.8)
    with pytest.raises(ValueError, match="neither is the decision the study recorded"):
        sequential.reanalysis_decision(grown, grown, curves, 8)
    # a row left at the first pass by the futility bound: recorded, kept by a reanalysis, and said
    call = sequential.SeedCall("ratio@0.1", "none@engine", "ratio", (sequential.STRADDLES,), 0.08, 0.2, 0.1, 8, 0.1,
                               False, 0.09, futile=True)
    rec = sequential.sequential_metrics([call], 97, [], SimpleNamespace(num_seeds=8, futility_power=0.3, seed=0))
    assert rec["sequential/futile_rows"] == 1.0 and rec["sequential/ratio@0.1/none@engine/futile"] == 1.0
    assert rec["sequential/ratio@0.1/none@engine/seeds"] == 8.0 and rec["sequential/rows"] == 0.0
    futile = {**took, "sequential/ratio@0.1/none@engine/futile": 1.0, "sequential/futile_rows": 1.0}
    assert sequential.reanalysis_decision(futile, took, curves, 8)[0] == futile
    assert ("Declared futility bound 30%: a row called only for its interval stays at 8 seeds where even 24 would "
            "give its test less power; left there: `ratio@0.1` `none@engine`.") in sequential_line(
        futile, 8, 24, 0.8, futility_power=0.3)
    assert "none was." in sequential_line(same, 8, 24, 0.8, futility_power=0.3)
    assert "futility" not in sequential_line(same, 8, 24, 0.8)
    with pytest.raises(ValueError, match="no sequential decision recorded"):
        sequential.reanalysis_decision(grown, {"gap": -0.1}, curves, 8)


def test_the_report_shows_the_benchmark_columns_a_reader_needs():
    """`benchmark_view` on a shipped study's table: the row, the dose, the level and what the fit noted, in
    `VIEW_COLUMNS`' order; not the per-row repeat of the error-control sentence nor the baseline's source (every
    column stays in the data); a table of an older run without some columns still shows."""
    from rlwb.experiments.mismatch_study import benchmarks

    b = pd.read_parquet(Path(__file__).resolve().parent.parent / "docs" / "runs" / "08_mismatch_cost"
                        / "20261129-045344-69f6476f" / "data" / "benchmarks.parquet")
    v = benchmarks.benchmark_view(b)
    assert list(v.columns) == benchmarks.VIEW_COLUMNS and len(v) == len(b)
    assert {"error_control", "baseline_se_source", "bmds_pick"} <= set(b.columns) - set(v.columns)
    assert len(v.columns) < len(b.columns) - 10
    old = benchmarks.benchmark_view(b.drop(columns=["fit_notes", "trend_p_holm"]))
    assert list(old.columns) == [c for c in benchmarks.VIEW_COLUMNS if c not in ("fit_notes", "trend_p_holm")]
