"""Figures of notebook 09_trainer_settings (the trainer's own settings against float64, beside the engine's).

One function per figure, and `FIGURES`: figure name -> (the data/<table>.parquet it is drawn from, the
function), the recipes `rlwb figures` rebuilds a run's figures from."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from rlwb.plots.style import FLOOR_VALUE, OKABE_ITO, figsize

POINT_COLORS = [c for c in OKABE_ITO[1:] if c != "#F0E442"]  # yellow vanishes as a hollow point on white
MARKERS = ["o", "s", "D", "^", "v"]
SIDE_COLORS = {"trainer": OKABE_ITO[5], "engine (this run)": OKABE_ITO[6], "engine (notebook 06)": OKABE_ITO[1]}


def _k3_interval(d):
    y = np.maximum(d["k3_mean"].to_numpy(float), FLOOR_VALUE)
    lo = np.maximum(d["k3_mean_ci_low"].to_numpy(float), FLOOR_VALUE)
    hi = np.maximum(d["k3_mean_ci_high"].to_numpy(float), FLOOR_VALUE)
    ok = np.isfinite(lo) & np.isfinite(hi)
    err = np.where(ok, [y - lo, hi - y], 0.0)
    return y, np.maximum(err, 0.0)


def settings_ranking(ranking_df, style: str = "notebook"):
    """Trainer settings (k3 against float64) and engine settings (k3 against the fp32 trainer) on one log scale,
    largest first, each with its 95% interval; colour says which side."""
    d = ranking_df.iloc[::-1].reset_index(drop=True)
    fig, ax = plt.subplots(figsize=figsize(style, 1.2, 0.45 + 0.075 * len(d)))
    y, err = _k3_interval(d)
    for side, color in SIDE_COLORS.items():
        pick = (d["side"] == side).to_numpy()
        if pick.any():
            ax.errorbar(y[pick], np.flatnonzero(pick), xerr=err[:, pick], fmt="o", ms=5, capsize=2, color=color,
                        label=side)
    ax.set_yticks(range(len(d)), d["name"], fontsize=7.5)
    ax.set_xscale("log")
    ax.set_xlabel(f"k3 per token (log; ≤ {FLOOR_VALUE:.0e} drawn at it): trainer vs float64, engine vs fp32 trainer")
    ax.set_title("Where the mismatch comes from: trainer settings and engine settings on one scale")
    ax.legend(fontsize="small", loc="lower right")
    fig.tight_layout()
    return fig


def settings_price(metrics_df, style: str = "notebook"):
    """One point per trainer setting: k3 against float64 (95% interval) against its time per 1k tokens relative to
    `fp32` in the same run; hollow where the setting is not bitwise batch-invariant. A legend names the points
    (settings at the float floor share a height, so labels beside them would overlap)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    t = metrics_df.pivot_table(index="setting", columns="metric", values="value", aggfunc="first")
    names = [s for s in dict.fromkeys(metrics_df["setting"]) if s in t.index and not str(s).startswith("grid/")
             and "time_ratio" in t.columns and np.isfinite(t.loc[s, "time_ratio"])]
    t = t.loc[names]
    fig, ax = plt.subplots(figsize=figsize(style, 1.35, 1.15))
    y, err = _k3_interval(t.rename_axis("name").reset_index())
    for i, s in enumerate(t.index):
        inv = t.loc[s].get("batch1_identical_frac", np.nan)
        color = POINT_COLORS[i % len(POINT_COLORS)]
        ax.errorbar(t.loc[s, "time_ratio"], y[i], yerr=err[:, [i]], fmt=MARKERS[i // len(POINT_COLORS) % len(MARKERS)],
                    ms=6, capsize=3, color=color, mfc=color if not np.isfinite(inv) or inv == 1 else "white", label=s)
    ax.set_yscale("log")
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}×"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.axvline(1.0, color="0.5", ls="--", lw=1)
    ax.set_xlabel("time per 1k tokens relative to fp32 (same run; log)")
    ax.set_ylabel(f"k3 vs float64 (log; ≤ {FLOOR_VALUE:.0e} drawn at it)")
    ax.set_title("Each trainer setting's mismatch and its price (hollow: not batch-invariant)")
    ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    return fig


def head_grid(grid_df, style: str = "notebook"):
    """Engine (rows) × trainer setting (columns): k3 engine vs trainer on the engine's samples, with its interval."""
    from matplotlib.colors import LogNorm

    g = grid_df[grid_df["status"] == "ok"]
    engines, trainers = list(dict.fromkeys(g["engine"])), list(dict.fromkeys(g["trainer"]))
    v = np.full((len(engines), len(trainers)), np.nan)
    text = [["" for _ in trainers] for _ in engines]
    for c in g.itertuples():
        i, j = engines.index(c.engine), trainers.index(c.trainer)
        v[i, j] = max(c.k3_mean, FLOOR_VALUE)
        text[i][j] = f"{c.k3_mean:.2e}\n[{c.k3_mean_ci_low:.1e}, {c.k3_mean_ci_high:.1e}]"
    wide = 0.45 + 0.25 * len(trainers)
    if style == "paper":  # at a column's width each cell's value and interval ran into the next cell's: the page's
        wide = max(wide, 1.2)
    fig, ax = plt.subplots(figsize=figsize(style, wide, 0.45 + 0.3 * len(engines)))
    hi = np.nanmax(v) if np.isfinite(v).any() else 1.0
    im = ax.imshow(v, aspect="auto", cmap="magma_r", norm=LogNorm(vmin=max(FLOOR_VALUE, np.nanmin(v) / 3), vmax=hi * 3))
    ax.set_xticks(range(len(trainers)), [f"trainer\n{t}" for t in trainers])
    ax.set_yticks(range(len(engines)), [e.replace("@", "\n@", 1) for e in engines])  # the preset, its variant below
    for i in range(len(engines)):
        for j in range(len(trainers)):
            ax.text(j, i, text[i][j], ha="center", va="center", fontsize=7.5,
                    color="white" if np.isfinite(v[i, j]) and v[i, j] > np.sqrt(hi * np.nanmin(v)) else "black")
    ax.grid(False)
    ax.set_title("fp32 lm_head on the engine side × on the trainer side: k3 engine vs trainer")
    fig.colorbar(im, ax=ax, label="k3 (log)")
    fig.tight_layout()
    return fig


FIGURES = {"settings_ranking": ("ranking", settings_ranking), "settings_price": ("metrics", settings_price),
           "head_grid": ("grid", head_grid)}
