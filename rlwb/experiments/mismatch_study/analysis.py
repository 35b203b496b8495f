"""Notebook 08's analysis, per run and per row: each run's outcomes (`per_seed`), its paired gaps to its clean twin
(`seed_gaps`), one row per dose row and arm with its interval, test and verdict (`dose_table`; in a study with a
second pass of seeds, a dose row's test has two looks: `two_look_p`), the controls, and the metrics of the rows
(`dose_metrics`). Rows may have different seed counts (the sequential rule's second pass): each gap pairs a run with
its own seed's clean twin. Pure pandas on the curves: an archived run's analysis is redone from its
data/curves.parquet alone."""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from rlwb.core.measure import stats
from rlwb.core.rl.mismatch_doses import DOSE_KINDS, kinds_for
from rlwb.experiments.grpo_grid import FINAL_FRAC, edge_steps, floor_breaches, reward_gain
from rlwb.experiments.mismatch_study.design import HELDOUT_PROBLEMS, HELDOUT_SEED, LONG, dosed_kinds, held_out

KEYS = ["kind", "label", "dose", "temperature", "updates", "epochs", "horizon", "arm", "seed"]
# what pairs a run with its clean twin (`seed_gaps`): same temperature, PPO regime, horizon, arm and seed
TWIN_KEYS = ["temperature", "updates", "epochs", "horizon", "arm", "seed"]


def with_defaults(curves: pd.DataFrame) -> pd.DataFrame:
    """Curves archived before the PPO regimes (or their epochs) and the policy outcome existed: one update per
    batch, one epoch, no policy reward (the training reward is then the tested outcome)."""
    if "updates" not in curves:
        curves = curves.assign(updates=1)
    if "epochs" not in curves:
        curves = curves.assign(epochs=1)
    if "policy_reward" not in curves:
        curves = curves.assign(policy_reward=np.nan)
    # each run's horizon (its step count): a long-horizon row pairs with the clean run of its own length
    return curves.assign(horizon=curves.groupby(["label", "arm", "seed"])["step"].transform("max") + 1)


def per_seed(curves: pd.DataFrame) -> pd.DataFrame:
    """Per run: final reward (last FINAL_FRAC of steps), area under the reward curve (mean reward over all steps),
    final entropy, mean gradient norm, clip fraction, engine-trainer k3, the trained policy's own greedy
    accuracy and its reward sampled with no dose in between (`policy_reward`)."""
    curves = with_defaults(curves)
    # each horizon's own last steps (a long-horizon row's final window is its own, not the short runs')
    final = pd.concat([curves[(curves["horizon"] == h) & curves["step"].isin(edge_steps(range(int(h)), FINAL_FRAC))]
                       for h in curves["horizon"].unique()])
    g = curves.groupby(KEYS, sort=False, dropna=False)
    out = pd.DataFrame({"auc": g["reward_mean"].mean(), "grad_norm": g["grad_norm"].mean(),
                        "clip_frac": g["clip_frac"].mean(), "k3": g["mismatch_k3"].mean(),
                        "k1": g["mismatch_k1"].mean() if "mismatch_k1" in curves else np.nan,
                        "raw_logprobs": g["raw_logprobs"].first(),
                        # runs archived before the held-out score have no such column: they recompute without it
                        "heldout_acc": g["heldout_greedy_acc"].first() if "heldout_greedy_acc" in curves else np.nan,
                        "policy_reward": g["policy_reward"].first(),
                        "kl_to_clean": g["kl_to_clean"].first() if "kl_to_clean" in curves else np.nan})
    fin = final.groupby(KEYS, sort=False, dropna=False)
    out["reward_final"] = fin["reward_mean"].mean()
    out["entropy"] = fin["entropy"].mean()
    return out.reset_index()


def k3_initial(curves: pd.DataFrame) -> pd.Series:
    """Per run label and arm: the k3 its dose gives the policy the run starts from, the mean over the row's seeds of
    the engine-trainer k3 at its kind's `first_full_step` (a row that is not a dose: step 0). For a kind acting from
    the start that is step 0, before any update: every arm of a seed sees the same batch there, so the arms agree.
    A lag is first whole after ceil(dose) updates, which differ by arm: each arm's row keeps its own value (stale@4
    on the default policy: 0.022 to 0.037 across arms). Indexed by (label, arm)."""
    curves = with_defaults(curves)
    out = {}
    for (label, arm), d in curves.groupby(["label", "arm"], sort=False):
        kind, dose = d["kind"].iloc[0], d["dose"].iloc[0]
        step = DOSE_KINDS[kind].first_full_step(dose) if kind in DOSE_KINDS else 0
        at = d[d["step"] == min(step, int(d["step"].max()))]
        out[(label, arm)] = float(at["mismatch_k3"].mean())
    return pd.Series(out, name="k3_initial", dtype=float)


def control_of(kind: str, arm: str, temperature: float, raw: bool) -> str:
    """Which null control a row is ("" if none): `<kind>-blind` (the kind's `blind_arm`, which the dose cannot
    reach: `ratio-blind`, `none@trainer` under ratio doses, whose update never reads the reported logprobs), `T=1`
    (an engine reporting raw logprobs at T = 1, where raw = processed)."""
    if kind in DOSE_KINDS and arm == DOSE_KINDS[kind].blind_arm:
        return f"{kind}-blind"
    if kind == "engine" and raw and temperature == 1.0:
        return "T=1"
    return ""


def panel_of(kind: str, raw: bool, present=()) -> str:
    """The dose-response panel a row belongs to: its kind; a real engine joins a kind of its mismatch
    (`mismatch_doses.kinds_for`): for raw logprobs (it samples right, reports wrong) the kind its error is
    (`DoseKind.raw_engine`, the one-sided kind) where the study has rows of it (`present`: the kinds of the study's
    rows), else the first that samples right (`ratio`); a distribution mismatch's first (`weights`) otherwise."""
    if kind != "engine":
        return kind
    kinds = kinds_for(raw)
    own = [k for k in kinds if raw and DOSE_KINDS[k].raw_engine and k in present]
    return own[0] if own else kinds[0]


def outcome_of(s: pd.DataFrame) -> str:
    """The tested outcome: the trained policy's reward sampled with no dose in between (`policy_reward`) where every
    run has one, else the final training reward (runs with `policy_samples` 0, or archived before it existed)."""
    return "policy_reward" if s["policy_reward"].notna().all() else "reward_final"


def late_slope(curves: pd.DataFrame) -> float:
    """The clean runs' reward slope per step over the second half of their steps (least squares on the mean over
    seeds): what a stale engine's lag of k updates alone takes off the training reward (k x this), since the
    engine's reward is that of weights k steps back."""
    c = curves.groupby("step")["reward_mean"].mean()
    c = c[c.index >= c.index.max() / 2]
    if len(c) < 2:
        return float("nan")
    return float(np.polyfit(c.index.to_numpy(dtype=float), c.to_numpy(), 1)[0])


def outcome_resolution(p, outcome: str) -> float:
    """The step of the tested outcome (`stats.paired_gap_test`'s `resolution`): the trained policy's reward is a mean
    of held-out problems x `policy_samples` rewards of 0 or 1; the final training reward a mean over the last
    FINAL_FRAC of steps of prompts x group rewards."""
    if outcome == "policy_reward":
        return 1.0 / (len(held_out(p, HELDOUT_PROBLEMS, HELDOUT_SEED)[0]) * max(1, p.policy_samples))
    return 1.0 / (p.prompts_per_step * p.group_size * len(edge_steps(range(p.steps), FINAL_FRAC)))


def seed_gaps(s: pd.DataFrame) -> pd.DataFrame:
    """Per run that is not a clean run: its outcomes minus its clean twin's (same temperature, PPO regime, arm and
    seed): `gap` (the tested outcome, `outcome_of`), `train_gap` (final training reward) and `heldout_gap` (own
    greedy accuracy). One row per (label, arm, seed)."""
    outcome = outcome_of(s)
    cols = list(dict.fromkeys([outcome, "reward_final", "heldout_acc"]))
    clean = s.loc[s["kind"] == "clean", TWIN_KEYS + cols].rename(columns={c: c + "_clean" for c in cols})
    d = s[s["kind"] != "clean"].merge(clean, on=TWIN_KEYS, how="left")
    return d.assign(gap=d[outcome] - d[outcome + "_clean"], train_gap=d["reward_final"] - d["reward_final_clean"],
                    heldout_gap=d["heldout_acc"] - d["heldout_acc_clean"])


def dose_table(curves: pd.DataFrame, p, kl: dict | None = None) -> pd.DataFrame:
    """One row per (label, arm): the dose as intended, as it meets the initial policy (`k3_initial`, the benchmark
    dose's axis) and as achieved (mean k3 per token over steps and seeds), the
    outcomes, and each outcome's gap to the same arm's clean run at the same temperature and PPO regime, paired by
    seed (95% t interval), with the smallest gap the seeds could detect (`mde`: 80% power at the Holm family's
    strictest level, noncentral t). `outcome` names the tested one (`outcome_of`: the trained policy's reward with
    no dose in between; the training reward's gap is `train_gap`, secondary, and for stale rows `lag_bias` is what
    the lag alone takes off it). verdict: a t test of gap = 0 per dosed row, Holm-corrected over every dosed row
    that is not a control, the placebo rows included (the clean run again on independent sampling: a "costs" or
    "gains" there is a false positive): "costs" / "gains" where it rejects, "no cost shown" where it does not (read
    the MDE beside it); a dose row of a study with a second pass of seeds (`max_seeds`) is tested at two looks
    (`two_look_p`). Controls (`control_of`) are tested alone, unadjusted (the stricter test for a null): "null
    (passes)" / "**fails**"."""
    curves = with_defaults(curves)
    s = per_seed(curves)
    if kl:  # KL values by job (runs archived before `kl_to_clean` was a column of the curves)
        by_run = {(j.label, j.arm, j.seed): v for j, v in kl.items()}
        s["kl_to_clean"] = [by_run.get(k, float("nan")) for k in zip(s["label"], s["arm"], s["seed"])]
    outcome = outcome_of(s)
    q = outcome_resolution(p, outcome)
    gaps = seed_gaps(s)
    slope = {k: late_slope(d) for k, d in
             curves[curves["kind"] == "clean"].groupby(["temperature", "updates", "epochs", "horizon", "arm"])}
    x0 = k3_initial(curves)
    present = set(s["kind"])
    initial = initial_outcome(curves, outcome)
    rows = []
    for (label, arm), d in s.groupby(["label", "arm"], sort=False):
        kind, dose, temp, raw = d["kind"].iloc[0], d["dose"].iloc[0], d["temperature"].iloc[0], bool(
            d["raw_logprobs"].iloc[0])
        updates, epochs, horizon = int(d["updates"].iloc[0]), int(d["epochs"].iloc[0]), int(d["horizon"].iloc[0])
        d = d.set_index("seed")
        row = {"kind": kind, "label": label, "dose": dose, "temperature": temp, "updates": updates,
               "epochs": epochs, "horizon": horizon, "arm": arm,
               "engine": curves.loc[curves["label"] == label, "engine"].iloc[0], "raw_logprobs": raw,
               "panel": panel_of(kind, raw, present), "control": control_of(kind, arm, temp, raw), "outcome": outcome,
               "k3_intended": dose if kind in DOSE_KINDS and DOSE_KINDS[kind].intended_k3 else float("nan"),
               "k3_initial": float(x0[(label, arm)]), "k3_achieved": float(d["k3"].mean()),
               "k1_achieved": float(d["k1"].mean()),
               "reward_final": float(d["reward_final"].mean()), "policy_reward": float(d["policy_reward"].mean()),
               "auc": float(d["auc"].mean()), "entropy": float(d["entropy"].mean()),
               "grad_norm": float(d["grad_norm"].mean()), "clip_frac": float(d["clip_frac"].mean()),
               "kl_to_clean": float(d["kl_to_clean"].mean()), "seeds": len(d),
               "heldout_acc": float(d["heldout_acc"].mean())}
        # the trained policy against the untrained one, in the tested outcome: a dose can leave it below where it
        # started (not only below its clean twin); its upper 95% limit below the initial policy's says so
        ov = d[outcome].dropna().to_numpy(float)
        row["initial_outcome"] = initial
        row["below_initial"] = bool(ov.size > 1 and np.isfinite(initial) and stats.seed_ci(ov)[1] < initial)
        g = gaps[(gaps["label"] == label) & (gaps["arm"] == arm)]
        for col in ("gap", "train_gap", "heldout_gap"):
            v = g[col].dropna().to_numpy()
            row[col] = float(v.mean()) if v.size else float("nan")
            row[f"{col}_ci_low"], row[f"{col}_ci_high"] = stats.seed_ci(v)
        gap = g["gap"].dropna().to_numpy()
        row["lag_bias"] = (-dose * slope.get((temp, updates, epochs, horizon, arm), float("nan"))
                           if kind in DOSE_KINDS and DOSE_KINDS[kind].lag else float("nan"))
        row["identical"] = identical_curves(curves, label, arm, temp, d.index, updates, horizon, epochs)
        row["gap_sd"] = float(gap.std(ddof=1)) if gap.size > 1 else float("nan")
        row["q_eff"] = q  # the step of the tested outcome its test floors the spread with (`stats.floored_sd`)
        row["mde"] = float("nan")  # set below, at the Holm family's level
        base = s[(s["kind"] == "clean") & (s["temperature"] == temp) & (s["updates"] == updates)
                 & (s["epochs"] == epochs) & (s["horizon"] == horizon) & (s["arm"] == arm)].set_index("seed")
        for col in ("auc", "entropy", "grad_norm", "clip_frac"):
            row[f"{col}_gap"] = float((d[col] - base[col]).mean()) if kind != "clean" else 0.0
        if kind == "clean":
            row["p"] = float("nan")
        elif two_looks(p) and kind in DOSE_KINDS and not row["control"]:  # a row the seed rule may extend
            row["p"] = two_look_p(g.set_index("seed")["gap"], p.seeds, p.max_seeds, q)
        else:
            row["p"] = stats.paired_gap_test(gap, margin=1.0, resolution=q).p_diff
        rows.append(row)
    t = pd.DataFrame(rows)
    # rewards are multiples of 1/(completions x steps averaged): a difference's last bits are rounding, not signal
    # (an identical pair of seeds reads -2.8e-17 otherwise)
    cols = [c for c in t.columns if c.endswith(("gap", "_ci_low", "_ci_high")) and c != "identical"]
    t[cols] = t[cols].round(12)
    t["p_holm"], t["verdict"] = np.nan, np.where(t["kind"].isin(["clean", "rerun"]), t["kind"], "n/a")
    tested = ~t["kind"].isin(["clean", "rerun"]) & t["p"].notna()
    family, ctl = tested & (t["control"] == ""), tested & (t["control"] != "")
    m = int(family.sum())
    if m:  # every dosed row that is not a control is a test: Holm over all of them, the MDE at the strictest level
        t.loc[family, "p_holm"] = stats.holm(t.loc[family, "p"])
        t.loc[family, "mde"] = mdes(t.loc[family], "gap_sd", stats.ALPHA / m)
        t.loc[family, "verdict"] = ["costs" if ph < stats.ALPHA and g < 0 else "gains" if ph < stats.ALPHA
                                    else "no cost shown" for ph, g in zip(t.loc[family, "p_holm"],
                                                                          t.loc[family, "gap"])]
    if ctl.any():
        t.loc[ctl, "mde"] = mdes(t.loc[ctl], "gap_sd", stats.ALPHA)
        t.loc[ctl, "verdict"] = ["null (passes)" if control_passes(r) else "fails" for r in t[ctl].itertuples()]
    return t


def two_looks(p) -> bool:
    """Does the study declare a second pass of seeds (`max_seeds` above `num_seeds`: `mismatch_study.sequential`)?
    Then every dose row it may extend is tested by `two_look_p`."""
    return getattr(p, "max_seeds", 0) > p.num_seeds


def two_look_p(gaps: pd.Series, first_seeds, max_seeds: int, resolution: float) -> float:
    """The p of gap = 0 for a dose row of a study with a sequential seed rule (per-seed `gaps`, indexed by seed; the
    first pass's seeds `first_seeds`, the rule's cap `max_seeds`): a two-look group-sequential test with Pocock's
    boundary (one critical value c at both looks) on the inverse-normal combination of the passes (Lehmacher &
    Wassmer 1999, https://doi.org/10.1111/j.0006-341X.1999.01286.x; Bauer & Koehne 1994). z1: the first pass's
    two-sided t test as a signed z; z2 the second pass's (its fresh seeds); Z = w z1 + sqrt(1 - w^2) z2 with
    w = sqrt(n1 / max_seeds), fixed before the run. The row is called at level a where |z1| >= c(a) or (extended)
    |Z| >= c(a), c(a) such that P(|Z1| >= c or |Z| >= c) = a for independent standard normal z1, z2; p is the level
    where it is first called: P(max(|Z1|, |Z|) >= its max) (a row the rule left alone: |z1| alone).

    Why not one t test over every seed: the first pass's seeds were chosen for more by their own mean (their
    interval held -BMR), so under no cost they lean toward one; pooled, a null row's false-positive rate at 5% was
    ~6.5% (tests/test_mismatch_cost.py). Nor the combination alone: rows the rule leaves at the first pass are then
    tested at the full level, and which test a row gets is itself the rule's choice. Here the second pass's z is
    N(0, 1) under no cost whatever the first decided, the weights are fixed, and a row that stops at the first look
    only gives up the second's chance: the level holds whatever the rule does (and for a row that is never
    extended, p is that of |z1| against Pocock's c, a little above its one-look p: the price of a second look).
    Fewer than 2 second-pass seeds: no second test; the first look's p."""
    from scipy.stats import norm

    g = gaps.dropna()
    seeds = set(first_seeds)
    first, later = g[g.index.isin(seeds)].to_numpy(), g[~g.index.isin(seeds)].to_numpy()

    def z_of(v: np.ndarray) -> float:
        pv = min(max(stats.paired_gap_test(v, margin=1.0, resolution=resolution).p_diff, 1e-300), 1.0)
        return float(np.sign(v.mean()) * norm.isf(pv / 2))

    if first.size < 2:
        return stats.paired_gap_test(g.to_numpy(), margin=1.0, resolution=resolution).p_diff
    w = np.sqrt(len(seeds) / max_seeds)
    z1 = z_of(first)
    c = abs(z1) if later.size < 2 else max(abs(z1), abs(w * z1 + np.sqrt(1 - w * w) * z_of(later)))
    return float(min(1.0, two_look_reject(c, w)))


def two_look_reject(c: float, w: float, theta1: float = 0.0, theta2: float = 0.0) -> float:
    """P(|Z1| >= c or |w Z1 + sqrt(1 - w^2) Z2| >= c) for independent Z1 ~ N(theta1, 1), Z2 ~ N(theta2, 1): the
    two-look test's rejection probability (`two_look_p`): its level at thetas 0, its power at the passes' effects."""
    from scipy import integrate
    from scipy.stats import norm

    sd = np.sqrt(1 - w * w)  # Z given z1 = x: N(w x + sd theta2, 1 - w^2)
    tail, _ = integrate.quad(lambda x: norm.pdf(x - theta1) * (norm.cdf((-c - w * x) / sd - theta2)
                                                                + norm.sf((c - w * x) / sd - theta2)),
                             -c, c, epsabs=1e-13, epsrel=1e-10)
    return float(norm.cdf(-c - theta1) + norm.sf(c - theta1) + tail)


@functools.lru_cache(maxsize=256)
def pocock_c(w: float, level: float) -> float:
    """Pocock's critical value for the two-look test at `level` with first-look weight `w` (`two_look_reject` at no
    effect equals the level); cached: the rule asks it for every candidate n of every row."""
    from scipy.optimize import brentq

    return float(brentq(lambda v: two_look_reject(v, w) - level, 0.5, 12.0, xtol=1e-10))


def two_look_power(effect: float, sd: float, first: int, seeds: int, cap: int, level: float) -> float:
    """The power of `two_look_p`'s test to detect a paired gap of size `effect` (per-seed spread `sd`) in a row
    whose first pass has `first` seeds and which the rule takes to `seeds` (cap `max_seeds` = `cap`, which fixes
    the weights), at `level`. Each pass's z is its paired t test's p turned into a normal quantile, so under no cost
    both are N(0, 1) (Pocock's c for the level holds exactly) and under a cost each is a transform of a noncentral t
    (df = seeds of the pass - 1, noncentrality effect sqrt(n) / sd, as `stats.paired_t_power`): the first look
    rejects where |T1| passes the t quantile of Phi(c), the second where the combination does, integrated over T1.
    A row left at the first pass (or given fewer than 2 more seeds) has only its first look, at Pocock's c. The
    outcome's step (`resolution`) is left out, as the fixed-n power leaves it."""
    from scipy import integrate
    from scipy.stats import nct, norm
    from scipy.stats import t as student

    if not (np.isfinite(sd) and sd > 0 and np.isfinite(effect) and cap > first >= 2 and seeds >= first):
        return float("nan")
    w = np.sqrt(first / cap)
    c = pocock_c(float(w), float(level))
    df1, th1 = first - 1, abs(effect) * np.sqrt(first) / sd
    t1 = float(student.ppf(norm.cdf(c), df1))
    def against(x, df, th):  # P(T <= x) for x on the far side of the effect: tiny, and scipy's nct gives NaN there
        return float(np.nan_to_num(nct.cdf(x, df, th), nan=0.0))

    power = float(nct.sf(t1, df1, th1) + against(-t1, df1, th1))
    if seeds - first < 2:
        return power
    df2, th2, s2 = seeds - first - 1, abs(effect) * np.sqrt(seeds - first) / sd, np.sqrt(1 - w * w)

    def second(t: float) -> float:  # P(|w z1 + s2 Z2| >= c) given the first pass's t
        z1 = float(norm.ppf(student.cdf(t, df1)))
        hi, lo = (student.ppf(norm.cdf(u), df2) for u in ((c - w * z1) / s2, (-c - w * z1) / s2))
        return float(nct.sf(hi, df2, th2) + against(lo, df2, th2)) * float(nct.pdf(t, df1, th1))

    more, _ = integrate.quad(second, -t1, t1, epsabs=1e-10, epsrel=1e-8, limit=200)
    return float(min(1.0, power + more))


def control_passes(r) -> bool:
    """A `<kind>-blind` control must train bitwise as its clean twin (the dose cannot reach it); a `T=1` control
    must show no cost at the unadjusted level (its gap's 95% interval holds 0)."""
    if r.control.endswith("-blind"):
        return bool(r.identical) and r.kl_to_clean == 0
    return bool(r.gap_ci_low <= 0 <= r.gap_ci_high) if np.isfinite(r.gap_ci_low) else r.gap == 0


def identical_curves(curves: pd.DataFrame, label: str, arm: str, temperature: float, seeds, updates: int = 1,
                     horizon: int | None = None, epochs: int = 1) -> bool:
    """Does every seed of (label, arm) have bitwise its clean twin's whole reward curve?"""
    curves = with_defaults(curves)
    cur = curves[(curves["label"] == label) & (curves["arm"] == arm)]
    horizon = int(cur["horizon"].max()) if horizon is None and len(cur) else horizon
    twin = curves[(curves["kind"] == "clean") & (curves["arm"] == arm) & (curves["temperature"] == temperature)
                  & (curves["updates"] == updates) & (curves["epochs"] == epochs) & (curves["horizon"] == horizon)
                  & curves["seed"].isin(list(seeds))]
    a, b = (c.sort_values(["seed", "step"])["reward_mean"].to_numpy() for c in (cur, twin))
    return bool(len(a) == len(b) and len(a) and (a == b).all())


# how far a step's updates moved the PPO ratio off 1: over every update of every epoch, and in its last optimizer
# step alone (the same step of every regime that makes as many optimizer steps per batch); `grpo.grpo_step`'s columns
RATIO_COLUMNS = ["ratio_abs_log_mean", "last_ratio_abs_log_mean", "clip_frac", "last_clip_frac"]


def regime_ratios(curves: pd.DataFrame) -> pd.DataFrame:
    """Per PPO regime and arm, its clean runs at the study's temperature and horizon (`clean`, `clean+ppo<k>`): the
    mean over steps and seeds of the PPO ratio's |log r| and clip fraction (`RATIO_COLUMNS`; a column the curves
    predate is NaN). In the decoupled mode one update per batch leaves the ratio exactly 1; further mini-batches move
    it, further epochs over tokens already trained on more: the table shows by how much."""
    curves = with_defaults(curves)
    label = curves["label"].astype(str)
    clean = curves[(curves["kind"] == "clean") & ((label == "clean") | label.str.startswith("clean+ppo"))]
    clean = clean.assign(**{c: clean.get(c, np.nan) for c in RATIO_COLUMNS})
    g = clean.groupby(["updates", "epochs", "arm"], sort=False)
    out = g[RATIO_COLUMNS].mean().assign(seeds=g["seed"].nunique()).reset_index()
    out.insert(0, "regime", [f"{u}x{e}" for u, e in zip(out["updates"], out["epochs"])])
    out.insert(3, "steps_per_batch", out["updates"] * out["epochs"])
    return out


def regime_metrics(ratios: pd.DataFrame) -> dict[str, float]:
    """`regime/<updates>x<epochs>/<arm>/<column>` for every column of `RATIO_COLUMNS` (`regime_ratios`)."""
    return {f"regime/{r['regime']}/{r['arm']}/{c}": float(r[c]) for r in ratios.to_dict("records")
            for c in RATIO_COLUMNS}


def dose_metrics(table: pd.DataFrame, curves: pd.DataFrame) -> dict[str, float]:
    """`<label>/<arm>/<outcome>` for every row (`clean/<arm>/...` for the clean runs), the clean arms' learning
    (`clean/<arm>/reward_gain` with its interval: last minus first 10% of steps, paired by seed; `outcome_gain`, the
    same in the tested outcome, `outcome_gain`), per dosed kind
    and arm the gap at its largest dose (`max_dose_gap`; the tolerable k3 is the benchmark dose's, `benchmark_table`),
    and the controls (`control/...`: 1 passes, 0 fails)."""
    out = {}
    outcome = table["outcome"].iloc[0] if "outcome" in table and len(table) else "reward_final"
    for r in table.itertuples():
        for col in ("k3_achieved", "reward_final", "auc", "gap", "gap_ci_low", "gap_ci_high", "mde", "entropy_gap",
                    "clip_frac", "grad_norm_gap", "kl_to_clean", "heldout_acc", "heldout_gap", "heldout_gap_ci_low",
                    "heldout_gap_ci_high"):
            out[f"{r.label}/{r.arm}/{col}"] = float(getattr(r, col))
        out[f"{r.label}/{r.arm}/identical_to_clean"] = float(r.identical)
        if r.control:
            out[f"control/{r.label}/{r.arm}"] = float(r.verdict == "null (passes)")
    for (label, arm), d in curves[curves["kind"] == "clean"].groupby(["label", "arm"], sort=False):
        first, last = reward_gain(d)
        gain = (last - first).to_numpy()
        out[f"{label}/{arm}/reward_gain"] = float(gain.mean())
        out[f"{label}/{arm}/reward_gain_ci_low"], out[f"{label}/{arm}/reward_gain_ci_high"] = stats.seed_ci(gain)
        og = outcome_gain(d, outcome)
        out[f"{label}/{arm}/outcome_gain"] = float(og.mean()) if og.size else float("nan")
        out[f"{label}/{arm}/outcome_gain_ci_low"], out[f"{label}/{arm}/outcome_gain_ci_high"] = stats.seed_ci(og)
    dosed = table[table["kind"].isin(dosed_kinds()) & ~table["label"].str.contains("+ppo", regex=False)
                  & ~table["label"].str.endswith(LONG)]
    for (kind, arm), d in dosed.groupby(["kind", "arm"], sort=False):
        d = d.sort_values("dose")
        out[f"{kind}/{arm}/max_dose_gap"] = float(d["gap"].iloc[-1])
    out.update(rejection_metrics(curves))
    out.update(placebo_metrics(table, curves))
    rerun = table[table["kind"] == "rerun"]
    if len(rerun):
        out["control/rerun/identical"] = float(rerun["identical"].iloc[0])
    out.update(floor_breaches(curves[curves["kind"].isin(["clean", "rerun"])]))  # the doses leave it on purpose
    return out


def placebo_metrics(table: pd.DataFrame, curves: pd.DataFrame) -> dict[str, float]:
    """The placebo rows (the clean run again on an independent sampling stream: every rejection is a false
    positive): `placebo/rows`, `placebo/streams` (independent ones: rows of several arms on the same sampling stream
    share their completions' seeds, so they are one stream counted once, by its first row; runs archived without a
    `stream` column: rows whose seeds' gaps are the same numbers), and the false-positive rate over the independent
    streams, unadjusted and after Holm, each with its 95% interval for tests that share their clean runs
    (`stats.shared_control_rate_ci`, simulated from the design; Clopper-Pearson where none share: the streams of
    one arm are each paired with the same clean run of a seed, so their calls are correlated;
    `placebo/shared_controls` is how many clean references they share out between). 0 of 2 is compatible with a
    rate up to 84%, so a handful of placebo rows checks little; 0 of 20 on one clean reference with up to 29%
    (Clopper-Pearson, taking them as independent, would say 17%)."""
    placebo = table[table["kind"] == "placebo"]
    if placebo.empty:
        return {}
    runs = curves[curves["kind"] == "placebo"]
    if "stream" in runs:
        key = {k: tuple(sorted(set(d["stream"]))) for k, d in runs.groupby(["label", "arm"], sort=False)}
    else:
        g = seed_gaps(per_seed(curves))
        g = g[g["kind"] == "placebo"]
        key = {k: tuple(np.round(d.sort_values("seed")["gap"].to_numpy(float), 12))
               for k, d in g.groupby(["label", "arm"], sort=False)}
    seen, independent = set(), []
    for r in placebo.itertuples():
        k = key.get((r.label, r.arm))
        if k not in seen:
            seen.add(k)
            independent.append(r)
    n = len(independent)
    # the streams tested against one clean reference: the same arm, temperature and regime (`seed_gaps`' twin)
    clusters = pd.Series([tuple(getattr(r, k) for k in TWIN_KEYS if k != "seed") for r in independent]).value_counts()
    seeds = int(np.median([r.seeds for r in independent]))
    out = {"placebo/rows": float(len(placebo)), "placebo/streams": float(n),
           "placebo/shared_controls": float(len(clusters))}
    for name, col in (("false_positive_rate", "p"), ("false_positive_rate_holm", "p_holm")):
        k = sum(bool(getattr(r, col) < stats.ALPHA) for r in independent)
        lo, hi = stats.shared_control_rate_ci(k, seeds, clusters.tolist())
        out.update({f"placebo/{name}": k / n, f"placebo/{name}_ci_low": lo, f"placebo/{name}_ci_high": hi})
    return out


INITIAL = {"policy_reward": "initial_policy_reward", "heldout_acc": "initial_heldout_greedy_acc"}
# the initial policy_reward's standard error over its sampling draws, measured (`stats.fixed_items_mean_se`); absent
# from runs archived before it was kept, whose bounds take the binomial upper bound (`benchmarks.baseline_se`)
INITIAL_SE = "initial_policy_reward_se"
# + a draw index j: a run's mean over the held-out problems of its j-th draw of each (`execution.outcome_columns`)
SAMPLE_COLUMN = "policy_reward_sample"
# + k (and + k + "_se"): the initial policy scored on seed set k (`execution.seed_set_scores`, `se_check_sets`)
SET_COLUMN = "initial_policy_reward_set"


def initial_outcome(curves: pd.DataFrame, outcome: str) -> float:
    """The untrained policy's value of a policy outcome (`INITIAL`: one measurement per study); NaN for the
    training reward (no such column) or a run archived before it was measured."""
    col = INITIAL.get(outcome)
    return float(curves[col].dropna().mean()) if col in curves and curves[col].notna().any() else float("nan")


def outcome_gain(clean: pd.DataFrame, outcome: str) -> np.ndarray:
    """One clean configuration's gain in the tested outcome, per seed: its trained policy's outcome minus the initial
    policy's, scored the same way (`initial_outcomes`; one value for the study). The benchmark response is a fraction
    of it, so the BMR and the gaps it is compared with are in the same outcome. For the training reward (runs
    with `policy_samples` 0, or archived before the policy outcome) the training reward's gain, last minus first
    GAIN_FRAC of steps; for a policy outcome without the initial policy's (archived before it was measured),
    empty: no benchmark response, said so."""
    if outcome == "reward_final":
        first, last = reward_gain(clean)
        return (last - first).to_numpy()
    col = INITIAL["policy_reward"]
    if col not in clean or clean[col].isna().all():
        return np.array([])
    per = clean.groupby("seed")[["policy_reward", col]].first()
    return (per["policy_reward"] - per[col]).to_numpy()


def rejection_metrics(curves: pd.DataFrame) -> dict[str, float]:
    """Per run label and arm of a sequence-rejecting correction (Geo-RS: `geo_rs` in its name), grouped under the
    `geo_rs/` prefix: the surviving sequences per step (mean, min over steps and seeds), the steps with none (the
    update then moves on momentum only), the fraction of tokens masked, and the mean completion length the finding
    is scoped to (Geo-RS's geometric-mean band is tighter on short completions than on long ones)."""
    out = {}
    if "kept_seqs" not in curves:
        return out
    rej = curves[curves["arm"].str.contains("geo_rs")]
    for (label, arm), d in rej.groupby(["label", "arm"], sort=False):
        k = f"geo_rs/{label}/{arm}"
        out.update({f"{k}/survivors_mean": float(d["kept_seqs"].mean()), f"{k}/survivors_min": float(
            d["kept_seqs"].min()), f"{k}/zero_survivor_steps": float((d["kept_seqs"] == 0).sum()),
                    f"{k}/masked_frac": float(d["masked_frac"].mean()),
                    f"{k}/completion_tokens": float(d["completion_tokens"].mean())})
    return out


def mdes(t: pd.DataFrame, sd: str, level: float) -> list[float]:
    """Each row's MDE at `level` for the test its p comes from: its seeds' spread (column `sd`) floored by its
    outcome's step (`q_eff`, `stats.floored_sd`), so a row whose seeds tie reads the MDE of that test, not 0."""
    q = t["q_eff"] if "q_eff" in t else pd.Series(0.0, index=t.index)
    return [stats.minimal_detectable_gap(stats.floored_sd(s, qe), n, level)
            for s, qe, n in zip(t[sd], q, t["seeds"])]


def dose_achieved(r) -> bool:
    """An intended k3 dose (a ratio dose) is achieved when the measured k3 is within a factor 2 of it (the noise is
    drawn per token, so over a run's thousands of tokens the mean sits far closer; a factor 2 is a broken dose
    path)."""
    return bool(0.5 <= r.k3_achieved / r.k3_intended <= 2.0)
