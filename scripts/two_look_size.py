"""What a notebook-08 study would train if its sequential rule sized by the two-look test: a benchmark, not a test.

Why: issue #58 asks for power >= 0.8 where a level is decided. The studies of record sized their second pass by a
fixed-n paired t test (`seed_power: fixed-n`), while each extended row is tested by the two-look test, whose power at
those seeds is lower (13-74% at the benchmark on the extended rows). This script redoes the rule on a study's own
first pass (`sequential.first_pass`: the same decision `analyze` redoes) with `seed_power: two-look` and each cap
given, and prints, per cap: the rows the rule extends, how many stay short of the target power at the cap, and the
runs the whole study would train (first pass + second pass, each counted once whatever its length: a count, not a
cost). Nothing is trained.

    .venv/bin/python scripts/two_look_size.py docs/runs/08_mismatch_cost/<run id> [--caps 24 48 96]
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pandas as pd

from rlwb import params
from rlwb.experiments.mismatch_study import design, sequential


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--caps", type=int, nargs="+", default=[24, 48, 96], help="max_seeds values to size with")
    args = ap.parse_args()
    p = params.load("08_mismatch_cost", [args.run_dir / "params.yaml"])
    curves = pd.read_parquet(args.run_dir / "data" / "curves.parquet")
    print(f"{args.run_dir.name}: {p.model}, first pass {p.num_seeds} seeds, target power {p.target_power}")
    for cap in args.caps:
        q = replace(p, seed_power="two-look", max_seeds=cap)
        calls, m = sequential.first_pass(curves, q)
        first = design.training_runs(q)
        second = sequential.second_pass_runs(calls, first, q)
        short = [f"{c.label} {c.arm} ({c.power_two_look:.2f})" for c in calls if c.capped]
        print(f"  cap {cap}: family m = {m}, rows extended {len(calls)}, short of the target at the cap "
              f"{len(short)}{': ' + ', '.join(short) if short else ''}; runs {len(first)} + {len(second)} = "
              f"{len(first) + len(second)}")
        for c in calls:
            print(f"    {c.label:>16} {c.arm:<12} seeds {c.seeds:>3}  two-look power {c.power_two_look:.2f}")


if __name__ == "__main__":
    main()
