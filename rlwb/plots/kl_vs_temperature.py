"""Figures of notebook 02_kl_vs_temperature (KL drift across temperatures and top-p).

One function per figure, and `FIGURES`: figure name -> (the data/<table>.parquet it is drawn from, the
function), the recipes `rlwb figures` rebuilds a run's figures from."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from rlwb.plots.style import FLOOR_VALUE, engine_color, engine_order, engine_style, figsize


def _sweep_lines(ax, rows, metric: str, top_p: float = 1.0, top_k: int = 0, trainer: str = "renorm",
                 dashed: bool = False, label_suffix: str = ""):
    d = rows[(rows["metric"] == metric) & (rows["top_p"] == top_p) & (rows["top_k"] == top_k)
             & (rows["trainer"] == trainer)]
    ci = rows[(rows["top_p"] == top_p) & (rows["top_k"] == top_k) & (rows["trainer"] == trainer)]
    for e in engine_order(d["engine"]):
        g = d[d["engine"] == e].sort_values("temperature")
        v = np.maximum(np.abs(g["value"].astype(float)), FLOOR_VALUE)
        ax.plot(g["temperature"], v, color=engine_color(e), ls="--" if dashed else engine_style(e), marker="o",
                ms=3, label=e + label_suffix)
        band = [ci[(ci["engine"] == e) & (ci["metric"] == f"{metric}_ci_{s}")].sort_values("temperature")
                for s in ("low", "high")]
        if len(band[0]) == len(g) and len(band[1]) == len(g):  # 95% sequence-bootstrap interval
            ax.fill_between(g["temperature"], *(np.maximum(b["value"].astype(float).to_numpy(), FLOOR_VALUE)
                                                for b in band), color=engine_color(e), alpha=0.15, lw=0)


def kl_vs_temperature(rows, style: str = "notebook", top_p: float = 1.0):
    """k3 and exact KL vs temperature, one line per engine (log y). With top_p < 1, dashed lines show the
    same engines against a trainer that does not renormalise over the kept tokens."""
    fig, axes = plt.subplots(1, 2, figsize=figsize(style, 1.4), sharey=True)
    for ax, (metric, title) in zip(axes, [("k3_mean", "k3 estimator"), ("full_kl_mean", "exact KL (full vocab)")]):
        _sweep_lines(ax, rows, metric, top_p=top_p)
        if top_p < 1.0:
            _sweep_lines(ax, rows, metric, top_p=top_p, trainer="no_renorm", dashed=True,
                         label_suffix=" (trainer w/o renorm)")
        ax.axvline(1.0, color="0.6", lw=0.8, ls=":")
        ax.set_yscale("log")
        ax.set_xlabel("temperature T")
        ax.set_title(title)
    axes[0].set_ylabel("KL(engine ‖ trainer) per token")
    axes[1].legend(fontsize="x-small", loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle("Engine-vs-trainer KL across temperatures" + (f", top_p={top_p:g}" if top_p < 1 else ""))
    fig.tight_layout()
    return fig


def kl_vs_temperature_top_p(rows, style: str = "notebook"):
    tps = sorted(x for x in rows["top_p"].unique() if x < 1.0)
    return kl_vs_temperature(rows, style, top_p=tps[0] if tps else 1.0)


def analytic_scatter(tokens, style: str = "notebook"):
    """Measured log r against its analytical expectation (raw engines: log softmax(z/T) - log softmax(z))."""
    d = tokens[(tokens["top_p"] == 1.0) & (tokens["top_k"] == 0)]
    fig, ax = plt.subplots(figsize=figsize(style, 0.75, 1.1))
    lim = [min(d["expected_log_r"].min(), d["measured_log_r"].min()),
           max(d["expected_log_r"].max(), d["measured_log_r"].max())]
    ax.plot(lim, lim, color="0.7", lw=0.8, zorder=0)
    for e in engine_order(d["engine"]):
        g = d[d["engine"] == e]
        err = np.max(np.abs(g["measured_log_r"] - g["expected_log_r"])) if len(g) else np.nan
        ax.scatter(g["expected_log_r"], g["measured_log_r"], s=5, alpha=0.5, color=engine_color(e), linewidths=0,
                   label=f"{e} (max err {err:.1e})", rasterized=True)
    ax.set_xlabel("expected log r (from the trainer's logits)")
    ax.set_ylabel("measured log r")
    ax.set_title("Measured vs analytical log ratio, all temperatures")
    ax.legend(fontsize="x-small", markerscale=3)
    fig.tight_layout()
    return fig


def dlogp_heatmap(rows, style: str = "notebook"):
    """Engine x temperature heat map of mean |Δlogp| (log colour scale), untruncated sampling."""
    from matplotlib.colors import LogNorm

    d = rows[(rows["metric"] == "abs_dlogp_mean") & (rows["top_p"] == 1.0) & (rows["top_k"] == 0)
             & (rows["trainer"] == "renorm")]
    t = d.pivot_table(index="engine", columns="temperature", values="value", aggfunc="first")
    t = t.loc[engine_order(t.index)]
    v = np.maximum(t.values.astype(float), FLOOR_VALUE)
    fig, ax = plt.subplots(figsize=figsize(style, 1.0, 0.3 + 0.15 * len(t)))
    im = ax.imshow(v, aspect="auto", cmap="viridis", norm=LogNorm(vmin=FLOOR_VALUE, vmax=max(1e-1, v.max())))
    ax.set_xticks(range(t.shape[1]), [f"{x:g}" for x in t.columns])
    ax.set_yticks(range(t.shape[0]), t.index)
    for i in range(v.shape[0]):
        for j in range(v.shape[1]):
            ax.text(j, i, f"{v[i, j]:.0e}", ha="center", va="center", fontsize=7,
                    color="white" if v[i, j] < 1e-4 else "black")
    ax.grid(False)
    ax.set_xlabel("temperature T")
    ax.set_title("mean |Δlogp| per token")
    fig.colorbar(im, ax=ax, label="mean |Δlogp|")
    fig.tight_layout()
    return fig


FIGURES = {"kl_vs_temperature": ("sweep", kl_vs_temperature),
              "kl_vs_temperature_top_p": ("sweep", kl_vs_temperature_top_p),
              "analytic_scatter": ("tokens", analytic_scatter), "dlogp_heatmap": ("sweep", dlogp_heatmap)}


