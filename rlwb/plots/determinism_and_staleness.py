"""Figures of notebook 04_determinism_and_staleness (batch invariance, reruns, stale prefix cache).

One function per figure, and `FIGURES`: figure name -> (the data/<table>.parquet it is drawn from, the
function), the recipes `rlwb figures` rebuilds a run's figures from."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from rlwb.plots.style import FLOOR_VALUE, engine_color, engine_order, figsize

DETERMINISM_MEASURES = [("batch_invariant_frac", "batch-invariant fraction", False),
                        ("rerun_identical_frac", "rerun-identical fraction", False),
                        ("stale_cache_abs_dlogp_max", "max |Δlogp|, stale cache", True),
                        ("after_reset_abs_dlogp_max", "max |Δlogp|, after reset", True)]


def determinism_bars(summary, style: str = "notebook"):
    """The four measures per engine (fractions on a linear axis, |Δlogp| on a shared log axis), values printed."""
    engines = engine_order(summary["engine"])
    fig, axes = plt.subplots(1, 4, figsize=figsize(style, 1.6, 0.9))
    t = summary.pivot_table(index="engine", columns="measure", values="value", aggfunc="first")
    top = max(1.0, float(np.nanmax(t[[k for k, _, log in DETERMINISM_MEASURES if log]].values)) * 3)
    for ax, (key, title, log) in zip(axes, DETERMINISM_MEASURES):
        raw = np.asarray([t.loc[e, key] if e in t.index else np.nan for e in engines], float)
        vals = np.maximum(raw, FLOOR_VALUE) if log else raw
        ax.bar(range(len(engines)), vals, color=[engine_color(e) for e in engines])
        for x, (v, r) in enumerate(zip(vals, raw)):
            ax.text(x, v, (f"{r:.0e}" if log else f"{r:.0%}"), ha="center", va="bottom", fontsize="x-small")
        ax.set_xticks(range(len(engines)), engines, rotation=35, ha="right", fontsize="small")
        ax.set_title(title, fontsize="small")
        ax.grid(axis="x", visible=False)
        if log:
            ax.set_yscale("log")
            ax.set_ylim(FLOOR_VALUE / 2, top)
        else:
            ax.set_ylim(0, 1.12)
    fig.suptitle("Determinism, batch invariance and prefix-cache staleness")
    fig.tight_layout()
    return fig


def stale_vs_position(stale_rows, style: str = "notebook"):
    """|Δlogp| vs completion position after an in-flight update, with the prefix cache left stale (solid)
    and after a reset (dotted). Every completion token attends to the shared prefix served from the cache."""
    fig, ax = plt.subplots(figsize=figsize(style))
    for case, ls, alpha in (("stale", "-", 1.0), ("after_reset", ":", 0.6)):
        d = stale_rows[stale_rows["case"] == case]
        for e in engine_order(d["engine"]):
            g = d[d["engine"] == e]
            m = g.groupby(g["position"] - g["prompt_len"])["abs_dlogp"].mean()
            ax.plot(m.index, np.maximum(m.values, FLOOR_VALUE), color=engine_color(e), ls=ls, alpha=alpha,
                    marker=".", ms=3, label=f"{e}, {'stale cache' if case == 'stale' else 'after reset'}")
    prefix = int(stale_rows["prompt_len"].min()) if len(stale_rows) else 0
    ax.set_yscale("log")
    ax.set_xlabel(f"position in the completion (after a ≥{prefix}-token prompt sharing one cached prefix)")
    ax.set_ylabel("mean |Δlogp| vs trainer (new weights)")
    ax.set_title("In-flight weight update: stale prefix cache vs reset")
    ax.legend(fontsize="x-small", ncols=2, loc="upper center", bbox_to_anchor=(0.5, -0.25))  # below: it hid curves
    fig.tight_layout()
    return fig


FIGURES = {"determinism_bars": ("summary", determinism_bars),
                       "stale_vs_position": ("stale", stale_vs_position)}


