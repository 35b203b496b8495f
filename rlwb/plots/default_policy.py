"""Figures of notebook 00_default_policy (the embedded policy's accuracy).

One function per figure, and `FIGURES`: figure name -> (the data/<table>.parquet it is drawn from, the
function), the recipes `rlwb figures` rebuilds a run's figures from."""

from __future__ import annotations

import matplotlib.pyplot as plt

from rlwb.plots.style import ENGINE_COLORS, figsize


def accuracy_by_digits(samples, style: str = "notebook"):
    """Greedy accuracy of an embedded policy per operand size (max digits of a, b; toy or chat prompts)."""
    import pandas as pd

    df = pd.DataFrame(samples).copy()
    df["digits"] = df["prompt"].str.extract(r"(\d+)\+(\d+)").apply(lambda ab: max(map(len, ab)), axis=1)
    acc = df.groupby("digits")["reward"].agg(["mean", "count"])
    fig, ax = plt.subplots(figsize=figsize(style, 0.7))
    ax.bar(acc.index.astype(str), acc["mean"], color=ENGINE_COLORS["hf"], alpha=0.8)
    for x, (m, c) in enumerate(zip(acc["mean"], acc["count"])):
        ax.text(x, m + 0.02, f"{m:.2f}\n(n={c})", ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, 1.15)
    ax.grid(axis="x", visible=False)
    ax.set_xlabel("digits in the larger operand")
    ax.set_ylabel("greedy accuracy")
    ax.set_title("Greedy accuracy by problem size")
    fig.tight_layout()
    return fig


FIGURES = {"accuracy_by_digits": ("samples", accuracy_by_digits)}
