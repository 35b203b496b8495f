"""Notebook 08's runs of record refitted by today's analysis (`mismatch_cost.reanalyze`: the benchmark dose by EPA's
convention on the k3 a dose gives the initial policy), printed as markdown: per study, the count of each status, and
per benchmark row of the first PPO regime at the study's horizon its doses, status, BMD, BMDL, BMDU, the log dose
scale's status and whether a level may be quoted. The runs themselves are not changed (their reports say what the
analysis of their day said); docs/benchmark_dose.md quotes this script's output.

    .venv/bin/python scripts/refit_08.py                 # every study run of record the audit reads
    .venv/bin/python scripts/refit_08.py docs/runs/08_mismatch_cost/<run id> ...
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rlwb import params
from rlwb.core.measure import dose_response
from rlwb.core.rl.mismatch_doses import dose_kinds
from rlwb.experiments import mismatch_cost
from rlwb.experiments.mismatch_study.benchmarks import MIN_DOSES
from rlwb.experiments.wording.mismatch_cost import quotable


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", help="run directories (default: the study runs of record the audit reads, every "
                    "study of a model's greatest breadth: `dose_response.study_benchmarks`)")
    a = ap.parse_args()
    runs = [Path(r) for r in a.runs] or [Path(s["path"]) for s in dose_response.study_benchmarks(
        None, dose_params=[k.param for k in dose_kinds()], min_doses=MIN_DOSES)]
    for run in runs:
        p = params.load("08_mismatch_cost", [run / "params.yaml"])
        b = mismatch_cost.reanalyze(run, p).benchmarks
        counts = b["status"].str.replace(r" \(.*", "", regex=True).value_counts().to_dict()
        n_q = sum(quotable(r) for r in b.itertuples())
        print(f"\n### `{p.model}`: {run.name} ({int(b['seeds'].max())} seeds)\n")
        print(f"{len(b)} rows: " + ", ".join(f"{v} {k}" for k, v in counts.items()) + f"; {n_q} quotable; "
              f"{int((~b['scale_agree']).sum())} where the linear and log dose scales disagree\n")
        print("| row | arm | doses | k3_initial | status (linear) | BMD | BMDL | BMDU | log scale | quotable |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in b.itertuples():
            print(f"| {r.name} | `{r.arm}` | {r.doses} | {r.k3_min:.1e}–{r.k3_max:.1e} | {r.status} | {r.bmd:.2g} | "
                  f"{r.bmdl:.2g} | {r.bmdu:.2g} | {r.status_log}"
                  + (f" ({r.bmdl_log:.2g})" if r.status_log == "bounded" else "")
                  + f" | {'**yes**' if quotable(r) else 'no'} |")


if __name__ == "__main__":
    main()
