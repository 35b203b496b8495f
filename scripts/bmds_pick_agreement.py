"""How often `benchmark_dose.bmds_recommend` picks the model EPA's own BMDS recommender (pybmds, `.venvs/bmds`) picks:
a benchmark, not a test (docs/benchmark_dose.md quotes it). Both fit BMDS's restricted models; a row is counted the
same where the two name the same model, and each difference is printed with pybmds's AICs and BMDLs.

    .venv/bin/python scripts/bmds_pick_agreement.py            # 30 synthetic studies and notebook 08's study runs
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from rlwb import params
from rlwb.core.measure import benchmark_dose as bd
from rlwb.core.measure import bmd_coverage as cov
from rlwb.core.measure import bmds_oracle as oracle
from rlwb.experiments.mismatch_study import analysis, benchmarks

RUNS = Path(__file__).resolve().parent.parent / "docs" / "runs" / "08_mismatch_cost"


def synthetic() -> list[tuple[str, bd.Study]]:
    out = []
    for truth in ("exponential", "hill", "linear"):
        for s in range(10):
            rng = np.random.default_rng(100 + s)
            c, y = cov.simulate(cov.TRUTHS[truth][0], list(cov.DESIGN_08), 10, cov.SD_08, rng)
            out.append((f"{truth} #{s}", bd.study(list(cov.DESIGN_08), c, y)))
    return out


def study_rows(run: Path) -> list[tuple[str, bd.Study]]:
    curves = pd.read_parquet(run / "data" / "curves.parquet")
    table = analysis.dose_table(curves, params.load("08_mismatch_cost", [run / "params.yaml"]))
    out = []
    for r in benchmarks.row_studies(curves, table):
        if len(r.doses) < 2:  # BMDS needs 3 dose groups
            continue
        try:
            out.append((f"{r.name} {r.arm}", bd.study(r.doses, r.clean, r.dosed, r.baseline)))
        except bd.BMDInputError as e:  # e.g. fewer than 3 seeds at a dose: no fit to compare, said
            print(f"  {run.name} {r.name} {r.arm}: left out ({e})")
    return out


def agreement(name: str, studies: list[tuple[str, bd.Study]]) -> None:
    theirs = oracle.bmds_fit([s.group_stats() for _, s in studies])
    same = 0
    for (label, s), o in zip(studies, theirs):
        pick = bd.fit_bmd(s, None, None, restricted=True, n_boot=20).bmds_pick
        same += pick == o["recommended"]
        if pick != o["recommended"]:
            print(f"  {label}: ours {pick}, BMDS {o['recommended']} (BMDS's AIC, BMDL: "
                  + ", ".join(f"{m} {v['aic']:.2f} {v['bmdl']:.3g}" for m, v in o["models"].items()
                              if v.get("aic") is not None and v.get("bmdl") is not None) + ")")
    print(f"{name}: the same model on {same} of {len(studies)}")


def main() -> None:
    agreement("synthetic studies (10 seeds, doses 0-1)", synthetic())
    for run in sorted(RUNS.glob("*/data/curves.parquet")):
        agreement(f"08_mismatch_cost/{run.parent.parent.name}", study_rows(run.parent.parent))


if __name__ == "__main__":
    main()
