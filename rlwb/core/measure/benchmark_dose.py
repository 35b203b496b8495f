"""Benchmark dose (BMD) with its lower and upper bounds (BMDL, BMDU) from seed-level dose-response data, by the
conventions of US EPA's Benchmark Dose Technical Guidance (EPA/100/R-12/001, 2012,
https://www.epa.gov/risk/benchmark-dose-technical-guidance) and of the EFSA Scientific Committee's guidance on the
benchmark dose approach (EFSA Journal 2022;20(10):7584, https://doi.org/10.2903/j.efsa.2022.7584).

Why a module of its own: notebook 08's first benchmark dose (`dose_response.benchmark_dose`) fits one straight line
per seed in log10 dose, not anchored at dose 0, with no goodness-of-fit test, and its BMR is taken as known although
it is estimated from the same clean runs as the gaps (issue #58). What a referee checks instead, and what this
module does:

- **The control is a fitted point.** A study gives, per seed (the unit), the outcome of its clean run (dose 0) and
  of its dosed runs at doses d_1..d_J (paired: the same seed's clean and dosed runs). Every model is fitted to all
  J + 1 dose groups, dose 0 included; nothing is subtracted before the fit.
- **Several monotone models** (`MODELS`), the continuous models of EPA's BMDS and EFSA's families: linear,
  power (f = g + v x^n), exponential 3 and 5 (Exp3 a exp(-(b x)^d), Exp5 a (c - (c - 1) exp(-(b x)^d))), Hill 3
  (EFSA's Hill family falling to the baseline) and Hill (g + v x^n / (k^n + x^n)); normal errors with one variance
  for all doses ("constant variance", BMDS's default), fitted by maximum likelihood (= least squares). Each model
  describes a *fall* of the outcome with dose: the cost of mismatch is a drop from the clean run. Shape exponents
  (power's n, Exp's d, Hill's n) lie in [0.25, 18] by default: EFSA's models have d > 0, a fall steepest at dose 0
  allowed (BMDS's "restricted" d >= 1 biased the bound upwards on concave falls: its model pick covered the true
  BMD 61-74%); `restricted=True` gives BMDS's bounds (d >= 1, Exp5's c >= 0), used to check against BMDS.
- **Goodness of fit per model**: BMDS's test 4, the likelihood ratio of the model against the model with one mean
  per dose group (EPA 2012, section 2.3.3; p < 0.1 fails, as BMDS's recommender), and AIC (all mean parameters and
  the variance counted, EFSA's convention: BMDS drops parameters that sit on a bound from its AIC and test-4
  degrees of freedom, so those differ where a bound binds). A model with as many mean parameters as dose groups is
  **saturated** (test 4 has no degrees of freedom): flagged, given no weight, never a bound.
- **The BMR** is relative to the fitted clean gain, BMDS's "relative deviation": the dose where the fitted mean
  has lost `bmr` (e.g. 0.25) of the fitted mean at dose 0, the outcome measured from the untrained policy's
  (`baseline`), so f(BMD) = (1 - bmr) f(0) is "a quarter of what clean training gains is lost". f(0) is fitted from
  the same clean runs that anchor the curve, so its uncertainty is inside every bound below. (`bmr_type="absolute"`:
  BMDS's absolute deviation, f(0) - f(BMD) = bmr.)
- **Model averaging** over the models that are not saturated and pass test 4, with Akaike weights (Buckland,
  Burnham & Augustin 1997, Biometrics 53:603, https://doi.org/10.2307/2533961) on the *curves*: the BMD is where the
  weighted mean curve reaches the BMR (Wheeler & Bailer 2007, Risk Analysis 27:659,
  https://doi.org/10.1111/j.1539-6924.2007.00920.x; EFSA 2022 recommends averaging over selecting). BMDS's own
  recommender is computed too, for comparison only (`bmds_recommend`: BMDS's models, its viability checks, its AIC
  and test-4 degrees of freedom that leave out parameters on their bounds, then the lowest AIC, or the lowest BMDL
  where the viable models' BMDLs differ more than 3x), with BMDS's profile BMDLs (`BMDResult.bmds_pick`,
  `bmds_bmdl`).
- **BMDL / BMDU from a bootstrap over seeds**: each resample draws S seeds with replacement and takes each drawn
  seed's clean run *with* its dosed runs (the pairing kept, the clean gain and so the BMR re-estimated in every
  resample), refits every passing model, re-weights the average and finds its BMD and each model's (the bootstrap
  of the model average, EFSA Scientific Committee 2017, https://doi.org/10.2903/j.efsa.2017.4658, section 2.5; the
  resampling unit is the independent unit, the seed). Each bound is an *expanded percentile* bound (Hesterberg 2015,
  The American Statistician 69:371, https://doi.org/10.1080/00031305.2015.1089789, section 5.1: the percentile
  bound widened to a t bound's width, level alpha' with z_{alpha'} = sqrt(S/(S-1)) t_{S-1, alpha}; the plain
  percentile bound undercovers at 6-10 seeds). **The reported BMDL is the lowest of the model average's and each
  passing model's** (`bound="lowest"`; the BMDU the highest): EPA 2012's rule takes the lowest BMDL where the
  models disagree, and taking it always makes the bound hold whichever passing model is the true curve (each
  model's own bound covers when that model is true). The average's bound alone (`bound="average"`) covered 89-93%
  at 08's design: the average leans to the simpler models AIC favours, which put the BMD high on curved truths.
- **Unequal seeds per dose** (a sequential study extends some doses): `dosed` holds NaN where a seed was not run.
  Each group enters the fit with its own n (BMDS's summary data: the least squares weight each mean by its n), and
  the bootstrap draws seeds within the seeds run at the same doses (`resample_seeds`, stratified), so a resample
  has the study's count at every dose, whatever patterns the rule left: the design decided them (drawing the
  union let a 3-seed group come out empty in 4% of resamples). A group of S seeds drawn in H strata gets (S - H)/S
  of its mean's variance in expectation, so the expanded bound's width is sqrt(S/(S - H)) t_{S-H} for the group it
  undersells most (`expanded_alpha`; with one stratum, the smallest group decides). Covariances between groups
  (the seeds two groups share) shrink alike, by the shared seeds' own share: second order, not widened for.
  Error control: **one-sided 1 - alpha (95%) for each bound, row by row**; nothing here adjusts for several rows.
- The per-model BMDL/BMDU in the model table are BMDS's: the profile-likelihood bounds (EPA 2012, section 2.3.5;
  Crump 1995, Risk Analysis 15:79, https://doi.org/10.1111/j.1539-6924.1995.tb00095.x), the doses where twice the
  log-likelihood has fallen by chi2_1(1 - 2 alpha) = 2.706 from its maximum with the BMD held fixed.
- **"bounded" only when a model passes, the model-average BMD lies inside the tested doses** (not above the highest
  dose; not more than 10x below the lowest non-zero dose, BMDS's "questionable" threshold; 3x below is a note), and
  the BMDL is finite. Otherwise the status says why (`STATUSES`), and `BMDResult.bound` is NaN.
- **The dose metric and its scale** are stated (`dose_scale`): "linear" (the dose as given, as BMDS takes it) or
  "log" (x = ln(1 + d / d_min), d_min the lowest non-zero dose: dose 0 stays at 0, log-spaced doses come out about
  evenly spaced; a log of dose proper has no place for the control). `compare_dose_scales` fits both and says
  whether they agree (each BMD inside the other's BMDL-BMDU).

Measured (docs/benchmark_dose.md has the tables, `scripts/bmd_coverage.py` reruns them): the BMDL's coverage at
notebook 08's design (doses 0, .03, .1, .3, 1; clean gain 0.3; seed sd 0.085; BMR 25%), 300 simulated studies per
cell, 95.4-98.6% on exponential, Hill and linear truths at 10 and 30 seeds (Clopper-Pearson lower ends 92.3-96.3%);
agreement with EPA's engine (pybmds 25.2) at the same optimum: BMD within 1e-5 relative, profile BMDL within 0.12%
(Exp5 1%) on synthetic curves and 0.06% on notebook 08's runs of record; 0.8 s CPU per study (2,000 resamples).

Pure numpy/scipy. Where the parts live: the models and their least-squares fits `bmd_models`; the coverage
simulation `bmd_coverage`; EPA's own engine as the oracle `bmds_oracle` (a process in its own environment).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from rlwb.core.measure.bmd_models import (
    MODELS,
    N_MEAN_PARAMS,
    basis,
    exponents,
    fit_many,
    model_bmd_x,
    params_of,
    polish,
    profile_bounds,
)
from rlwb.errors import BMDInputError

ALPHA = 0.05  # each bound one-sided 95%, as BMDS's default (alpha 0.05: BMDL and BMDU are the 90% interval's ends)
GOF_LEVEL = 0.1  # BMDS's recommender: test 4 p below 0.1 fails the fit (pybmds recommender/default.json, "gof")
CURVE_POINTS = 48  # points of the fitted curve a figure draws across the tested doses (`BMDResult.curve`)
LOW_BMD_FAIL, LOW_BMD_WARN = 10.0, 3.0  # BMDS: BMD this many times below the lowest non-zero dose (fail / warning)

BOUNDED = "bounded"
ABOVE_RANGE = "above tested range"
BELOW_RANGE = "below tested range"
NO_FIT = "no fit passes"
SATURATED = "saturated"
NO_BENCHMARK = "no benchmark"
NOT_BOUNDED = "not bounded"
STATUSES = {
    BOUNDED: "a model that is not saturated passes test 4; the model-average BMD lies inside the tested doses and the "
             "bootstrap BMDL is finite",
    ABOVE_RANGE: "the model-average curve does not lose the BMR by the highest tested dose (BMD above it, or never)",
    BELOW_RANGE: f"the model-average BMD is more than {LOW_BMD_FAIL:g}x below the lowest non-zero dose: the curve "
                 "there is the model's, not the data's",
    NO_FIT: "every model that is not saturated fails test 4 (p < 0.1): none describes these means",
    SATURATED: "every model has as many mean parameters as there are dose groups (no test of fit is possible)",
    NO_BENCHMARK: "the clean runs gained nothing over the baseline (relative BMR undefined)",
    NOT_BOUNDED: "no finite bound: the bootstrap put the BMD at or beyond the tested range too often, or cannot be "
                 "drawn on these seeds (the fit's notes say which)",
}


@dataclass(frozen=True)
class Study:
    """Seed-level data of one dose-response row, checked. `clean` [S]: each seed's clean-run outcome (dose 0);
    `dosed` [S, J]: the same seeds' outcomes at `doses` [J] (> 0, distinct, increasing after `study`), NaN where a
    seed was not run at a dose (a sequential study's second pass extends some doses only: each dose group then has
    its own number of seeds, `ns`); `baseline`: the outcome before training (the untrained policy's), which the
    clean gain is measured from."""

    doses: np.ndarray
    clean: np.ndarray
    dosed: np.ndarray
    baseline: float = 0.0

    @property
    def seeds(self) -> int:
        return int(self.clean.size)

    @property
    def ns(self) -> np.ndarray:
        """Seeds per dose group [J + 1], dose 0 first."""
        return np.concatenate([[self.seeds], np.isfinite(self.dosed).sum(0)]).astype(np.float64)

    def group_stats(self) -> dict:
        """Per dose group (dose 0 first): dose, n, mean and sd (ddof 1) of the outcome minus `baseline` (BMDS's
        summary input)."""
        y = np.column_stack([self.clean, self.dosed]) - self.baseline
        return {"doses": [0.0, *map(float, self.doses)], "ns": [int(v) for v in self.ns],
                "means": np.nanmean(y, 0).tolist(), "stdevs": np.nanstd(y, 0, ddof=1).tolist()}


MIN_SEEDS = 3  # per dose group (dose 0 included): fewer has no spread to bound with


def study(doses, clean, dosed, baseline: float = 0.0) -> Study:
    """Check and order a study's arrays; a `BMDInputError` names the problem (shape, dose 0 among the doses,
    negative or repeated doses, a missing value and where)."""
    d = np.asarray(doses, dtype=np.float64)
    c = np.asarray(clean, dtype=np.float64)
    y = np.asarray(dosed, dtype=np.float64)
    if d.ndim != 1 or d.size < 1:
        raise BMDInputError(f"doses must be a 1-d array of the non-zero doses, got shape {d.shape}")
    if c.ndim != 1:
        raise BMDInputError(f"clean must be 1-d, one clean-run outcome per seed, got shape {c.shape}")
    if y.ndim == 1 and d.size == 1:
        y = y[:, None]
    if y.ndim != 2 or y.shape != (c.size, d.size):
        raise BMDInputError(f"dosed must be [seeds, doses] = ({c.size}, {d.size}) (one row per seed of clean, one "
                            f"column per dose), got shape {y.shape}")
    if not np.isfinite(d).all():
        raise BMDInputError(f"doses must be finite, got {d}")
    if (d < 0).any():
        raise BMDInputError(f"doses must not be negative, got {d}")
    if (d == 0).any():
        raise BMDInputError("dose 0 is the clean run: pass its outcomes as `clean`, not as a column of `dosed`")
    if np.unique(d).size != d.size:
        raise BMDInputError(f"doses must be distinct, got {d}")
    bad = np.argwhere(~np.isfinite(c))
    if bad.size:
        raise BMDInputError(f"clean has a missing or infinite value at seed {int(bad[0][0])} ({len(bad)} in all): "
                            "every seed of a study needs its clean run (its dose 0); drop the seed")
    bad = np.argwhere(np.isinf(y))
    if bad.size:
        raise BMDInputError(f"dosed has an infinite value at {tuple(int(i) for i in bad[0])} ({len(bad)} in all)")
    if c.size < MIN_SEEDS:
        raise BMDInputError(f"need at least {MIN_SEEDS} seeds (one clean and one dosed run each), got {c.size}")
    few = [(float(d[j]), int(k)) for j, k in enumerate(np.isfinite(y).sum(0)) if k < MIN_SEEDS]
    if few:
        raise BMDInputError(f"every dose needs at least {MIN_SEEDS} seeds' outcomes (NaN: a seed not run there), got "
                            + ", ".join(f"{k} at dose {v:g}" for v, k in few))
    if not np.isfinite(baseline):
        raise BMDInputError(f"baseline must be finite, got {baseline}")
    o = np.argsort(d)
    return Study(d[o], c, y[:, o], float(baseline))


def strata_shortfall(st: Study, strata=None) -> str | None:
    """Why the stratified bootstrap cannot bound `st`, or None: a dose group with fewer than 2 seeds more than the
    strata it is drawn in (`group_strata`) leaves it S - H < 2 degrees of freedom of its spread. The point fit
    needs no strata, so `fit_bmd` still reports it, placed by the range (above or below the tested doses where it
    lies outside them, else "not bounded"), this reason in its notes."""
    spare = st.ns - (group_strata(st) if strata is None else strata)
    if not (spare < 2).any():
        return None
    k = int(np.argmin(spare))
    return (f"the {int(st.ns[k])} seeds of dose {([0.0] + list(st.doses))[k]:g} fall in {int(st.ns[k] - spare[k])} "
            "patterns of doses run: the bootstrap draws within each pattern, so a group needs at least 2 seeds more "
            "than its patterns for a bound; drop the odd seeds")


# ------------------------------------------------------------------------------------------------ dose metric ---

def to_metric(d, scale: str, d_min: float):
    """The dose metric x of dose d: "linear" x = d; "log" x = ln(1 + d / d_min) (dose 0 at 0)."""
    d = np.asarray(d, dtype=np.float64)
    if scale == "linear":
        return d
    if scale == "log":
        return np.log1p(d / d_min)
    raise ValueError(f"dose_scale must be 'linear' or 'log', got {scale!r}")


def from_metric(x, scale: str, d_min: float):
    x = np.asarray(x, dtype=np.float64)
    if scale == "linear":
        return x
    with np.errstate(over="ignore"):
        return d_min * np.expm1(x)


# ----------------------------------------------------------------------------------------------- the result ---

@dataclass(frozen=True)
class ModelFit:
    """One model's point fit. `params`: BMDS's parameter names and values on the dose metric's scale (outcome
    minus baseline); `gof_p`: test 4 (vs one mean per dose group), NaN when saturated; `bmd`/`bmdl`/`bmdu` in dose
    units (BMDS's profile-likelihood bounds); `weight`: its Akaike weight in the average (0 if it is saturated or
    fails)."""

    model: str
    params: dict
    n_params: int
    loglik: float
    aic: float
    gof_df: int
    gof_p: float
    saturated: bool
    passes: bool
    bmd: float
    bmdl: float
    bmdu: float
    weight: float


@dataclass(frozen=True)
class BMDResult:
    """A row's benchmark dose. `bmd`: the model-average BMD (dose units; inf where the average curve never loses the
    BMR); `bmdl`/`bmdu`: its one-sided (1 - alpha) bootstrap bounds (expanded percentile, seeds resampled with
    their clean runs); `status` (one of `STATUSES`) and `bound` (the BMDL where status is "bounded", else NaN: the
    only number to quote as "keep the dose below"); `models`: each model's fit; `bmds_pick`/`bmds_bmdl`: the model
    BMDS's recommender would pick among the passing ones and its profile BMDL (for comparison, not the bound);
    `notes`: warnings that do not change the status."""

    bmd: float
    bmdl: float
    bmdu: float
    status: str
    models: tuple[ModelFit, ...]
    bmr: float
    bmr_type: str
    dose_scale: str
    dose_min: float
    dose_max: float
    seeds: int
    clean_gain: float
    alpha: float
    n_boot: int
    boot_undefined: int
    bmds_pick: str | None
    bmds_bmdl: float
    notes: tuple[str, ...] = field(default=())
    error_control: str = ""
    boot: np.ndarray | None = field(default=None, repr=False, compare=False)  # the resamples' BMDs (dose units)
    model_bounds: dict | None = None  # each passing model's own bootstrap (BMDL, BMDU), same resamples
    # the model-average curve over the tested doses (dose 0 first, then CURVE_POINTS log-spaced from the lowest to
    # the highest dose; never beyond them): `dose`, `mean` and its pointwise 95% bootstrap band `low`/`high`
    # (outcome minus baseline, the same resamples; NaN where no bootstrap was drawn); None where no model passes
    curve: dict | None = field(default=None, repr=False, compare=False)

    @property
    def bound(self) -> float:
        return self.bmdl if self.status == BOUNDED else float("nan")

    def table(self) -> list[dict]:
        """The per-model table as rows of plain values."""
        return [{"model": m.model, **{f"p_{k}": v for k, v in m.params.items()}, "aic": m.aic, "gof_p": m.gof_p,
                 "saturated": m.saturated, "passes": m.passes, "bmd": m.bmd, "bmdl": m.bmdl, "bmdu": m.bmdu,
                 "weight": m.weight} for m in self.models]



def _group_means(st: Study, idx=None):
    """Per data set (the study itself, or one per row of seed indices `idx` [B, S]): group means [B, K], group
    counts [B, K] and the within-group sum of squares [B] (dose 0 first). A seed not run at a dose (NaN) is not in
    that group; a resample that drew none of a dose's seeds has that group empty (count 0, mean 0: no weight in any
    fit)."""
    y = np.concatenate([st.clean[:, None], st.dosed], axis=1) - st.baseline  # [S, K]
    have = np.isfinite(y)
    y = np.where(have, y, 0.0)
    yb, hb = (y[None], have[None]) if idx is None else (y[idx], have[idx])  # [B, S, K]
    n = hb.sum(1).astype(np.float64)
    m = yb.sum(1) / np.maximum(n, 1.0)
    within = (((yb - m[:, None, :]) ** 2) * hb).sum((1, 2))
    return m, n, within


def seed_strata(st: Study) -> np.ndarray:
    """Each seed's stratum [S]: the index of its pattern of doses run (which doses it has outcomes at), the unit
    `resample_seeds` draws within and `group_strata` counts."""
    return np.unique(np.isfinite(st.dosed), axis=0, return_inverse=True)[1].ravel()


def resample_seeds(st: Study, n_boot: int, rng) -> np.ndarray:
    """Bootstrap resamples of seeds [n_boot, S], each seed drawn with all its runs (its clean run with its dosed
    ones: the BMR's uncertainty moves with the gaps'), stratified by which doses a seed was run at: every pattern of
    doses is a stratum of its own, drawn within itself, so every resample keeps each dose's count. Why: a sequential
    study decided how many seeds each dose gets (a new study of the same design has the same counts), and its rule
    leaves small patterns (seeds 18-19 extended only at the top dose, or run clean only because another row's
    extension added clean twins); drawn with other seeds they made a group's count vary between resamples (a
    10-seed dose drew 8 to 15) or come out empty. The price is the stratified bootstrap's known shortfall: a stratum
    of n_h seeds gives (n_h - 1) / n_h of its share of the variance (a seed alone in its pattern, a failed run, is
    in every resample and gives none), so a group of S seeds in H strata gets (S - H)/S of its mean's variance in
    expectation, each stratum costing 1/S whatever its size; `expanded_alpha` widens the bound by it. One stratum
    (every seed at every dose): the plain bootstrap over seeds, draw for draw."""
    S = st.seeds
    which = seed_strata(st)
    strata = np.unique(which)
    if len(strata) == 1:
        return rng.integers(0, S, size=(n_boot, S))
    idx = np.empty((n_boot, S), dtype=np.int64)
    for p in strata:
        members = np.flatnonzero(which == p)
        idx[:, members] = members[rng.integers(0, members.size, size=(n_boot, members.size))]
    return idx


def resample_fits(st: Study, idx, models, x, x_max: float, exps, drawn=None):
    """Every model fitted to every resample of seeds `idx` [B, S] at once, each resample on its own group counts (a
    seed not run at a dose is not in that group; a group a resample drew none of weighs nothing): (fits per model,
    group means [B, K], counts [B, K], within-group SS [B]). `drawn` [B]: each resample's own baseline offset
    (y - (baseline + drawn) for every group)."""
    yb, nb, wb = _group_means(st, idx)
    if drawn is not None:
        yb = yb - drawn[:, None]
    n = st.ns
    bn = n if (nb == n).all() else nb  # one design for every resample where no group can change its count
    return [fit_many(m, x, bn, yb, x_max, exps) for m in models], yb, nb, wb


def average_curve(models, fits, weights, xv):
    """The Akaike-weighted mean of the models' fitted curves (outcome minus baseline) at dose metric `xv` ([B, K],
    or [B]: one point per data set), per data set (`weights` [B, M])."""
    xv = np.atleast_2d(xv.T).T if xv.ndim == 1 else xv
    tot = np.zeros(xv.shape)
    for m, f, w in zip(models, fits, weights.T):
        e = basis(m, xv, f.t1[:, None], f.t2[:, None])
        tot += w[:, None] * (f.alpha[:, None] + f.beta[:, None] * e)
    return tot


def _ma_bmd_x(models, fits, weights, bmr, bmr_type, x_lo, x_hi, iters: int = 40):
    """BMD of the weighted mean curve, per data set: bracketed on a log grid from x_lo to x_hi and refined by
    bisection; inf if it does not lose the BMR by x_hi, NaN if there is no benchmark."""
    B = weights.shape[0]

    def curve(xv):
        return average_curve(models, fits, weights, xv)

    f0 = curve(np.zeros((B, 1)))[:, 0]
    target = f0 * (1 - bmr) if bmr_type == "relative" else f0 - bmr
    grid = np.concatenate([[0.0], np.geomspace(x_lo, x_hi, 160)])
    fx = curve(np.broadcast_to(grid, (B, grid.size)).copy())
    tol = target[:, None] + 1e-15 * np.abs(target[:, None])
    below = fx <= tol
    below[:, 0] = False
    hit = below.any(1)
    k = np.argmax(below, axis=1)
    lo = grid[np.maximum(k - 1, 0)]
    hi = grid[k]
    lo = np.where(lo <= 0, x_lo * 1e-3, lo)
    for _ in range(iters):
        mid = np.sqrt(lo * hi)
        fm = curve(mid[:, None])[:, 0]
        down = fm <= target
        hi = np.where(down, mid, hi)
        lo = np.where(down, lo, mid)
    out = np.where(hit, np.sqrt(lo * hi), np.inf)
    if bmr_type == "relative":
        out = np.where(f0 > 0, out, np.nan)
    return out


def _akaike(rss_total, N, n_par):
    """AIC of each model from its total RSS under the normal model with MLE variance (constant parts included)."""
    return N * np.log(2 * np.pi * rss_total / N) + N + 2 * (n_par + 1)


def _weights(aics, mask):
    a = np.where(mask, aics, np.inf)
    a = a - a.min(-1, keepdims=True)
    w = np.where(mask, np.exp(-0.5 * a), 0.0)
    return w / w.sum(-1, keepdims=True)


def expanded_alpha(alpha: float, seeds: int, strata: int = 1) -> float:
    """The tail level of Hesterberg's (2015) expanded percentile interval: Phi(-sqrt(S/(S-1)) t_{S-1, 1-alpha}); for a
    group of S seeds drawn in H strata (`resample_seeds`), Phi(-sqrt(S/(S-H)) t_{S-H, 1-alpha}): the stratified
    bootstrap's variance of the group's mean is, in expectation, (S - H)/S of the unbiased estimate's (each stratum
    of n_h seeds gives (n_h - 1)/n_h of its share, whatever its size), on S - H degrees of freedom; H = 1 is
    Hesterberg's."""
    from scipy import stats as st

    if not 0 < strata < seeds:
        raise ValueError(f"need 0 < strata < seeds, got {strata} strata of {seeds} seeds")
    return float(st.norm.cdf(-math.sqrt(seeds / (seeds - strata)) * st.t.ppf(1 - alpha, seeds - strata)))


def group_strata(st: Study) -> np.ndarray:
    """Per dose group (dose 0 first) [K]: how many of `resample_seeds`' strata (patterns of doses run) its seeds
    fall in."""
    which = seed_strata(st)
    have = np.concatenate([np.ones((st.seeds, 1), bool), np.isfinite(st.dosed)], axis=1)
    return np.array([np.unique(which[have[:, k]]).size for k in range(have.shape[1])])


def fit_bmd(doses, clean, dosed, *, baseline: float = 0.0, baseline_se: float = 0.0, bmr: float = 0.25,
            bmr_type: str = "relative", dose_scale: str = "linear", models=MODELS, alpha: float = ALPHA,
            n_boot: int = 2000, seed: int = 0, interval: str = "expanded", profile: bool = True,
            restricted: bool = False, bound: str = "lowest") -> BMDResult:
    """The benchmark dose of one row (module docstring: models, test of fit, average, bounds, status).

    `clean` [S]: each seed's clean-run outcome; `dosed` [S, J]: the same seeds at `doses` [J] (> 0); `baseline`: the
    outcome before training (the clean gain is clean minus it; a relative `bmr` is that fraction of the fitted
    gain); `baseline_se`: its standard error where it is a measurement of its own, not the seeds' (each resample
    then draws its own baseline, normal around it, from a generator of its own: the seeds' resamples stay those of
    `seed`, and the BMR's uncertainty includes the baseline's). `dose_scale`: "linear" (the dose as given) or "log"
    (ln(1 + d / d_min)). `n_boot` resamples of seeds (`seed` the generator's seed); `expanded`: Hesterberg's
    expanded percentile (False: the plain percentile); `profile`: compute each model's profile-likelihood
    BMDL/BMDU (BMDS's), ~0.1 s a model."""
    from scipy import stats as st

    if bound not in ("lowest", "average"):
        raise ValueError(f"bound must be 'lowest' or 'average', got {bound!r}")
    if not (np.isfinite(baseline_se) and baseline_se >= 0):
        raise ValueError(f"baseline_se must be finite and >= 0, got {baseline_se}")
    if bmr_type not in ("relative", "absolute"):
        raise ValueError(f"bmr_type must be 'relative' or 'absolute', got {bmr_type!r}")
    if not (np.isfinite(bmr) and bmr > 0 and (bmr < 1 or bmr_type == "absolute")):
        raise ValueError(f"bmr must be > 0 (and < 1 when relative), got {bmr}")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise ValueError(f"unknown models {unknown}; models: {MODELS}")
    st_ = doses if isinstance(doses, Study) else study(doses, clean, dosed, baseline)
    exps = exponents(restricted)
    S, J = st_.seeds, st_.doses.size
    K = J + 1
    d_min, d_max = float(st_.doses[0]), float(st_.doses[-1])
    x = to_metric(np.concatenate([[0.0], st_.doses]), dose_scale, d_min)
    x_max, x_lo = float(x[-1]), float(x[1])
    ybar, _, within = _group_means(st_)
    n = st_.ns  # seeds per dose group (unequal where a second pass extended some doses)
    N = float(n.sum())
    gain = float(ybar[0, 0])
    notes: list[str] = []
    control = f"one-sided {1 - alpha:.0%} for each of BMDL and BMDU, this row alone (no adjustment across rows)"

    # the point fits
    fits, rows = [], []
    for m in models:
        f = polish(m, x, n, ybar, x_max, fit_many(m, x, n, ybar, x_max, exps), exps)
        fits.append(f)
    rss_tot = np.array([within[0] + f.rss[0] for f in fits])
    p_mean = np.array([N_MEAN_PARAMS[m] for m in models])
    aics = _akaike(rss_tot, N, p_mean)
    gof_df = K - p_mean
    saturated = gof_df <= 0
    with np.errstate(divide="ignore"):
        lr = N * np.log(rss_tot / max(within[0], 1e-300))
    gof_p = np.where(saturated, np.nan, st.chi2.sf(np.maximum(lr, 0), np.maximum(gof_df, 1)))
    passes = ~saturated & (gof_p >= GOF_LEVEL)
    w = _weights(aics[None], passes[None])[0] if passes.any() else np.zeros(len(models))
    bmd_x_m = np.array([float(model_bmd_x(m, f.t1, f.t2, f.alpha, f.beta, bmr, bmr_type)[0])
                        for m, f in zip(models, fits)])
    for i, (m, f) in enumerate(zip(models, fits)):
        bl = bu = float("nan")
        # on BMDS's restricted bounds, a saturated model with its shape exponent on a bound has a free parameter
        # fewer, so BMDS fits and bounds it (and its recommender may pick it: `bmds_recommend`); never in the average
        on_bound = restricted and m in _SHAPE and _on_bound(f.t2[0], exps) and gof_df[i] + 1 > 0
        if profile and bmr_type == "relative" and np.isfinite(bmd_x_m[i]) and (not saturated[i] or on_bound):
            bl, bu = profile_bounds(m, x, n, ybar, float(within[0]), N, f, bmd_x_m[i], bmr, x_max, alpha, exps)
        to_d = (lambda v: float(from_metric(v, dose_scale, d_min)))
        rows.append(ModelFit(m, params_of(m, f), int(p_mean[i]) + 1, float(-aics[i] / 2 + p_mean[i] + 1),
                             float(aics[i]), int(gof_df[i]), float(gof_p[i]), bool(saturated[i]), bool(passes[i]),
                             to_d(bmd_x_m[i]), to_d(bl), to_d(bu), float(w[i])))

    # BMDS's recommender (pybmds recommender/default.json), for comparison
    y0 = np.column_stack([st_.clean, st_.dosed])
    pick, pick_bmdl = bmds_recommend(rows, fits, x, n, ybar[0], np.nanstd(y0, 0, ddof=1), float(within[0]),
                                     np.concatenate([[0.0], st_.doses]), exps)

    boot, model_bounds, band = [None], [None], [None]

    def to_x(v):
        return float(to_metric(v, dose_scale, d_min)) if np.isfinite(v) else float(v)

    def result(status, bmd=float("nan"), bmdl=float("nan"), bmdu=float("nan"), undefined=0):
        return BMDResult(float(bmd), float(bmdl), float(bmdu), status, tuple(rows), float(bmr), bmr_type,
                         dose_scale, d_min, d_max, S, gain, alpha, n_boot, undefined, pick, pick_bmdl,
                         tuple(notes), control, boot[0], model_bounds[0], band[0])

    if bmr_type == "relative" and gain <= 0:
        return result(NO_BENCHMARK)
    if saturated.all():
        return result(SATURATED)
    if not passes.any():
        return result(NO_FIT)
    sel = [i for i in range(len(models)) if passes[i]]
    msel = [models[i] for i in sel]
    x_hi = 10 * x_max
    bmd_x = float(_ma_bmd_x(msel, [fits[i] for i in sel], w[sel][None], bmr, bmr_type, x_lo / 1e3, x_hi)[0])
    bmd = float(from_metric(bmd_x, dose_scale, d_min)) if np.isfinite(bmd_x) else float("inf")
    if d_min / LOW_BMD_FAIL <= bmd < d_min / LOW_BMD_WARN:
        notes.append(f"BMD more than {LOW_BMD_WARN:g}x below the lowest non-zero dose (BMDS warning)")
    # the fitted curve over the tested doses (its band from the bootstrap, below)
    xs = np.concatenate([[0.0], to_metric(np.geomspace(d_min, d_max, CURVE_POINTS), dose_scale, d_min)])
    mid = average_curve(msel, [fits[i] for i in sel], w[sel][None], xs[None])[0]
    band[0] = {"dose": from_metric(xs, dose_scale, d_min), "mean": mid, "low": np.full_like(mid, np.nan),
               "high": np.full_like(mid, np.nan)}

    def placed(bmdl=float("nan"), bmdu=float("nan"), undefined=0, unbounded: str = ""):
        """The status the point BMD's place gives (outside the tested range: above or below it, bound or not),
        else bounded where the BMDL is finite, not bounded where it is not (`unbounded`, if given, the note why)."""
        if not np.isfinite(bmd) or bmd > d_max:
            return result(ABOVE_RANGE, bmd, bmdl, bmdu, undefined)
        if bmd < d_min / LOW_BMD_FAIL:
            return result(BELOW_RANGE, bmd, bmdl, bmdu, undefined)
        if not np.isfinite(bmdl):
            if unbounded:
                notes.append(unbounded)
            return result(NOT_BOUNDED, bmd, bmdl, bmdu, undefined)
        return result(BOUNDED, bmd, bmdl, bmdu, undefined)

    H = group_strata(st_)
    short = strata_shortfall(st_, H)
    if short:
        notes.append(short)
        return placed()
    # the expanded bound's small-sample width (`expanded_alpha`) is set by the group whose mean the stratified
    # bootstrap undersells most: S seeds in H strata give (S - H)/S of its variance (S - 1 of S where every dose has
    # every seed: the fewest seeds decide; a group of 24 in 4 strata, a seed alone, 7, 8 and 8, gives 20/24 of it)
    k_w = min(range(K), key=lambda k: expanded_alpha(alpha, int(n[k]), int(H[k])))
    n_small, h_small = int(n[k_w]), int(H[k_w])
    # the bootstrap over seeds, clean runs drawn with their dosed runs
    idx = resample_seeds(st_, n_boot, np.random.default_rng(seed))
    drawn = np.random.default_rng([seed, 1]).normal(0.0, baseline_se, n_boot) if baseline_se > 0 else np.zeros(n_boot)
    bfits, yb, nb, wb = resample_fits(st_, idx, msel, x, x_max, exps, drawn)
    brss = np.stack([wb + f.rss for f in bfits], axis=1)  # [B, M]
    bw = _weights(_akaike(brss, nb.sum(-1)[:, None], p_mean[sel][None]), np.ones(len(sel), bool)[None])
    bx = _ma_bmd_x(msel, bfits, bw, bmr, bmr_type, x_lo / 1e3, x_hi)
    undefined = int(np.isnan(bx).sum())
    bx = bx[~np.isnan(bx)]
    boot[0] = from_metric(bx, dose_scale, d_min)
    # the band is of the fitted outcome, which the baseline's draw does not move (it moves only where the BMR lies):
    # each resample's curve back on the outcome's scale before the quantiles
    spread = average_curve(msel, bfits, bw, np.broadcast_to(xs, (n_boot, xs.size)).copy()) + drawn[:, None]
    band[0] = {"dose": from_metric(xs, dose_scale, d_min), "mean": mid,
               "low": np.nanquantile(spread, alpha / 2, axis=0), "high": np.nanquantile(spread, 1 - alpha / 2, axis=0)}
    if bx.size < 0.5 * n_boot:
        notes.append(f"{undefined} of {n_boot} resamples had no clean gain (no benchmark)")
        return placed(undefined=undefined)
    ql, qu = bootstrap_bounds(bx, bmd_x, n_small, alpha, interval, h_small)
    bm = np.stack([model_bmd_x(m, f.t1, f.t2, f.alpha, f.beta, bmr, bmr_type) for m, f in zip(msel, bfits)], 1)
    per_model = {}
    for k, i in enumerate(sel):
        b = bm[:, k][~np.isnan(bm[:, k])]
        if b.size >= 0.5 * n_boot:
            per_model[models[i]] = tuple(float(from_metric(v, dose_scale, d_min)) if np.isfinite(v) else float(v)
                                         for v in bootstrap_bounds(b, bmd_x_m[i], n_small, alpha, interval,
                                                                   h_small))
    model_bounds[0] = per_model
    if bound == "lowest" and per_model:  # each passing model's bound too: the bound holds whichever model is true
        lows = [to_x(v[0]) for v in per_model.values()]
        highs = [to_x(v[1]) for v in per_model.values()]
        ql, qu = min([ql, *lows]), max([qu, *highs])
    bmdl = float(from_metric(ql, dose_scale, d_min)) if np.isfinite(ql) else float("inf")
    bmdu = float(from_metric(qu, dose_scale, d_min)) if np.isfinite(qu) else float("inf")
    if undefined:
        notes.append(f"{undefined} of {n_boot} resamples had no clean gain and were left out")
    return placed(bmdl, bmdu, undefined,
                  unbounded="the bootstrap put the BMD at or beyond the tested range too often for a finite bound")


INTERVALS = ("expanded", "percentile", "bc")


BMDS_MODELS = ("linear", "power", "exp3", "exp5", "hill")  # BMDS's continuous models: no Hill 3
_SHAPE = {"power": "n", "exp3": "d", "exp5": "d", "hill": "n"}  # each model's shape exponent (BMDS's name)


def _on_bound(shape: float, exps) -> bool:
    """Is a fitted shape exponent on an end of the grid it was fitted on (BMDS: a parameter on its bound)?"""
    return bool(np.isfinite(shape) and min(abs(shape - exps[0]), abs(shape - exps[-1])) < 1e-6)


def bmds_recommend(rows: list[ModelFit], fits, x, n, ybar, sds, within: float, doses, exps) -> tuple[str | None, float]:
    """The model BMDS's recommender picks, and its BMDL (pybmds 25.2, `recommender/default.json`, continuous data):
    among BMDS's own models, those left "viable" by every check that bins a model questionable or unusable (test 4
    p < 0.1, no degrees of freedom, |scaled residual at the dose nearest the BMD| > 2, BMD or BMDL more than 10x
    below the lowest dose, BMD/BMDL > 20, the constant-variance test 2 p < 0.05, a missing AIC/BMD/BMDL); of those,
    the lowest AIC where their BMDLs lie within 3x, else the lowest BMDL; ties to the fewest parameters. Its AIC
    and its test 4 count only the parameters off their bounds (a shape exponent at 1 or at the grid's top), as
    BMDS's do.
    (None, NaN) when no model is viable. For comparison with the model average, which is the bound quoted."""
    from scipy import stats as st

    N = float(n.sum())
    ss = (n - 1) * np.asarray(sds, dtype=float) ** 2
    with np.errstate(divide="ignore"):  # test 2: one variance against one per dose group
        lr2 = N * np.log(max(within, 1e-300) / N) - float(np.sum(n * np.log(np.maximum(ss, 1e-300) / n)))
    variance_fails = bool(st.chi2.sf(max(lr2, 0.0), len(n) - 1) < 0.05) if np.all(ss > 0) else False
    lowest = float(doses[doses > 0].min())
    viable = []
    for r, f in zip(rows, fits):
        if r.model not in BMDS_MODELS or not (np.isfinite(r.aic) and np.isfinite(r.bmd) and np.isfinite(r.bmdl)):
            continue
        on_bound = int(r.model in _SHAPE and _on_bound(r.params[_SHAPE[r.model]], exps))
        rss = within + float(f.rss[0])
        df = r.gof_df + on_bound  # BMDS's test 4 counts only the parameters off their bounds
        gof = float(st.chi2.sf(max(N * np.log(rss / max(within, 1e-300)), 0.0), df)) if df > 0 else float("nan")
        pred = f.alpha[0] + f.beta[0] * basis(r.model, x, f.t1[0], f.t2[0])
        roi = float(((ybar - pred) / (np.sqrt(rss / N) / np.sqrt(n)))[int(np.argmin(np.abs(doses - r.bmd)))])
        if (df <= 0 or not gof >= GOF_LEVEL or abs(roi) > 2 or variance_fails or r.bmd <= 0 or r.bmdl <= 0
                or lowest / r.bmd > 10 or lowest / r.bmdl > 10 or r.bmd / r.bmdl > 20):
            continue
        viable.append((r, -2 * r.loglik + 2 * (r.n_params - on_bound)))
    if not viable:
        return None, float("nan")
    bl = np.array([r.bmdl for r, _ in viable])
    # AICs equal to 1e-6 are a tie (power with its exponent on 1 is the line), broken as BMDS does: fewer parameters
    key = [a for _, a in viable] if bl.max() / bl.min() <= 3 else list(bl)
    tied = [i for i in range(len(viable)) if key[i] - min(key) <= 1e-6 * max(1.0, abs(min(key)))]
    best = min(tied, key=lambda i: viable[i][0].n_params)
    return viable[best][0].model, viable[best][0].bmdl


def bootstrap_bounds(boot, estimate: float, seeds: int, alpha: float = ALPHA, interval: str = "expanded",
                     strata: int = 1):
    """(lower, upper) one-sided 1 - alpha bounds from bootstrap estimates `boot` (may hold +inf: never reached):
    "expanded" Hesterberg's (2015) expanded percentile (the default; `seeds` drawn in `strata` strata,
    `expanded_alpha`), "percentile" the plain percentile (Efron), "bc" Efron's bias-corrected percentile at the
    expanded level."""
    from scipy import stats as st

    if interval not in INTERVALS:
        raise ValueError(f"interval must be one of {INTERVALS}, got {interval!r}")
    boot = np.asarray(boot, dtype=np.float64)
    a_lo = a_hi = expanded_alpha(alpha, seeds, strata) if interval != "percentile" else alpha
    if interval == "bc" and np.isfinite(estimate):
        share = float(np.clip((boot < estimate).mean() + 0.5 * (boot == estimate).mean(), 1 / boot.size,
                              1 - 1 / boot.size))
        z0, za = st.norm.ppf(share), st.norm.ppf(a_lo)
        a_lo, a_hi = float(st.norm.cdf(2 * z0 + za)), float(st.norm.cdf(-2 * z0 + za))
    return _q_inf(boot, a_lo), _q_inf(boot, 1 - a_hi)


def _q_inf(v, q):
    """Quantile of values that may include +inf (sorted order statistic, linear between finite neighbours)."""
    s = np.sort(v)
    pos = q * (s.size - 1)
    lo, hi = int(np.floor(pos)), int(np.ceil(pos))
    if not np.isfinite(s[hi]):
        return float("inf") if not np.isfinite(s[lo]) or hi != lo and pos > lo else float(s[lo])
    return float(s[lo] + (pos - lo) * (s[hi] - s[lo]))


# ------------------------------------------------------------------------------------- dose scale, simulation ---

@dataclass(frozen=True)
class ScaleComparison:
    """The same row fitted with the dose on a linear and on a log scale. `agree`: each scale's BMD lies inside the
    other's [BMDL, BMDU] (or both say the same non-bounded status); `bmdl_ratio`: log's BMDL over linear's."""

    linear: BMDResult
    log: BMDResult
    agree: bool
    bmdl_ratio: float


def compare_dose_scales(doses, clean, dosed, **kw) -> ScaleComparison:
    """Fit with `dose_scale` "linear" and "log" (same bootstrap resamples) and say whether the scale decides the
    answer."""
    a = fit_bmd(doses, clean, dosed, dose_scale="linear", **kw)
    b = fit_bmd(doses, clean, dosed, dose_scale="log", **kw)
    if a.status == BOUNDED and b.status == BOUNDED:
        agree = (b.bmdl <= a.bmd <= b.bmdu) and (a.bmdl <= b.bmd <= a.bmdu)
    else:
        agree = a.status == b.status
    return ScaleComparison(a, b, bool(agree), b.bmdl / a.bmdl if a.bmdl > 0 else float("nan"))
