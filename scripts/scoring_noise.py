"""What a notebook-08 study's tested outcome owes to its scoring, and what more draws would buy: a benchmark, not a
test.

Why: issue #58 asks for a study cheaper per unit of information and for the shared scoring seed's noise. Every run
of a study trained with `policy_samples` S >= 2 keeps each draw index's mean (`policy_reward_sample<j>`), its
scoring time (`t_policy`) and its wall time (`t_job`); this prints, from one such run's curves
(`mismatch_study.scoring_noise`, whose docstring says what each number compares):

- per k draws a problem (k = 1, 2, 4, ... S): the dose rows' gap sd pooled within rows, the clean runs' between-seed
  sd, a run's wall time at k, and against k = 2 (the studies of record's) the variance ratio, the time ratio and
  their product, the information per second of a run;
- the draw indices' common noise (two-way random effects over the clean runs of one arm): its sd in the S-draw
  outcome beside a run's own scoring noise and the policies' spread;
- per dose row, the part of that noise its gap keeps, common to the row's seeds (so in no interval over seeds),
  beside the row's standard error over seeds at k = 2.

    .venv/bin/python scripts/scoring_noise.py docs/runs/08_mismatch_cost/<run id> [--reference 2]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from rlwb.experiments.mismatch_study import scoring_noise


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--reference", type=int, default=2, help="the k the ratios are against (the studies' 2)")
    args = ap.parse_args()
    curves = pd.read_parquet(args.run_dir / "data" / "curves.parquet")
    r = scoring_noise.runs(curves)
    t = scoring_noise.value_of_samples(scoring_noise.gaps_by_samples(r), args.reference)
    t["clean_sd"] = np.sqrt(t["clean_var"])
    cols = ["k", "groups", "seed_df", "gap_sd", "clean_sd", "t_job_k", "variance_ratio", "time_ratio", "value_ratio"]
    print(f"{args.run_dir.name}: gaps by draws a problem (ratios against k = {args.reference})")
    print(t[[c for c in cols if c in t]].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    c = scoring_noise.common_noise(r)
    print(f"common noise over {c['runs']} clean runs ({c['arm']}) x {c['draws']} draw indices: "
          f"sd in the outcome {c['sd_common_outcome']:.4f} (F test p {c['p_common']:.3g}); a run's own scoring "
          f"{c['sd_scoring_outcome']:.4f}; the policies' spread {np.sqrt(c['var_run']):.4f}")
    g = scoring_noise.common_gap_noise(r)
    print("the draw indices' noise common to a dose row's seeds (not in an interval over seeds), beside its se over "
          "seeds at k = 2:")
    cols = ["label", "arm", "seeds", "p_common", *[c for c in g if c.startswith("sd_common_k")], "se_seeds_k2"]
    print(g[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"))


if __name__ == "__main__":
    main()
