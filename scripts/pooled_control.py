"""Would a pooled clean control buy notebook 08's study information? A measurement on a run of record, not a test.

Why: issue #58 asks what can be shared between the arms of a seed to make a study cheaper per unit of information.
The clean run is shared already (at the fp32 base engine the clean runs of bypass, decoupled and TIS are bitwise one
run: the script says whether they are). What is not shared is the *comparison*: each dose row's gap is paired by seed
(dosed minus clean, seed by seed), so each gap carries one clean run's noise per seed. Were the clean outcome
pooled (every clean run, and every placebo stream: the clean bypass run on another sampling stream, an independent
draw of the same outcome), a gap would be the dosed mean minus the pool's mean, its variance about
sd_dose^2 / n + sd_clean^2 / N instead of (sd_dose^2 + sd_clean^2 - 2 rho sd_dose sd_clean) / n. Pooling gains
where rho (the dosed and clean outcomes' correlation across seeds) is small and the clean spread is not small
beside the dosed one; it loses where the pairing is informative (rho large).

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
import yaml


def outcomes(run: Path) -> tuple[pd.DataFrame, str]:
    """Each run's tested outcome (the last step's row of its curve), one row per (label, arm, seed), first PPO
    regime at the study's horizon; and the outcome's column."""
    c = pd.read_parquet(run / "data" / "curves.parquet")
    d = pd.read_parquet(run / "data" / "doses.parquet")
    col = str(d["outcome"].dropna().iloc[0])
    c = c[(c["updates"] == 1) & (c["epochs"] == 1)] if "updates" in c else c
    last = c[c["step"] == c.groupby(["label", "arm", "seed"])["step"].transform("max")]
    steps = int((yaml.safe_load((run / "params.yaml").read_text()) or {}).get("steps", 30))
    last = last[last["step"] == steps - 1]  # the study's horizon: a long row's runs end later
    return last[["label", "arm", "seed", col]].rename(columns={col: "y"}), col


def compare(run: Path, boot: int, seed: int = 0) -> pd.DataFrame:
    y, col = outcomes(run)
    clean = y[y["label"] == "clean"]
    by_arm = clean.pivot(index="seed", columns="arm", values="y")
    differ = int((by_arm.sub(by_arm.iloc[:, 0], axis=0).abs().fillna(0) > 0).any(axis=1).sum())
    placebo = y[y["label"].str.startswith("placebo")]
    print(f"{run.name}: outcome `{col}`; clean runs {len(by_arm)} seeds, the arms' clean runs "
          f"{'bitwise one run' if not differ else f'one run but at {differ} seed(s)'}; placebo draws {len(placebo)} "
          f"({placebo['label'].nunique()} streams); clean sd {by_arm.iloc[:, 0].std():.4f}, "
          f"placebo sd {placebo['y'].std():.4f}")
    # the pool: one clean draw per seed (the first arm's, bypass: the arms' are one run but where `differ`) and
    # every placebo draw (bypass's clean run on other sampling streams)
    pool = pd.concat([by_arm.iloc[:, 0].dropna().rename("y").reset_index(), placebo[["seed", "y"]]])
    per_seed = pool.groupby("seed")["y"].agg(["sum", "count"])
    seeds = np.array(sorted(by_arm.index))
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(seeds), size=(boot, len(seeds)))
    first = int(y[y["label"] == "placebo"]["seed"].nunique()) if len(placebo) else None
    rows = []
    skip = ("clean", "rerun")
    for (label, arm), g in y.groupby(["label", "arm"]):
        if label in skip or label.startswith("placebo") or "@T" in label:  # controls, and T-1 pairs of their own
            continue
        yd = g.set_index("seed")["y"]
        yc = by_arm[arm].reindex(yd.index) if arm in by_arm else by_arm.iloc[:, 0].reindex(yd.index)
        if len(yd) < 4 or yc.isna().any():
            continue
        gap = yd - yc
        if gap.std() == 0:  # bitwise the clean run (a blind control): nothing to estimate
            continue
        in_row = np.isin(seeds, yd.index)
        yd_all = yd.reindex(seeds).to_numpy()
        gap_all = gap.reindex(seeds).to_numpy()
        psum, pcnt = per_seed["sum"].reindex(seeds).fillna(0).to_numpy(), per_seed["count"].reindex(seeds).fillna(0)
        pcnt = pcnt.to_numpy()
        paired, pooled = [], []
        for idx in draws:
            m = in_row[idx]
            if m.sum() < 2:
                continue
            paired.append(gap_all[idx][m].mean())
            pooled.append(yd_all[idx][m].mean() - psum[idx].sum() / pcnt[idx].sum())
        rows.append({"row": f"{label} {arm}", "n": len(yd), "rho": float(np.corrcoef(yd, yc)[0, 1]),
                     "sd_dose": yd.std(), "sd_clean": yc.std(), "gap_paired": gap.mean(),
                     "gap_pooled": yd.mean() - pool["y"].mean(), "se_paired": float(np.std(paired)),
                     "se_pooled": float(np.std(pooled))})
    r = pd.DataFrame(rows)
    r["variance_ratio"] = (r["se_paired"] / r["se_pooled"]) ** 2
    r["extended"] = r["n"] > (first or 8)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--boot", type=int, default=2000, help="bootstrap resamples of the seeds")
    args = ap.parse_args()
    pd.set_option("display.width", 220)
    for run in args.runs:
        r = compare(run, args.boot)
        print(r.drop(columns="extended").round(4).to_string(index=False))
        ext = r[r["extended"]]
        print(f"  variance ratio (paired / pooled; > 1: pooling needs fewer seeds): all {len(r)} rows median "
              f"{r['variance_ratio'].median():.2f}; the {len(ext)} extended rows median "
              f"{ext['variance_ratio'].median():.2f}, mean {ext['variance_ratio'].mean():.2f}, range "
              f"{ext['variance_ratio'].min():.2f}-{ext['variance_ratio'].max():.2f}; rho median "
              f"{r['rho'].median():.2f} (extended {ext['rho'].median():.2f})\n")


if __name__ == "__main__":
    main()
