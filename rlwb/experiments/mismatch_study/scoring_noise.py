"""What a study's tested outcome owes to its scoring, measured on the study's own runs.

Every trained policy is scored on the same held-out problems with `policy_samples` draws each, draw (i, j) sampled
with the same seed in every run (`execution.policy_rewards`), and each run keeps draw index j's mean over the
problems (`execution.outcome_columns`: `policy_reward_sample<j>`, S of them; the outcome is their mean). So a study
scoring k < S draws a problem is the mean of k of those columns, recomputed from the same trained policies:

- `gaps_by_samples`: every dose row's gaps to its clean twins recomputed from k of the S columns, k = 1, 2, 4, ...,
  S, over the disjoint groups of k columns, and their within-row variance pooled over rows and groups: the gap's
  variance a study scoring k draws would have had with these policies. Model-free: no variance model is fitted.
- `common_noise`: the shared seeds' common noise. The clean runs of one arm by draw index as a two-way layout with
  random effects: var(a draw index's effect, common to every run) and var(the rest, run by run). Where a draw's
  seed moves every policy's outcome alike it cancels from a gap to a twin scored on the same seeds; what does not
  cancel is `common_gap_noise`: the same layout on each dose row's gaps, whose common part is shared by the row's
  seeds, so no interval over seeds holds it.
- `dispersion`: whether a run's draws vary as the outcome's standard error says (`policy_reward_se`,
  `stats.fixed_items_mean_se`: draws independent, problems fixed): a run's draw-index means vary by S x se^2 if so.
  The ratio of the two, over the study's distinct policies, is the factor by which that error model misstates the
  variance (it also prices the benchmark response's `baseline_se`).
- `seed_set_check`: the same question asked directly, where a study scored the initial policy on independent seed
  sets (`se_check_sets`): the spread of its scores over the sets against the standard error each reports.
- `value_of_samples`: information per second of a run at k draws against the study's own reference k (the studies
  of record scored 2): (1 / gap variance) / (the run's wall time), the run's wall time at k being its own minus
  the share of its scoring k would not have drawn (`t_policy` x (1 - k / S); scoring time taken as linear in the
  draws, which overstates the saving below S: larger batches sample faster per draw).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats as sps

from rlwb.experiments.mismatch_study.analysis import (
    INITIAL,
    INITIAL_SE,
    KEYS,
    SAMPLE_COLUMN,
    SET_COLUMN,
    TWIN_KEYS,
    per_seed,
    seed_gaps,
    with_defaults,
)

ROW = ["label", "arm", "temperature", "updates", "epochs", "horizon"]
SE_COLUMN = "policy_reward_se"  # the outcome's standard error over its draws (`execution.outcome_columns`)
# rows that are not doses: their gaps say nothing about what scoring does to a dose's (a placebo is a clean run on
# other seeds, whose gap to its twin is mostly scoring noise; a rerun is one run)
NOT_DOSES = ("clean", "placebo", "rerun")


def dose_gaps(r: pd.DataFrame) -> pd.DataFrame:
    """`analysis.seed_gaps` of the dose rows (kinds not in NOT_DOSES, engine points included) of a `runs` table."""
    g = seed_gaps(r)
    return g[~g["kind"].isin(NOT_DOSES)]


def first_clean(r: pd.DataFrame) -> pd.DataFrame:
    """The clean runs of the first arm at the first temperature, horizon and regime: one run per seed (the clean
    runs of the other arms are the same policies, scored alike, and would count as independent runs)."""
    c = r[r["kind"] == "clean"]
    if c.empty:
        return c
    first = c.sort_values(ROW).iloc[0]
    return c[(c[ROW] == first[ROW]).all(axis=1)]


def sample_columns(curves: pd.DataFrame) -> list[str]:
    """The draw-index columns of a run's outcome (`policy_reward_sample0`, ...), in index order; empty for runs
    scored with one draw a problem or archived before they were kept."""
    cols = [c for c in curves.columns if c.startswith(SAMPLE_COLUMN) and c[len(SAMPLE_COLUMN):].isdigit()]
    return sorted(cols, key=lambda c: int(c[len(SAMPLE_COLUMN):]))


def runs(curves: pd.DataFrame) -> pd.DataFrame:
    """One row per run: `per_seed`'s outcomes with the draw-index columns, the initial policy's (`initial_<column>`,
    where kept) and the run's timings (`t_job`, its wall time in its lane; `t_policy`, its scoring's): the table
    every function below reads, made once per analysis (`scoring_analysis`)."""
    curves = with_defaults(curves)
    cols = sample_columns(curves)
    if len(cols) < 2:
        raise ValueError("these curves keep no draw-index columns (policy_reward_sample<j>): runs scored with one "
                         "draw a problem, or archived before the columns were kept, cannot be split by draw")
    extra = [c for c in ("t_job", "t_policy", SE_COLUMN, f"initial_{SE_COLUMN}", *(f"initial_{c}" for c in cols))
             if c in curves]
    if any(c.startswith(SET_COLUMN) for c in curves.columns):  # `seed_set_check`: the study's set and the others
        extra += [c for c in curves.columns if c.startswith(SET_COLUMN) or c == INITIAL["policy_reward"]]
    first = curves.groupby(KEYS, sort=False, dropna=False)[cols + extra].first().reset_index()
    return per_seed(curves).merge(first, on=KEYS, how="left", validate="one_to_one")


def groups(s: int, k: int) -> list[list[int]]:
    """The disjoint groups of k draw indices among s (the remainder, fewer than k, left out)."""
    return [list(range(g * k, (g + 1) * k)) for g in range(s // k)]


def sizes(s: int) -> list[int]:
    """k = 1, 2, 4, ... up to s, and s itself."""
    return sorted({*(2 ** i for i in range(int(np.log2(s)) + 1)), s})


def pooled_var(values: pd.Series, by: pd.DataFrame) -> tuple[float, int]:
    """The within-group variance pooled over groups (ddof 1 each) and its degrees of freedom."""
    g = values.groupby([by[c] for c in by.columns], sort=False, dropna=False)
    n, v = g.count(), g.var(ddof=1)
    ok = n >= 2
    df = int((n[ok] - 1).sum())
    return (float(((n[ok] - 1) * v[ok]).sum() / df) if df else float("nan")), df


def gaps_by_samples(r: pd.DataFrame) -> pd.DataFrame:
    """Per k (draws a problem): the dose rows' gap variance pooled within rows (`gap_var`; `seed_df`, the rows'
    degrees of freedom over seeds, the same at every k: the groups of k columns re-score the same policies, so they
    sharpen the estimate of the scoring's share, not of the policies'), the clean runs' between-seed variance
    (`clean_var`, `first_clean`), and the mean over runs of their scoring time at k (`t_policy_k`) and wall time at
    k (`t_job_k`), from a `runs` table. The dose rows are `dose_gaps`' (no placebo, no rerun). Empty where no dose
    row has two seeds."""
    cols = sample_columns(r)
    s = len(cols)
    g = dose_gaps(r)
    seed_df = pooled_var(g["gap"], g[ROW])[1] if len(first_clean(r)) else 0
    if not seed_df:
        return pd.DataFrame()
    out = []
    for k in sizes(s):
        gv, cv = [], []
        for idx in groups(s, k):
            rk = r.assign(policy_reward=r[[cols[i] for i in idx]].mean(axis=1))
            g = dose_gaps(rk)
            gv.append(pooled_var(g["gap"], g[ROW])[0])
            c = first_clean(rk)
            cv.append(pooled_var(c["policy_reward"], c[ROW])[0])
        row = {"k": k, "groups": s // k, "seed_df": seed_df, "gap_var": float(np.mean(gv)),
               "clean_var": float(np.nanmean(cv)) if np.isfinite(cv).any() else float("nan")}
        if {"t_job", "t_policy"} <= set(r):
            row["t_policy_k"] = float(r["t_policy"].mean() * k / s)
            row["t_job_k"] = float((r["t_job"] - r["t_policy"] * (1 - k / s)).mean())
        out.append(row)
    t = pd.DataFrame(out)
    t["gap_sd"] = np.sqrt(t["gap_var"])
    return t


def value_of_samples(table: pd.DataFrame, reference: int = 2) -> pd.DataFrame:
    """`gaps_by_samples`' table with each k's information per second of a run against k = `reference`:
    (gap_var at reference / gap_var at k) x (t_job at reference / t_job at k); > 1: k buys more per second. A
    study's seeds for the same power scale with gap_var, its cost with seeds x t_job."""
    t = table.set_index("k")
    if reference not in t.index:
        raise ValueError(f"reference k={reference} not among the sizes {list(t.index)}")
    out = table.copy()
    out["variance_ratio"] = t.loc[reference, "gap_var"] / out["gap_var"]
    if "t_job_k" in out:
        out["time_ratio"] = t.loc[reference, "t_job_k"] / out["t_job_k"]
        out["value_ratio"] = out["variance_ratio"] * out["time_ratio"]
    return out


def two_way(y: np.ndarray) -> dict[str, float]:
    """Variance components of a [units, draw indices] layout without replication, random effects: `var_common`
    (a draw index's effect shared by every unit, (MS_index - MS_residual) / units, floored at 0) with its F test
    (`p_common`), `var_unit` (a unit's own effect, (MS_unit - MS_residual) / draws, floored at 0),
    `var_residual` (MS_residual) and `ms_index` (MS_index, for pooling layouts)."""
    y = np.asarray(y, dtype=float)
    n, s = y.shape
    if n < 2 or s < 2:
        raise ValueError(f"a two-way layout needs two units and two draw indices or more, got {n} x {s}")
    m, rows, cols = y.mean(), y.mean(axis=1), y.mean(axis=0)
    ms_unit = s * ((rows - m) ** 2).sum() / (n - 1)
    ms_idx = n * ((cols - m) ** 2).sum() / (s - 1)
    df_res = (n - 1) * (s - 1)
    ms_res = ((y - rows[:, None] - cols[None, :] + m) ** 2).sum() / df_res
    return {"units": n, "draws": s, "var_common": max(0.0, (ms_idx - ms_res) / n),
            "p_common": float(sps.f.sf(ms_idx / ms_res, s - 1, df_res)) if ms_res > 0 else float("nan"),
            "var_unit": max(0.0, (ms_unit - ms_res) / s), "var_residual": float(ms_res), "ms_index": float(ms_idx)}


def common_noise(r: pd.DataFrame) -> dict[str, float]:
    """The draw indices' common effect on the clean runs' outcomes, from the clean runs of the first arm at the
    first temperature, horizon and regime (one run per seed: the clean runs of the other arms are the same
    policies, scored alike, and would count as independent runs), runs x draw index (`two_way`): `var_run` (the
    policies' spread), `sd_common_outcome` (what every run's S-draw outcome shares, sqrt(var_common / S)) and
    `sd_scoring_outcome` (a run's own scoring noise in it, sqrt(var_residual / S)); from a `runs` table."""
    cols = sample_columns(r)
    c = first_clean(r)
    w = two_way(c[cols].to_numpy(dtype=float))
    return {"runs": w["units"], "draws": w["draws"], "arm": c["arm"].iloc[0], "var_common": w["var_common"],
            "p_common": w["p_common"], "var_run": w["var_unit"], "var_residual": w["var_residual"],
            "sd_common_outcome": float(np.sqrt(w["var_common"] / w["draws"])),
            "sd_scoring_outcome": float(np.sqrt(w["var_residual"] / w["draws"]))}


def common_gap_noise(r: pd.DataFrame) -> pd.DataFrame:
    """The shared seeds' noise in each dose row's mean gap, which a t interval over seeds cannot see (it is common
    to every seed of the row): the row's gaps by draw index (seed x draw index: the dosed run's column j minus its
    clean twin's) as a two-way layout (`two_way`). A draw index's effect on the gap, shared by the row's seeds
    (`var_common`: where the dose changes how a draw's seed lands, it does not cancel in the gap), enters the mean
    gap over k draws as sqrt(var_common / k) (`sd_common_k<k>`, at the study's own S and at 2); beside it the row's
    standard error over seeds at 2 draws (`se_seeds_k2`: the gaps' sd over seeds from each disjoint pair of draws,
    pooled over the pairs, over sqrt(seeds)), what its bounds hold. One row per dose row (`dose_gaps`' rows), and
    `pooled`: the rows' unfloored estimates averaged, weighted by seeds, with an F test on the pooled mean squares
    whose degrees of freedom are approximate (every row's gaps subtract the same clean twins, so the rows' draw
    effects are correlated: the pooled test is anticonservative). From a `runs` table; empty where no dose row has
    two seeds."""
    cols = sample_columns(r)
    s = len(cols)
    d = r[~r["kind"].isin(NOT_DOSES)].merge(r.loc[r["kind"] == "clean", TWIN_KEYS + cols], on=TWIN_KEYS,
                                             how="inner", suffixes=("", "_clean"))
    out, ws = [], []
    for key, g in d.groupby(ROW, sort=False):
        if len(g) < 2:
            continue
        y = g[cols].to_numpy(dtype=float) - g[[c + "_clean" for c in cols]].to_numpy(dtype=float)
        w = two_way(y)
        se2 = np.mean([y[:, idx].mean(axis=1).var(ddof=1) for idx in groups(s, 2)]) / len(y)
        out.append({**dict(zip(ROW, key)), "seeds": w["units"], "draws": s, "var_common": w["var_common"],
                    "p_common": w["p_common"], "se_seeds_k2": float(np.sqrt(se2))})
        ws.append(w)
    if not ws:
        return pd.DataFrame()
    t = pd.DataFrame(out)
    n = np.array([w["units"] for w in ws], dtype=float)
    raw = np.array([(w["ms_index"] - w["var_residual"]) / w["units"] for w in ws])
    df_res = sum((w["units"] - 1) * (s - 1) for w in ws)
    ms_idx = np.mean([w["ms_index"] for w in ws])
    ms_res = sum(w["var_residual"] * (w["units"] - 1) * (s - 1) for w in ws) / df_res
    pooled = {"label": "pooled", "arm": "every row", "seeds": float(n.mean()), "draws": s,
              "var_common": max(0.0, float((n * raw).sum() / n.sum())),
              "p_common": float(sps.f.sf(ms_idx / ms_res, len(ws) * (s - 1), df_res)),
              "se_seeds_k2": float(np.sqrt(np.mean(t["se_seeds_k2"] ** 2)))}
    t = pd.concat([t, pd.DataFrame([pooled])], ignore_index=True)
    for k in sorted({2, s}):
        t[f"sd_common_k{k}"] = np.sqrt(t["var_common"] / k)
    return t


def gain_sd(r: pd.DataFrame, k: int = 2) -> float:
    """The clean runs' mean gain over the initial policy (the benchmark response's base), recomputed from each
    disjoint group of k draw indices (the initial policy's own columns, `initial_policy_reward_sample<j>`, with the
    clean runs' of the first arm, as `common_noise` picks them): its sd over the groups. What a study scoring k
    draws would see its gain move by from the draws' seeds alone, the policies held (the clean runs and the initial
    policy share the seeds, so this is not the initial policy's noise plus the clean mean's). From a `runs` table;
    NaN without the initial's columns or with fewer than two groups."""
    cols = sample_columns(r)
    init = [f"initial_{c}" for c in cols]
    if not set(init) <= set(r) or len(cols) // k < 2:
        return float("nan")
    c = first_clean(r)
    gain = c[cols].to_numpy(dtype=float).mean(axis=0) - c[init].iloc[0].to_numpy(dtype=float)
    return float(np.std([gain[g].mean() for g in groups(len(cols), k)], ddof=1))


def variance_ratio_test(ratio: float, df: int) -> dict[str, float]:
    """A variance ratio whose df x ratio is chi2(df) when the true ratio is 1: the ratio, its 95% interval and the
    two-sided p of 1 (`dispersion`, `seed_set_check`)."""
    chi = df * ratio
    return {"ratio": ratio, "low": chi / float(sps.chi2.ppf(0.975, df)), "high": chi / float(sps.chi2.ppf(0.025, df)),
            "p": float(min(1.0, 2 * min(sps.chi2.sf(chi, df), sps.chi2.cdf(chi, df))))}


def dispersion(r: pd.DataFrame) -> dict[str, float]:
    """Do the draws vary as the outcome's standard error says? Per distinct policy of a `runs` table (a rerun, or a
    clean run another arm shares, has the same draw columns and counts once): the variance of its S draw-index means
    over S x se^2, which is 1 in expectation when the draws are independent given the problems
    (`stats.fixed_items_mean_se`'s model), (S - 1) x ratio then close to chi2(S - 1). Their mean over the policies,
    with a 95% interval and a two-sided test of 1 from that chi2(S - 1): draw (i, j) has the same seed in every run,
    so what one draw index does it does to every policy (`common_noise`) and the policies are not independent
    replicates; as one policy, the mean is exactly that chi2, and the less the policies move together the narrower
    its true spread, so the interval is conservative whatever their dependence (an interval over n independent
    policies would claim n(S - 1) degrees of freedom; a jackknife over the draw index covers 85-90%:
    tests/test_scoring_noise.py). The initial policy's ratio (scored once, on the same seeds), its one-sided p,
    that p Bonferroni-adjusted over the policies it is one of (valid under their dependence), and its rank among
    them. {} without the columns."""
    cols = sample_columns(r)
    if len(cols) < 3 or SE_COLUMN not in r:
        return {}
    u = r.drop_duplicates(subset=cols)
    u = u[u[SE_COLUMN] > 0]
    if len(u) < 2:
        return {}
    s = len(cols)
    x, scale = u[cols].to_numpy(dtype=float), s * u[SE_COLUMN].to_numpy(dtype=float) ** 2
    per_policy = x.var(axis=1, ddof=1) / scale
    out = {"runs": float(len(u)), **variance_ratio_test(float(per_policy.mean()), s - 1)}
    init, se0 = [f"initial_{c}" for c in cols], f"initial_{SE_COLUMN}"
    if set(init) <= set(r) and se0 in r and r[se0].notna().any() and r[se0].iloc[0] > 0:
        ri = float(r[init].iloc[0].to_numpy(dtype=float).var(ddof=1) / (s * float(r[se0].iloc[0]) ** 2))
        p = float(sps.chi2.sf((s - 1) * ri, s - 1))
        out.update({"initial_ratio": ri, "initial_p": p, "initial_p_adjusted": min(1.0, p * (len(u) + 1)),
                    "initial_rank": float(1 + (per_policy > ri).sum())})
    return out


def seed_set_check(r: pd.DataFrame) -> dict[str, float]:
    """Does the outcome's standard error hold, asked of one policy on independent seeds? The initial policy scored on
    the study's seed set and on K more (`execution.seed_set_scores`, the same problems): its K + 1 scores vary by
    se^2 if `stats.fixed_items_mean_se` is right (draws independent given the problems), so var(scores) / mean(se^2)
    is 1 in expectation and K x ratio close to chi2(K). The ratio with a 95% interval and a two-sided test of 1 from
    that chi2, and the scores' mean and sd. Unlike `dispersion` nothing is shared between the sets, so the interval
    is not conservative: it is chi2(K)'s but for se^2 being estimated (pooled over the sets: thousands of problem
    variances at 2 draws, and the scores near normal, the interval covers within about 0.1 point of 95% for
    100-128 problems at 2 or 16 draws, by simulation). It checks the initial policy's scoring, not a trained one's.
    {} where the study scored no seed set."""
    ks = sorted(int(c[len(SET_COLUMN):]) for c in r.columns
                if c.startswith(SET_COLUMN) and c[len(SET_COLUMN):].isdigit())
    main, main_se = INITIAL["policy_reward"], INITIAL_SE
    if not ks or not {main, main_se, *(f"{SET_COLUMN}{k}_se" for k in ks)} <= set(r.columns):
        return {}
    first = r.iloc[0]
    y = np.array([first[main], *(first[f"{SET_COLUMN}{k}"] for k in ks)], dtype=float)
    se = np.array([first[main_se], *(first[f"{SET_COLUMN}{k}_se"] for k in ks)], dtype=float)
    if not (np.isfinite(y).all() and np.isfinite(se).all() and (se > 0).all()):
        return {}
    return {"sets": float(len(y)), **variance_ratio_test(float(y.var(ddof=1) / np.mean(se**2)), len(y) - 1),
            "mean": float(y.mean()), "sd": float(y.std(ddof=1)), "se": float(np.sqrt(np.mean(se**2)))}


def scoring_analysis(curves: pd.DataFrame, reference: int = 2) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """The study's scoring tables and metrics, for runs that kept their draw-index columns (empty tables and no
    metrics else): per k draws a problem (`gaps_by_samples`, with `value_of_samples` against k = `reference` where
    the study drew that many), per dose row the draw noise its mean gap keeps (`common_gap_noise`), and
    `scoring_metrics`. Empty too where some runs lack the columns (a study resumed from runs trained before they
    were kept): a split of some runs only would compare other rows."""
    empty = pd.DataFrame(), pd.DataFrame(), {}
    cols = sample_columns(curves)
    if len(cols) < 2 or curves[cols].isna().any().any():
        return empty
    r = runs(curves)
    if len(first_clean(r)) < 2:
        return empty
    t = gaps_by_samples(r)
    if t.empty:
        return empty
    if reference in set(t["k"]):
        t = value_of_samples(t, reference)
    g = common_gap_noise(r)
    return t, g, scoring_metrics(r, t, g)


def scoring_metrics(r: pd.DataFrame, by_samples: pd.DataFrame, gap_common: pd.DataFrame) -> dict[str, float]:
    """The study's metrics of its scoring (`scoring/...`) from its `runs` table and `scoring_analysis`' tables: per k
    draws a problem the gap's pooled sd, the run's wall time and, against the reference k, the
    variance, time and value ratios; the clean runs' common noise in the outcome with its F test, a run's own
    scoring sd and the policies' spread (`common_noise`); the clean gain's sd over draw groups of 2 (`gain_sd`); per
    dose row (and pooled) the common noise its mean gap keeps at 2 draws, its F test and the row's se over seeds at
    2 draws; the draws' dispersion against the standard error's model (`dispersion`) and, where the study scored
    the initial policy on more seed sets, the same check on independent seeds (`seed_set_check`)."""
    out = {}
    for row in by_samples.itertuples(index=False):
        for name in ("gap_sd", "variance_ratio", "time_ratio", "value_ratio", "t_job_k"):
            if hasattr(row, name):
                out[f"scoring/k{row.k}/{name}"] = float(getattr(row, name))
    c = common_noise(r)
    out.update({"scoring/draws": float(c["draws"]), "scoring/common_sd": c["sd_common_outcome"],
                "scoring/common_p": c["p_common"], "scoring/run_scoring_sd": c["sd_scoring_outcome"],
                "scoring/policy_sd": float(np.sqrt(c["var_run"])), "scoring/gain_sd_k2": gain_sd(r, 2)})
    out.update({f"scoring/dispersion/{k}": v for k, v in dispersion(r).items()})
    out.update({f"scoring/seed_sets/{k}": v for k, v in seed_set_check(r).items()})
    for row in gap_common.itertuples(index=False):
        name = "pooled" if row.label == "pooled" else f"{row.label}/{row.arm}"
        out.update({f"scoring/gap_common/{name}/sd_k2": float(row.sd_common_k2),
                    f"scoring/gap_common/{name}/p": float(row.p_common),
                    f"scoring/gap_common/{name}/se_seeds_k2": float(row.se_seeds_k2)})
    return out
