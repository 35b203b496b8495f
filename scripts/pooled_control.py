"""Would a pooled clean control buy notebook 08's study information? A measurement on a run of record, not a test.

Why: issue #58 asks what can be shared between the arms of a seed to make a study cheaper per unit of information.
Each arm trains its own clean run (at the fp32 base engine those of bypass, decoupled and TIS sample the same
batches and score the same outcome, though their losses differ at float level: the script says at how many seeds the
outcome differs). What a design could share is the *comparison*: each dose row's gap is paired by seed
(dosed minus clean, seed by seed), so each gap carries one clean run's noise per seed. Were the clean outcome
pooled (every clean run, and every placebo stream: the clean bypass run on another sampling stream, an independent
draw of the same outcome), a gap would be the dosed mean minus the pool's mean, its variance about
sd_dose^2 / n + sd_clean^2 / N instead of (sd_dose^2 + sd_clean^2 - 2 rho sd_dose sd_clean) / n: with an endless
pool the ratio is 1 + r^2 - 2 rho r (r = sd_clean / sd_dose). Pooling gains where rho (the dosed and clean
outcomes' correlation across seeds) is small or negative and the clean spread is not small beside the dosed one; it
loses where the pairing is informative (rho large). It also assumes the placebo streams are draws of the clean
outcome: the script prints the clean runs' mean minus the placebo streams' on the seeds that have both.

Per dose row (first PPO regime, study horizon, the tested outcome): n seeds, rho, both sds, both gaps, and each
estimator's standard error from one bootstrap over seeds (each resampled seed brings its dosed run, its clean run and
its placebo draws, so the pool's covariance with the row is in both), and their ratio of variances: the factor by
which the pooled design needs fewer seeds for the same standard error. Summaries over the rows the sequential rule
extended (n above the first pass), where the seeds are spent.

    .venv/bin/python scripts/pooled_control.py docs/runs/08_mismatch_cost/<run id> [...] [--boot 2000]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd


def outcomes(run: Path) -> tuple[pd.DataFrame, str, dict, int]:
    """Each run's tested outcome, one row per (label, arm, seed), first PPO regime at the study's horizon, from the
    study's own per-run table (`analysis.per_seed`, the outcome `analysis.outcome_of` picks, as its gaps use); the
    outcome's column; the run's params (its params.yaml: a study's file says every value the design depends on);
    and how many runs the study trained, every regime and horizon."""
    from rlwb import params as rlwb_params
    from rlwb.experiments.mismatch_study import analysis

    p = vars(rlwb_params.load("08_mismatch_cost", [str(run / "params.yaml")]))
    s = analysis.per_seed(pd.read_parquet(run / "data" / "curves.parquet"))
    col = analysis.outcome_of(s)
    first = s[(s["updates"] == p["updates_per_batch"][0]) & (s["epochs"] == p["ppo_epochs"][0])
              & (s["horizon"] == p["steps"])]  # the first regime, at the study's horizon (a long row ends later)
    return first[["label", "arm", "seed", col]].rename(columns={col: "y"}), col, p, len(s)


def compare(run: Path, boot: int, seed: int = 0) -> tuple[pd.DataFrame, dict]:
    """Per dose row: both gaps, their standard errors from one bootstrap over seeds and their variance ratio; and
    the study's `runs` and first pass (`first`, seeds per row before the sequential rule)."""
    y, col, p, runs = outcomes(run)
    clean = y[y["label"] == "clean"]
    by_arm = clean.pivot(index="seed", columns="arm", values="y")
    base = "none@engine" if "none@engine" in by_arm else by_arm.columns[0]  # bypass: the placebo streams' arm
    differ = int((by_arm.sub(by_arm[base], axis=0).abs().fillna(0) > 0).any(axis=1).sum())
    placebo = y[y["label"].str.startswith("placebo")]
    print(f"{run.name}: outcome `{col}`; clean runs {len(by_arm)} seeds, the arms' clean runs "
          f"{'outcome equal at every seed' if not differ else f'outcome equal but at {differ} seed(s)'} "
          f"(each arm trains its own); "
          f"placebo draws {len(placebo)} ({placebo['label'].nunique()} streams); clean sd {by_arm[base].std():.4f}, "
          f"placebo sd {placebo['y'].std():.4f}")
    # the pool: one clean draw per seed (bypass's: the arms' are equal but where `differ`) and every placebo draw
    # (bypass's clean run on other sampling streams), assumed draws of one outcome: checked below, on the seeds
    # that have both, as the mean over seeds of (clean - the seed's placebo mean), with its t over seeds
    pool = pd.concat([by_arm[base].dropna().rename("y").reset_index(), placebo[["seed", "y"]]])
    if len(placebo):
        diff = by_arm[base].reindex(placebo["seed"].unique()) - placebo.groupby("seed")["y"].mean()
        t = diff.mean() / (diff.std(ddof=1) / np.sqrt(len(diff)))
        print(f"  clean minus placebo on the {len(diff)} seeds with both: {diff.mean():+.4f} (t {t:.1f} over seeds): "
              f"the pooled gap of a row on those seeds moves by about that")
    per_seed = pool.groupby("seed")["y"].agg(["sum", "count"])
    seeds = np.array(sorted(by_arm.index))
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(seeds), size=(boot, len(seeds)))
    first = int(p["num_seeds"])  # the first pass: a row with more seeds was extended by the sequential rule
    psum = per_seed["sum"].reindex(seeds).fillna(0).to_numpy()
    pcnt = per_seed["count"].reindex(seeds).fillna(0).to_numpy()
    pool_means = np.array([psum[idx].sum() / pcnt[idx].sum() for idx in draws])  # each resample's, for every row
    rows = []
    skip = ("clean", "rerun")
    for (label, arm), g in y.groupby(["label", "arm"]):
        if label in skip or label.startswith("placebo") or "@T" in label:  # controls, and T-1 pairs of their own
            continue
        yd = g.set_index("seed")["y"]
        yc = by_arm[arm if arm in by_arm else base].reindex(yd.index)
        if len(yd) < 4 or yc.isna().any():
            continue
        gap = yd - yc
        if gap.std() == 0:  # bitwise the clean run (a blind control): nothing to estimate
            continue
        in_row = np.isin(seeds, yd.index)
        yd_all = yd.reindex(seeds).to_numpy()
        gap_all = gap.reindex(seeds).to_numpy()
        paired, pooled = [], []
        for idx, pool_mean in zip(draws, pool_means, strict=True):
            m = in_row[idx]
            if m.sum() < 2:
                continue
            paired.append(gap_all[idx][m].mean())
            pooled.append(yd_all[idx][m].mean() - pool_mean)
        rows.append({"row": f"{label} {arm}", "n": len(yd), "rho": float(np.corrcoef(yd, yc)[0, 1]),
                     "sd_dose": yd.std(), "sd_clean": yc.std(), "gap_paired": gap.mean(),
                     "gap_pooled": yd.mean() - pool["y"].mean(), "se_paired": float(np.std(paired)),
                     "se_pooled": float(np.std(pooled))})
    r = pd.DataFrame(rows)
    r["variance_ratio"] = (r["se_paired"] / r["se_pooled"]) ** 2
    r["extended"] = r["n"] > first
    r["capped"] = r["n"] >= int(p["max_seeds"]) if int(p["max_seeds"]) else False  # at the rule's cap
    # the pool's effective size: the clean runs whose mean would have the pool mean's bootstrap variance
    n_eff = by_arm[base].var() / np.var(pool_means)
    print(f"  pool: {len(pool)} draws, {int(pcnt[np.isin(seeds, placebo['seed'].unique())].sum())} of them on the "
          f"{placebo['seed'].nunique()} first-pass seeds; as precise as {n_eff:.0f} independent clean runs")
    return r, {"runs": runs, "first": first}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--boot", type=int, default=2000, help="bootstrap resamples of the seeds")
    args = ap.parse_args()
    pd.set_option("display.width", 220)
    for run in args.runs:
        r, study = compare(run, args.boot)
        print(r.drop(columns=["extended", "capped"]).round(4).to_string(index=False))
        ext = r[r["extended"]]
        print(f"  variance ratio (paired / pooled; > 1: pooling needs fewer seeds): all {len(r)} rows median "
              f"{r['variance_ratio'].median():.2f}; the {len(ext)} extended rows median "
              f"{ext['variance_ratio'].median():.2f}, mean {ext['variance_ratio'].mean():.2f}, range "
              f"{ext['variance_ratio'].min():.2f}-{ext['variance_ratio'].max():.2f}; rho median "
              f"{r['rho'].median():.2f} over all rows, {ext['rho'].median():.2f} over the extended")
        # in runs: each extended row cut by the median factor, or by its own (at least 1), never below the first
        # pass; a capped row's seeds buy power below the target, so a pooled design would keep them (second line)
        total = study["runs"]
        for name, rows in (("every extended row", ext), ("the extended rows below the cap", ext[~ext["capped"]])):
            cut = [float((rows["n"] - np.maximum(study["first"], rows["n"] / f)).sum())
                   for f in (ext["variance_ratio"].median(), rows["variance_ratio"].clip(lower=1))]
            print(f"  runs: {name} ({len(rows)}, {int(rows['n'].sum())} runs) would need {cut[0]:.0f} fewer at the "
                  f"median factor, {cut[1]:.0f} at each row's own: {total / (total - cut[0]):.2f}x and "
                  f"{total / (total - cut[1]):.2f}x the study's {total} runs")
        print()


if __name__ == "__main__":
    main()
