"""Coverage by simulation of the benchmark-dose lower bound (`rlwb.core.measure.benchmark_dose.fit_bmd`): on
exponential, Hill and linear truths at notebook 08's design (doses 0, 0.03, 0.1, 0.3, 1; clean gain 0.3; seed sd
0.085; BMR 25% of the clean gain), the share of simulated studies whose BMDL lies at or below the true BMD, with
its Clopper-Pearson 95% interval; optionally the same for BMDS's selection rule (its recommended model's profile
BMDL), which the model average replaces. Prints a markdown table (docs/benchmark_dose.md has the measured one).

    .venv/bin/python scripts/bmd_coverage.py                       # 400 studies per cell, 10 and 30 seeds
    .venv/bin/python scripts/bmd_coverage.py --studies 100 --bmds-rule --jobs 2
    .venv/bin/python scripts/bmd_coverage.py --sequential 8 --seeds 30 --studies 200 --boot 500   # the rule decides
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor

from rlwb.core.measure import bmd_coverage as cov
from rlwb.core.measure import stats


def cell(args):
    truth, seeds, studies, n_boot, seed, bmds_rule, rho, dose_scale, bound, dose_seeds, first = args
    t = time.process_time()
    if first:  # the sequential rule decides each study's second pass (an experiments-layer simulation)
        from rlwb.experiments.mismatch_study import sequential_coverage as sc

        r = sc.simulate_sequential_coverage(truth, studies, num_seeds=first, max_seeds=seeds, n_boot=n_boot,
                                            seed=seed)
        return r.coverage, (time.process_time() - t) / studies, r
    c = cov.simulate_coverage(truth, seeds, studies, n_boot=n_boot, seed=seed, bmds_rule=bmds_rule, rho=rho,
                             dose_scale=dose_scale, bound=bound, dose_seeds=dose_seeds)
    return c, (time.process_time() - t) / studies, None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--truths", nargs="+", default=list(cov.TRUTHS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[10, 30])
    ap.add_argument("--studies", type=int, default=400)
    ap.add_argument("--boot", type=int, default=1000)
    ap.add_argument("--rho", type=float, default=0.0, help="correlation of one seed's clean and dosed runs")
    ap.add_argument("--dose-scale", default="linear", choices=["linear", "log"])
    ap.add_argument("--bound", default="lowest", choices=["lowest", "average"],
                    help="the BMDL reported: lowest of the average's and each passing model's, or the average's")
    ap.add_argument("--bmds-rule", action="store_true", help="also BMDS's selection rule (slower)")
    ap.add_argument("--dose-seeds", nargs="+", type=int, default=None,
                    help="seeds run at each dose (the clean run has all --seeds): a second pass that extended some "
                         "doses, e.g. 8 30 30 8 with --seeds 30")
    ap.add_argument("--sequential", type=int, default=None, metavar="FIRST",
                    help="the sequential rule decides the second pass: a first pass of FIRST seeds, then at most "
                         "--seeds per dose where the rule extends (sequential_coverage)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=2026)
    a = ap.parse_args()
    if a.sequential and (a.dose_seeds or a.bmds_rule or a.rho or a.dose_scale != "linear" or a.bound != "lowest"):
        ap.error("--sequential takes none of --dose-seeds, --bmds-rule, --rho, --dose-scale, --bound")
    cells = [(t, s, a.studies, a.boot, a.seed + 7 * i, a.bmds_rule, a.rho, a.dose_scale, a.bound, a.dose_seeds,
              a.sequential) for i, (t, s) in enumerate((t, s) for t in a.truths for s in a.seeds)]
    with ProcessPoolExecutor(a.jobs) as ex:
        out = list(ex.map(cell, cells))
    print(f"BMR 25% of the clean gain, doses 0 + {list(cov.DESIGN_08)}, sd {cov.SD_08}, rho {a.rho}, "
          f"{a.boot} resamples, dose scale {a.dose_scale}, bound {a.bound}"
          + (f", seeds per dose {a.dose_seeds}" if a.dose_seeds else "")
          + (f", the sequential rule: a first pass of {a.sequential} seeds, at most the seeds column per dose"
             if a.sequential else "") + "\n")
    head = "| truth | seeds | studies | bounded | BMDL <= true BMD | 95% interval | median BMDL / BMD |"
    if a.bmds_rule:
        head += " BMDS rule (recommended model's profile BMDL) |"
    if a.sequential:
        head += " studies extended | runs per study (first pass alone) |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for c, cpu, sq in out:
        row = (f"| {c.truth} | {c.seeds} | {c.studies} | {c.bounded} | {c.hits}/{c.bounded} = {c.rate:.1%} | "
               f"[{c.low:.1%}, {c.high:.1%}] | {c.median_bmdl_ratio:.2f} |")
        if a.bmds_rule:
            lo, hi = stats.proportion_ci(c.bmds_hits, c.bmds_bounded, method="exact")
            row += (f" {c.bmds_hits}/{c.bmds_bounded} = {c.bmds_hits / max(c.bmds_bounded, 1):.1%} "
                    f"[{lo:.1%}, {hi:.1%}] |")
        if sq is not None:
            row += f" {sq.extended:.0%} | {sq.mean_runs:.1f} ({sq.first_pass_runs}) |"
        print(row + f"  <!-- {cpu:.2f} s CPU per study -->")


if __name__ == "__main__":
    main()
