"""Numbers for people: one formatter for the CLI, the index page, conclusions and report tables.

Why a float floor: an fp32 engine and an fp32 trainer that agree still differ by rounding, so an exact KL
comes out as -3.4e-09 or 2e-10. Printing that invites the question "why is KL negative?" when the answer
is "it is zero to float precision". Divergences (k2, k3, exact KL: non-negative by definition) below
`KL_FLOOR` therefore read "≤ 1e-8", and |Δlogp| below one float32 ulp at |logp| ~ 1 reads "≤ 1e-7". Exact
zeros stay "0" (bit-identical is a finding of its own). k1 is signed on purpose and is never clamped, and
so are differences (`delta_k3_mean`). The χ² estimate mean(r²) - 1 is floored only near 0: a clearly negative
value is the estimator's sampling noise, not rounding, and is shown as it is.
"""

from __future__ import annotations

import math
import re

KL_FLOOR = 1e-8  # divergences at or below this are float noise in an fp32 pipeline
DLOGP_FLOOR = 1e-7  # ~ one float32 ulp of a logprob of order 1
# χ² = E[r²] - 1 ≈ 2 E[log r] near r = 1: first order in the rounding of the logprobs (mean |Δlogp| ~ 1e-7 to
# 1e-6 at the fp32 floor), unlike the KL estimators' second order
CHI2_FLOOR = 1e-6
MISSING = "–"

_DIVERGENCE = re.compile(r"(^|[_/\s])(k2|k3|kl|full_kl)([_\s]|$)")  # also table headers: "k3 at T=0.5"
_DLOGP = re.compile(r"(^|[_/\s])abs_dlogp")
_CHI2 = re.compile(r"(^|[_/\s])chi2")
_DELTA = re.compile(r"(^|[_/\s])delta_|Δ")


def number(v, spec: str = ".3g", missing: str = MISSING) -> str:
    """`v` with `spec` if it is a real number; `missing` for None/NaN; str() for anything else."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return missing
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if math.isfinite(v) and float(v).is_integer() and abs(v) >= 1000:  # counts: 803,968, not 8.04e+05
        return f"{int(v):,}"
    return format(v, spec)


def floor_of(name: str) -> float | None:
    """The display floor of a metric name (`vllm-v1/k3_mean`, `full_kl_mean_ci_low`, ...), or None."""
    if _DELTA.search(name):
        return None
    if _CHI2.search(name):
        return CHI2_FLOOR
    if _DIVERGENCE.search(name):
        return KL_FLOOR
    if _DLOGP.search(name):
        return DLOGP_FLOOR
    return None


def metric(name: str, v, spec: str = ".2e") -> str:
    """A metric's value for a reader: at or below its float floor it reads "≤ floor" (never a negative KL)."""
    if _DELTA.search(name):  # a signed difference of two values at their floor is 0 to float precision
        floor = floor_of(_DELTA.sub(" ", name))
        if floor is not None and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) \
                and v != 0 and abs(v) <= floor:
            return "≈ 0"
        return number(v, spec)
    floor = floor_of(name)
    if floor is not None and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        if v == 0:
            return "0"
        if v <= floor and (abs(v) <= floor or not _CHI2.search(name)):  # negative rounding noise included
            return f"≤ {floor:.0e}"
    return number(v, spec)


def table(df, spec: str = ".3g"):
    """A DataFrame's display: each numeric cell through `metric` with its column name (or its row name in a
    `metric`-indexed frame). Returns a pandas Styler; the frame itself keeps the raw values."""
    import pandas as pd

    def cell_formatter(name: str):
        return lambda v: metric(str(name), v, spec) if isinstance(v, (int, float)) else number(v, spec)

    styler = df.style
    numeric = [c for c in df.columns if pd.api.types.is_numeric_dtype(df[c])]
    if df.index.name in ("metric", "measure"):  # metric names are the rows
        for row in df.index:
            styler = styler.format(cell_formatter(row), subset=pd.IndexSlice[[row], numeric])
    else:
        styler = styler.format({c: cell_formatter(c) for c in numeric})
    if isinstance(df.index, pd.RangeIndex):  # 0, 1, 2, ... tells a reader nothing: hide it
        styler = styler.hide(axis="index")
    return styler


def text_table(rows, align: str, widths=None, rstrip: bool = False) -> str:
    """Rows (the header first) as aligned plain text, columns two spaces apart: the CLI's tables and `compare`'s.
    `align` has one character per column: `<` left, `>` right, `-` as it is (no padding). `widths`: per column,
    None for the widest cell of the column (the default for all), or a fixed width that a longer cell overflows.
    `rstrip` drops trailing spaces of each line."""
    rows = [[str(c) for c in row] for row in rows]
    fixed = widths or [None] * len(align)
    w = [max(len(r[i]) for r in rows) if fixed[i] is None else fixed[i] for i in range(len(align))]
    pad = {"<": str.ljust, ">": str.rjust, "-": lambda c, _: c}
    lines = ["  ".join(pad[a](c, wi) for c, a, wi in zip(r, align, w)) for r in rows]
    return "\n".join(line.rstrip() if rstrip else line for line in lines)
