"""Notebook 08's tests across rows: the paired contrasts the conclusion states (`contrast_table`), the long-horizon
rows (`horizon_table`), and the study's one Holm family over every test (`one_family`, the benchmark rows' trend tests
included: `benchmarks.benchmark_table`). Pure pandas on the curves and the rows of `analysis`."""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np
import pandas as pd

from rlwb.core.measure import stats
from rlwb.core.rl.mismatch_doses import dose_kinds
from rlwb.experiments.mismatch_study.analysis import (
    dose_table,
    mdes,
    outcome_resolution,
    per_seed,
    seed_gaps,
    with_defaults,
)
from rlwb.experiments.mismatch_study.benchmarks import baseline_draws, benchmark_table
from rlwb.experiments.mismatch_study.design import LONG

# a gradient-norm spike: > 3 x the long clean run's median; entropy collapse: < half the long clean run's entropy
# at the same step (not its first step's: a run that learns sharpens its policy, and the clean run itself would
# "collapse" by step ~20 on the default policy)
SPIKE, ENTROPY_DROP = 3.0, 0.5


def horizon_table(curves: pd.DataFrame, block: int, resolution: float = 0.0) -> tuple[pd.DataFrame, dict[str, float]]:
    """The long-horizon rows (label ending `+long`): per dosed row and arm, the gap of the mean training reward to
    the long clean twin (same arm and seed) per block of `block` steps, with a 95% t interval over seeds, and
    whether it changes from the first block to the last (a paired t test of each seed's last-block minus
    first-block gap: `<label>/<arm>/gap_change` and `_p`). Per long row (clean ones included) the step where a
    collapse starts, if any: the first step whose seed-mean gradient norm exceeds `SPIKE` x the long clean run's
    median (`grad_spike_step`), or whose seed-mean entropy falls below `ENTROPY_DROP` x the clean run's seed-mean
    entropy at the same step (`entropy_collapse_step`); NaN: none. The training reward, because it is the only
    outcome measured per step (under a stale dose it carries the lag bias, `lag_bias`). `resolution`: the step of
    one block's mean training reward (`stats.paired_gap_test`; the change is a difference of four such means).
    `gap_change_p` is unadjusted here; `analyze` puts it in the study's one Holm family (`gap_change_p_holm`)."""
    curves = with_defaults(curves)
    long = curves[curves["label"].str.endswith(LONG)]
    rows, out = [], {}
    if long.empty:
        return pd.DataFrame(columns=["label", "arm", "block_start", "block_end", "gap", "ci_low", "ci_high",
                                     "seeds", "grad_spike_step", "entropy_collapse_step"]), out
    for (label, arm), d in long.groupby(["label", "arm"], sort=False):
        clean = long[(long["kind"] == "clean") & (long["arm"] == arm)]
        gm = clean.groupby("step")["grad_norm"].mean()
        em = clean.groupby("step")["entropy"].mean()
        own_g, own_e = d.groupby("step")["grad_norm"].mean(), d.groupby("step")["entropy"].mean()
        spike = own_g[own_g > SPIKE * gm.median()].index
        ref = em.reindex(own_e.index)
        drop = own_e[own_e < ENTROPY_DROP * ref].index if len(em) else []
        out[f"{label}/{arm}/grad_spike_step"] = float(spike[0]) if len(spike) else float("nan")
        out[f"{label}/{arm}/entropy_collapse_step"] = float(drop[0]) if len(drop) else float("nan")
        if d["kind"].iloc[0] == "clean":
            continue
        per = (d.assign(b=d["step"] // block).groupby(["seed", "b"])["reward_mean"].mean()
               - clean.assign(b=clean["step"] // block).groupby(["seed", "b"])["reward_mean"].mean()).dropna()
        wide = per.unstack("b")
        for b in wide.columns:
            v = wide[b].dropna().to_numpy()
            lo, hi = stats.seed_ci(v)
            rows.append({"label": label, "arm": arm, "block_start": int(b * block),
                         "block_end": int(min((b + 1) * block, d["step"].max() + 1) - 1), "gap": float(v.mean()),
                         "ci_low": lo, "ci_high": hi, "seeds": int(v.size),
                         "grad_spike_step": out[f"{label}/{arm}/grad_spike_step"],
                         "entropy_collapse_step": out[f"{label}/{arm}/entropy_collapse_step"]})
        change = (wide[wide.columns[-1]] - wide[wide.columns[0]]).dropna().to_numpy()
        out[f"{label}/{arm}/gap_change"] = float(change.mean()) if change.size else float("nan")
        out[f"{label}/{arm}/gap_change_p"] = stats.paired_gap_test(change, margin=1.0,
                                                                  resolution=resolution * np.sqrt(2)).p_diff
    return pd.DataFrame(rows), out


UNCORRECTED = "none@trainer"  # the decoupled arm a correction is compared with: same mode, no correction


SCALED_BAND, VERL_BAND = "geo_rs_len@trainer", "verl.geo_rs@trainer"  # the `band` contrast


REGIME = re.compile(r"\+ppo\d+(x\d+)?")  # a further PPO regime's label suffix (`+ppo4`, `+ppo2x2`)


MATCHED_K3 = 2.0  # a symmetric dose matches a point's k3 when within this factor (as `dose_achieved`)


def contrast_table(table: pd.DataFrame, curves: pd.DataFrame, resolution: float = 0.0) -> pd.DataFrame:
    """The paired contrasts the conclusion's sentences rest on, each a per-seed difference of two rows' gaps (same
    seeds, prompts, sampling seeds and noise), with a 95% t interval and a t test (`resolution`: the tested
    outcome's step, `outcome_resolution`). `p_holm` and `mde` here are over these contrasts alone; `analyze` puts
    them in the study's one Holm family with every row, trend and horizon test.

    - `correction`: a correction arm in the decoupled mode minus the uncorrected decoupled arm `none@trainer` at the
      same dosed row or engine point (what the correction adds, not what the mode does: bypass is another mode);
    - `mode`: `none@engine` (bypass) minus `none@trainer` (decoupled) at the same row;
    - `one-sided vs symmetric`: an engine point reporting raw logprobs (a one-sided error) minus the symmetric ratio
      dose of matched k3 (within a factor `MATCHED_K3`) at the same temperature, PPO regime and arm;
    - `band`: the length-scaled Geo-RS band (`geo_rs_len@trainer`) minus verl's (`verl.geo_rs@trainer`) at the
      same row: what scaling the band by the completion length changes;
    - `regime`: the `mode` contrast at a dose in a further PPO regime (`<label>+ppo<k>`) minus the same contrast at
      that dose in the first regime, seed by seed (a difference of differences): does bypass-vs-decoupled hold
      when several updates per batch let the clip act in both modes?
    Rows that are controls (`none@trainer` under ratio doses is bitwise its clean run) are not contrasted."""
    curves = with_defaults(curves)
    g = seed_gaps(per_seed(curves)).set_index(["label", "arm", "seed"])["gap"].sort_index()
    rows = []

    def seeds_of(label: str, a: str):
        return g.loc[(label, a)]

    def add(kind: str, label: str, a: str, label_b: str, b: str, what: str, minus: tuple | None = None):
        try:
            x, y = seeds_of(label, a), seeds_of(label_b, b)
            d = x - y
            if minus:  # a difference of differences: (label a - label b) - (minus[0] a - minus[0] b)
                d = d - (seeds_of(minus[0], a) - seeds_of(minus[0], b))
        except KeyError:
            return
        d = d.dropna().to_numpy()
        if d.size < 2:
            return
        lo, hi = stats.seed_ci(d)
        q = resolution * (2.0 if minus else np.sqrt(2))  # 4 (or 8) scored outcomes in each seed's difference
        rows.append({"contrast": kind, "label": label, "arm": a, "vs_label": label_b, "vs_arm": b, "what": what,
                     "diff": float(d.mean()), "ci_low": lo, "ci_high": hi, "sd": float(d.std(ddof=1)),
                     "seeds": int(d.size), "q_eff": q,
                     "p": stats.paired_gap_test(d, margin=1.0, resolution=q).p_diff})

    dosed = table[~table["kind"].isin(["clean", "rerun", "placebo"])]
    for label, d in dosed.groupby("label", sort=False):
        arms = set(d["arm"])
        if UNCORRECTED in arms and (d.loc[d["arm"] == UNCORRECTED, "control"] == "").all():
            for a in sorted(x for x in arms if x.endswith("@trainer") and x != UNCORRECTED):
                add("correction", label, a, label, UNCORRECTED, f"`{a}` vs `{UNCORRECTED}` at {label}")
            if "none@engine" in arms:
                add("mode", label, "none@engine", label, UNCORRECTED, f"bypass vs decoupled at {label}")
        ok = set(d.loc[d["control"] == "", "arm"])
        if {SCALED_BAND, VERL_BAND} <= ok:
            add("band", label, SCALED_BAND, label, VERL_BAND, f"`{SCALED_BAND}` vs `{VERL_BAND}` at {label}")
        base = REGIME.sub("", label)
        if base != label and {"none@engine", UNCORRECTED} <= ok:
            b_ok = set(dosed.loc[(dosed["label"] == base) & (dosed["control"] == ""), "arm"])
            if {"none@engine", UNCORRECTED} <= b_ok:
                add("regime", label, "none@engine", label, UNCORRECTED,
                    f"bypass vs decoupled at {label} minus at {base}", minus=(base,))
    # the symmetric ratio errors a raw engine's one-sided one is matched with: kinds that sample right, at an
    # intended k3
    ratio = table[table["kind"].isin([k.name for k in dose_kinds() if k.samples_right and k.intended_k3])]
    for r in table[(table["kind"] == "engine") & table["raw_logprobs"] & (table["control"] == "")].itertuples():
        cand = ratio[(ratio["temperature"] == r.temperature) & (ratio["updates"] == r.updates)
                     & (ratio.get("epochs", 1) == getattr(r, "epochs", 1)) & (ratio["arm"] == r.arm)]
        cand = cand[(cand["k3_intended"] / r.k3_achieved).between(1 / MATCHED_K3, MATCHED_K3)]
        if len(cand):
            m = cand.iloc[(np.log(cand["k3_intended"] / r.k3_achieved)).abs().argmin()]
            add("one-sided vs symmetric", r.label, r.arm, m["label"], r.arm,
                f"`{r.label}` (one-sided, k3 {r.k3_achieved:.1e}) vs {m['label']} (symmetric) `{r.arm}`")
    c = pd.DataFrame(rows, columns=["contrast", "label", "arm", "vs_label", "vs_arm", "what", "diff", "ci_low",
                                    "ci_high", "sd", "seeds", "q_eff", "p"])
    c["p_holm"] = stats.holm(c["p"]) if len(c) else []
    m = max(len(c), 1)
    c["mde"] = mdes(c, "sd", stats.ALPHA / m)
    c["verdict"] = ["differs" if ph < stats.ALPHA else "no difference shown" for ph in c["p_holm"]]
    return c


def contrast_metrics(con: pd.DataFrame) -> dict[str, float]:
    """`contrast/<contrast>/<label>/<arm>/{diff, ci_low, ci_high, p_holm, mde}`."""
    out = {}
    for r in con.itertuples():
        k = f"contrast/{r.contrast}/{r.label}/{r.arm}"
        out.update({f"{k}/{f}": float(getattr(r, f)) for f in ("diff", "ci_low", "ci_high", "p_holm", "mde")})
    return out


def one_family(table: pd.DataFrame, bench: pd.DataFrame, con: pd.DataFrame, hm: dict) -> dict[str, float]:
    """One Holm family per study: every dosed row and engine point that is not a control (the placebo
    rows included), every trend test across doses, every paired contrast and every long-horizon change test, Holm
    over all m of them at once; a row's or contrast's MDE at alpha / m, the family's strictest level (noncentral t).
    Why one: the conclusion reads them together, and a reader cannot tell which of several families a claim was
    adjusted in; separate families each at 5% would let the study as a whole call a false cost with a probability
    that grows with the number of families. Controls stay outside, tested alone unadjusted (the stricter test for a
    null). Sets `p_holm`, `mde` and `verdict` in `table` and `con`, `trend_p_holm` in `bench` and `<label>/<arm>/
    gap_change_p_holm` in `hm`, in place; returns the family's size by part (`family/...`)."""
    rows = (~table["kind"].isin(["clean", "rerun"]) & table["p"].notna() & (table["control"] == "")).to_numpy()
    trends = bench["trend_p"].notna().to_numpy() if len(bench) else np.zeros(0, bool)
    hz_keys = [k for k, v in hm.items() if k.endswith("/gap_change_p") and np.isfinite(v)]
    ps = np.concatenate([table.loc[rows, "p"].to_numpy(float), bench.loc[trends, "trend_p"].to_numpy(float)
                         if len(bench) else [], con["p"].to_numpy(float), [hm[k] for k in hz_keys]])
    m = len(ps)
    adj = np.asarray(stats.holm(ps)) if m else np.zeros(0)
    n_rows, n_trends, n_con = int(rows.sum()), int(trends.sum()), len(con)
    level = stats.ALPHA / max(m, 1)
    if n_rows:
        t = table.loc[rows]
        table.loc[rows, "p_holm"] = adj[:n_rows]
        table.loc[rows, "mde"] = mdes(t, "gap_sd", level)
        table.loc[rows, "verdict"] = ["costs" if ph < stats.ALPHA and g < 0 else "gains" if ph < stats.ALPHA
                                      else "no cost shown" for ph, g in zip(adj[:n_rows], t["gap"])]
    if len(bench):
        bench["trend_p_holm"] = np.nan
        bench.loc[trends, "trend_p_holm"] = adj[n_rows:n_rows + n_trends]
    if n_con:
        c = adj[n_rows + n_trends:n_rows + n_trends + n_con]
        con["p_holm"] = c
        con["mde"] = mdes(con, "sd", level)
        con["verdict"] = ["differs" if ph < stats.ALPHA else "no difference shown" for ph in c]
    for k, ph in zip(hz_keys, adj[n_rows + n_trends + n_con:]):
        hm[k + "_holm"] = float(ph)
    return {"family/tests": float(m), "family/rows": float(n_rows), "family/trends": float(n_trends),
            "family/contrasts": float(n_con), "family/horizon": float(len(hz_keys))}


class StudyTests(NamedTuple):
    """Every test of a study and its one Holm family (`study_tests`)."""

    table: pd.DataFrame  # `analysis.dose_table`, its p_holm, mde and verdict set in the family
    bench: pd.DataFrame  # `benchmarks.benchmark_table`'s rows, trend_p_holm set in the family
    fits: pd.DataFrame  # what the dose-response figure draws
    con: pd.DataFrame  # `contrast_table`, p_holm, mde and verdict set in the family
    horizon: pd.DataFrame  # `horizon_table`'s blocks
    horizon_metrics: dict  # its metrics, gap_change_p_holm set in the family
    family: dict  # the family's size by part (`one_family`)


def study_tests(curves: pd.DataFrame, p) -> StudyTests:
    """The study's rows, benchmark doses, contrasts and long-horizon tests from its curves, adjusted in one Holm
    family (`one_family`): what `mismatch_cost.analyze` reports, and what the sequential seed rule reads of a first
    pass (`sequential.first_pass`)."""
    table = dose_table(curves, p)
    q = outcome_resolution(p, table["outcome"].iloc[0]) if len(table) else 0.0
    bench, fits = benchmark_table(table, curves, p.bmr_fraction, baseline_draws(p))
    con = contrast_table(table, curves, q)
    hz, hm = horizon_table(curves, p.steps, 1.0 / (p.prompts_per_step * p.group_size * p.steps))
    # what the params declared, before the run, it confirms (on fresh seeds); every other test is exploratory
    con["standing"] = [standing(c, p, lab) for c, lab in zip(con["contrast"], con["label"])]
    hz["standing"] = standing("horizon", p)
    family = one_family(table, bench, con, hm)
    return StudyTests(table, bench, fits, con, hz, hm, family)


def standing(test: str, p, label: str = "") -> str:
    """"confirmatory" for a kind of test the params declared, before the run, to confirm (`confirms`, on seeds no
    study uses), "exploratory" otherwise: a contrast chosen after seeing a study's results is exploratory there.
    A declared kind confirms its rows in the first PPO regime at the study's horizon (`label`: the contrast's row):
    at a further regime's row (`+ppo...`) only the `regime` contrast, whose question that regime is, and at a
    long-horizon row (`+long`) only where `horizon` is declared too; the rest there is exploratory."""
    declared = getattr(p, "confirms", [])
    if test not in declared or ("+ppo" in label and test != "regime") or (LONG in label and "horizon" not in declared):
        return "exploratory"
    return "confirmatory"
