"""Notebook 08's benchmark doses: "keep k3 below X" per kind of dose, PPO regime, horizon and arm, by the field's
convention (`rlwb.core.measure.benchmark_dose`: models anchored at dose 0, test of fit, model average, a bootstrap
over seeds that re-estimates the clean gain, so the benchmark response's own uncertainty is inside every bound; the
initial policy's outcome, the baseline, is one measurement of its own, and each resample draws it too, with the
standard error of its sampling noise, measured from each scored problem's repeated draws, or for a run that did not
keep them the binomial bound: `baseline_se`).

What is on the dose axis: `k3_initial`, the k3 a dose gives the policy a run starts from (at the kind's
`DoseKind.first_full_step`: step 0, before any update, or for a lag the step it is first whole, per arm). The
k3 a run measures over all its steps (`k3_achieved`) is partly an outcome: a run the dose degrades drifts further
from its engine (bypass reaches 2.5x decoupled's k3 at the same perturbation), so a dose-response in achieved k3
would put the same dose at different x per arm. Achieved k3 stays a column.

What is fitted: each seed's tested outcome (`analysis.outcome_of`) at dose 0 (its clean run, same arm, temperature,
PPO regime and horizon) and at every dose of the row, the untrained policy's outcome as the baseline the clean gain
is measured from; the benchmark response is `bmr_fraction` of that gain (relative, BMDS's "relative deviation").
The dose scale is linear in k3 (as BMDS takes a dose); every row is refitted on the log scale too, and
`scale_agree` says whether the scale decides the answer (it does on 2-dose rows, which is why they are flagged).

Error control, stated per row (`error_control`): each BMDL and BMDU one-sided 95% for that row alone, no adjustment
across rows; the trend test across doses sits in the study's one Holm family (`comparisons.one_family`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from rlwb.core.measure import benchmark_dose as bd
from rlwb.core.measure import dose_response, stats
from rlwb.experiments.mismatch_study.analysis import (
    INITIAL,
    INITIAL_SE,
    initial_outcome,
    k3_initial,
    outcome_of,
    per_seed,
    with_defaults,
)
from rlwb.experiments.mismatch_study.design import (
    HELDOUT_PROBLEMS,
    HELDOUT_SEED,
    LONG,
    dosed_kinds,
    held_out,
    kind_label,
)
from rlwb.experiments.mismatch_study.grammar import Regime

N_BOOT = 2000  # bootstrap resamples of seeds per row (the coverage table in docs/benchmark_dose.md used 500-2000)
BOOT_SEED = 0  # the resamples' generator: a row's bounds are reproducible from its curves


@dataclass(frozen=True)
class RowStudy:
    """One benchmark row's data: the seeds' outcomes at dose 0 (`clean` [S]) and at each of the row's doses
    (`dosed` [S, J], doses in increasing `k3_initial`), paired by seed, and the untrained policy's outcome."""

    kind: str
    updates: int
    epochs: int
    long: bool
    arm: str
    name: str
    labels: list[str]
    doses: np.ndarray  # k3_initial of each label
    k3_achieved: np.ndarray
    clean: np.ndarray
    dosed: np.ndarray
    baseline: float
    seeds: list[int]
    outcome: str
    baseline_se: float = 0.0  # the baseline's standard error (`baseline_se`)
    baseline_se_source: str = ""  # MEASURED, BOUND, or "" (no noise of its own)


def _baseline(curves: pd.DataFrame, outcome: str, clean_labels) -> float:
    """The untrained policy's outcome: `initial_policy_reward` for the policy outcome (one value per study; NaN for
    a run archived before it was measured), else (the training reward) the clean runs' mean reward over their first
    steps (`grpo_grid.reward_gain`'s window)."""
    from rlwb.experiments.grpo_grid import reward_gain

    if outcome in INITIAL:  # archived before the initial policy's outcome was measured: none (NaN), said so
        return initial_outcome(curves, outcome)
    first, _ = reward_gain(curves[curves["label"].isin(clean_labels)])
    return float(first.mean())


def baseline_draws(p) -> int:
    """The completions behind the initial policy's sampled outcome: `policy_samples` per held-out problem (the
    problems `execution.initial_outcomes` scores, fewer than `HELDOUT_PROBLEMS` on a task too small to hold them)."""
    return len(held_out(p, HELDOUT_PROBLEMS, HELDOUT_SEED)[0]) * int(p.policy_samples)


MEASURED, BOUND = "measured", "binomial bound"  # where a row's `baseline_se` comes from (`baseline_se_source`)


def baseline_se(outcome: str, baseline: float, draws: int, measured: float = float("nan")) -> tuple[float, str]:
    """(standard error, its source) of the baseline as a measurement. For the sampled policy reward (a 0/1 reward,
    `draws` completions of fixed problems at the study's T): `measured`, the run's own estimate from each problem's
    repeated draws (`analysis.INITIAL_SE`, `stats.fixed_items_mean_se`) where the run kept it, else the binomial
    bound sqrt(b (1 - b) / draws), which no spread of the problems' own success rates can exceed
    (sum p_i (1 - p_i) <= n b (1 - b)). Neither holds what the fixed scoring seed shares: every trained policy is
    sampled with the same seed on the same problems, so part of their scoring noise is common to all seeds (no
    resample over seeds sees it) and correlated with the baseline's; its net effect on the bounds is not measured.
    (0, "") for greedy accuracy (deterministic on fixed problems) and for the training reward's baseline (the clean
    runs' own first steps, resampled with them)."""
    if outcome != "policy_reward" or not np.isfinite(baseline):
        return 0.0, ""
    if np.isfinite(measured):
        if measured < 0:
            raise ValueError(f"a measured standard error must be >= 0, got {measured}")
        return float(measured), MEASURED
    if draws <= 0:
        return 0.0, ""
    b = min(max(baseline, 0.0), 1.0)
    return float(np.sqrt(b * (1 - b) / draws)), BOUND


def _measured_se(curves: pd.DataFrame) -> float:
    """The initial policy's measured standard error (one value per study), NaN where the run did not keep it."""
    if INITIAL_SE not in curves or curves[INITIAL_SE].isna().all():
        return float("nan")
    values = curves[INITIAL_SE].dropna().unique()
    if len(values) != 1:
        raise ValueError(f"{INITIAL_SE}: one value per study expected (the initial policy is scored once), got "
                         f"{len(values)}: curves of several studies mixed?")
    return float(values[0])


def row_studies(curves: pd.DataFrame, table: pd.DataFrame, draws: int = 0) -> list[RowStudy]:
    """Per dosed kind x PPO regime x horizon x arm (rows that are not controls, `table` = `analysis.dose_table`):
    every seed with a clean run (dose 0) in the row's cell, with its outcome at each dose of the row where it was run
    there (NaN where not: a sequential study's second pass extends some doses and their clean twins, so each dose
    group has its own seeds, and the fit and its bootstrap take every seed a group has); `draws`: the completions
    behind the baseline (`baseline_draws`; 0: its noise left out)."""
    curves = with_defaults(curves)
    s = per_seed(curves)
    outcome = outcome_of(s)
    measured_se = _measured_se(curves)
    first = Regime(int(table["updates"].iloc[0]), int(table["epochs"].iloc[0])) if len(table) else Regime(1)
    sel = table[table["kind"].isin(dosed_kinds()) & (table["control"] == "")]
    rows = []
    for (kind, updates, epochs, long, arm), d in sel.groupby(
            ["kind", "updates", "epochs", table["label"].str.endswith(LONG), "arm"], sort=False):
        temp, horizon = d["temperature"].iloc[0], int(d["horizon"].iloc[0])
        regime = Regime(int(updates), int(epochs))
        d = d.sort_values("k3_initial", kind="stable")  # the table's own k3_initial per (label, arm)
        labels = list(d["label"])
        runs = s[(s["arm"] == arm) & (s["temperature"] == temp) & (s["updates"] == updates)
                 & (s["epochs"] == epochs) & (s["horizon"] == horizon)]
        clean_runs = runs[runs["kind"] == "clean"]
        twice = sorted(set(clean_runs.loc[clean_runs["seed"].duplicated(), "seed"].astype(int)))
        if twice:  # a seed's clean twin is one run: two would enter its dose-0 group twice
            raise ValueError(f"row {kind} ({arm}): seeds {twice} have more than one clean run at temperature {temp}, "
                             f"updates {updates}, epochs {epochs}, horizon {horizon} (labels "
                             f"{sorted(set(clean_runs['label']))}); a study gives each seed one clean run per cell")
        wide = runs[runs["label"].isin(labels)].pivot(index="seed", columns="label", values=outcome)
        wide = clean_runs.set_index("seed")[[outcome]].rename(columns={outcome: "__clean__"}).join(
            wide.reindex(columns=labels), how="left").dropna(subset=["__clean__"]).sort_index()
        clean_labels = sorted(set(clean_runs["label"]))
        # the dose each group is placed at is its k3_initial over the seeds whose outcomes are fitted (k3 varies by
        # seed, by up to 2x for perturbed weights): the table's is over every seed run at the dose, and those
        # without a clean twin are not fitted
        mine = curves[(curves["arm"] == arm) & curves["label"].isin(labels) & curves["seed"].isin(wide.index)]
        x0 = k3_initial(mine) if len(mine) else pd.Series(dtype=float)
        doses = np.array([x0.get((lab, arm), k) for lab, k in zip(labels, d["k3_initial"])], float)
        order = np.argsort(doses, kind="stable")
        labels = [labels[i] for i in order]
        b = _baseline(curves, outcome, clean_labels)
        se, source = baseline_se(outcome, b, draws, measured_se)
        rows.append(RowStudy(
            kind=kind, updates=int(updates), epochs=int(epochs), long=bool(long), arm=arm,
            name=kind_label(kind, regime, first) + (LONG if long else ""), labels=labels,
            doses=doses[order], k3_achieved=d["k3_achieved"].to_numpy(float)[order],
            clean=wide["__clean__"].to_numpy(float), dosed=wide[labels].to_numpy(float),
            baseline=b, seeds=list(map(int, wide.index)), outcome=outcome, baseline_se=se, baseline_se_source=source))
    return rows


COLUMNS = ["kind", "updates", "epochs", "arm", "name", "doses", "seeds", "dose_seeds", "outcome", "baseline",
           "baseline_se", "baseline_se_source",
           "clean_gain", "bmr", "k3_min", "k3_max", "k3_achieved_min", "k3_achieved_max", "trend_slope",
           "trend_ci_low", "trend_ci_high", "trend_p", "bmd", "bmdl", "bmdu", "status", "models_passing",
           "bmds_pick", "bmd_log", "bmdl_log", "status_log", "scale_agree", "keep_below", "error_control",
           "fit_notes"]


# what the report shows of the table (every column stays in the run's data/benchmarks.parquet): the row, its doses
# and seeds, the trend, the benchmark dose on both scales, the level to quote and what the fit noted. Left out:
# error control (one sentence, the same on every row: the report's text says it), the baseline's source and the
# achieved k3 range (in the dose table), BMDS's pick (docs/benchmark_dose.md compares it).
VIEW_COLUMNS = ["kind", "updates", "epochs", "arm", "doses", "seeds", "dose_seeds", "k3_min", "k3_max", "clean_gain",
                "bmr", "trend_slope", "trend_p_holm", "bmd", "bmdl", "bmdu", "status", "models_passing", "bmdl_log",
                "status_log", "keep_below", "fit_notes"]


def benchmark_view(benchmarks: pd.DataFrame) -> pd.DataFrame:
    """The benchmark table as a reader gets it (`VIEW_COLUMNS`, those the table has: tables of older runs lack
    some)."""
    return benchmarks[[c for c in VIEW_COLUMNS if c in benchmarks.columns]]


def benchmark_table(table: pd.DataFrame, curves: pd.DataFrame, bmr_fraction: float, draws: int = 0
                    ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(benchmarks, fits). `benchmarks`: one row per `row_studies` row: the trend of the outcome's paired gap
    across doses (`dose_response.dose_trend`, per-seed slope per decade of k3_initial, on the seeds every dose has;
    `trend_p_holm` is Holm over these trends alone here, `analyze` puts them in the study's one family) and the
    benchmark dose in k3_initial
    (`benchmark_dose.fit_bmd`, BMR `bmr_fraction` of the fitted clean gain; `bmr` is that cost in outcome units;
    the baseline's noise from `draws`, `baseline_draws`, in every resample),
    with its status, the models that pass, and the same fit on the log dose scale. `fits`: what the figure draws,
    one long table (`part`): each dose group's mean outcome with its 95% t interval (`group`, dose 0 included), the
    model-average curve with its pointwise 95% bootstrap band over the tested doses only (`fit`), and the BMR level
    with the BMD, BMDL and BMDU (`mark`)."""
    rows, fits = [], []
    empty = {"clean_gain": np.nan, "bmr": np.nan, "bmd": np.nan, "bmdl": np.nan, "bmdu": np.nan, "models_passing": "",
             "bmds_pick": "", "bmd_log": np.nan, "bmdl_log": np.nan, "status_log": "", "scale_agree": False,
             "keep_below": np.nan, "error_control": "", "fit_notes": ""}
    for r in row_studies(curves, table, draws):
        base = {"kind": r.kind, "updates": r.updates, "epochs": r.epochs, "arm": r.arm, "name": r.name}
        have = np.isfinite(r.dosed)
        row = {**base, "doses": len(r.labels), "seeds": len(r.seeds),
               "dose_seeds": " ".join(str(int(k)) for k in have.sum(0)), "outcome": r.outcome, "baseline": r.baseline,
               "baseline_se": r.baseline_se, "baseline_se_source": r.baseline_se_source,
               "k3_min": float(r.doses.min()), "k3_max": float(r.doses.max()),
               "k3_achieved_min": float(r.k3_achieved.min()), "k3_achieved_max": float(r.k3_achieved.max())}
        # the trend's per-seed slope needs a seed at every dose: the seeds every dose has
        gaps = (r.dosed - r.clean[:, None])[have.all(1)]
        try:
            tr = dose_response.dose_trend(r.doses, gaps)
            row.update(trend_slope=tr.slope, trend_ci_low=tr.ci_low, trend_ci_high=tr.ci_high, trend_p=tr.p)
        except ValueError:  # a k3 of 0 or two doses alike: no trend in log dose
            row.update(trend_slope=np.nan, trend_ci_low=np.nan, trend_ci_high=np.nan, trend_p=np.nan)
        y = np.column_stack([r.clean, r.dosed])
        groups = [(x, float(v[np.isfinite(v)].mean()), *stats.seed_ci(v[np.isfinite(v)]))
                  for x, v in zip([0.0, *r.doses], y.T)] if len(y) else []
        f = g = None
        if not np.isfinite(r.baseline):
            rows.append({**row, **empty,
                         "status": f"{bd.NO_BENCHMARK} (the initial policy's {r.outcome} was not measured)"})
        else:
            try:
                sc = bd.compare_dose_scales(r.doses, r.clean, r.dosed, baseline=r.baseline,
                                            baseline_se=r.baseline_se, bmr=bmr_fraction, n_boot=N_BOOT,
                                            seed=BOOT_SEED)
            except bd.BMDInputError as e:  # fewer than 3 seeds, a dose of 0: said in the status
                rows.append({**row, **empty, "status": f"{bd.NO_BENCHMARK} ({e})"})
            else:
                f, g = sc.linear, sc.log
                # the BMR is relative to the model average's fitted clean level f(0), as the fit defines the BMD
                gain = float(f.curve["mean"][0]) if f.curve is not None else f.clean_gain
                row.update(clean_gain=gain, bmr=bmr_fraction * gain, bmd=f.bmd, bmdl=f.bmdl, bmdu=f.bmdu,
                           status=f.status, models_passing=",".join(m.model for m in f.models if m.passes),
                           bmds_pick=f.bmds_pick or "", bmd_log=g.bmd, bmdl_log=g.bmdl, status_log=g.status,
                           scale_agree=sc.agree,
                           keep_below=keep_below(f, g, sc.agree, len(r.labels), float(r.doses.min())),
                           error_control=f.error_control, fit_notes="; ".join(f.notes))
                rows.append(row)
        # the figure: the dose groups whatever the fit says, as the share of the clean gain kept (the fitted f(0)
        # where a model fits, so the BMR line is where the curve loses the BMR; else the clean runs' mean)
        gain = row["clean_gain"] if np.isfinite(row.get("clean_gain", np.nan)) else float(r.clean.mean() - r.baseline)
        base = {**base, "baseline": r.baseline, "gain": gain}
        fits += [{**base, "part": "group", "dose": x, "y": m, "low": a, "high": b} for x, m, a, b in groups]
        if f is not None and f.curve is not None:
            c = f.curve
            fits += [{**base, "part": "fit", "dose": x, "y": m + r.baseline, "low": a + r.baseline,
                      "high": b + r.baseline} for x, m, a, b in zip(c["dose"], c["mean"], c["low"], c["high"])]
        if f is not None and np.isfinite(gain) and gain > 0:
            fits.append({**base, "part": "mark", "dose": f.bmd, "y": r.baseline + (1 - bmr_fraction) * gain,
                         "low": f.bmdl, "high": f.bmdu, "status": f.status})
    fits += engine_points(table, fits)
    b = pd.DataFrame(rows, columns=COLUMNS)
    b["trend_p_holm"] = stats.holm(b["trend_p"]) if len(b) else []
    fit_table = pd.DataFrame(fits, columns=["kind", "updates", "epochs", "arm", "name", "part", "dose", "y", "low",
                                            "high", "baseline", "gain", "status", "label", "control"])
    return b, fit_table


MIN_DOSES = 4  # doses (beside dose 0) a row needs for a level to quote


def keep_below(linear: bd.BMDResult, log: bd.BMDResult, agree: bool, doses: int,
               k3_min: float = 0.0) -> float:
    """The level to quote as "keep k3 below": where the row has `MIN_DOSES` doses or more, is bounded on the linear
    dose scale with its BMD inside the tested doses (not below the smallest, `k3_min`: the fit calls a BMD up to 10x
    below it bounded, as BMDS does, but there the bound rests on a stretch of curve no dose tested, and issue #58 asks
    for the BMD inside them) and the log scale agrees (each scale's BMD inside the other's BMDL-BMDU), the lower of the
    two scales' BMDLs (the scale is a modelling choice, so the bound that holds under either); NaN otherwise. Why 4
    doses: with 2 (3 dose groups) every curved model is saturated and only the straight line can pass, so the
    lowest-of-models bound guards nothing (simulated at doses 0.17 and 1, 8 seeds: the linear BMDL covered a steep
    concave truth's BMD in 0 of ~200 bounded studies); the BMDL's coverage is measured at 4 doses
    (docs/benchmark_dose.md)."""
    if doses < MIN_DOSES or linear.status != bd.BOUNDED or not agree or linear.bmd < k3_min:
        return float("nan")
    return float(min(linear.bmdl, log.bmdl)) if log.status == bd.BOUNDED else float(linear.bmdl)


def engine_points(table: pd.DataFrame, fits: list[dict]) -> list[dict]:
    """The real engines placed on the curves (`part` "engine"): each engine row of the first PPO regime at the
    study's horizon, on the panel of its kind (`analysis.panel_of`) beside the same arm's fit, at the k3 it gives
    the initial policy, its outcome drawn as the arm's clean runs' mean plus its paired gap to its own clean twin
    (same temperature), with the gap's 95% interval: an engine at another temperature is compared with its own
    clean run, not with the curve's."""
    level = {(f["kind"], f["arm"]): (f["baseline"], f["gain"]) for f in fits
             if f["part"] == "group" and f["dose"] == 0.0 and "+" not in f["name"]}
    if table.empty:
        return []
    first, first_epochs = int(table["updates"].iloc[0]), int(table["epochs"].iloc[0])
    out = []
    for r in table[(table["kind"] == "engine") & (table["updates"] == first) & (table["epochs"] == first_epochs)
                   & ~table["label"].str.endswith(LONG)].itertuples():
        if (r.panel, r.arm) not in level:
            continue
        baseline, gain = level[(r.panel, r.arm)]
        clean = baseline + gain
        out.append({"kind": r.panel, "updates": first, "epochs": first_epochs, "arm": r.arm, "name": r.panel,
                    "part": "engine",
                    "dose": float(r.k3_initial), "y": clean + r.gap, "low": clean + r.gap_ci_low,
                    "high": clean + r.gap_ci_high, "baseline": baseline, "gain": gain, "label": r.label,
                    "control": r.control})
    return out


def benchmark_metrics(bench: pd.DataFrame) -> dict[str, float]:
    """`<kind>[+ppo<u>][+long]/<arm>/{trend_slope, trend_p_holm, bmr, bmd_k3, bmdl_k3, bmdu_k3, bmdl_bounded,
    keep_below_k3, scale_agree, bmd_log_k3, bmdl_log_k3, baseline_se, baseline_se_measured, seeds_clean,
    seeds_dose_min, seeds_dose_max}` per benchmark row
    (`bmdl_bounded`: 1 where the status is "bounded"; `keep_below_k3`: the level to quote, NaN where there is none,
    `keep_below`; `*_log_k3`: the same fit on the log dose scale, what `scale_agree` compares; `baseline_se_measured`:
    1 where the baseline's noise is the run's own measurement, 0 for the binomial bound; `seeds_*`: the seeds the
    fit has at dose 0 and the fewest and most at a dose)."""
    out = {}
    for r in bench.itertuples():
        k = f"{r.name}/{r.arm}"
        out.update({f"{k}/trend_slope": float(r.trend_slope), f"{k}/trend_p_holm": float(r.trend_p_holm),
                    f"{k}/bmr": float(r.bmr), f"{k}/bmd_k3": float(r.bmd), f"{k}/bmdl_k3": float(r.bmdl),
                    f"{k}/bmdu_k3": float(r.bmdu), f"{k}/bmdl_bounded": float(r.status == bd.BOUNDED),
                    f"{k}/keep_below_k3": float(r.keep_below),
                    f"{k}/scale_agree": float(bool(r.scale_agree)), f"{k}/bmd_log_k3": float(r.bmd_log),
                    f"{k}/bmdl_log_k3": float(r.bmdl_log), f"{k}/baseline_se": float(r.baseline_se),
                    f"{k}/baseline_se_measured": float(r.baseline_se_source == MEASURED),
                    f"{k}/seeds_clean": float(r.seeds)})
        if isinstance(r.dose_seeds, str) and r.dose_seeds:
            ns = [int(v) for v in r.dose_seeds.split()]
            out.update({f"{k}/seeds_dose_min": float(min(ns)), f"{k}/seeds_dose_max": float(max(ns))})
    return out

