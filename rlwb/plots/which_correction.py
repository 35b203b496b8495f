"""Figures of notebook 07_which_correction (the corrections race per mismatch level).

One function per figure, and `FIGURES`: figure name -> (the data/<table>.parquet it is drawn from, the
function), the recipes `rlwb figures` rebuilds a run's figures from."""

from __future__ import annotations

import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np

from rlwb.plots.style import OKABE_ITO, figsize, legend_below, seed_band
from rlwb.plots.toy_grpo import time_breakdown

CORRECTION_STYLES = ["-", "--", "-.", ":"]


CORRECTION_COLORS = [OKABE_ITO[i] for i in (0, 1, 2, 3, 5, 6, 7, 4)]  # Okabe-Ito, its yellow last (faint)


def correction_color(i: int) -> str:
    return CORRECTION_COLORS[i % len(CORRECTION_COLORS)]





def _race_panels(curves, column: str, ylabel: str, title: str, style: str, smooth: int = 1,
                 bounds: tuple[float, float] | None = None, baseline: bool = True):
    """One panel per mismatch level, one line per correction (colour and dash by correction), the
    baseline (first level, `none`) drawn grey in every panel."""
    levels = list(dict.fromkeys(curves["engine"]))
    base = curves[(curves["engine"] == levels[0]) & (curves["correction"] == "none")]
    panels = levels[1:] or levels
    corrections = list(dict.fromkeys(curves["correction"]))
    fig, axes = plt.subplots(1, len(panels), figsize=figsize(style, 0.6 * len(panels) + 0.4), sharey=True,
                             squeeze=False)
    for ax, lvl in zip(axes[0], panels):
        if baseline and not base.empty:
            m, lo, hi = seed_band(base, column, smooth)
            if bounds is not None:
                lo, hi = lo.clip(*bounds), hi.clip(*bounds)
            ax.plot(m.index, m.values, color="0.55", lw=2.2, label=f"baseline ({levels[0]}, none)", zorder=1)
            ax.fill_between(m.index, lo.values, hi.values, color="0.55", alpha=0.15, lw=0)
        for i, c in enumerate(corrections):
            d = curves[(curves["engine"] == lvl) & (curves["correction"] == c)]
            if d.empty or (lvl == levels[0] and c == "none" and baseline):
                continue
            m, lo, hi = seed_band(d, column, smooth)
            if bounds is not None:
                lo, hi = lo.clip(*bounds), hi.clip(*bounds)
            ax.plot(m.index, m.values, color=correction_color(i), ls=CORRECTION_STYLES[i % 4], label=c, lw=1.3)
            ax.fill_between(m.index, lo.values, hi.values, color=correction_color(i), alpha=0.08, lw=0)
        ax.set_title(f"level: {lvl}")
        ax.set_xlabel("GRPO step")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    axes[0][0].set_ylabel(ylabel)
    avg = f", {smooth}-step moving average" if smooth > 1 else ""
    fig.suptitle(f"{title} (mean over seeds{avg}; band: 95% CI)")
    legend_below(fig, *axes[0][0].get_legend_handles_labels())
    return fig


def race_reward_curves(curves, style: str = "notebook"):
    return _race_panels(curves, "reward_mean", "mean reward", "Reward per mismatch level", style, smooth=5,
                        bounds=(0.0, 1.0))


def race_health(curves, style: str = "notebook"):
    """ESS (top) and the share of tokens whose loss term the correction removed (bottom), per level."""
    levels = list(dict.fromkeys(curves["engine"]))
    panels = levels[1:] or levels
    corrections = list(dict.fromkeys(curves["correction"]))
    fig, axes = plt.subplots(2, len(panels), figsize=figsize(style, 0.6 * len(panels) + 0.4, 1.6),
                             sharex=True, sharey="row", squeeze=False)
    for j, lvl in enumerate(panels):
        for row, (col, label) in enumerate((("ess", "ESS (share of tokens)"), ("masked_frac", "tokens removed"))):
            ax = axes[row][j]
            for i, c in enumerate(corrections):
                d = curves[(curves["engine"] == lvl) & (curves["correction"] == c)]
                if d.empty:
                    continue
                m, lo, hi = seed_band(d, col, 1)
                ax.plot(m.index, m.values, color=correction_color(i), ls=CORRECTION_STYLES[i % 4], label=c, lw=1.3)
                ax.fill_between(m.index, lo.clip(0, 1).values, hi.clip(0, 1).values, color=correction_color(i),
                                alpha=0.08, lw=0)
            ax.set_ylim(-0.03, 1.03)
            ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
            if j == 0:
                ax.set_ylabel(label)
            if row == 0:
                ax.set_title(f"level: {lvl}")
            else:
                ax.set_xlabel("GRPO step")
    fig.suptitle("Correction health over training (mean over seeds; band: 95% CI)")
    legend_below(fig, *axes[0][0].get_legend_handles_labels())
    return fig


def race_gaps(ranking, style: str = "notebook"):
    """Final reward minus the baseline's, paired by seed, with its 95% CI: one row per correction, one
    panel per mismatch level, best on top; the dashed line is the baseline (gap 0)."""
    levels = [lvl for lvl in dict.fromkeys(ranking["level"])
              if (ranking.loc[ranking["level"] == lvl, "verdict"] != "baseline").any()]
    n = max(len(ranking[ranking["level"] == lvl]) for lvl in levels) if levels else 1
    tall = 0.3 + 0.12 * n + (0.2 if style == "paper" else 0)  # paper: a column-wide title takes three lines
    fig, axes = plt.subplots(1, max(1, len(levels)), figsize=figsize(style, 0.55 * len(levels) + 0.45, tall),
                             sharex=True, squeeze=False)
    verdict_color = {"recovers": "#009E73", "above baseline": "#0072B2", "falls short": "#D55E00",
                     "inconclusive": "#E69F00", "= baseline (by construction)": "0.6", "n/a": "0.5", "baseline": "0.5"}
    for ax, lvl in zip(axes[0], levels):
        d = ranking[ranking["level"] == lvl].sort_values("rank", ascending=False)
        y = np.arange(len(d))
        lo = (d["gap"] - d["gap_ci_low"]).clip(lower=0).fillna(0)
        hi = (d["gap_ci_high"] - d["gap"]).clip(lower=0).fillna(0)
        for k, (_, r) in enumerate(d.iterrows()):
            ax.errorbar(r["gap"], y[k], xerr=[[lo.iloc[k]], [hi.iloc[k]]], fmt="o", ms=5, capsize=3,
                        color=verdict_color.get(r["verdict"], "0.3"))
        ax.axvline(0, color="0.4", ls="--", lw=1)
        if "margin" in d and np.isfinite(d["margin"].iloc[0]):  # the equivalence band a "recovers" is shown inside
            ax.axvspan(-d["margin"].iloc[0], d["margin"].iloc[0], color="#009E73", alpha=0.08, lw=0)
        ax.set_yticks(y, d["correction"])
        ax.set_title(f"level: {lvl}")
        ax.set_xlabel("final reward − baseline")
        ax.grid(axis="y", visible=False)
    from matplotlib.lines import Line2D

    used = [v for v in ("recovers", "above baseline", "falls short", "inconclusive", "= baseline (by construction)",
                        "n/a") if v in set(ranking["verdict"])]
    fig.suptitle("What recovers the baseline (95% CI over seeds, paired by seed; shaded: equivalence margin)")
    legend_below(fig, [Line2D([], [], marker="o", ls="", color=verdict_color[v]) for v in used], used,
                 max_cols=len(used))
    return fig


FIGURES = {"race_reward_curves": ("curves", race_reward_curves), "race_gaps": ("ranking", race_gaps),
                "race_health": ("curves", race_health), "time_breakdown": ("curves", time_breakdown)}


