"""The fewest runs a notebook-08 design with a study's rows trains for #58's power at the benchmark: a benchmark.

Why: issue #58 asks for both "power >= 0.8 to detect the BMR at the doses that bracket each BMD" and "each model's
study <= 2 hours on 2 idle cores". This script asks whether the two fit together on a study's own measurements, by
giving the power ask the cheapest design with the study's own rows: an oracle that knows beforehand, from the whole
study (every seed), which doses bracket each level's BMD and each row's per-seed spread, so it needs no first pass
and no second look. It trains

- each bracketing dose row at the fewest seeds whose fixed-n paired t test detects a gap equal to the row's BMR with
  power >= `--power` (`stats.paired_t_power`, the spread `stats.floored_sd` of the row's gaps over every seed), at the
  level the family's Holm test needs for its first rejection (alpha / m, two-sided: the level the studies size at) and,
  as the cheapest reading of the ask, at alpha one-sided for each row alone;
- each clean twin at the most seeds of its arm's bracketing rows (its rows are paired with it by seed);
- every other row the study has (the other doses of each curve, the engine points, the controls, the placebo streams)
  at `--floor` seeds, the least a row is given;
- no row past `--cap` seeds, if one is given (the rows it stops are counted short of the power).

A floor for a design with this study's rows, controls and Holm family (the doses, engine points and 20 placebo
streams issue #58 asks for), at these point estimates of the spread: a real design of that kind trains more, since it
must find the bracketing doses first (a first pass) and a sequential rule's two-look test has less power at the same
seeds than the fixed-n test counted here. What it does not bound: a design with other rows or controls (the runs
without the placebo streams are printed), and the spread's own uncertainty (n grows with sd^2: each row's seeds at
the ends of its sd's 95% chi-square interval are printed). The family's level is Bonferroni's alpha / m, Holm's first
step, which no later step exceeds (conservative for the rows Holm rejects after the first). The runs divide by the
runs per hour given (`--rates`: measured ones, e.g. `scripts/study_cost.py`'s) into hours, and the rate 2 hours would
need is printed. Runs are counted, not weighted by length (every row of the power studies is a 30-step, one-update
run). Nothing is trained.

    .venv/bin/python scripts/study_floor.py docs/runs/08_mismatch_cost/<run id> --rates 235 372 [--floor 8 4] [--cap 48]
"""

from __future__ import annotations

import argparse
from collections import namedtuple
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import chi2

from rlwb import params
from rlwb.core.measure import stats
from rlwb.experiments.mismatch_study import design, sequential
from rlwb.experiments.mismatch_study.benchmarks import row_studies
from rlwb.experiments.mismatch_study.comparisons import study_tests

Call = namedtuple("Call", "label arm seeds")  # what `sequential.twin_seeds` reads of a call
MAX_N = 400


def seeds_for(bmr: float, sd: float, level: float, power: float) -> int:
    """The fewest seeds n >= 2 whose two-sided paired t test at `level` detects `bmr` with `power`; MAX_N if none
    (counted short of the power). Not the rule's `sequential.seeds_for`: one fixed-n look, no second pass to size."""
    if not (np.isfinite(sd) and sd > 0):
        return 2
    return next((n for n in range(2, MAX_N + 1) if stats.paired_t_power(bmr, sd, n, level) >= power), MAX_N)


def bracketing(curves: pd.DataFrame, p) -> tuple[list[dict], int]:
    """Each level's bracketing dose rows on the whole study (every seed): benchmark row, arm, dose label, BMR, the
    row's floored per-seed sd and its k3; and the family size m."""
    tests = study_tests(curves, p)
    rows = tests.table.set_index(["label", "arm"])
    doses = {(r.name, r.arm): (r.labels, np.asarray(r.doses, float)) for r in row_studies(curves, tests.table)}
    out = []
    for b in tests.bench.itertuples():
        bmr = float(b.bmr)
        if not (np.isfinite(bmr) and bmr > 0 and np.isfinite(b.bmd)) or (b.name, b.arm) not in doses:
            continue
        labels, x = doses[(b.name, b.arm)]
        for label in sequential.bracketing(labels, x, float(b.bmd)):
            r = rows.loc[(label, b.arm)]
            v = x[list(labels).index(label)]
            sd = stats.floored_sd(float(r.gap_sd), float(r.q_eff))
            df = int(r.seeds) - 1  # the sd's 95% interval: df * sd^2 / sd_true^2 is chi-square(df)
            lo, hi = (sd * np.sqrt(df / chi2.ppf(q, df)) for q in (0.975, 0.025))
            out.append({"level": b.name, "arm": b.arm, "label": label, "bmr": bmr, "k3": float(v), "sd": sd,
                        "sd_lo": lo, "sd_hi": hi, "seeds_run": int(r.seeds)})
    return out, int(tests.family["family/tests"])


def floor_runs(p, seeds: dict[tuple[str, str], int], floor: int, placebo: bool = True) -> int:
    """Runs of the oracle design: every row of the study at `floor` seeds (its placebo streams too, or none), the
    bracketing rows at `seeds`, their clean twins at their arm's most (`sequential.twin_seeds`, the rule's own
    pairing)."""
    q = replace(p, num_seeds=floor, max_seeds=max([floor, *seeds.values()]),
                placebo_streams=p.placebo_streams if placebo else 0)
    first = design.training_runs(q)
    calls = [Call(label, arm, n) for (label, arm), n in seeds.items()]
    return len(first) + len(sequential.second_pass_runs(calls, first, q))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--rates", type=float, nargs="+", required=True, help="runs per hour to convert runs into hours")
    ap.add_argument("--floor", type=int, nargs="+", default=[8, 4], help="seeds of every row that brackets nothing")
    ap.add_argument("--power", type=float, default=0.8)
    ap.add_argument("--cap", type=int, default=MAX_N, help="the most seeds a row gets (short of the power above it)")
    args = ap.parse_args()
    p = params.load("08_mismatch_cost", [args.run_dir / "params.yaml"])
    curves = pd.read_parquet(args.run_dir / "data" / "curves.parquet")
    brackets, m = bracketing(curves, p)
    levels = {"family (alpha/m, two-sided)": stats.ALPHA / m, "row alone (alpha, one-sided)": 2 * stats.ALPHA}
    trained = len(curves.groupby(["label", "arm", "seed", "stream"]))
    print(f"{args.run_dir.name}: {p.model}, {trained} runs trained on {curves['seed'].nunique()} seeds, family m = "
          f"{m}; bracketing rows of the levels with a BMD (the whole study's), seeds for power {args.power} "
          "at the BMR at the family's level, then the row's alone [at the ends of the sd's 95% interval]:")
    table = []
    for b in brackets:
        ns = {name: seeds_for(b["bmr"], b["sd"], lv, args.power) for name, lv in levels.items()}
        ci = [f"{ns[k]} [{seeds_for(b['bmr'], b['sd_lo'], lv, args.power)}-"
              f"{seeds_for(b['bmr'], b['sd_hi'], lv, args.power)}]" for k, lv in levels.items()]
        table.append({**b, **ns})
        print(f"  {b['level']:>9} {b['arm']:<12} {b['label']:>14} k3 {b['k3']:.1e}  BMR {b['bmr']:.3f}  sd "
              f"{b['sd']:.3f} ({b['seeds_run']} seeds)  sd/BMR {b['sd'] / b['bmr']:.2f}  seeds: " + ", ".join(ci))
    for name in levels:
        seeds: dict[tuple[str, str], int] = {}
        for t in table:
            seeds[(t["label"], t["arm"])] = min(args.cap, max(seeds.get((t["label"], t["arm"]), 0), t[name]))
        short = sum(t[name] > args.cap or t[name] >= MAX_N for t in table)
        for floor in args.floor:
            at = {k: max(v, floor) for k, v in seeds.items()}
            runs, bare = floor_runs(p, at, floor), floor_runs(p, at, floor, placebo=False)
            hours = ", ".join(f"{runs / r:.1f} h at {r:g} runs/h" for r in args.rates)
            hours += f" (2 hours need {runs / 2:.0f} runs/h)"
            cut = f"; {short} rows short of the power at the cap {args.cap}" if short else ""
            print(f"  power at the {name}, other rows at {floor} seeds: {runs} runs ({runs / trained:.2f} of the "
                  f"{trained} trained; {bare} without the placebo streams); {hours}{cut}")


if __name__ == "__main__":
    main()
