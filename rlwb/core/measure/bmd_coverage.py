"""Coverage of `benchmark_dose.fit_bmd`'s BMDL by simulation: synthetic studies of known truths at notebook 08's
design (`TRUTHS`, `DESIGN_08`), the share whose BMDL lies at or below the true BMD with its Clopper-Pearson interval
(what tests/test_benchmark_dose.py and scripts/bmd_coverage.py run)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rlwb.core.measure import stats
from rlwb.core.measure.benchmark_dose import BOUNDED, MIN_SEEDS, fit_bmd


def simulate(curve, doses, seeds: int, sd: float, rng, baseline: float = 0.0, rho: float = 0.0):
    """A synthetic study: (clean [S], dosed [S, J]) with mean `curve(dose)` (+ baseline), normal seed-to-seed spread
    `sd`, correlation `rho` between one seed's runs (a shared seed effect)."""
    d = np.asarray(doses, dtype=np.float64)
    mu = np.concatenate([[curve(np.array([0.0]))[0]], curve(d)]) + baseline
    shared = rng.normal(0, sd * math.sqrt(rho), (seeds, 1))
    own = rng.normal(0, sd * math.sqrt(1 - rho), (seeds, d.size + 1))
    y = mu[None, :] + shared + own
    return y[:, 0], y[:, 1:]


def thinned(dosed, dose_seeds):
    """`dosed` [S, J] with dose j run on its first `dose_seeds[j]` seeds only (NaN after: a sequential study's
    first pass at the doses it did not extend); None: unchanged."""
    y = np.array(dosed, dtype=np.float64)
    for j, k in enumerate(dose_seeds or ()):
        y[k:, j] = np.nan
    return y


DESIGN_08 = (0.03, 0.1, 0.3, 1.0)  # notebook 08-like doses (with the clean run at 0), clean gain 0.3, seed sd 0.085
GAIN_08, SD_08 = 0.3, 0.085
TRUTHS = {  # name: (mean outcome minus baseline at dose d, its true BMD at a 25% relative BMR)
    "exponential": (lambda d: GAIN_08 * np.exp(-np.asarray(d) / 0.5), 0.5 * math.log(4 / 3)),
    "hill": (lambda d: GAIN_08 / (1 + (np.asarray(d) / 0.3) ** 2), 0.3 / math.sqrt(3)),
    "linear": (lambda d: GAIN_08 * (1 - np.asarray(d)), 0.25),
}


@dataclass(frozen=True)
class Coverage:
    """P(BMDL <= true BMD) over simulated studies whose status is "bounded" (`hits` of `bounded`; the others
    report no bound, so they claim nothing), its Clopper-Pearson 95% interval, and the share of studies bounded.
    Also the same for BMDS's selection rule (`bmds_hits` of `bmds_bounded`, its profile BMDL) when computed."""

    truth: str
    seeds: int
    studies: int
    bounded: int
    hits: int
    low: float
    high: float
    median_bmdl_ratio: float  # median BMDL / true BMD: how much the bound gives away
    bmds_bounded: int = 0
    bmds_hits: int = 0

    @property
    def rate(self) -> float:
        return self.hits / self.bounded if self.bounded else float("nan")


def tally(truth: str, seeds: int, results, bmds_bounded: int = 0, bmds_hits: int = 0) -> Coverage:
    """The coverage of the BMDL over simulated studies' fits `results` (`BMDResult`s) of `TRUTHS[truth]`: the bounded
    ones, how many lie at or below the true BMD, the Clopper-Pearson interval, the median BMDL / true BMD."""
    true = TRUTHS[truth][1]
    bounded = [r for r in results if r.status == BOUNDED]
    hits = sum(bool(r.bmdl <= true) for r in bounded)
    lo, hi = stats.proportion_ci(hits, len(bounded), method="exact")
    ratio = float(np.median([r.bmdl / true for r in bounded])) if bounded else float("nan")
    return Coverage(truth, seeds, len(results), len(bounded), hits, lo, hi, ratio, bmds_bounded, bmds_hits)


def simulate_coverage(truth: str, seeds: int = 10, studies: int = 200, *, doses=DESIGN_08, sd: float = SD_08,
                      rho: float = 0.0, n_boot: int = 500, seed: int = 0, bmds_rule: bool = False,
                      dose_seeds=None, **kw) -> Coverage:
    """Coverage of `fit_bmd`'s BMDL on `studies` simulated studies of `TRUTHS[truth]` at `doses` with `seeds` seeds
    (normal spread `sd`, correlation `rho` between a seed's runs). `dose_seeds`: per dose, how many of the seeds
    were run there (the rest missing, as a sequential study's doses it did not extend; the clean run has all
    `seeds`); None: every seed at every dose. `bmds_rule`: also BMDS's recommended model's profile BMDL (slower:
    every model's profile)."""
    curve, true = TRUTHS[truth]
    if dose_seeds is not None and (len(dose_seeds) != len(doses)
                                   or not all(MIN_SEEDS <= k <= seeds for k in dose_seeds)):
        raise ValueError(f"dose_seeds must give {MIN_SEEDS}..{seeds} seeds for each of the {len(doses)} doses, "
                         f"got {dose_seeds}")
    rng = np.random.default_rng(seed)
    results, b_bounded, b_hits = [], 0, 0
    for i in range(studies):
        c, y = simulate(curve, doses, seeds, sd, rng, rho=rho)
        y = thinned(y, dose_seeds)
        r = fit_bmd(doses, c, y, n_boot=n_boot, seed=seed * 100003 + i, profile=bmds_rule, **kw)
        results.append(r)
        if bmds_rule and r.bmds_pick is not None and np.isfinite(r.bmds_bmdl):
            b_bounded += 1
            b_hits += r.bmds_bmdl <= true
    return tally(truth, seeds, results, b_bounded, b_hits)
