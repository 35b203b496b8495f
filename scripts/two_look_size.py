"""What a notebook-08 study would train if its sequential rule sized by the two-look test: a benchmark, not a test.

Why: issue #58 asks for power >= 0.8 where a level is decided. The studies of record sized their second pass by a
fixed-n paired t test (`seed_power: fixed-n`), while each extended row is tested by the two-look test, whose power at
those seeds is lower (13-74% at the benchmark on the extended rows). This script redoes the rule on a study's own
first pass (`sequential.first_pass`: the same decision `analyze` redoes) with `seed_power: two-look` and each cap
given, and prints, per cap: the rows the rule extends, how many stay short of the target power at the cap, and the
runs the whole study would train (first pass + second pass, each counted once whatever its length: a count, not a
cost). Nothing is trained. What-ifs of the design: `--first N` a first pass of N seeds, `--row-level` each row sized
for power at one-sided alpha for that row alone (a two-sided test at 2 alpha: the level every benchmark bound is
stated at, one-sided 95%) instead of the family's alpha / m;
with `--refit` the levels fitted on that design's runs show what it gives up.

    .venv/bin/python scripts/two_look_size.py docs/runs/08_mismatch_cost/<run id> [--caps 24 48 96] [--futility 0 0.5] \
        [--first 6] [--row-level] [--refit]
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pandas as pd

from rlwb import params
from rlwb.core.measure import stats
from rlwb.experiments.mismatch_study import design, sequential

ROW_LEVEL = 2 * stats.ALPHA  # --row-level: a two-sided test at 2 alpha, one-sided alpha: each bound's own level


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--caps", type=int, nargs="+", default=[24, 48, 96], help="max_seeds values to size with")
    ap.add_argument("--futility", type=float, nargs="+", default=[0.0],
                    help="futility_power values (0: off): rows below it at the cap stay at the first pass")
    ap.add_argument("--refit", action="store_true",
                    help="also fit the levels on the runs each rule would have trained, where the study trained them "
                         "all (a subset of its runs), beside the fit on every run (minutes per fit)")
    ap.add_argument("--first", type=int, default=0, help="a first pass of this many seeds (0: the study's)")
    ap.add_argument("--row-level", action="store_true",
                    help="size each row for power at one-sided alpha for that row alone (the level each bound is "
                         "stated at), not at the family's alpha / m")
    args = ap.parse_args()
    p = params.load("08_mismatch_cost", [args.run_dir / "params.yaml"])
    curves = pd.read_parquet(args.run_dir / "data" / "curves.parquet")
    print(f"{args.run_dir.name}: {p.model}, the study's first pass {p.num_seeds} seeds, target power "
          f"{p.target_power}; the study sized by {p.seed_power} at cap {p.max_seeds}, every rule below by two-look at "
          "the cap it names"
          + (f", on a first pass of {args.first} seeds" if args.first else "")
          + (", each row sized at one-sided alpha for that row alone" if args.row_level else ""))
    fits: dict = {}
    level = ROW_LEVEL if args.row_level else None
    for cap in args.caps:
        for futility in args.futility:
            q = replace(p, seed_power="two-look", max_seeds=cap, futility_power=futility,
                        num_seeds=args.first or p.num_seeds)
            calls, m = sequential.first_pass(curves, q, level=level)
            first = design.training_runs(q)
            second = sequential.second_pass_runs(calls, first, q)
            short = [f"{c.label} {c.arm} ({c.power_two_look:.2f})" for c in calls if c.capped]
            futile = [f"{c.label} {c.arm}" for c in calls if c.futile]
            at = f"two-sided {level:g}" if level else f"alpha / m, m = {m}"
            print(f"  cap {cap}, futility {futility}: sized at {at}, rows called {len(calls)}, extended "
                  f"{sum(c.seeds > q.num_seeds for c in calls)}, short of the target at the cap {len(short)}"
                  f"{': ' + ', '.join(short) if short else ''}; futile {len(futile)}"
                  f"{': ' + ', '.join(futile) if futile else ''}; runs {len(first)} + {len(second)} = "
                  f"{len(first) + len(second)}")
            for c in calls:
                print(f"    {c.label:>16} {c.arm:<12} seeds {c.seeds:>3}  two-look power {c.power_two_look:.2f}"
                      + ("  futile" if c.futile else ""))
            if args.refit:
                refit(curves, p, q, first + second, fits)


def refit(curves: pd.DataFrame, p, q, runs, fits: dict) -> None:
    """The benchmark levels fitted on the runs a rule `q` trains (`runs`: first and second pass), where the study's
    curves hold them all, beside those the study's own analysis (`p`) fits on every run: what the rule's seeds give
    the levels. `fits` keeps the whole study's fit between calls."""
    from rlwb.experiments import mismatch_cost as mc

    want = {(j.label, j.arm, j.seed) for j in runs}
    have = set(curves.groupby(["label", "arm", "seed"]).groups)
    if not want <= have:
        print(f"      refit: the study did not train {len(want - have)} of this rule's runs; not refitted")
        return
    sub = curves[[k in want for k in zip(curves["label"], curves["arm"], curves["seed"])]]
    if "full" not in fits:
        fits["full"] = mc.analyze(curves, p).benchmarks.set_index(["name", "arm"])
    full, part = fits["full"], mc.analyze(sub, q).benchmarks.set_index(["name", "arm"])
    print(f"      levels (keep k3 below, status; BMDL-BMDU) on every run / on this rule's {len(want)} runs:")
    for key in full.index:
        a, b = full.loc[key], part.loc[key]
        print(f"      {key[0]:>9} {key[1]:<12} {a.keep_below:9.2e} {a.status:<20} {a.bmdl:9.2e}-{a.bmdu:9.2e}"
              f"  |  {b.keep_below:9.2e} {b.status:<20} {b.bmdl:9.2e}-{b.bmdu:9.2e}")


if __name__ == "__main__":
    main()
