"""Figures of notebook 03_toy_grpo (GRPO curves per engine and correction).

One function per figure, and `FIGURES`: figure name -> (the data/<table>.parquet it is drawn from, the
function), the recipes `rlwb figures` rebuilds a run's figures from."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from rlwb.plots.style import (
    FLOOR_VALUE,
    OKABE_ITO,
    engine_color,
    engine_order,
    engine_style,
    figsize,
    lay_out,
    seed_band,
)


def _curve_panels(curves, column: str, ylabel: str, title: str, style: str, log: bool = False, smooth: int = 1,
                  bounds: tuple[float, float] | None = None):
    corrections = list(dict.fromkeys(curves["correction"]))
    fig, axes = plt.subplots(1, len(corrections), figsize=figsize(style, 0.55 * len(corrections) + 0.3),
                             sharey=True, squeeze=False)
    for ax, c in zip(axes[0], corrections):
        for e in engine_order(curves["engine"]):
            d = curves[(curves["engine"] == e) & (curves["correction"] == c)]
            if d.empty:
                continue
            mean, lo, hi = seed_band(d, column, smooth, log)
            if log:
                mean, lo, hi = (np.maximum(10.0 ** x, FLOOR_VALUE) for x in (mean, lo, hi))
            if bounds is not None:
                lo, hi = lo.clip(*bounds), hi.clip(*bounds)
            ax.plot(mean.index, mean.values, color=engine_color(e), ls=engine_style(e), label=e)
            ax.fill_between(mean.index, lo.values, hi.values, color=engine_color(e), alpha=0.15, lw=0)
        ax.set_title(f"correction: {c}")
        ax.set_xlabel("GRPO step")
        if log:
            ax.set_yscale("log")
    axes[0][0].set_ylabel(ylabel)
    # one legend for every engine (a `none_only` engine's curve is in the `none` panel alone), on the fullest panel
    labelled = {}
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            labelled.setdefault(lab, h)
    fullest = max(axes[0], key=lambda ax: len(ax.get_legend_handles_labels()[1]))
    fullest.legend(list(labelled.values()), list(labelled), fontsize="small")
    avg = f"{smooth}-step moving average per seed; " if smooth > 1 else ""
    center = "geometric mean" if log else "mean"
    fig.suptitle(f"{title} ({avg}line: {center} over seeds; band: 95% CI over seeds)")
    fig.tight_layout()
    return fig


def reward_curves(curves, style: str = "notebook"):
    return _curve_panels(curves, "reward_mean", "mean reward", "Reward", style, smooth=5, bounds=(0.0, 1.0))


def clip_curves(curves, style: str = "notebook"):
    return _curve_panels(curves, "clip_frac", "PPO clip fraction", "Clip fraction", style, bounds=(0.0, 1.0))


def mismatch_curves(curves, style: str = "notebook"):
    return _curve_panels(curves, "mismatch_k3", "k3(engine ‖ trainer)", "Engine-trainer mismatch", style, log=True)


def time_breakdown(curves, style: str = "notebook"):
    parts = [("t_rollout", "rollout"), ("t_score", "scoring"), ("t_update", "update"), ("t_sync", "weight sync")]
    engines = engine_order(curves["engine"])
    means = curves.groupby("engine")[[p for p, _ in parts]].mean().loc[engines]
    fig, ax = plt.subplots(figsize=figsize(style, 0.8))
    left = np.zeros(len(engines))
    for (col, label), color in zip(parts, OKABE_ITO[1:]):
        ax.barh(engines, means[col], left=left, label=label, color=color)
        left += means[col].values
    totals = [ax.text(total, y, f" {total:.2f} s", va="center", fontsize="small") for y, total in enumerate(left)]
    if "concurrent_runs" in curves:  # a run's wall time while others shared the cores reads longer: say so
        shared = curves.groupby("engine")["concurrent_runs"].max().loc[engines]
        ax.set_yticks(range(len(engines)), [e if k <= 1 else f"{e}\n({k} runs at a time)" for e, k in shared.items()])
    ax.set_xlim(0, 1.15 * left.max())  # room for the totals
    ax.set_xlabel("seconds per GRPO step (mean)")
    ax.set_title("Where a GRPO step's time goes")
    ax.grid(axis="y", visible=False)
    ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.02, 0.5))  # beside: below, it met the x label
    fig.tight_layout()
    lay_out(fig)  # the totals' widths are known once drawn: widen the x axis until each ends inside it
    right = max(t.get_window_extent().x1 for t in totals)
    if right > ax.get_window_extent().x1:
        ax.set_xlim(0, ax.transData.inverted().transform((right, 0))[0] * 1.05)
        fig.tight_layout()
    return fig


FIGURES = {"reward_curves": ("curves", reward_curves), "clip_curves": ("curves", clip_curves),
                "mismatch_curves": ("curves", mismatch_curves), "time_breakdown": ("curves", time_breakdown)}


