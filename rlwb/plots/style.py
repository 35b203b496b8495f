"""The style every figure shares: palette, engine colours and order, sizes, saving, seed bands.

Why fixed colours: a reader comparing the mismatch, KL and GRPO figures should recognise `vllm-v1` by
colour everywhere. The palette is Okabe-Ito (colour-blind safe). Saved files are deterministic (no
dates or random ids in PDF/SVG metadata) so regenerating a run's figures reproduces them.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

OKABE_ITO = ["#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7"]
ENGINE_COLORS = {
    "hf": "#000000",
    "vllm-v0": "#0072B2",
    "vllm-v1": "#D55E00",
    "vllm-v1-processed": "#E69F00",
    "vllm-v1-fixed": "#009E73",
}
LADDER = ["hf", "vllm-v0", "vllm-v1", "vllm-v1-processed", "vllm-v1-fixed"]
# Line styles too, so curves that coincide (e.g. processed and fixed at the float floor) stay visible
# and figures survive black-and-white printing.
ENGINE_STYLES = {"hf": "-", "vllm-v0": "--", "vllm-v1": "-", "vllm-v1-processed": ":", "vllm-v1-fixed": "-."}


def engine_style(name: str) -> str:
    return ENGINE_STYLES.get(name.split("+")[0], "-")


def engine_color(name: str) -> str:
    base = name.split("+")[0]
    if base in ENGINE_COLORS:
        return ENGINE_COLORS[base]
    return OKABE_ITO[(sum(map(ord, base)) % 3) + 4]  # user presets: stable, distinct from the ladder


def set_style(style: str = "notebook") -> None:
    """`notebook` (screen), `paper` (serif, single-column width, vector) or `blog` (larger type)."""
    if style not in ("notebook", "paper", "blog"):
        raise ValueError(f"style must be notebook, paper or blog, got {style!r}")
    plt.rcdefaults()
    rc = {
        "figure.dpi": 110, "savefig.dpi": 200, "savefig.bbox": "tight", "axes.spines.top": False,
        "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3, "legend.frameon": False,
        "font.size": 10, "axes.titlesize": 11, "svg.hashsalt": "rlwb", "pdf.fonttype": 42,
    }
    if style == "paper":
        rc.update({"font.family": "serif", "font.size": 8, "axes.titlesize": 9, "axes.labelsize": 8,
                   "legend.fontsize": 7, "xtick.labelsize": 7, "ytick.labelsize": 7, "lines.linewidth": 1.2})
    if style == "blog":
        rc.update({"font.size": 12, "axes.titlesize": 13, "lines.linewidth": 2})
    plt.rcParams.update(rc)


FIGSIZE = {"notebook": (7.0, 4.0), "paper": (3.4, 2.4), "blog": (8.0, 4.5)}


def figsize(style: str = "notebook", wide: float = 1.0, tall: float = 1.0) -> tuple[float, float]:
    w, h = FIGSIZE.get(style, FIGSIZE["notebook"])
    return (w * wide, h * tall)


def save_figure(fig, path_stem: str | Path) -> Path:
    """Write `<stem>.png`, `.pdf` and `.svg` with reproducible metadata; returns the PNG path."""
    path_stem = Path(path_stem)
    path_stem.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path_stem.with_suffix(".png"), metadata={"Software": None})
    fig.savefig(path_stem.with_suffix(".pdf"), metadata={"CreationDate": None, "Producer": None, "Creator": None})
    fig.savefig(path_stem.with_suffix(".svg"), metadata={"Date": None, "Creator": None})
    return path_stem.with_suffix(".png")


FLOOR_VALUE = 1e-9  # log-scale plots: values at or below this are drawn at the floor


def engine_order(engines) -> list[str]:
    """Engines in ladder order (`LADDER`), then any others alphabetically: the same order in every figure."""
    engines = list(dict.fromkeys(engines))
    return sorted(engines, key=lambda e: (LADDER.index(e) if e in LADDER else len(LADDER), e))


def finite(x):
    x = np.asarray(x, dtype=float)
    return x[np.isfinite(x)]


def t_quantile(n):
    """Two-sided 95% Student-t quantile for n samples (NaN for n < 2: no interval from one seed)."""
    from scipy import stats as st

    n = np.asarray(n, dtype=float)
    return np.where(n >= 2, st.t.ppf(0.975, np.maximum(n - 1, 1)), np.nan)


def seed_band(d, column: str, smooth: int, log: bool = False):
    """Mean over seeds of each seed's `smooth`-step moving average, and its 95% Student-t band (NaN, no band,
    for one seed). `log`: of log10 values (a geometric mean, never below zero) for columns spanning decades."""
    per_seed = d.pivot_table(index="step", columns="seed", values=column, aggfunc="mean")
    per_seed = per_seed.rolling(smooth, center=True, min_periods=1).mean()
    if log:
        per_seed = np.log10(np.maximum(per_seed, FLOOR_VALUE))
    mean = per_seed.mean(axis=1)
    half = per_seed.sem(axis=1) * t_quantile(per_seed.count(axis=1))
    return mean, mean - half, mean + half


