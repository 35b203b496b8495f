"""Figures: one function per figure, used by the notebooks and by `rlwb figures` alike.

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


def _finite(x):
    x = np.asarray(x, dtype=float)
    return x[np.isfinite(x)]


# -- notebook 00 ------------------------------------------------------------------------------------
def accuracy_by_digits(samples, style: str = "notebook"):
    """Greedy accuracy of the default policy per operand size (max digits of a, b)."""
    import pandas as pd

    df = pd.DataFrame(samples)
    df["digits"] = df["prompt"].str.rstrip("=").str.split("+").map(lambda ab: max(len(x) for x in ab))
    acc = df.groupby("digits")["reward"].agg(["mean", "count"])
    fig, ax = plt.subplots(figsize=figsize(style, 0.7))
    ax.bar(acc.index.astype(str), acc["mean"], color=ENGINE_COLORS["hf"], alpha=0.8)
    for x, (m, c) in enumerate(zip(acc["mean"], acc["count"])):
        ax.text(x, m + 0.02, f"{m:.2f}\n(n={c})", ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, 1.15)
    ax.grid(axis="x", visible=False)
    ax.set_xlabel("digits in the larger operand")
    ax.set_ylabel("greedy accuracy")
    ax.set_title("Default policy: accuracy by problem size")
    fig.tight_layout()
    return fig
