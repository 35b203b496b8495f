"""Figures of notebook 05_equivalence_and_stress (validator cases, memory pressure, long context).

One function per figure, and `FIGURES`: figure name -> (the data/<table>.parquet it is drawn from, the
function), the recipes `rlwb figures` rebuilds a run's figures from."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from rlwb.plots.style import FLOOR_VALUE, engine_color, engine_order, engine_style, figsize


def validate_cases(cases, style: str = "notebook", tolerance: float | None = None):
    """Validator: every drawn case's max |Δlogp| (one dot per case, grey = outside the tolerance), the
    distribution of KLΔ per case, and the pass rate with its 95% Wilson interval (error bars)."""
    from rlwb.core.measure.stats import proportion_ci

    engines = engine_order(cases["engine"])
    fig, (ax, bx, cx) = plt.subplots(1, 3, figsize=figsize(style, 1.7),
                                     gridspec_kw={"width_ratios": [1.3, 1, 0.8]})
    rng = np.random.default_rng(0)
    tol = tolerance if tolerance is not None else (float(cases["tolerance"].iloc[0]) if "tolerance" in cases else None)
    for x, e in enumerate(engines):
        g = cases[cases["engine"] == e]
        for panel, col in ((ax, "abs_dlogp_max"), (bx, "k3_mean")):
            v = np.maximum(g[col].to_numpy(float), FLOOR_VALUE)
            colors = np.where(g["passed"].to_numpy(), engine_color(e), "#999999") if panel is ax else engine_color(e)
            panel.scatter(x + rng.uniform(-0.18, 0.18, len(v)), v, s=10, c=colors, alpha=0.75, lw=0)
        n, k = len(g), int(g["passed"].sum())
        lo, hi = proportion_ci(k, n)
        rate = k / n if n else np.nan
        cx.bar(x, rate, color=engine_color(e), alpha=0.85)
        cx.errorbar(x, rate, yerr=[[rate - lo], [hi - rate]], color="#333333", capsize=3, lw=1)
        cx.text(x, hi + 0.02, f"{k}/{n}", ha="center", va="bottom", fontsize="x-small")
    for panel, label in ((ax, "max |Δlogp| per case"), (bx, "KLΔ (k3) per case"), (cx, "pass rate (95% Wilson CI)")):
        if panel is not cx:
            panel.set_yscale("log")
        panel.set_xticks(range(len(engines)), engines, rotation=35, ha="right", fontsize="small")
        panel.set_ylabel(label)
        panel.grid(axis="x", visible=False)
    cx.set_ylim(0, 1.15)
    if tol is not None:
        ax.axhline(tol, color="#555555", ls="--", lw=1)
        ax.text(len(engines) - 0.5, tol, f" tolerance {tol:g}", va="bottom", ha="right", fontsize="x-small")
    fig.suptitle("Equivalence validator: hypothesis-drawn cases per engine (grey = failed)")
    fig.tight_layout()
    return fig


def pressure_bars(summary, style: str = "notebook"):
    """Memory pressure per engine: max |Δlogp| vs the trainer without and with a tiny KV cache (log axis,
    preemptions printed over the pressure bar), and the share of requests whose tokens did not change."""
    t = summary.pivot_table(index="engine", columns="measure", values="value", aggfunc="first")
    if "pressure_abs_dlogp_max" not in t:
        raise ValueError("no memory-pressure measurements in this summary")
    t = t[t["pressure_abs_dlogp_max"].notna()]
    engines = engine_order(t.index)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=figsize(style, 1.4), gridspec_kw={"width_ratios": [1.6, 1]})
    x = np.arange(len(engines))
    for off, key, label, hatch in ((-0.2, "free_abs_dlogp_max", "without pressure", None),
                                   (0.2, "pressure_abs_dlogp_max", "KV cache under pressure", "//")):
        vals = np.maximum(t.loc[engines, key].to_numpy(float), FLOOR_VALUE)
        ax.bar(x + off, vals, 0.38, color=[engine_color(e) for e in engines], hatch=hatch, edgecolor="white",
               alpha=1.0 if hatch is None else 0.7, label=label)
        if key.startswith("pressure"):
            for xi, e, v in zip(x, engines, vals):
                pre = t.loc[e, "pressure_preemptions"] if "pressure_preemptions" in t else np.nan
                ax.text(xi + off, v, "n/a" if not np.isfinite(pre) else f"{int(pre)}\npreempt.", ha="center",
                        va="bottom", fontsize="x-small")
    ax.set_yscale("log")
    both = t[["free_abs_dlogp_max", "pressure_abs_dlogp_max"]].to_numpy(float)
    ax.set_ylim(max(FLOOR_VALUE, float(np.nanmin(both))) / 10, max(FLOOR_VALUE, float(np.nanmax(both))) * 30)
    ax.set_ylabel("max |Δlogp| vs trainer")
    ax.set_xticks(x, engines, rotation=35, ha="right", fontsize="small")
    ax.legend(fontsize="x-small", loc="upper left")
    ax.grid(axis="x", visible=False)
    same = t.loc[engines, "pressure_identical_frac"].to_numpy(float)
    bx.bar(x, same, color=[engine_color(e) for e in engines])
    for xi, v in zip(x, same):
        bx.text(xi, v, f"{v:.0%}", ha="center", va="bottom", fontsize="x-small")
    bx.set_ylim(0, 1.12)
    bx.set_ylabel("requests with the same tokens\nas without pressure")
    bx.set_xticks(x, engines, rotation=35, ha="right", fontsize="small")
    bx.grid(axis="x", visible=False)
    kv = t["pressure_kv_tokens"].dropna()
    fig.suptitle(f"Memory pressure: KV cache of {int(kv.min()) if len(kv) else '?'}"
                 f"{'' if len(kv) and kv.min() == kv.max() else '+'} tokens, same seeded requests")
    fig.tight_layout()
    return fig


def longctx_vs_position(rows, style: str = "notebook"):
    """|Δlogp| vs absolute position: at each completion position the largest |Δlogp| over the vocabulary
    (small dots; the sampled token's where no full distributions exist), and per prompt length the
    largest of those (line). Engines are offset sideways so overlapping ones stay visible."""
    engines = engine_order(rows["engine"])
    fig, ax = plt.subplots(figsize=figsize(style, 1.2))
    span = float(rows["position"].max() - rows["position"].min()) or 1.0
    for j, e in enumerate(engines):
        g = rows[rows["engine"] == e]
        col = "dist_abs_dlogp_max" if g["dist_abs_dlogp_max"].notna().any() else "abs_dlogp"
        dx = (j - (len(engines) - 1) / 2) * span * 0.006
        start = g.groupby("prompt_len")["position"].transform("min")  # completion start (= prompt length)
        ax.scatter(start + dx, np.maximum(g[col].to_numpy(float), FLOOR_VALUE), s=7, color=engine_color(e),
                   alpha=0.3, lw=0)
        m = g.groupby("prompt_len")[col].max()
        ax.plot(m.index + dx, np.maximum(m.values, FLOOR_VALUE), color=engine_color(e), ls=engine_style(e),
                marker="o", ms=4, label=e if col == "dist_abs_dlogp_max" else f"{e} (sampled tokens only)")
    ax.set_yscale("log")
    lo = float(np.nanmin(np.maximum(rows[["dist_abs_dlogp_max", "abs_dlogp"]].max(axis=1).to_numpy(float),
                                    FLOOR_VALUE)))
    ax.set_ylim(lo / 3, None)
    ax.set_xlabel("absolute position where the completion starts (prompt length, tokens)")
    ax.set_ylabel("largest |Δlogp| over the vocabulary")
    ax.set_title("Long context: engine vs trainer at every completion position (dots), max per length (line)")
    ax.legend(fontsize="x-small", ncols=3)
    fig.tight_layout()
    return fig


FIGURES = {"validate_cases": ("cases", validate_cases), "pressure_bars": ("summary", pressure_bars),
                  "longctx_vs_position": ("longctx", longctx_vs_position)}


