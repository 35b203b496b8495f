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
  selection rule (lowest AIC, or lowest BMDL where the passing models' BMDLs differ more than 3x) is computed too,
  with BMDS's profile BMDLs (`BMDResult.bmds_pick`, `bmds_bmdl`), for comparison only.
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

How a fit is done fast enough for a bootstrap: each model is a linear model a + b*e(x; theta) in two linear
parameters for a fixed shape theta (one or two nonlinear parameters, e.g. Exp's (b, g), Hill's (k, n)), so the
least-squares fit profiles out the linear part in closed form (variable projection, Golub & Pereyra 1973) and is
found on a grid of theta (log-spaced scale x exponent), refined by a parabola on the grid and by damped Newton
steps on every resample at once (without them the grid's step biased the bootstrap's BMDs, power's by 6%) and, for
the point fit, polished by L-BFGS-B. Fits on a dose group's sufficient statistics (n, mean, sum of squares) are
the same as on the seed-level data under the constant-variance normal model, which is also why BMDS's fit on
(n, mean, sd) can be compared with this one (`bmds_fit`). With the bootstrap's per-group means one matrix product
fits every resample at every grid shape.

Measured (docs/benchmark_dose.md has the tables, `scripts/bmd_coverage.py` reruns them): the BMDL's coverage at
notebook 08's design (doses 0, .03, .1, .3, 1; clean gain 0.3; seed sd 0.085; BMR 25%), 300 simulated studies per
cell, 95.4-98.6% on exponential, Hill and linear truths at 10 and 30 seeds (Clopper-Pearson lower ends 92.3-96.3%);
agreement with EPA's engine (pybmds 25.2) at the same optimum: BMD within 1e-5 relative, profile BMDL within 0.12%
(Exp5 1%) on synthetic curves and 0.06% on notebook 08's runs of record; 0.8 s CPU per study (2,000 resamples).

Pure numpy/scipy; `bmds_fit` alone starts a process (EPA's engine in its own environment, `.venvs/bmds`).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rlwb.errors import BMDInputError, BMDSUnavailable

__all__ = ["BMDInputError", "BMDSUnavailable", "BMDResult", "ModelFit", "Study", "fit_bmd", "compare_dose_scales",
           "bmds_fit", "study", "study08_rows", "simulate", "simulate_coverage"]

ALPHA = 0.05  # each bound one-sided 95%, as BMDS's default (alpha 0.05: BMDL and BMDU are the 90% interval's ends)
GOF_LEVEL = 0.1  # BMDS's recommender: test 4 p below 0.1 fails the fit (pybmds recommender/default.json, "gof")
LOW_BMD_FAIL, LOW_BMD_WARN = 10.0, 3.0  # BMDS: BMD this many times below the lowest non-zero dose (fail / warning)
PROFILE_CHI2 = 2.705543454095404  # chi2_1 quantile 0.90: a one-sided 95% profile-likelihood bound (BMDS)
MODELS = ("linear", "power", "exp3", "exp5", "hill3", "hill")
N_MEAN_PARAMS = {"linear": 2, "power": 3, "exp3": 3, "exp5": 4, "hill3": 3, "hill": 4}
BMDS_NAMES = {"linear": "Linear", "power": "Power", "exp3": "Exponential 3", "exp5": "Exponential 5",
              "hill": "Hill"}

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
    NOT_BOUNDED: "the bootstrap put the BMD at or beyond the tested range too often for a finite bound",
}

# the grids of the nonlinear shape parameters (x in units of the largest dose metric x_max)
_SCALE_DECADES = (-2.0, 3.0)  # Exp's b x_max from 0.01 to 1000; Hill's k / x_max from 1e-3 to 1e2 (reversed)
_SCALE_PER_DECADE = 16
_EXPONENTS = np.array([1.0, 1.15, 1.3, 1.5, 1.75, 2.0, 2.3, 2.65, 3.0, 3.5, 4.0, 5.0, 6.0, 7.5, 9.5, 12.0, 15.0,
                       18.0])  # g / n in [1, 18], BMDS's restricted bounds
_EXPONENTS_FREE = np.concatenate([[0.25, 0.35, 0.5, 0.7, 0.85], _EXPONENTS])  # EFSA: d > 0


def exponents(restricted: bool) -> np.ndarray:
    """The grid of shape exponents (Exp's g, Hill's n, power's g): BMDS's restricted [1, 18] or, unrestricted,
    [0.25, 18] (EFSA's models have d > 0: a drop steepest at dose 0 is allowed; 0.25 keeps the BMDL finite)."""
    return _EXPONENTS if restricted else _EXPONENTS_FREE


@dataclass(frozen=True)
class Study:
    """Seed-level data of one dose-response row, checked. `clean` [S]: each seed's clean-run outcome (dose 0);
    `dosed` [S, J]: the same seeds' outcomes at `doses` [J] (> 0, distinct, increasing after `study`); `baseline`:
    the outcome before training (the untrained policy's), which the clean gain is measured from."""

    doses: np.ndarray
    clean: np.ndarray
    dosed: np.ndarray
    baseline: float = 0.0

    @property
    def seeds(self) -> int:
        return int(self.clean.size)

    def group_stats(self) -> dict:
        """Per dose group (dose 0 first): dose, n, mean and sd (ddof 1) of the outcome minus `baseline` (BMDS's
        summary input)."""
        y = np.column_stack([self.clean, self.dosed]) - self.baseline
        return {"doses": [0.0, *map(float, self.doses)], "ns": [self.seeds] * y.shape[1],
                "means": y.mean(0).tolist(), "stdevs": y.std(0, ddof=1).tolist()}


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
    for name, a in (("clean", c), ("dosed", y)):
        bad = np.argwhere(~np.isfinite(a))
        if bad.size:
            raise BMDInputError(f"{name} has a missing or infinite value at {tuple(int(i) for i in bad[0])} "
                                f"({len(bad)} in all): a seed missing at one dose cannot be paired; drop the seed")
    if c.size < 3:
        raise BMDInputError(f"need at least 3 seeds (one clean and one dosed run each), got {c.size}")
    if not np.isfinite(baseline):
        raise BMDInputError(f"baseline must be finite, got {baseline}")
    o = np.argsort(d)
    return Study(d[o], c, y[:, o], float(baseline))


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


# ------------------------------------------------------------------------------------------------- the models ---

def _grid(model: str, x_max: float, exps, per_decade: int = _SCALE_PER_DECADE
          ) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """The shape parameters' grid of `model`: (theta1, theta2) flattened, and the grid's shape. theta1 is a scale
    (Exp's b, Hill's k), log-spaced; theta2 an exponent (Exp's g, Hill's n, power's g)."""
    if model == "linear":
        return np.array([np.nan]), np.array([1.0]), (1, 1)
    if model == "power":  # one shape parameter: a finer grid costs little
        g = np.geomspace(exps[0], exps[-1], 64)
        return np.full(g.size, np.nan), g, (1, g.size)
    lo, hi = _SCALE_DECADES
    s = np.logspace(lo, hi, int((hi - lo) * per_decade) + 1) / x_max
    if model in ("hill", "hill3"):
        s = np.sort(1.0 / s)  # Hill's k: k / x_max from 1e-3 to 1e2
    t1, t2 = np.meshgrid(s, exps, indexing="ij")
    return t1.ravel(), t2.ravel(), t1.shape


def _scale_bounds(model: str, x_max: float) -> tuple[float, float]:
    """The range of the scale parameter (Exp's b, Hill's k) the fits search: b x_max in [0.01, 1000], k / x_max
    in [0.001, 100]."""
    lo, hi = 10.0 ** _SCALE_DECADES[0] / x_max, 10.0 ** _SCALE_DECADES[1] / x_max
    return (1 / hi, 1 / lo) if model in ("hill", "hill3") else (lo, hi)


def _basis(model: str, x, t1, t2):
    """e(x; theta), decreasing in x: the model's mean is alpha + beta * e with beta >= 0 (exp3: beta * e).
    Broadcasts theta [..., 1] against x [K]."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
        if model == "linear":
            return -x + 0.0 * np.asarray(t2)
        if model == "power":
            return -(x ** t2)
        if model in ("exp3", "exp5"):
            return np.exp(-((t1 * x) ** t2))
        if model in ("hill", "hill3"):
            return 1.0 / (1.0 + (x / t1) ** t2)
    raise ValueError(f"unknown model {model!r}; models: {MODELS}")


def _floor(model: str, exps) -> bool:
    """BMDS's restricted Exp5 keeps c >= 0 (its plateau at or above 0); with the exponent grid starting at 1 (the
    restricted bounds, `exponents`) so does this one's."""
    return model == "exp5" and exps[0] >= 1.0


def _has_alpha(model: str) -> bool:
    return model not in ("exp3", "hill3")


def _ls(model: str, e, n, ybar, floor: bool = False):
    """Least squares of the group means `ybar` [B, K] (weights `n` [K]) on alpha + beta * e, e [G, K], beta >= 0:
    (alpha [B, G], beta [B, G], between-group RSS [B, G])."""
    N = n.sum()
    Sy = ybar @ n  # [B]
    Syy = (ybar ** 2) @ n
    ne = e * n  # [G, K]
    Sey = ybar @ ne.T  # [B, G]
    See = (e * ne).sum(-1)  # [G]
    if _has_alpha(model):
        Se = ne.sum(-1)
        See_c = See - Se ** 2 / N
        Sey_c = Sey - Se[None, :] * Sy[:, None] / N
        ok = See_c > 1e-14 * np.maximum(See, 1e-300)
        with np.errstate(divide="ignore", invalid="ignore"):
            beta = np.where(ok & (Sey_c > 0), Sey_c / np.where(ok, See_c, 1.0), 0.0)
        alpha = (Sy[:, None] - beta * Se[None, :]) / N
        rss = (Syy - Sy ** 2 / N)[:, None] - beta * Sey_c
        if floor:  # BMDS's Exp5 keeps c >= 0 (the plateau not below 0): where alpha < 0, the fit through 0
            b0 = np.where(Sey > 0, Sey / np.maximum(See, 1e-300), 0.0)
            neg = alpha < 0
            beta, alpha = np.where(neg, b0, beta), np.where(neg, 0.0, alpha)
            rss = np.where(neg, Syy[:, None] - b0 * Sey, rss)
    else:
        ok = See > 1e-300
        beta = np.where(ok & (Sey > 0), Sey / np.where(ok, See, 1.0), 0.0)
        alpha = np.zeros_like(beta)
        rss = Syy[:, None] - beta * Sey
    return alpha, beta, np.maximum(rss, 0.0)


def _bmd_x(model: str, t1, t2, alpha, beta, bmr: float, bmr_type: str):
    """The BMD on the metric scale from a model's parameters (arrays broadcast): inf where the curve never loses the
    BMR, NaN where there is no benchmark (relative BMR with f(0) <= 0)."""
    t1, t2, alpha, beta = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in (t1, t2, alpha, beta)))
    e0 = 0.0 if model in ("linear", "power") else 1.0
    f0 = alpha + beta * e0
    # the basis must fall from e0 by `drop` = (f(0) - f(BMD)) / beta
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if bmr_type == "relative":
            drop = bmr * f0 / beta
        else:
            drop = bmr / beta
        eD = e0 - drop
        if model == "linear":
            out = drop
        elif model == "power":
            out = drop ** (1.0 / t2)
        elif model in ("exp3", "exp5"):
            out = np.where(eD > 0, (-np.log(np.where(eD > 0, eD, 1.0))) ** (1.0 / t2) / t1, np.inf)
        else:  # hill: 1 / (1 + (x/k)^n) = eD
            out = np.where(eD > 0, t1 * (np.where(eD > 0, 1.0 / eD - 1.0, 1.0)) ** (1.0 / t2), np.inf)
        out = np.where(beta > 0, out, np.inf)
        if bmr_type == "relative":
            out = np.where(f0 > 0, out, np.nan)
    return out


# ------------------------------------------------------------------------------------------------ fitting ---

@dataclass
class _Fits:
    """Per model, per data set b: the fitted shape and linear parameters and the between-group RSS."""

    t1: np.ndarray
    t2: np.ndarray
    alpha: np.ndarray
    beta: np.ndarray
    rss: np.ndarray


def _fit_many(model: str, x, n, ybar, x_max: float, exps, chunk: int = 256) -> _Fits:
    """Fit `model` to every row of group means `ybar` [B, K] at once: the grid minimum, refined by a parabola
    through its neighbours along each grid axis (kept only where it lowers the RSS)."""
    t1g, t2g, shape = _grid(model, x_max, exps)
    e = _basis(model, x[None, :], t1g[:, None], t2g[:, None])  # [G, K]
    B = ybar.shape[0]
    out = {k: np.empty(B) for k in ("t1", "t2", "alpha", "beta", "rss")}
    n1, n2 = shape
    for s in range(0, B, chunk):
        yb = ybar[s:s + chunk]
        rss = _rss_grid(model, e, n, yb, _floor(model, exps))
        i = np.argmin(rss, axis=1)
        rows = np.arange(yb.shape[0])
        al_i, be_i, _ = _ls_rows(model, e[i], n, yb, _floor(model, exps))
        r0 = rss[rows, i]
        t1, t2 = t1g[i].copy(), t2g[i].copy()
        if model != "linear":
            i1, i2 = np.divmod(i, n2)
            # parabola along the scale axis (log scale) and the exponent axis (index space)
            if n1 > 1:
                ok = (i1 > 0) & (i1 < n1 - 1)
                rm = rss[rows, np.where(ok, i - n2, i)]
                rp = rss[rows, np.where(ok, i + n2, i)]
                den = rm - 2 * r0 + rp
                dlt = np.where(ok & (den > 0), np.clip(0.5 * (rm - rp) / np.where(den > 0, den, 1), -0.5, 0.5), 0)
                step = np.log(t1g[n2]) - np.log(t1g[0])
                t1 = np.exp(np.log(t1) + dlt * step)
            ok = (i2 > 0) & (i2 < n2 - 1)
            rm = rss[rows, np.where(ok, i - 1, i)]
            rp = rss[rows, np.where(ok, i + 1, i)]
            den = rm - 2 * r0 + rp
            dlt = np.where(ok & (den > 0), np.clip(0.5 * (rm - rp) / np.where(den > 0, den, 1), -0.5, 0.5), 0)
            ax2 = t2g[:n2]
            nb = np.where(dlt >= 0, ax2[np.minimum(i2 + 1, n2 - 1)], ax2[np.maximum(i2 - 1, 0)])
            t2 = t2 + np.abs(dlt) * (nb - t2)
            er = _basis(model, x[None, :], t1[:, None], t2[:, None])  # [b, K]
            a2, b2, r2 = _ls_rows(model, er, n, yb, _floor(model, exps))
            better = r2 < r0
            t1g_i, t2g_i = t1g[i], t2g[i]
            t1 = np.where(better, t1, t1g_i)
            t2 = np.where(better, t2, t2g_i)
            out["alpha"][s:s + chunk] = np.where(better, a2, al_i)
            out["beta"][s:s + chunk] = np.where(better, b2, be_i)
            out["rss"][s:s + chunk] = np.where(better, r2, r0)
        else:
            out["alpha"][s:s + chunk] = al_i
            out["beta"][s:s + chunk] = be_i
            out["rss"][s:s + chunk] = r0
        out["t1"][s:s + chunk], out["t2"][s:s + chunk] = t1, t2
    f = _Fits(**out)
    return _newton(model, x, n, ybar, x_max, exps, f) if model != "linear" else f


def _newton(model: str, x, n, ybar, x_max: float, exps, f: _Fits, iters: int = 8, h: float = 1e-3) -> _Fits:
    """Polish every data set's grid fit at once: damped Newton steps on the profiled RSS over the log shape
    parameters (finite-difference gradient and Hessian), each step kept only where it lowers the RSS, within the
    grid's bounds. Without it the grid's step biases the bootstrap's BMDs (power's by ~6%, measured)."""
    floor = _floor(model, exps)
    lo1, hi1 = (np.log(v) for v in _scale_bounds(model, x_max))
    lo2, hi2 = np.log(exps[0]), np.log(exps[-1])
    two = model != "power"
    l1 = np.log(f.t1) if two else np.zeros_like(f.t2)
    l2 = np.log(f.t2)

    def rss(a, b):
        t1 = np.exp(a) if two else np.full(a.shape, np.nan)
        e = _basis(model, x[None, :], t1[:, None], np.exp(b)[:, None])
        return _ls_rows(model, e, n, ybar, floor)[2]

    r0 = rss(l1, l2)
    for _ in range(iters):
        rp2, rm2 = rss(l1, l2 + h), rss(l1, l2 - h)
        g2, h22 = (rp2 - rm2) / (2 * h), (rp2 - 2 * r0 + rm2) / h ** 2
        if two:
            rp1, rm1 = rss(l1 + h, l2), rss(l1 - h, l2)
            g1, h11 = (rp1 - rm1) / (2 * h), (rp1 - 2 * r0 + rm1) / h ** 2
            h12 = (rss(l1 + h, l2 + h) - rss(l1 + h, l2 - h) - rss(l1 - h, l2 + h) + rss(l1 - h, l2 - h)) / (4 * h * h)
            det = h11 * h22 - h12 ** 2
            pd = (det > 0) & (h11 > 0)
            with np.errstate(divide="ignore", invalid="ignore"):
                d1 = np.where(pd, -(h22 * g1 - h12 * g2) / det, np.where(h11 > 0, -g1 / h11, -np.sign(g1) * 0.1))
                d2 = np.where(pd, -(h11 * g2 - h12 * g1) / det, np.where(h22 > 0, -g2 / h22, -np.sign(g2) * 0.1))
        else:
            d1 = np.zeros_like(l2)
            with np.errstate(divide="ignore", invalid="ignore"):
                d2 = np.where(h22 > 0, -g2 / h22, -np.sign(g2) * 0.1)
        d1 = np.clip(np.nan_to_num(d1), -0.5, 0.5)
        d2 = np.clip(np.nan_to_num(d2), -0.5, 0.5)
        best, b1, b2 = r0, l1, l2
        for step in (1.0, 0.5, 0.25):
            a = np.clip(l1 + step * d1, lo1, hi1) if two else l1
            b = np.clip(l2 + step * d2, lo2, hi2)
            r = rss(a, b)
            better = r < best
            best, b1, b2 = np.where(better, r, best), np.where(better, a, b1), np.where(better, b, b2)
        if np.allclose(best, r0, rtol=1e-12, atol=0):
            break
        r0, l1, l2 = best, b1, b2
    t1 = np.exp(l1) if two else f.t1
    e = _basis(model, x[None, :], t1[:, None], np.exp(l2)[:, None])
    a, b, r = _ls_rows(model, e, n, ybar, floor)
    return _Fits(t1, np.exp(l2), a, b, r)


def _rss_grid(model: str, e, n, ybar, floor: bool = False):
    """The between-group RSS [B, G] of `_ls`, alone (the bootstrap's hot loop: one matrix product and a few
    elementwise operations)."""
    if floor:
        return _ls(model, e, n, ybar, floor)[2]
    N = n.sum()
    Sy, Syy = ybar @ n, (ybar ** 2) @ n
    ne = e * n
    Sey = ybar @ ne.T
    See = (e * ne).sum(-1)
    if _has_alpha(model):
        Se = ne.sum(-1)
        See_c = See - Se ** 2 / N
        ok = See_c > 1e-14 * np.maximum(See, 1e-300)
        inv = np.where(ok, 1.0 / np.where(ok, See_c, 1.0), 0.0)
        Sey -= Sy[:, None] * (Se / N)[None, :]
        np.maximum(Sey, 0.0, out=Sey)
        Sey *= Sey
        Sey *= -inv[None, :]
        Sey += (Syy - Sy ** 2 / N)[:, None]
    else:
        inv = np.where(See > 1e-300, 1.0 / np.maximum(See, 1e-300), 0.0)
        np.maximum(Sey, 0.0, out=Sey)
        Sey *= Sey
        Sey *= -inv[None, :]
        Sey += Syy[:, None]
    return np.maximum(Sey, 0.0, out=Sey)


def _ls_rows(model, e, n, ybar, floor: bool = False):
    """`_ls` with one basis per data row: e [B, K], ybar [B, K] -> alpha, beta, rss [B]."""
    N = n.sum()
    Sy, Syy = ybar @ n, (ybar ** 2) @ n
    Sey, See = (ybar * e) @ n, (e * e) @ n
    if _has_alpha(model):
        Se = e @ n
        See_c, Sey_c = See - Se ** 2 / N, Sey - Se * Sy / N
        ok = See_c > 1e-14 * np.maximum(See, 1e-300)
        beta = np.where(ok & (Sey_c > 0), Sey_c / np.where(ok, See_c, 1.0), 0.0)
        alpha, rss = (Sy - beta * Se) / N, Syy - Sy ** 2 / N - beta * Sey_c
        if floor:
            b0 = np.where(Sey > 0, Sey / np.maximum(See, 1e-300), 0.0)
            neg = alpha < 0
            beta, alpha = np.where(neg, b0, beta), np.where(neg, 0.0, alpha)
            rss = np.where(neg, Syy - b0 * Sey, rss)
        return alpha, beta, np.maximum(rss, 0.0)
    ok = See > 1e-300
    beta = np.where(ok & (Sey > 0), Sey / np.where(ok, See, 1.0), 0.0)
    return np.zeros_like(beta), beta, np.maximum(Syy - beta * Sey, 0.0)


def _polish(model: str, x, n, ybar, x_max: float, f: _Fits, exps) -> _Fits:
    """The point fit: the grid fit polished by L-BFGS-B over the shape parameters (log scale, exponent) within the
    grid's bounds."""
    from scipy import optimize

    if model == "linear":
        return f
    lo, hi = _SCALE_DECADES
    if model == "power":
        def rss_of(p):
            e = _basis(model, x[None, :], np.array([np.nan])[:, None], np.array([p[0]])[:, None])
            return float(_ls_rows(model, e, n, ybar, _floor(model, exps))[2][0])
        res = optimize.minimize(rss_of, [f.t2[0]], method="L-BFGS-B", bounds=[(exps[0], exps[-1])])
        p = [f.t1[0], res.x[0]] if res.fun < f.rss[0] else [f.t1[0], f.t2[0]]
    else:
        if model in ("hill", "hill3"):
            b1 = (np.log(x_max) - hi * np.log(10), np.log(x_max) - lo * np.log(10))
        else:
            b1 = (lo * np.log(10) - np.log(x_max), hi * np.log(10) - np.log(x_max))

        def rss_of(p):
            e = _basis(model, x[None, :], np.array([np.exp(p[0])])[:, None], np.array([p[1]])[:, None])
            return float(_ls_rows(model, e, n, ybar, _floor(model, exps))[2][0]) / scale

        scale = max(float(f.rss[0]), 1e-300)
        res = optimize.minimize(rss_of, [np.log(f.t1[0]), f.t2[0]], method="L-BFGS-B",
                                bounds=[b1, (exps[0], exps[-1])],
                                options={"ftol": 1e-13, "gtol": 1e-10, "maxiter": 200})
        p = [np.exp(res.x[0]), res.x[1]] if res.fun * scale < f.rss[0] else [f.t1[0], f.t2[0]]
    e = _basis(model, x[None, :], np.array([p[0]])[:, None], np.array([p[1]])[:, None])
    a, b, r = _ls_rows(model, e, n, ybar, _floor(model, exps))
    return _Fits(np.array([p[0]]), np.array([p[1]]), a, b, r)


def _profile_bounds(model: str, x, n, ybar, within: float, N: int, fit: _Fits, bmd_x: float, bmr: float,
                    x_max: float, alpha: float, exps) -> tuple[float, float]:
    """BMDS's per-model BMDL and BMDU: the doses below and above the BMD where the profile log-likelihood with the
    BMD held fixed has fallen by chi2_1(1 - 2 alpha) / 2 (relative BMR only). Profiles over the shape grid, the
    crossing found by Brent's method on the profile itself."""
    from scipy import stats as st

    crit = float(st.chi2.ppf(1 - 2 * alpha, 1))
    if not np.isfinite(bmd_x) or bmd_x <= 0:
        return float("nan"), float("nan")
    from scipy import optimize

    rss_min = within + float(fit.rss[0])
    fine = np.geomspace(exps[0], exps[-1], 64)  # the profile's exponent grid: finer than the bootstrap's

    def lr_minus_crit(logd: float) -> float:
        prof = _profile_rss(model, x, n, ybar[0], float(np.exp(logd)), bmr, x_max, fine) + within
        return N * math.log(max(prof, rss_min) / rss_min) - crit

    L = np.linspace(np.log(bmd_x) - np.log(1e4), np.log(bmd_x) + np.log(1e3), 43)
    v = np.array([lr_minus_crit(li) for li in L])
    j = int(np.argmin(np.abs(L - np.log(bmd_x))))
    v[j] = min(v[j], -1e-12)
    lo_k = j
    while lo_k > 0 and v[lo_k - 1] <= 0:
        lo_k -= 1
    hi_k = j
    while hi_k < L.size - 1 and v[hi_k + 1] <= 0:
        hi_k += 1

    def root(a: float, b: float) -> float:  # the crossing, by Brent's method on the profile itself
        try:
            return float(np.exp(optimize.brentq(lr_minus_crit, a, b, xtol=1e-10)))
        except ValueError:
            return float(np.exp(0.5 * (a + b)))

    bmdl = 0.0 if lo_k == 0 else root(L[lo_k - 1], L[lo_k])
    bmdu = float("inf") if hi_k == L.size - 1 else root(L[hi_k], L[hi_k + 1])
    return bmdl, bmdu


def _profile_rss(model: str, x, n, yb, D: float, bmr: float, x_max: float, exps) -> float:
    """The smallest between-group RSS of `model` with its relative BMD fixed at D (metric scale): the BMR constraint
    is linear in (alpha, beta) for a fixed shape, leaving one linear parameter; exp3's shape scale is fixed by D."""
    if model in ("exp3", "hill3"):  # f = beta * e, e(D) = 1 - bmr fixes the scale from the exponent
        t2 = exps
        t1 = ((-np.log(1 - bmr)) ** (1 / t2) / D if model == "exp3" else D * (1 / (1 - bmr) - 1) ** (-1 / t2))
        u = _basis(model, x[None, :], t1[:, None], t2[:, None])
    elif model in ("linear", "power"):
        # e = -x^g, e(0) = 0: f(0) - f(D) = beta D^g = bmr * alpha, so f = beta (D^g / bmr - x^g)
        t2 = np.array([1.0]) if model == "linear" else exps
        u = (D ** t2 / bmr)[:, None] - x[None, :] ** t2[:, None]
    else:
        # exp5, Hill (e(0) = 1): the BMR fixes alpha / beta = (1 - bmr - e(D)) / bmr; the profile runs over e(D)
        # and the exponent, the scale (Exp's b, Hill's k) following from them exactly (a grid of the scale would
        # move the BMD it is meant to hold fixed)
        eD = np.unique(np.append(1 / (1 + np.exp(-np.linspace(-16, 16, 321))), 1 - bmr))  # logit-spaced, c = 0
        if _floor(model, exps):  # BMDS's Exp5: c >= 0, i.e. alpha >= 0
            eD = eD[eD <= 1 - bmr]
        eD, t2 = (v.ravel() for v in np.meshgrid(eD, exps, indexing="ij"))
        if model == "exp5":
            t1 = (-np.log(eD)) ** (1 / t2) / D
        else:
            t1 = D * (1 / eD - 1) ** (-1 / t2)
        lo, hi = _scale_bounds(model, x_max)  # the point fit's bounds on the scale, kept here
        keep = (t1 >= lo) & (t1 <= hi)
        eD, t1, t2 = eD[keep], t1[keep], t2[keep]
        u = ((1 - bmr - eD) / bmr)[:, None] + _basis(model, x[None, :], t1[:, None], t2[:, None])
    Suy, Suu = (u * yb) @ n, (u * u) @ n
    Syy = float((yb ** 2) @ n)
    with np.errstate(invalid="ignore", divide="ignore"):
        rss = np.where((Suy > 0) & (Suu > 0), Syy - Suy ** 2 / Suu, np.where(np.isnan(Suu), np.nan, Syy))
    return float(np.nanmin(rss)) if np.isfinite(rss).any() else float("inf")


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

    @property
    def bound(self) -> float:
        return self.bmdl if self.status == BOUNDED else float("nan")

    def table(self) -> list[dict]:
        """The per-model table as rows of plain values."""
        return [{"model": m.model, **{f"p_{k}": v for k, v in m.params.items()}, "aic": m.aic, "gof_p": m.gof_p,
                 "saturated": m.saturated, "passes": m.passes, "bmd": m.bmd, "bmdl": m.bmdl, "bmdu": m.bmdu,
                 "weight": m.weight} for m in self.models]


def _params(model, f: _Fits) -> dict:
    a, b, t1, t2 = float(f.alpha[0]), float(f.beta[0]), float(f.t1[0]), float(f.t2[0])
    if model == "linear":
        return {"g": a, "b1": -b}
    if model == "power":
        return {"g": a, "v": -b, "n": t2}
    if model == "exp3":
        return {"a": b, "b": t1, "d": t2}
    if model == "exp5":
        return {"a": a + b, "b": t1, "c": a / (a + b) if a + b != 0 else float("nan"), "d": t2}
    return {"g": a + b, "v": -b, "k": t1, "n": t2}  # hill; hill3: the same with g + v = 0 (falls to 0)


def _group_means(st: Study, idx=None):
    """Per data set: group means [B, K] and the within-group sum of squares [B] (dose 0 first)."""
    y = np.concatenate([st.clean[:, None], st.dosed], axis=1) - st.baseline  # [S, K]
    if idx is None:
        yb = y[None]
    else:
        yb = y[idx]  # [B, S, K]
    m = yb.mean(1)
    within = ((yb - m[:, None, :]) ** 2).sum((1, 2))
    return m, within


def _ma_bmd_x(models, fits, weights, bmr, bmr_type, x_lo, x_hi, iters: int = 40):
    """BMD of the weighted mean curve, per data set: bracketed on a log grid from x_lo to x_hi and refined by
    bisection; inf if it does not lose the BMR by x_hi, NaN if there is no benchmark."""
    B = weights.shape[0]

    def curve(xv):  # xv [B] or [B, K]
        xv = np.atleast_2d(xv.T).T if xv.ndim == 1 else xv
        tot = np.zeros(xv.shape)
        for m, f, w in zip(models, fits, weights.T):
            e = _basis(m, xv, f.t1[:, None], f.t2[:, None])
            tot += w[:, None] * (f.alpha[:, None] + f.beta[:, None] * e)
        return tot

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


def expanded_alpha(alpha: float, seeds: int) -> float:
    """The tail level of Hesterberg's (2015) expanded percentile interval: Phi(-sqrt(S/(S-1)) t_{S-1, 1-alpha})."""
    from scipy import stats as st

    return float(st.norm.cdf(-math.sqrt(seeds / (seeds - 1)) * st.t.ppf(1 - alpha, seeds - 1)))


def fit_bmd(doses, clean, dosed, *, baseline: float = 0.0, bmr: float = 0.25, bmr_type: str = "relative",
            dose_scale: str = "linear", models=MODELS, alpha: float = ALPHA, n_boot: int = 2000,
            seed: int = 0, interval: str = "expanded", profile: bool = True, restricted: bool = False,
            bound: str = "lowest") -> BMDResult:
    """The benchmark dose of one row (module docstring: models, test of fit, average, bounds, status).

    `clean` [S]: each seed's clean-run outcome; `dosed` [S, J]: the same seeds at `doses` [J] (> 0); `baseline`: the
    outcome before training (the clean gain is clean minus it; a relative `bmr` is that fraction of the fitted
    gain). `dose_scale`: "linear" (the dose as given) or "log" (ln(1 + d / d_min)). `n_boot` resamples of seeds
    (`seed` the generator's seed); `expanded`: Hesterberg's expanded percentile (False: the plain percentile);
    `profile`: compute each model's profile-likelihood BMDL/BMDU (BMDS's), ~0.1 s a model."""
    from scipy import stats as st

    if bound not in ("lowest", "average"):
        raise ValueError(f"bound must be 'lowest' or 'average', got {bound!r}")
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
    K, N = J + 1, S * (J + 1)
    d_min, d_max = float(st_.doses[0]), float(st_.doses[-1])
    x = to_metric(np.concatenate([[0.0], st_.doses]), dose_scale, d_min)
    x_max, x_lo = float(x[-1]), float(x[1])
    n = np.full(K, float(S))
    ybar, within = _group_means(st_)
    gain = float(ybar[0, 0])
    notes: list[str] = []
    control = f"one-sided {1 - alpha:.0%} for each of BMDL and BMDU, this row alone (no adjustment across rows)"

    # the point fits
    fits, rows = [], []
    for m in models:
        f = _polish(m, x, n, ybar, x_max, _fit_many(m, x, n, ybar, x_max, exps), exps)
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
    bmd_x_m = np.array([float(_bmd_x(m, f.t1, f.t2, f.alpha, f.beta, bmr, bmr_type)[0])
                        for m, f in zip(models, fits)])
    for i, (m, f) in enumerate(zip(models, fits)):
        bl = bu = float("nan")
        if profile and bmr_type == "relative" and np.isfinite(bmd_x_m[i]) and not saturated[i]:
            bl, bu = _profile_bounds(m, x, n, ybar, float(within[0]), N, f, bmd_x_m[i], bmr, x_max, alpha, exps)
        to_d = (lambda v: float(from_metric(v, dose_scale, d_min)))
        rows.append(ModelFit(m, _params(m, f), int(p_mean[i]) + 1, float(-aics[i] / 2 + p_mean[i] + 1),
                             float(aics[i]), int(gof_df[i]), float(gof_p[i]), bool(saturated[i]), bool(passes[i]),
                             to_d(bmd_x_m[i]), to_d(bl), to_d(bu), float(w[i])))

    # BMDS's recommender among the passing models: lowest AIC if their BMDLs lie within 3x, else lowest BMDL
    pick, pick_bmdl = None, float("nan")
    cand = [r for r in rows if r.passes and np.isfinite(r.bmdl)]
    if cand:
        bl = np.array([r.bmdl for r in cand])
        best = cand[int(np.argmin([r.aic for r in cand]))] if bl.max() / max(bl.min(), 1e-300) <= 3 else \
            cand[int(np.argmin(bl))]
        pick, pick_bmdl = best.model, best.bmdl

    boot, model_bounds = [None], [None]

    def to_x(v):
        return float(to_metric(v, dose_scale, d_min)) if np.isfinite(v) else float(v)

    def result(status, bmd=float("nan"), bmdl=float("nan"), bmdu=float("nan"), undefined=0):
        return BMDResult(float(bmd), float(bmdl), float(bmdu), status, tuple(rows), float(bmr), bmr_type,
                         dose_scale, d_min, d_max, S, gain, alpha, n_boot, undefined, pick, pick_bmdl,
                         tuple(notes), control, boot[0], model_bounds[0])

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

    # the bootstrap over seeds, clean runs drawn with their dosed runs
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, S, size=(n_boot, S))
    yb, wb = _group_means(st_, idx)
    bfits = [_fit_many(m, x, n, yb, x_max, exps) for m in msel]
    brss = np.stack([wb + f.rss for f in bfits], axis=1)  # [B, M]
    bw = _weights(_akaike(brss, N, p_mean[sel][None]), np.ones(len(sel), bool)[None])
    bx = _ma_bmd_x(msel, bfits, bw, bmr, bmr_type, x_lo / 1e3, x_hi)
    undefined = int(np.isnan(bx).sum())
    bx = bx[~np.isnan(bx)]
    boot[0] = from_metric(bx, dose_scale, d_min)
    if bx.size < 0.5 * n_boot:
        notes.append(f"{undefined} of {n_boot} resamples had no clean gain (no benchmark)")
        return result(NOT_BOUNDED, bmd, undefined=undefined)
    ql, qu = bootstrap_bounds(bx, bmd_x, S, alpha, interval)
    bm = np.stack([_bmd_x(m, f.t1, f.t2, f.alpha, f.beta, bmr, bmr_type) for m, f in zip(msel, bfits)], 1)
    per_model = {}
    for k, i in enumerate(sel):
        b = bm[:, k][~np.isnan(bm[:, k])]
        if b.size >= 0.5 * n_boot:
            per_model[models[i]] = tuple(float(from_metric(v, dose_scale, d_min)) if np.isfinite(v) else float(v)
                                         for v in bootstrap_bounds(b, bmd_x_m[i], S, alpha, interval))
    model_bounds[0] = per_model
    if bound == "lowest" and per_model:  # each passing model's bound too: the bound holds whichever model is true
        lows = [to_x(v[0]) for v in per_model.values()]
        highs = [to_x(v[1]) for v in per_model.values()]
        ql, qu = min([ql, *lows]), max([qu, *highs])
    bmdl = float(from_metric(ql, dose_scale, d_min)) if np.isfinite(ql) else float("inf")
    bmdu = float(from_metric(qu, dose_scale, d_min)) if np.isfinite(qu) else float("inf")
    if undefined:
        notes.append(f"{undefined} of {n_boot} resamples had no clean gain and were left out")
    if not np.isfinite(bmd) or bmd > d_max:
        return result(ABOVE_RANGE, bmd, bmdl, bmdu, undefined)
    if bmd < d_min / LOW_BMD_FAIL:
        return result(BELOW_RANGE, bmd, bmdl, bmdu, undefined)
    if bmd < d_min / LOW_BMD_WARN:
        notes.append(f"BMD more than {LOW_BMD_WARN:g}x below the lowest non-zero dose (BMDS warning)")
    if not np.isfinite(bmdl):
        return result(NOT_BOUNDED, bmd, bmdl, bmdu, undefined)
    return result(BOUNDED, bmd, bmdl, bmdu, undefined)


INTERVALS = ("expanded", "percentile", "bc")


def bootstrap_bounds(boot, estimate: float, seeds: int, alpha: float = ALPHA, interval: str = "expanded"):
    """(lower, upper) one-sided 1 - alpha bounds from bootstrap estimates `boot` (may hold +inf: never reached):
    "expanded" Hesterberg's (2015) expanded percentile (the default), "percentile" the plain percentile (Efron),
    "bc" Efron's bias-corrected percentile at the expanded level."""
    from scipy import stats as st

    if interval not in INTERVALS:
        raise ValueError(f"interval must be one of {INTERVALS}, got {interval!r}")
    boot = np.asarray(boot, dtype=np.float64)
    a_lo = a_hi = expanded_alpha(alpha, seeds) if interval != "percentile" else alpha
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


def simulate(curve, doses, seeds: int, sd: float, rng, baseline: float = 0.0, rho: float = 0.0):
    """A synthetic study: (clean [S], dosed [S, J]) with mean `curve(dose)` (+ baseline), normal seed-to-seed spread
    `sd`, correlation `rho` between one seed's runs (a shared seed effect)."""
    d = np.asarray(doses, dtype=np.float64)
    mu = np.concatenate([[curve(np.array([0.0]))[0]], curve(d)]) + baseline
    shared = rng.normal(0, sd * math.sqrt(rho), (seeds, 1))
    own = rng.normal(0, sd * math.sqrt(1 - rho), (seeds, d.size + 1))
    y = mu[None, :] + shared + own
    return y[:, 0], y[:, 1:]


# ------------------------------------------------------------------------------ notebook 08's runs of record ---

DOSED_KINDS = ("ratio", "weights", "stale")


def study08_rows(run_dir: str | Path, dose: str = "k3_achieved") -> list[dict]:
    """The dose-response rows of one notebook-08 run of record (`docs/runs/08_mismatch_cost/<run>`), read from its
    `data/curves.parquet`: per dosed kind x arm, the first PPO regime at the study's horizon (labels without a `+`
    suffix, temperature of the clean run), one `Study` of the tested outcome (`policy_reward`, one per run) paired
    by seed with the same arm's clean run, its `baseline` the initial policy's reward. The dose of a label is its
    runs' mean achieved k3 (`dose` "k3_achieved", what notebook 08's benchmark table uses) or the nominal dose
    ("dose"). Rows with a seed missing at some dose keep the seeds present at every dose. Reads pandas lazily."""
    import pandas as pd

    c = pd.read_parquet(Path(run_dir) / "data" / "curves.parquet")
    c = c[~c["label"].astype(str).str.contains("+", regex=False) & (c["updates"] == c["updates"].min())]
    runs = c.groupby(["kind", "label", "arm", "temperature", "seed"], sort=False).agg(
        y=("policy_reward", "first"), base=("initial_policy_reward", "first"), dose=("dose", "first"),
        k3=("mismatch_k3", "mean")).reset_index()
    rows = []
    for (kind, arm), d in runs[runs["kind"].isin(DOSED_KINDS)].groupby(["kind", "arm"], sort=False):
        temp = d["temperature"].iloc[0]
        clean = runs[(runs["kind"] == "clean") & (runs["label"] == "clean") & (runs["arm"] == arm)
                     & (runs["temperature"] == temp)].set_index("seed")["y"]
        wide = d.pivot(index="seed", columns="label", values="y")
        k3 = d.groupby("label")["k3"].mean() if dose == "k3_achieved" else d.groupby("label")["dose"].first()
        labels = list(k3.sort_values().index)
        wide = wide[labels].join(clean.rename("clean"), how="inner").dropna()
        if wide.empty:
            continue
        rows.append({"kind": kind, "arm": arm, "labels": labels, "doses": k3[labels].to_numpy(float),
                     "clean": wide["clean"].to_numpy(float), "dosed": wide[labels].to_numpy(float),
                     "baseline": float(d["base"].iloc[0]), "seeds": list(map(int, wide.index))})
    return rows


# ------------------------------------------------------------------------------------ coverage by simulation ---

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


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    from scipy import stats as st

    if n == 0:
        return float("nan"), float("nan")
    a = (1 - level) / 2
    lo = 0.0 if k == 0 else float(st.beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(st.beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def simulate_coverage(truth: str, seeds: int = 10, studies: int = 200, *, doses=DESIGN_08, sd: float = SD_08,
                      rho: float = 0.0, n_boot: int = 500, seed: int = 0, bmds_rule: bool = False,
                      **kw) -> Coverage:
    """Coverage of `fit_bmd`'s BMDL on `studies` simulated studies of `TRUTHS[truth]` at `doses` with `seeds` seeds
    (normal spread `sd`, correlation `rho` between a seed's runs). `bmds_rule`: also BMDS's recommended model's
    profile BMDL (slower: every model's profile)."""
    curve, true = TRUTHS[truth]
    rng = np.random.default_rng(seed)
    bounded = hits = b_bounded = b_hits = 0
    ratios = []
    for i in range(studies):
        c, y = simulate(curve, doses, seeds, sd, rng, rho=rho)
        r = fit_bmd(doses, c, y, n_boot=n_boot, seed=seed * 100003 + i, profile=bmds_rule, **kw)
        if r.status == BOUNDED:
            bounded += 1
            hits += r.bmdl <= true
            ratios.append(r.bmdl / true)
        if bmds_rule and r.bmds_pick is not None and np.isfinite(r.bmds_bmdl):
            b_bounded += 1
            b_hits += r.bmds_bmdl <= true
    lo, hi = clopper_pearson(hits, bounded)
    return Coverage(truth, seeds, studies, bounded, hits, lo, hi,
                    float(np.median(ratios)) if ratios else float("nan"), b_bounded, b_hits)


# ----------------------------------------------------------------------------------------- EPA's engine ---

BMDS_ENV = "bmds"  # .venvs/bmds: pybmds (pins pandas < 3, so not the kernel env), `scripts/setup.sh bmds`
_WORKER = Path(__file__).with_name("_bmds_worker.py")


def bmds_python(envs: str | Path | None = None) -> Path:
    """The interpreter of the pybmds environment (`$RLWB_ENVS`/bmds, default .venvs/bmds beside the repository);
    `BMDSUnavailable` if it is missing or its setup did not finish."""
    from rlwb.paths import envs_dir

    env = Path(envs or envs_dir()) / BMDS_ENV
    py = env / "bin" / "python"
    if not py.exists() or (env / ".rlwb-incomplete").exists() or not (env / ".rlwb-stamp").exists():
        raise BMDSUnavailable(f"no complete pybmds environment at {env}: run  make bmds  (scripts/setup.sh bmds)")
    return py


def bmds_fit(groups: dict | list[dict], *, bmr: float = 0.25, bmr_type: str = "relative",
             models=tuple(BMDS_NAMES), timeout: float = 300.0, envs=None) -> list[dict]:
    """Run EPA's BMDS engine (pybmds, in its own environment, as a subprocess: JSON in, JSON out) on one or more
    summary data sets (`Study.group_stats()`: doses with 0 first, ns, means, sds), a decreasing curve, constant
    variance, the given models with BMDS's default (restricted) settings. Per data set: {"models": {name: {bmd,
    bmdl, bmdu, aic, loglik, gof_p, params}}, "recommended": name or None}. The engine's optimizer prints to stderr;
    that is swallowed, and returned in the error if the run fails."""
    py = bmds_python(envs)
    many = isinstance(groups, list)
    req = {"datasets": groups if many else [groups], "bmr": bmr, "bmr_type": bmr_type,
           "models": [BMDS_NAMES[m] for m in models if m in BMDS_NAMES]}
    p = subprocess.run([str(py), str(_WORKER)], input=json.dumps(req), capture_output=True, text=True,
                       timeout=timeout, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if p.returncode != 0:
        raise RuntimeError(f"pybmds failed (exit {p.returncode}):\n{p.stderr[-4000:]}")
    try:
        out = json.loads(p.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError) as e:
        raise RuntimeError(f"pybmds gave no JSON ({e}); stdout tail {p.stdout[-500:]!r}; stderr tail "
                           f"{p.stderr[-2000:]}") from e
    names = {v: k for k, v in BMDS_NAMES.items()}
    for r in out:
        r["models"] = {names.get(k, k): v for k, v in r["models"].items()}
        r["recommended"] = names.get(r["recommended"], r["recommended"])
    return out if many else out[0]


if __name__ == "__main__":  # pragma: no cover - a quick look: python -m rlwb.core.measure.benchmark_dose
    rng = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    c, y = simulate(lambda d: 0.3 * np.exp(-d / 0.5), [0.03, 0.1, 0.3, 1.0], 10, 0.085, rng)
    r = fit_bmd([0.03, 0.1, 0.3, 1.0], c, y)
    print(r.status, r.bmd, r.bmdl, r.bmdu, r.bmds_pick, r.bmds_bmdl)
    for row in r.table():
        print(row)
