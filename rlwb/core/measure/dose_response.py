"""The trend of paired per-seed gaps across doses, and where notebook 08's benchmark doses are read from.

Notebook 08 trains every arm at several doses of one kind of mismatch with the same seeds, so a (kind, arm) gives a
matrix of gaps: one row per seed, one column per dose, each the seed's outcome minus its own clean run's.
*Does the cost grow with the dose?* (`dose_trend`) Each seed's least-squares slope of gap on log10 dose, and a
one-sample t test of those slopes (the *summary-measure* approach to repeated measures: reduce each subject's curve
to one number, then test across subjects; Matthews, Altman, Campbell & Royston 1990, BMJ 300:230,
https://doi.org/10.1136/bmj.300.6719.230). Why this test: the doses are log-spaced, the seeds are paired across doses
(same prompts, sampling seeds and noise), so one seed's gaps are correlated and a pooled regression over all (seed,
dose) cells would count them as independent; one slope per seed keeps that dependence inside the seed.

*Below which dose is the cost tolerable?* is `benchmark_dose` (EPA's and EFSA's benchmark-dose convention), fitted
per row by `rlwb.experiments.mismatch_study.benchmarks`. `study_benchmarks` reads the benchmark tables of notebook
08's runs of record (docs/runs), picked by the dose params its caller names (what `rlwb audit` places an engine's k3
against).
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


STUDY_DIR = "08_mismatch_cost"  # the study's runs of record: `rlwb publish` puts them in RUNS_OF_RECORD/<this>/


def first_regime_benchmarks(bench: pd.DataFrame) -> pd.DataFrame:
    """The benchmark rows of the first PPO regime at the study's horizon: their `name` is the bare kind, where a
    further regime's or the long horizon's carries a `+` suffix (`weights+ppo4`, `weights+long`)."""
    return bench[~bench["name"].astype(str).str.contains("+", regex=False)]


def study_benchmarks(runs_dir: str | Path | None, dose_params: Iterable[str], min_doses: int) -> list[dict]:
    """The benchmark doses of notebook 08's study runs of record, every study of a model's greatest breadth: for
    each, `run` (its id), `model`, `path`, `params` (its params.yaml) and `benchmarks` (its
    `data/benchmarks.parquet`, first PPO regime at the study's horizon). Read
    from `runs_dir` (default `paths.RUNS_OF_RECORD / STUDY_DIR`, where `rlwb publish` puts notebook 08's runs); a
    run counts as a study only if its params give some kind of mismatch two doses or more (a curve to fit: each
    of `dose_params` is a parameter listing one kind's doses, the caller's `DoseKind.param`s, this domain importing
    no other) and it has a benchmark table. Per model the studies with the most benchmark rows (kind x arm) fitted
    on `min_doses` doses or more (the caller's least for a level) count, every one of them, newest first: a narrower
    follow-up (a confirmation with two doses of one kind, a horizon run of one arm and one kind) must not hide a
    study, an older study of more rows on fewer doses must not either, and two studies as broad (a study and its
    rerun on fresh seeds) are both runs of record, whose levels a reader compares (README: act on the lower). Where
    no study has a row on `min_doses` doses (breadth 0), the newest replaces the others, as a narrower follow-up
    is not a study.
    Empty: no study run of record yet. What `rlwb audit` places an engine's measured k3 against."""
    import pandas as pd
    import yaml

    from rlwb.paths import RUNS_OF_RECORD

    root = Path(runs_dir) if runs_dir is not None else RUNS_OF_RECORD / STUDY_DIR
    best: dict[str, list[dict]] = {}
    for d in sorted(root.glob("*/")) if root.is_dir() else []:  # run ids sort by time: newest last
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
        breadth = int((bench["doses"] >= min_doses).sum()) if "doses" in bench else 0
        study = {"run": d.name, "model": model, "path": str(d), "params": params, "benchmarks": bench,
                 "breadth": breadth}
        if model not in best or breadth > best[model][0]["breadth"] or breadth == best[model][0]["breadth"] == 0:
            best[model] = [study]
        elif breadth == best[model][0]["breadth"]:
            best[model].insert(0, study)  # newest first
    return [{k: v for k, v in r.items() if k != "breadth"} for studies in best.values() for r in studies]
