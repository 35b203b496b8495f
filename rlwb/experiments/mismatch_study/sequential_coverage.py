"""Coverage of the benchmark-dose bound under the sequential rule itself: a simulated first pass, the rule's own
decision (`sequential.decide`: which doses to extend, to how many seeds), the second pass's seeds, the fit on every
seed each dose then has (`scripts/bmd_coverage.py --sequential`, docs/benchmark_dose.md).

Why: the rule extends the doses whose first-pass gap interval holds -BMR or that bracket the first-pass BMD, so the
doses it extends are chosen by the data the final fit pools. A coverage simulation that fixes the extension in
advance (`bmd_coverage.simulate_coverage(dose_seeds=...)`) does not see that selection; this one does.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pandas as pd

from rlwb.core.measure import benchmark_dose as bd
from rlwb.core.measure import bmd_coverage as cov
from rlwb.core.measure import stats
from rlwb.experiments.mismatch_study import sequential

FAMILY_08 = 97  # the Holm family of notebook 08's studies: the rule sizes its seeds at alpha / m
ARM, ROW = "sim", "sim"


def extension(doses, clean, dosed, *, num_seeds: int, max_seeds: int, bmr_fraction: float = 0.25,
              target_power: float = 0.8, m: int = FAMILY_08, seed_power: str = "fixed-n", n_boot: int = 200,
              seed: int = 0) -> tuple[int, ...]:
    """The seeds the rule gives each dose after a first pass (`clean` [num_seeds], `dosed` [num_seeds, J]): the
    first pass's `num_seeds` where it calls nothing, `decide`'s count where it extends. Built from the same inputs
    the study gives it: each dose's paired gap interval and sd (`stats.seed_ci`, as `analysis.dose_table`), the
    first pass's BMD and its BMR in outcome units (the fitted clean gain's `bmr_fraction`, as
    `benchmarks.benchmark_table`)."""
    first = bd.fit_bmd(doses, clean, dosed, bmr=bmr_fraction, n_boot=n_boot, seed=seed, profile=False)
    labels = [f"dose{j}" for j in range(len(doses))]
    gaps = np.asarray(dosed, float) - np.asarray(clean, float)[:, None]
    table = pd.DataFrame([{"label": lab, "arm": ARM, "gap_ci_low": lo, "gap_ci_high": hi,
                           "gap_sd": float(gaps[:, j].std(ddof=1)), "q_eff": 0.0}
                          for j, lab in enumerate(labels) for lo, hi in [stats.seed_ci(gaps[:, j])]])
    gain = float(first.curve["mean"][0]) if first.curve is not None else first.clean_gain
    bench = pd.DataFrame([{"name": ROW, "arm": ARM, "bmr": bmr_fraction * gain, "bmd": first.bmd}])
    studies = [SimpleNamespace(name=ROW, arm=ARM, labels=labels, doses=np.asarray(doses, float))]
    calls = sequential.decide(table, bench, studies, m, num_seeds=num_seeds, max_seeds=max_seeds,
                              target_power=target_power, seed_power=seed_power)
    more = {c.label: c.seeds for c in calls}
    return tuple(max(num_seeds, more.get(lab, num_seeds)) for lab in labels)


@dataclass(frozen=True)
class SequentialCoverage:
    """`coverage` of the final fit's BMDL (its `seeds`: the most seeds a study may reach, `max_seeds`); `extended`:
    the share of studies in which the rule extended a dose; `mean_runs`: the dosed and clean runs a study trained,
    on average, against `num_seeds` x (doses + 1) for the first pass alone."""

    coverage: cov.Coverage
    extended: float
    mean_runs: float
    first_pass_runs: int


def simulate_sequential_coverage(truth: str, studies: int = 200, *, num_seeds: int = 8, max_seeds: int = 30,
                                 target_power: float = 0.8, m: int = FAMILY_08, doses=cov.DESIGN_08,
                                 sd: float = cov.SD_08, n_boot: int = 500, seed: int = 0) -> SequentialCoverage:
    """Coverage of `fit_bmd`'s BMDL when the rule decides the second pass: per study, `max_seeds` seeds drawn from
    `TRUTHS[truth]`, the first `num_seeds` the first pass, `extension` the rule's counts per dose, the clean run on
    as many seeds as the most any dose gets (its twin rule, `sequential.twin_seeds`), the fit on every seed each
    dose has."""
    curve, _ = cov.TRUTHS[truth]
    if not bd.MIN_SEEDS <= num_seeds <= max_seeds:
        raise ValueError(f"need {bd.MIN_SEEDS} <= num_seeds <= max_seeds, got {num_seeds} and {max_seeds}")
    rng = np.random.default_rng(seed)
    extended = runs = 0
    results = []
    for i in range(studies):
        c, y = cov.simulate(curve, doses, max_seeds, sd, rng)
        counts = extension(doses, c[:num_seeds], y[:num_seeds], num_seeds=num_seeds, max_seeds=max_seeds,
                           target_power=target_power, m=m, seed=seed * 100003 + i)
        S = max(counts)
        extended += num_seeds < S
        runs += S + sum(counts)
        results.append(bd.fit_bmd(doses, c[:S], cov.thinned(y[:S], counts), n_boot=n_boot, seed=seed * 100003 + i,
                                  profile=False))
    return SequentialCoverage(cov.tally(truth, max_seeds, results), extended / studies, runs / studies,
                              num_seeds * (len(doses) + 1))
