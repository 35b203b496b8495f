"""Figures of notebook 06_engine_knobs (engine knobs: mismatch, throughput, MoE routing).

One function per figure, and `FIGURES`: figure name -> (the data/<table>.parquet it is drawn from, the
function), the recipes `rlwb figures` rebuilds a run's figures from."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from rlwb.plots.style import FLOOR_VALUE, OKABE_ITO, figsize

KNOB_HEAT = [("abs_dlogp_mean", "mean |Δlogp|"), ("abs_dlogp_max", "max |Δlogp|"), ("k3_mean", "k3 KL"),
             ("chi2_token", "χ² token"), ("ess_tis", "1 − ESS (verl)"), ("mult_prob_error", "mult. prob. error − 1")]


def _knob_values(metrics_df):
    """(knob, metric) -> value, with ESS and the multiplicative error turned into 'distance from perfect'."""
    t = metrics_df.pivot_table(index="knob", columns="metric", values="value", aggfunc="first")
    t = t[[c for c in t.columns if not str(c).startswith("layer")]]
    knobs = [k for k in dict.fromkeys(metrics_df["knob"]) if k in t.index and not str(k).startswith("moe/")
             and "k3_mean" in t.columns and np.isfinite(t.loc[k, "k3_mean"])]
    return t.loc[knobs]


def knob_heatmap(metrics_df, style: str = "notebook"):
    """Knob x metric heat map (log colour), each cell with its value and, where there is one, its 95% interval."""
    from matplotlib.colors import LogNorm

    t = _knob_values(metrics_df)
    cols = [(m, label) for m, label in KNOB_HEAT if m in t.columns]
    v = np.empty((len(t), len(cols)))
    text = [["" for _ in cols] for _ in range(len(t))]
    for j, (m, _) in enumerate(cols):
        for i, k in enumerate(t.index):
            x, lo, hi = (t.loc[k, c] if c in t.columns else np.nan for c in (m, f"{m}_ci_low", f"{m}_ci_high"))
            if m == "ess_tis":
                x, lo, hi = 1 - x, 1 - hi, 1 - lo
            elif m == "mult_prob_error":
                x, lo, hi = x - 1, lo - 1, hi - 1
            v[i, j] = max(abs(x), FLOOR_VALUE)
            text[i][j] = f"{x:.1e}" + (f"\n[{lo:.0e}, {hi:.0e}]" if np.isfinite(lo) and np.isfinite(hi) else "")
    fig, ax = plt.subplots(figsize=figsize(style, 1.45, 0.35 + 0.17 * len(t)))
    im = ax.imshow(v, aspect="auto", cmap="magma_r", norm=LogNorm(vmin=FLOOR_VALUE, vmax=max(1.0, v.max())))
    ax.set_xticks(range(len(cols)), [label for _, label in cols], rotation=20, ha="right")
    ax.set_yticks(range(len(t)), t.index)
    for i in range(v.shape[0]):
        for j in range(v.shape[1]):
            ax.text(j, i, text[i][j], ha="center", va="center", fontsize=6.5,
                    color="white" if v[i, j] > 1e-3 else "black")
    ax.grid(False)
    ax.set_title("Engine vs fp32 trainer, per knob (value and 95% interval)")
    fig.colorbar(im, ax=ax, label="distance from no mismatch (log)")
    fig.tight_layout()
    return fig


def knob_price(metrics_df, style: str = "notebook"):
    """One point per knob: mismatch (k3, 95% interval) against throughput relative to the baseline."""
    t = _knob_values(metrics_df)
    fig, ax = plt.subplots(figsize=figsize(style, 1.1, 1.15))
    for i, k in enumerate(t.index):
        x = 1.0 if k == "baseline" else t.loc[k, "throughput_ratio"]  # the reference: no ratio to itself stored
        y = max(t.loc[k, "k3_mean"], FLOOR_VALUE)
        lo = max(t.loc[k].get("k3_mean_ci_low", np.nan), FLOOR_VALUE)
        hi = max(t.loc[k].get("k3_mean_ci_high", np.nan), FLOOR_VALUE)
        yerr = [[y - lo], [hi - y]] if np.isfinite(lo) and np.isfinite(hi) else None
        color = "0.2" if k == "baseline" else OKABE_ITO[1 + i % 7]
        # named in a legend, not by annotations beside the points: knobs that cost the same sit on top of each other
        ax.errorbar(x, y, yerr=yerr, fmt="o", ms=6, capsize=3, color=color, label=k)
    ax.set_yscale("log")
    ax.axvline(1.0, color="0.5", ls="--", lw=1)
    ax.set_xlabel("throughput relative to the baseline (×, same run)")
    ax.set_ylabel(f"k3 KL engine vs trainer (log; ≤ {FLOOR_VALUE:.0e} drawn at it)")
    ax.set_title("What each knob costs in mismatch, and what it buys in speed")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False, title="knob",
              title_fontsize="small")
    fig.tight_layout()
    return fig


def router_agreement(routing_df, style: str = "notebook"):
    """Per MoE layer: share of tokens whose top-k expert set is the same in engine and trainer."""
    fig, ax = plt.subplots(figsize=figsize(style, 0.9))
    for i, (knob, d) in enumerate(routing_df.groupby("knob", sort=False)):
        d = d.sort_values("layer")
        ax.plot(d["layer"], 100 * d["topk_set_agree"], marker="o", label=f"{knob}: same top-k set",
                color=OKABE_ITO[(5, 6, 1, 3)[i % 4]])
        ax.plot(d["layer"], 100 * d["top1_agree"], marker="x", ls=":", label=f"{knob}: same first expert",
                color=OKABE_ITO[(5, 6, 1, 3)[i % 4]])
    ax.set_xticks(sorted(routing_df["layer"].unique()))
    ax.set_xlabel("layer")
    ax.set_ylabel("tokens routed as the trainer routes (%)")
    ax.set_title("MoE router: engine vs fp32 trainer")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


FIGURES = {"knob_heatmap": ("metrics", knob_heatmap), "knob_price": ("metrics", knob_price),
                "router_agreement": ("routing", router_agreement)}


