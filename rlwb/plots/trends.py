"""The index page's trend figure: a notebook's headline metrics run after run."""

from __future__ import annotations

import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np


def trend_figure(points: list[dict], metrics: list[str], title: str, style: str = "notebook"):
    """Headline metrics of one notebook's runs, oldest first, one panel per metric.

    `points`: {"label": tick text (time, commit), "versions": engine versions, "status": ok | failed,
    "drift": bool | None, "params": params hash, "values": {metric: value}}. Successful runs with the same
    parameters are one line (runs with other parameters measure something else: another line, another
    colour); failed runs are red crosses on the axis; runs a rerun flagged as drift get a red ring; a dotted
    vertical line marks where the engines' versions changed (the upgrade the nightly audit is for), labelled
    with the new ones. Log scale where a metric spans more than two decades."""
    n = len(metrics)
    fig, axes = plt.subplots(1, n, figsize=(3.0 * n + 1.5, 2.6), sharex=True, squeeze=False)
    xs = np.arange(len(points))
    step = max(1, int(np.ceil(len(points) / (12 // n))))  # a few tick labels; the table under it has them all
    ticks = xs[::step]
    hashes = list(dict.fromkeys(p.get("params") for p in reversed(points) if p["status"] == "ok"))
    palette = ["#0072B2", "#009E73", "#CC79A7", "#E69F00", "#56B4E9"]  # newest parameters first
    series = [(h, palette[i] if i < len(palette) else "#999999") for i, h in enumerate(hashes)]
    for ax, m in zip(axes[0], metrics):
        ok = [(x, p["values"].get(m)) for x, p in zip(xs, points) if p["status"] == "ok"]
        ok = [(x, v) for x, v in ok if v is not None and np.isfinite(v)]
        vals = np.array([v for _, v in ok])
        log = len(vals) > 0 and (vals > 0).all() and vals.max() / max(vals.min(), 1e-300) > 100
        if log:
            ax.set_yscale("log")
        else:  # no offset text ("1e-14" above the axis collides with the title)
            ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%.3g"))
        for (h, colour) in series:
            pts = [(x, v) for x, v in ok if points[x].get("params") == h]
            if pts:
                ax.plot([x for x, _ in pts], [v for _, v in pts], marker="o", ms=4, color=colour, lw=1.2)
        for x, p in zip(xs, points):
            v = p["values"].get(m)
            if p.get("drift") and v is not None and np.isfinite(v):
                ax.plot([x], [v], marker="o", ms=11, mfc="none", mec="#D55E00", mew=1.6, ls="none")
        fails = [x for x, p in zip(xs, points) if p["status"] != "ok"]
        if fails:
            ax.plot(fails, [0.02] * len(fails), marker="x", ms=7, color="#D55E00", ls="none",
                    transform=ax.get_xaxis_transform(), clip_on=False)
        ax.set_title(m, fontsize=8)
        for i in range(1, len(points)):
            if points[i]["versions"] != points[i - 1]["versions"]:
                ax.axvline(i - 0.5, color="#888", ls=":", lw=1)
                ax.annotate(points[i]["versions"], (i - 0.45, 0.98), xycoords=("data", "axes fraction"),
                            fontsize=6, color="#555", ha="left", va="top",
                            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1})
        ax.set_xticks(ticks, [points[i]["label"] for i in ticks], fontsize=6)
        ax.set_xlim(-0.5, max(len(points) - 0.5, 0.5))
        ax.tick_params(axis="y", labelsize=7)
    counts = {h: sum(p.get("params") == h and p["status"] == "ok" for p in points) for h, _ in series}
    runs = {h: f"{k} run" + ("s" if k != 1 else "") for h, k in counts.items()}
    # which model each parameter set ran on, when it is not the default policy (params alone do not say)
    model = {p.get("params"): p.get("model") for p in points}
    handles = [plt.Line2D([], [], marker="o", color=c, label=f"params {h} ("
                          + (f"{model[h]}, " if model.get(h) not in (None, "default") else "") + f"{runs[h]})")
               for h, c in series[:5]]
    if len(series) > 5:
        handles.append(plt.Line2D([], [], marker="o", color="#999999", label=f"{len(series) - 5} other parameter sets"))
    handles += [plt.Line2D([], [], marker="o", mfc="none", mec="#D55E00", ls="none", ms=9, label="drift flagged"),
                plt.Line2D([], [], marker="x", color="#D55E00", ls="none", label="failed run")]
    axes[0, -1].legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig
