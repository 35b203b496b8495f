"""Figures of notebook 10_audit (your prompts, your engine, your trainer).

The token-level views are notebook 01's (the same per-token table: `prob_scatter`, `log_ratio_hist`,
`mismatch_vs_position`); the audit adds the cross-framework panel as a figure: each framework's logged metric
against its own alert threshold. `FIGURES`: figure name -> (the data/<table>.parquet it is drawn from, the
function), the recipes `rlwb figures` rebuilds a run's figures from."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from rlwb.plots.logprob_mismatch import log_ratio_hist, mismatch_vs_position, prob_scatter
from rlwb.plots.style import FLOOR_VALUE, engine_color, engine_order, figsize


def threshold_distance(panel_df, style: str = "notebook"):
    """Every panel metric that has a threshold, as the distance from no mismatch to the framework's alert line
    (`FrameworkMetric.distance`: 0 = no mismatch, 1 = where it alerts), log scale, 95% intervals as error bars.
    Bars left of the line are inside what the framework accepts."""
    d = panel_df[panel_df["threshold"].notna()]
    engines = engine_order(d["engine"])
    names = list(dict.fromkeys(f"{r.framework}: {r.metric}" for r in d.itertuples()))
    fig, ax = plt.subplots(figsize=figsize(style, 1.2, 0.4 + 0.1 * len(names) * (1 + 0.5 * max(1, len(engines)))))
    height = 0.8 / max(1, len(engines))
    top = 10.0
    for i, e in enumerate(engines):
        rows = d[d["engine"] == e]
        rows = rows.set_index(rows["framework"] + ": " + rows["metric"]).reindex(names)
        v = np.maximum(rows["distance"].to_numpy(float), FLOOR_VALUE)
        lo = np.maximum(rows["distance_ci_low"].to_numpy(float), FLOOR_VALUE)
        hi = np.maximum(rows["distance_ci_high"].to_numpy(float), FLOOR_VALUE)
        top = max(top, 2 * float(np.nanmax(hi, initial=0)))
        ax.barh(np.arange(len(names)) + (i - (len(engines) - 1) / 2) * height, v, height, color=engine_color(e),
                label=e, xerr=np.nan_to_num(np.vstack([v - lo, hi - v]).clip(min=0)), capsize=2,
                error_kw={"lw": 0.8, "ecolor": "0.2"})
    ax.axvline(1.0, color="#c00", lw=1.2, ls="--")
    ax.text(1.0, 1.0, " alert threshold", color="#c00", fontsize="small", va="bottom",
            transform=ax.get_xaxis_transform())
    ax.set_xscale("log")
    ax.set_xlim(FLOOR_VALUE / 2, top)
    ax.set_yticks(np.arange(len(names)), names, fontsize="small")
    ax.invert_yaxis()
    ax.set_xlabel("distance to the framework's threshold (0 = no mismatch, 1 = it alerts; log scale, floor 1e-9)")
    ax.set_title("The audit on each framework's dashboard", pad=14)  # above the threshold's label
    ax.grid(axis="y", visible=False)
    if len(engines) > 1:
        ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.4, -0.1), ncols=min(3, len(engines)))
    fig.tight_layout()
    return fig


FIGURES = {"threshold_distance": ("panel", threshold_distance), "prob_scatter": ("rollouts", prob_scatter),
           "log_ratio_hist": ("rollouts", log_ratio_hist), "mismatch_vs_position": ("rollouts", mismatch_vs_position)}
