"""Dose-response statistics of paired per-seed gaps: a trend test across doses and the benchmark dose.

Notebook 08 trains every arm at several doses of one kind of mismatch with the same seeds, so a (kind, arm) gives a
matrix of gaps: one row per seed, one column per dose, each the seed's outcome minus its own clean run's. Two
questions are asked of it, both with the seed as the unit (the *summary-measure* approach to repeated measures:
reduce each subject's curve to one number, then test across subjects; Matthews, Altman, Campbell & Royston 1990,
BMJ 300:230, https://doi.org/10.1136/bmj.300.6719.230):

- *Does the cost grow with the dose?* (`dose_trend`) Each seed's least-squares slope of gap on log10 dose, and a
  one-sample t test of those slopes. Why this test: the doses are log-spaced (0.01, 0.1, 1), the seeds are paired
  across doses (same prompts, sampling seeds and noise), so the doses' gaps of one seed are correlated and a pooled
  regression over all (seed, dose) cells would count them as independent; one slope per seed keeps that
  dependence inside the seed, and the t test over seeds needs no model of it.
- *Below which dose is the cost tolerable?* (`benchmark_dose`) The benchmark dose of dose-response toxicology
  (US EPA, Benchmark Dose Technical Guidance, 2012, https://www.epa.gov/risk/benchmark-dose-technical-guidance;
  EFSA Scientific Committee 2022, https://doi.org/10.2903/j.efsa.2022.7584): fit a dose-response model over all
  doses, fix a benchmark response (BMR: the cost that matters), report the dose where the fitted cost reaches it
  (BMD) and the lower one-sided 95% confidence bound of that dose (BMDL), the number a practitioner quotes ("keep the
  dose below the BMDL"). Unlike "the first dose that shows a cost" (a NOAEL), a weaker study gives a *lower* BMDL,
  never a higher one.

The model is the same line in log10 dose per seed that the trend test fits (gap = a + b log10 dose). The BMDL is the
smallest dose in the tested range where the one-sided upper 95% confidence limit of the mean cost reaches the BMR: a
Fieller-type inversion of pointwise confidence limits (the doses whose upper limit stays below the BMR form the
confidence set of the BMD's lower side; for a straight line this is Fieller's theorem for the x at which a fitted line
reaches a given y, Fieller 1954, J. R. Stat. Soc. B 16:175, https://doi.org/10.1111/j.2517-6161.1954.tb00159.x; the
calibration or inverse-prediction interval of regression). It is not the profile-likelihood BMDL that EPA's BMDS
reports by default. With the seed as the unit the limit at each dose is a one-sample t limit of the seeds' fitted
costs there, so it is exact under normal seed-to-seed spread, and P(BMDL <= true BMD) >= 95% whenever the line is the
true curve (at the true BMD the upper limit exceeds the true cost, the BMR, with probability 95%;
tests/test_dose_response.py checks the coverage in a simulation). Nothing is extrapolated beyond the tested doses:
where the data cannot place the BMDL inside them, the result says so (`status`).

Limits: one model (linear in log dose), no model averaging; a cost that is flat and then drops sharply is fitted by
a line that crosses the BMR early, which errs towards a lower (more conservative) BMDL.

The statistics (`dose_trend`, `benchmark_dose`) are pure numpy/scipy functions of arrays; nothing here touches an
engine or a model. `study_benchmarks` alone reads files: the benchmark tables of notebook 08's runs of record
(docs/runs), picked by the dose params its caller names (what `rlwb audit` places an engine's k3 against).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pandas is imported where a table is read (this module's statistics run on arrays)
    import pandas as pd

ALPHA = 0.05


def _check(doses, gaps) -> tuple[np.ndarray, np.ndarray]:
    d = np.asarray(doses, dtype=np.float64)
    g = np.asarray(gaps, dtype=np.float64)
    if d.ndim != 1 or g.ndim != 2 or g.shape[1] != d.size:
        raise ValueError(f"gaps must be [seeds, doses] with one column per dose: got doses {d.shape}, gaps {g.shape}")
    if not (np.isfinite(d).all() and (d > 0).all()):
        raise ValueError(f"doses must be finite and > 0 (dose 0 is the clean run every gap is taken against), got {d}")
    if np.unique(d).size != d.size:
        raise ValueError(f"doses must be distinct, got {d}")
    if not np.isfinite(g).all():
        raise ValueError("gaps must be finite: a seed missing at one dose cannot be paired across doses")
    return d, g


def _per_seed_lines(d: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(intercepts, slopes) of each seed's least-squares line gap = a + b log10(dose)."""
    x = np.log10(d)
    xc = x - x.mean()
    b = (g - g.mean(1, keepdims=True)) @ xc / (xc @ xc)
    a = g.mean(1) - b * x.mean()
    return a, b


@dataclass(frozen=True)
class Trend:
    """The mean over seeds of each seed's slope of gap on log10 dose (outcome per decade of dose), its 95% t
    interval and the two-sided p of slope = 0."""

    slope: float
    ci_low: float
    ci_high: float
    p: float
    n: int


def dose_trend(doses, gaps, alpha: float = ALPHA) -> Trend:
    """Does the gap change with the dose? One least-squares slope of gap on log10 dose per seed, and a one-sample t
    test of the slopes (the summary-measure approach, Matthews et al. 1990, https://doi.org/10.1136/bmj.300.6719.230:
    the seed is the unit, so the correlation between one seed's doses needs no model). `gaps`: [seeds, doses],
    paired by seed, each the seed's outcome at that dose minus its own clean run's. Needs >= 2 doses and >= 2 seeds
    (otherwise every field but n is NaN). Every seed's slope the same (no spread): p is 1 for slope 0, else the
    exact sign-flip p 2 / 2^n (never 0 from a tie)."""
    from scipy import stats as st

    d, g = _check(doses, gaps)
    n = g.shape[0]
    if d.size < 2 or n < 2:
        return Trend(float("nan"), float("nan"), float("nan"), float("nan"), n)
    _, b = _per_seed_lines(d, g)
    m, sd = float(b.mean()), float(b.std(ddof=1))
    if sd <= 1e-12 * max(1.0, abs(m)):  # every seed's slope the same: the t statistic is undefined; the exact
        # sign-flip test's p (n slopes all of one sign: 2 / 2^n, as stats.paired_gap_test) instead of a p of 0
        return Trend(m, m, m, 1.0 if m == 0 else min(1.0, 2.0 / 2 ** n), n)
    t = st.ttest_1samp(b, 0.0)
    ci = t.confidence_interval(1 - alpha)
    return Trend(m, float(ci.low), float(ci.high), float(t.pvalue), n)


BOUNDED, BELOW_RANGE, NOT_BOUNDED, NO_BMR = "bounded", "below the tested range", "not bounded", "no benchmark"


@dataclass(frozen=True)
class BenchmarkDose:
    """Where the fitted cost reaches `bmr`. `bmd`: the dose where the mean fitted cost reaches it (NaN if it does
    not inside the tested doses); `bmdl`: its lower one-sided (1 - alpha) bound, the smallest tested-range dose
    where the upper confidence limit of the cost reaches it. `status`:
    - `bounded`: the BMDL lies inside the tested doses;
    - `below the tested range`: the upper limit already reaches the BMR at the smallest dose (`bmdl` is that dose,
      an upper bound on the true BMDL: the data cannot say how much lower it is);
    - `not bounded`: even the upper limit stays below the BMR up to the largest dose: the cost is below the BMR
      wherever it was tested, and where it would reach it is not bounded by these data (`bmdl`, `bmd` NaN);
    - `no benchmark`: no positive BMR (the clean run gained nothing to lose) or too few doses or seeds."""

    bmd: float
    bmdl: float
    bmr: float
    status: str
    dose_min: float
    dose_max: float
    n: int


def benchmark_dose(doses, gaps, bmr: float, alpha: float = ALPHA, grid: int = 512) -> BenchmarkDose:
    """The benchmark dose and its lower bound (BMDL) at benchmark response `bmr` (a cost, > 0, in the gaps' units)
    from paired per-seed gaps (`gaps`: [seeds, doses]; a cost is a negative gap).

    Model: each seed's line gap = a + b log10(dose) (as `dose_trend`); the mean cost at dose x is the mean of the
    seeds' fitted costs there, its upper one-sided (1 - alpha) limit a one-sample t limit of them. BMD: where the
    mean crosses `bmr`; BMDL: the smallest dose where the upper limit reaches `bmr` (a Fieller-type inversion of the
    pointwise limits, Fieller 1954, https://doi.org/10.1111/j.2517-6161.1954.tb00159.x; the benchmark dose and BMR
    themselves as US EPA's Benchmark Dose Technical Guidance 2012 and EFSA 2022 define them,
    https://doi.org/10.2903/j.efsa.2022.7584). Both are searched on `grid` log-spaced doses across the tested
    range and refined by bisection; nothing is extrapolated outside it (`BenchmarkDose.status` says where the data
    cannot bound it)."""
    from scipy import optimize
    from scipy import stats as st

    d, g = _check(doses, gaps)
    n = g.shape[0]
    lo_d, hi_d = float(d.min()), float(d.max())
    if not (np.isfinite(bmr) and bmr > 0) or d.size < 2 or n < 2:
        return BenchmarkDose(float("nan"), float("nan"), float(bmr), NO_BMR, lo_d, hi_d, n)
    a, b = _per_seed_lines(d, g)
    tq = st.t.ppf(1 - alpha, n - 1)

    def mean_cost(x: float) -> float:
        return float(-(a + b * x).mean())

    def upper_cost(x: float) -> float:
        c = -(a + b * x)
        return float(c.mean() + tq * c.std(ddof=1) / np.sqrt(n))

    xs = np.linspace(np.log10(lo_d), np.log10(hi_d), grid)

    def first_crossing(f) -> float:
        v = np.array([f(x) for x in xs]) - bmr
        hit = np.flatnonzero(v >= 0)
        if not hit.size:
            return float("nan")
        i = int(hit[0])
        if i == 0:
            return float(xs[0])
        return float(optimize.brentq(lambda x: f(x) - bmr, xs[i - 1], xs[i], xtol=1e-12))

    x_bmdl, x_bmd = first_crossing(upper_cost), first_crossing(mean_cost)
    bmd = float(10 ** x_bmd) if np.isfinite(x_bmd) else float("nan")
    if not np.isfinite(x_bmdl):
        return BenchmarkDose(bmd, float("nan"), float(bmr), NOT_BOUNDED, lo_d, hi_d, n)
    if x_bmdl == xs[0]:
        return BenchmarkDose(bmd, lo_d, float(bmr), BELOW_RANGE, lo_d, hi_d, n)
    return BenchmarkDose(bmd, float(10 ** x_bmdl), float(bmr), BOUNDED, lo_d, hi_d, n)


STUDY_DIR = "08_mismatch_cost"  # the study's runs of record: `rlwb publish` puts them in RUNS_OF_RECORD/<this>/


def first_regime_benchmarks(bench: pd.DataFrame) -> pd.DataFrame:
    """The benchmark rows of the first PPO regime at the study's horizon: their `name` is the bare kind, where a
    further regime's or the long horizon's carries a `+` suffix (`weights+ppo4`, `weights+long`)."""
    return bench[~bench["name"].astype(str).str.contains("+", regex=False)]


def study_benchmarks(runs_dir: str | Path | None = None, dose_params: Iterable[str] = ()) -> list[dict]:
    """The benchmark doses of notebook 08's study runs of record, newest run per model: for each, `run` (its id),
    `model`, `path` and `benchmarks` (its `data/benchmarks.parquet`, first PPO regime at the study's horizon). Read
    from `runs_dir` (default `paths.RUNS_OF_RECORD / STUDY_DIR`, where `rlwb publish` puts notebook 08's runs); a
    run counts as the study's only if its params give some kind of mismatch two doses or more (a curve to fit: each
    of `dose_params` is a parameter listing one kind's doses, the caller's `DoseKind.param`s, this domain importing
    no other) and it has a benchmark table; a follow-up with one dose per kind
    (`params/08_mismatch_cost/one_sided.yaml`) is not one, and a newer such run must not hide the study.
    Empty: no study run of record yet. What `rlwb audit` places an engine's measured k3 against."""
    import pandas as pd
    import yaml

    from rlwb.paths import RUNS_OF_RECORD

    root = Path(runs_dir) if runs_dir is not None else RUNS_OF_RECORD / STUDY_DIR
    newest: dict[str, dict] = {}
    for d in sorted(root.glob("*/")) if root.is_dir() else []:
        bench_file, params_file = d / "data" / "benchmarks.parquet", d / "params.yaml"
        if not (bench_file.exists() and params_file.exists()):
            continue
        params = yaml.safe_load(params_file.read_text()) or {}
        # a study fits a curve: two doses of a kind at least (a params file without the dose lists: the defaults')
        doses = [len(params[k] or []) for k in dose_params if k in params]
        bench = pd.read_parquet(bench_file)
        if (doses and max(doses) < 2) or bench.empty or "bmdl" not in bench:
            continue
        bench = first_regime_benchmarks(bench)
        model = str(params.get("model", "?"))
        newest[model] = {"run": d.name, "model": model, "path": str(d), "benchmarks": bench}  # sorted: newest last
    return list(newest.values())
