"""The continuous dose-response models of `benchmark_dose` and their fits: each model's basis, least squares
for every shape on a grid, Newton and L-BFGS-B polish, the BMD of a fit and BMDS's profile-likelihood bounds.

How a fit is done fast enough for a bootstrap: each model is a linear model a + b*e(x; theta) in two linear
parameters for a fixed shape theta (one or two nonlinear parameters, e.g. Exp's (b, g), Hill's (k, n)), so the
least-squares fit profiles out the linear part in closed form (variable projection, Golub & Pereyra 1973) and is
found on a grid of theta (log-spaced scale x exponent), refined by a parabola on the grid and by damped Newton
steps on every resample at once (without them the grid's step biased the bootstrap's BMDs, power's by 6%) and, for
the point fit, polished by L-BFGS-B. Fits on a dose group's sufficient statistics (n, mean, sum of squares) are
the same as on the seed-level data under the constant-variance normal model, which is also why BMDS's fit on
(n, mean, sd) can be compared with this one (`bmds_fit`). With the bootstrap's per-group means one matrix product
fits every resample at every grid shape.
"""

from __future__ import annotations

import contextlib
import math
import threading
from dataclasses import dataclass

import numpy as np

PROFILE_CHI2 = 2.705543454095404  # chi2_1 quantile 0.90: a one-sided 95% profile-likelihood bound (BMDS)
MODELS = ("linear", "power", "exp3", "exp5", "hill3", "hill")
N_MEAN_PARAMS = {"linear": 2, "power": 3, "exp3": 3, "exp5": 4, "hill3": 3, "hill": 4}

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


def basis(model: str, x, t1, t2):
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


# A basis whose centred spread is below this fraction of its size (sum n (e - e_bar)^2 < tol * N e_bar^2: e.g. Hill's
# 1 / (1 + (x/k)^n) with k far above the doses) is treated as constant (beta = 0, the flat fit): at s^2 = 1e-12 the
# stored basis, rounded to 1e-16 of its size, still has 1e-10 of its spread right; below it the fit's beta and alpha
# grow without bound and its RSS is rounding. Such a shape is reached by the same model at a smaller scale.
_MIN_SPREAD2 = 1e-12


def _wsum(w, b, rows: bool):
    """sum_k w[., k] b[., k]: per row (w [B or 1, K], b [B, K] -> [B]) or every row against every basis
    (b [G, K] -> [B, G])."""
    return (w * b).sum(-1) if rows else w @ b.T


def _ls_core(model: str, e, n, ybar, floor: bool, rows: bool):
    """Weighted least squares of group means `ybar` [B, K] (weights `n`, the groups' counts: [K], or [B, K] per data
    set) on alpha + beta * e, beta >= 0 (exp3, hill3: beta * e alone): (alpha, beta, between-group RSS), [B, G] for
    bases e [G, K] or [B] for one basis per row (`rows`, e [B, K]).

    The sums are taken on centred data (y about its weighted mean, e about its plain mean over doses, the rest of e's
    weighted mean exactly): uncentred sums of a near-constant basis lose every digit of its spread, which put RSS 0
    on fits whose true RSS is most of the data's (alpha -6e5, beta 6e5), and the grid's argmin picked them."""
    n2 = np.atleast_2d(n)
    N = n2.sum(-1)  # [1 or B]
    yn = ybar * n2
    if not _has_alpha(model):  # through the origin: nothing cancels
        See, Sey, Syy = _wsum(n2, e * e, rows), _wsum(yn, e, rows), (ybar * yn).sum(-1)
        Syy = Syy if rows else Syy[:, None]
        ok = See > 1e-300
        beta = np.where(ok & (Sey > 0), Sey / np.where(ok, See, 1.0), 0.0)
        return np.zeros_like(beta), beta, np.maximum(Syy - beta * Sey, 0.0)
    my = yn.sum(-1) / N  # [B]
    yc = ybar - my[:, None]
    me = e.mean(-1)
    es = e - me[:, None]
    # Sey is the centred sum already: sum n yc = 0
    Se, See, Sey = _wsum(n2, es, rows), _wsum(n2, es * es, rows), _wsum(yc * n2, es, rows)
    Syy = (yc * yc * n2).sum(-1)
    if not rows:
        N, my, Syy = N[:, None], my[:, None], Syy[:, None]
    See_c = See - Se * Se / N
    ebar = me + Se / N
    ok = (See_c > 0) & (See_c > _MIN_SPREAD2 * N * ebar * ebar)
    with np.errstate(divide="ignore", invalid="ignore"):
        beta = np.where(ok & (Sey > 0), Sey / np.where(ok, See_c, 1.0), 0.0)
    alpha = my - beta * ebar
    rss = Syy - beta * Sey
    if floor:  # BMDS's Exp5 keeps c >= 0 (the plateau not below 0): where alpha < 0, the fit through 0
        Sey0, See0 = _wsum(yn, e, rows), _wsum(n2, e * e, rows)
        Syy0 = (ybar * yn).sum(-1)
        Syy0 = Syy0 if rows else Syy0[:, None]
        b0 = np.where(Sey0 > 0, Sey0 / np.maximum(See0, 1e-300), 0.0)
        neg = alpha < 0
        beta, alpha = np.where(neg, b0, beta), np.where(neg, 0.0, alpha)
        rss = np.where(neg, Syy0 - b0 * Sey0, rss)
    return alpha, beta, np.maximum(rss, 0.0)


def _ls(model: str, e, n, ybar, floor: bool = False):
    """`_ls_core` for every data row against every basis e [G, K]: (alpha, beta, rss) [B, G]."""
    return _ls_core(model, e, n, ybar, floor, rows=False)


def model_bmd_x(model: str, t1, t2, alpha, beta, bmr: float, bmr_type: str):
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
class Fits:
    """Per model, per data set b: the fitted shape and linear parameters and the between-group RSS."""

    t1: np.ndarray
    t2: np.ndarray
    alpha: np.ndarray
    beta: np.ndarray
    rss: np.ndarray


def fit_many(model: str, x, n, ybar, x_max: float, exps, chunk: int = 256) -> Fits:
    """Fit `model` to every row of group means `ybar` [B, K] at once: the grid minimum, refined by a parabola
    through its neighbours along each grid axis (kept only where it lowers the RSS)."""
    t1g, t2g, shape = _grid(model, x_max, exps)
    e = basis(model, x[None, :], t1g[:, None], t2g[:, None])  # [G, K]
    n_all = n
    B = ybar.shape[0]
    out = {k: np.empty(B) for k in ("t1", "t2", "alpha", "beta", "rss")}
    n1, n2 = shape
    per_set = np.ndim(n) == 2  # each data set its own group counts
    for s in range(0, B, chunk):
        yb = ybar[s:s + chunk]
        n = n_all[s:s + chunk] if per_set else n_all
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
            er = basis(model, x[None, :], t1[:, None], t2[:, None])  # [b, K]
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
    f = Fits(**out)
    return _newton(model, x, n_all, ybar, x_max, exps, f) if model != "linear" else f


def _newton(model: str, x, n, ybar, x_max: float, exps, f: Fits, iters: int = 8, h: float = 1e-3) -> Fits:
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
        e = basis(model, x[None, :], t1[:, None], np.exp(b)[:, None])
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
    e = basis(model, x[None, :], t1[:, None], np.exp(l2)[:, None])
    a, b, r = _ls_rows(model, e, n, ybar, floor)
    return Fits(t1, np.exp(l2), a, b, r)


def _rss_grid(model: str, e, n, ybar, floor: bool = False):
    """The between-group RSS [B, G] of `_ls` alone (the bootstrap's hot loop)."""
    return _ls_core(model, e, n, ybar, floor, rows=False)[2]


def _ls_rows(model, e, n, ybar, floor: bool = False):
    """`_ls` with one basis per data row: e [B, K], ybar [B, K], n [K] or [B, K] -> alpha, beta, rss [B]."""
    return _ls_core(model, e, n, ybar, floor, rows=True)


POLISH_STARTS = 4  # the grid's best local minima (over the exponent) each polished: the best is the point fit


def _grid_starts(model: str, x, n, ybar, x_max: float, exps, k: int = POLISH_STARTS) -> list[tuple[float, float]]:
    """Where to polish from besides the grid fit: per exponent on the grid its best scale, and of those the `k`
    lowest local minima along the exponent. Why: L-BFGS-B from the grid's lowest point alone stopped short on flat,
    correlated ridges (Exp3 at d 9.1 where the optimum is at 4.2, 0.0025 in log-likelihood below BMDS's on one
    machine: where it stalls turns on rounding) or in a nearby optimum (Hill3, RSS 9e-5 above); starts spread over
    the exponent reach the optimum (`test_the_point_fit_reaches_the_optimum_of_a_nested_search`)."""
    t1g, t2g, shape = _grid(model, x_max, exps)
    e = basis(model, x[None, :], t1g[:, None], t2g[:, None])
    rss = _rss_grid(model, e, n, ybar, _floor(model, exps))[0].reshape(shape)  # [scales, exponents]
    rss = np.where(np.isfinite(rss), rss, np.inf)
    best = rss.argmin(0)
    r = rss[best, np.arange(shape[1])]
    pad = np.concatenate([[np.inf], r, [np.inf]])
    local = np.flatnonzero(np.isfinite(r) & (r <= pad[:-2]) & (r <= pad[2:]))
    pick = local[np.argsort(r[local], kind="stable")][:k]
    t1, t2 = t1g.reshape(shape), t2g.reshape(shape)
    return [(float(t1[best[j], j]), float(t2[best[j], j])) for j in pick]


def _value_and_grad(p, rss_rows, lb, ub, step: float = 1e-8):
    """`rss_rows(P) -> [m]` at p and its forward-difference gradient, the m = 1 + d points in one call: what
    scipy's L-BFGS-B computes by default (absolute step `eps` 1e-8, one-sided, a step that would leave the bounds
    taken backward; scipy.optimize._numdiff), the same values to the bit, from one batched least squares instead of
    1 + d calls through scipy's differencing."""
    h = np.full(p.size, step)
    dx0 = (p + h) - p
    h = np.where(dx0 == 0, np.sqrt(np.finfo(np.float64).eps) * ((p >= 0) * 2.0 - 1) * np.maximum(1.0, np.abs(p)), h)
    fits = np.abs(h) <= np.maximum(p - lb, ub - p)
    h = np.where((((p + h) < lb) | ((p + h) > ub)) & fits, -h, h)
    pts = np.repeat(p[None, :], p.size + 1, axis=0)
    pts[np.arange(1, p.size + 1), np.arange(p.size)] = p + h
    v = rss_rows(pts)
    return float(v[0]), (v[1:] - v[0]) / ((p + h) - p)


_BLAS = None  # threadpoolctl's view of the loaded BLAS libraries, made once (it scans the process's libraries)
_BLAS_LOCK = threading.Lock()  # the thread setting is the process's: two threads' limits would restore each other's


@contextlib.contextmanager
def _one_blas_thread():
    """A context in which the BLAS libraries (scipy's and numpy's OpenBLAS) run one thread. Why: scipy's L-BFGS-B
    (C since scipy 1.15) calls BLAS on vectors of one or two elements at every iteration, and a threaded OpenBLAS
    wakes its pool for each call (scipy issues #23191, #26137): measured here 15-30x the time of a minimize on 2
    busy cores, and the point fits' polish was about 70% of a study's `fit_bmd`. The values are the same to the bit
    (a vector that small is never split between threads; `tests/test_bmd_models.py` checks a fit both ways). One
    thread of a process at a time holds it (the setting is process-wide)."""
    global _BLAS
    from scipy import optimize  # noqa: F401  (scipy's own OpenBLAS, which L-BFGS-B calls, loaded before the scan)
    from threadpoolctl import ThreadpoolController

    with _BLAS_LOCK:
        if _BLAS is None:
            _BLAS = ThreadpoolController()
        with _BLAS.limit(limits=1, user_api="blas"):
            yield


def polish(model: str, x, n, ybar, x_max: float, f: Fits, exps) -> Fits:
    """The point fit: the grid fit, and the grid's best local minima over the exponent (`_grid_starts`), each
    polished by L-BFGS-B over the shape parameters (log scale, exponent) within the grid's bounds; the lowest RSS
    wins (the grid fit itself where no polish lowers it). The gradient is scipy's own forward difference, taken in
    one batched call (`_value_and_grad`)."""
    from scipy import optimize

    if model == "linear":
        return f
    fl = _floor(model, exps)
    lo, hi = _SCALE_DECADES
    starts = [(float(f.t1[0]), float(f.t2[0]))] + _grid_starts(model, x, n, ybar, x_max, exps)
    scale = max(float(f.rss[0]), 1e-300)
    best, best_rss = (float(f.t1[0]), float(f.t2[0])), float(f.rss[0])
    if model == "power":
        bounds = [(exps[0], exps[-1])]

        def rss_rows(P):
            e = basis(model, x[None, :], np.full((P.shape[0], 1), np.nan), P[:, :1])
            return _ls_rows(model, e, n, ybar, fl)[2]
    else:
        if model in ("hill", "hill3"):
            b1 = (np.log(x_max) - hi * np.log(10), np.log(x_max) - lo * np.log(10))
        else:
            b1 = (lo * np.log(10) - np.log(x_max), hi * np.log(10) - np.log(x_max))
        bounds = [b1, (exps[0], exps[-1])]

        def rss_rows(P):
            e = basis(model, x[None, :], np.exp(P[:, :1]), P[:, 1:2])
            return _ls_rows(model, e, n, ybar, fl)[2] / scale
    lb, ub = (np.array(v, dtype=np.float64) for v in zip(*bounds))
    opts = {} if model == "power" else {"ftol": 1e-13, "gtol": 1e-10, "maxiter": 200}
    with _one_blas_thread():
        for t1, t2 in starts:
            p0 = [t2] if model == "power" else [np.log(t1), t2]
            res = optimize.minimize(_value_and_grad, p0, args=(rss_rows, lb, ub), jac=True, method="L-BFGS-B",
                                    bounds=bounds, options=opts)
            val = float(res.fun) if model == "power" else float(res.fun * scale)
            if val < best_rss:
                best = (float(f.t1[0]), float(res.x[0])) if model == "power" else (float(np.exp(res.x[0])),
                                                                                     float(res.x[1]))
                best_rss = val
    e = basis(model, x[None, :], np.array([best[0]])[:, None], np.array([best[1]])[:, None])
    a, b, r = _ls_rows(model, e, n, ybar, fl)
    return Fits(np.array([best[0]]), np.array([best[1]]), a, b, r)


def profile_bounds(model: str, x, n, ybar, within: float, N: int, fit: Fits, bmd_x: float, bmr: float,
                    x_max: float, alpha: float, exps) -> tuple[float, float]:
    """BMDS's per-model BMDL and BMDU: the doses below and above the BMD where the profile log-likelihood with the
    BMD held fixed has fallen by chi2_1(1 - 2 alpha) / 2 (relative BMR only). Profiles over the shape grid, the
    crossing found by Brent's method on the profile itself."""
    from scipy import stats as st

    crit = float(st.chi2.ppf(1 - 2 * alpha, 1))
    if not np.isfinite(bmd_x) or bmd_x <= 0:
        return float("nan"), float("nan")
    from scipy import optimize

    def lr_minus_crit(logd: float) -> float:
        return profile_lr(model, x, n, ybar, within, N, fit, float(np.exp(logd)), bmr, x_max, exps) - crit

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


def profile_lr(model: str, x, n, ybar, within: float, N: float, fit: Fits, D: float, bmr: float, x_max: float,
               exps, scale_max: float | None = None, coef_max: float | None = None) -> float:
    """Twice the log-likelihood's fall from the fit `fit` when the model's relative BMD is held at D (metric scale):
    what `profile_bounds` compares with chi2_1(1 - 2 alpha). A grid over the shape parameters (finer than the
    bootstrap's), so it can only overstate the fall. `scale_max`, `coef_max`: bounds on the scale (Hill's k, Exp5's
    b) and on the linear coefficients' size (Hill's g and v, Exp5's a) tighter than the fits' own, e.g. BMDS's, so
    that a fall computed here is one within BMDS's parameter space (scales past `scale_max` are left out; the linear
    coefficient is clipped to `coef_max`, its exact constrained optimum for each shape: the fall can only be
    overstated by the grid, never made infinite by an empty one)."""
    rss_min = within + float(fit.rss[0])
    fine = np.geomspace(exps[0], exps[-1], 64)  # the profile's exponent grid: finer than the bootstrap's
    prof = _profile_rss(model, x, n, ybar[0], D, bmr, x_max, fine, scale_max, coef_max) + within
    return N * math.log(max(prof, rss_min) / rss_min)


def _profile_rss(model: str, x, n, yb, D: float, bmr: float, x_max: float, exps,
                 scale_max: float | None = None, coef_max: float | None = None) -> float:
    """The smallest between-group RSS of `model` with its relative BMD fixed at D (metric scale): the BMR constraint
    is linear in (alpha, beta) for a fixed shape, leaving one linear parameter; exp3's shape scale is fixed by D."""
    if model in ("exp3", "hill3"):  # f = beta * e, e(D) = 1 - bmr fixes the scale from the exponent
        t2 = exps
        t1 = ((-np.log(1 - bmr)) ** (1 / t2) / D if model == "exp3" else D * (1 / (1 - bmr) - 1) ** (-1 / t2))
        u = basis(model, x[None, :], t1[:, None], t2[:, None])
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
        hi = hi if scale_max is None else min(hi, scale_max)
        keep = (t1 >= lo) & (t1 <= hi)
        eD, t1, t2 = eD[keep], t1[keep], t2[keep]
        u = ((1 - bmr - eD) / bmr)[:, None] + basis(model, x[None, :], t1[:, None], t2[:, None])
    Suy, Suu = (u * yb) @ n, (u * u) @ n
    Syy = float((yb ** 2) @ n)
    with np.errstate(invalid="ignore", divide="ignore"):
        rss = np.where((Suy > 0) & (Suu > 0), Syy - Suy ** 2 / Suu, np.where(np.isnan(Suu), np.nan, Syy))
        if coef_max is not None and model in ("exp5", "hill"):
            # f = beta u: beta and f(0) = beta (1 - eD) / bmr in size at most coef_max; one linear parameter, so
            # the constrained least squares is the unconstrained beta clipped to that bound
            beta = np.where((Suy > 0) & (Suu > 0), Suy / np.where(Suu > 0, Suu, 1.0), 0.0)
            cap = coef_max * np.minimum(1.0, bmr / np.maximum(np.abs(1 - eD), 1e-300))
            rss = np.where(beta > cap, Syy - 2 * cap * Suy + cap * cap * Suu, rss)
    return float(np.nanmin(rss)) if np.isfinite(rss).any() else float("inf")


def params_of(model, f: Fits) -> dict:
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
