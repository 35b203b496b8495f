"""Figures: one function per figure, used by the notebooks and by `rlwb figures` alike.

Why fixed colours: a reader comparing the mismatch, KL and GRPO figures should recognise `vllm-v1` by
colour everywhere. The palette is Okabe-Ito (colour-blind safe). Saved files are deterministic (no
dates or random ids in PDF/SVG metadata) so regenerating a run's figures reproduces them.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np

OKABE_ITO = ["#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7"]
ENGINE_COLORS = {
    "hf": "#000000",
    "vllm-v0": "#0072B2",
    "vllm-v1": "#D55E00",
    "vllm-v1-processed": "#E69F00",
    "vllm-v1-fixed": "#009E73",
}
LADDER = ["hf", "vllm-v0", "vllm-v1", "vllm-v1-processed", "vllm-v1-fixed"]
# Line styles too, so curves that coincide (e.g. processed and fixed at the float floor) stay visible
# and figures survive black-and-white printing.
ENGINE_STYLES = {"hf": "-", "vllm-v0": "--", "vllm-v1": "-", "vllm-v1-processed": ":", "vllm-v1-fixed": "-."}


def engine_style(name: str) -> str:
    return ENGINE_STYLES.get(name.split("+")[0], "-")


def engine_color(name: str) -> str:
    base = name.split("+")[0]
    if base in ENGINE_COLORS:
        return ENGINE_COLORS[base]
    return OKABE_ITO[(sum(map(ord, base)) % 3) + 4]  # user presets: stable, distinct from the ladder


def set_style(style: str = "notebook") -> None:
    """`notebook` (screen), `paper` (serif, single-column width, vector) or `blog` (larger type)."""
    if style not in ("notebook", "paper", "blog"):
        raise ValueError(f"style must be notebook, paper or blog, got {style!r}")
    plt.rcdefaults()
    rc = {
        "figure.dpi": 110, "savefig.dpi": 200, "savefig.bbox": "tight", "axes.spines.top": False,
        "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3, "legend.frameon": False,
        "font.size": 10, "axes.titlesize": 11, "svg.hashsalt": "rlwb", "pdf.fonttype": 42,
    }
    if style == "paper":
        rc.update({"font.family": "serif", "font.size": 8, "axes.titlesize": 9, "axes.labelsize": 8,
                   "legend.fontsize": 7, "xtick.labelsize": 7, "ytick.labelsize": 7, "lines.linewidth": 1.2})
    if style == "blog":
        rc.update({"font.size": 12, "axes.titlesize": 13, "lines.linewidth": 2})
    plt.rcParams.update(rc)


FIGSIZE = {"notebook": (7.0, 4.0), "paper": (3.4, 2.4), "blog": (8.0, 4.5)}


def figsize(style: str = "notebook", wide: float = 1.0, tall: float = 1.0) -> tuple[float, float]:
    w, h = FIGSIZE.get(style, FIGSIZE["notebook"])
    return (w * wide, h * tall)


def save_figure(fig, path_stem: str | Path) -> Path:
    """Write `<stem>.png`, `.pdf` and `.svg` with reproducible metadata; returns the PNG path."""
    path_stem = Path(path_stem)
    path_stem.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path_stem.with_suffix(".png"), metadata={"Software": None})
    fig.savefig(path_stem.with_suffix(".pdf"), metadata={"CreationDate": None, "Producer": None, "Creator": None})
    fig.savefig(path_stem.with_suffix(".svg"), metadata={"Date": None, "Creator": None})
    return path_stem.with_suffix(".png")


def _finite(x):
    x = np.asarray(x, dtype=float)
    return x[np.isfinite(x)]


# -- notebook 00 ------------------------------------------------------------------------------------
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


# -- notebook 01: logprob mismatch ------------------------------------------------------------------
LADDER_METRICS = [("abs_dlogp_mean", "mean |Δlogp|"), ("abs_dlogp_max", "max |Δlogp|"),
                  ("k3_mean", "k3 KL"), ("full_kl_mean", "exact KL"), ("chi2_token", "|χ²|")]
FLOOR_VALUE = 1e-9  # log-scale plots: values at or below this are drawn at the floor


def _order(engines) -> list[str]:
    engines = list(dict.fromkeys(engines))
    return sorted(engines, key=lambda e: (LADDER.index(e) if e in LADDER else len(LADDER), e))


def ablation_ladder(metrics_df, style: str = "notebook"):
    """One bar group per metric, engines in ladder order, log scale; 95% sequence-bootstrap intervals as
    error bars where the run has them (`<metric>_ci_low/high`)."""
    engines = _order(metrics_df["engine"])
    table = metrics_df.pivot_table(index="engine", columns="metric", values="value", aggfunc="first")
    # a metric the run did not measure (exact KL without full-vocabulary logprobs) is left out, not drawn empty
    mets = [(k, lbl) for k, lbl in LADDER_METRICS if k in table.columns and np.isfinite(table[k].astype(float)).any()]

    def cell(e, k):
        return abs(table.loc[e, k]) if e in table.index and k in table.columns and np.isfinite(table.loc[e, k]) \
            else np.nan

    fig, ax = plt.subplots(figsize=figsize(style, 1.2))
    width = 0.8 / max(1, len(engines))
    for i, e in enumerate(engines):
        vals = np.maximum(np.asarray([cell(e, k) for k, _ in mets], float), FLOOR_VALUE)
        lo = np.maximum(np.asarray([cell(e, f"{k}_ci_low") for k, _ in mets], float), FLOOR_VALUE)
        hi = np.maximum(np.asarray([cell(e, f"{k}_ci_high") for k, _ in mets], float), FLOOR_VALUE)
        yerr = np.nan_to_num(np.vstack([vals - lo, hi - vals]).clip(min=0))
        ax.bar(np.arange(len(mets)) + (i - (len(engines) - 1) / 2) * width, vals, width, label=e,
               color=engine_color(e), yerr=yerr, capsize=2, error_kw={"lw": 0.8, "ecolor": "0.2"})
    ax.set_yscale("log")
    ax.set_ylim(FLOOR_VALUE / 2, None)
    ax.set_xticks(np.arange(len(mets)), [lbl for _, lbl in mets])
    ax.set_ylabel("engine vs trainer (log scale)")
    ax.set_title("Mismatch ablation ladder (error bars: 95% CI, sequences resampled)")
    ax.grid(axis="x", visible=False)
    ax.legend(ncols=min(5, len(engines)), loc="upper center", bbox_to_anchor=(0.5, -0.12), fontsize="small")
    fig.tight_layout()
    return fig


def reward_distributions(rewards_df, style: str = "notebook"):
    """Reward equivalence: per engine the mean reward with its 95% bootstrap interval (left) and the
    distribution over prompts of the per-prompt success rate (right, 8 rollouts per prompt)."""
    from rlwb.core import stats

    engines = _order(rewards_df["engine"])
    fig, (a, b) = plt.subplots(1, 2, figsize=figsize(style, 1.4))
    for i, e in enumerate(engines):
        r = rewards_df[rewards_df["engine"] == e]["reward"].to_numpy()
        lo, hi = stats.mean_ci(r)
        a.errorbar([i], [r.mean()], yerr=[[r.mean() - lo], [hi - r.mean()]], fmt="o", color=engine_color(e),
                   capsize=4, ms=6)
        rates = rewards_df[rewards_df["engine"] == e].groupby("prompt_index")["reward"].mean()
        parts = b.violinplot([rates.to_numpy()], positions=[i], widths=0.7, showmeans=True, showextrema=False)
        for body in parts["bodies"]:
            body.set_facecolor(engine_color(e))
            body.set_alpha(0.35)
        parts["cmeans"].set_color(engine_color(e))
    for ax in (a, b):
        ax.set_xticks(range(len(engines)), engines, rotation=20, ha="right")
        ax.set_xlim(-0.6, len(engines) - 0.4)
        ax.grid(axis="x", visible=False)
    a.set_ylabel("mean reward (95% CI)")
    a.set_title("Mean reward per engine")
    b.set_ylabel("success rate per prompt")
    b.set_ylim(-0.05, 1.05)
    b.set_title("Distribution over prompts")
    n = int(rewards_df.groupby("engine").size().iloc[0]) if len(rewards_df) else 0
    fig.suptitle(f"Reward equivalence: {n} rollouts per engine, same prompts and seeds")
    fig.tight_layout()
    return fig


def prob_scatter(rollouts_df, style: str = "notebook"):
    """p_engine vs p_trainer per engine, with Pearson r."""
    engines = _order(rollouts_df["engine"])
    n = len(engines)
    fig, axes = plt.subplots(1, n, figsize=figsize(style, 0.35 * n + 0.3, 0.8), sharex=True, sharey=True,
                             squeeze=False)
    for ax, e in zip(axes[0], engines):
        d = rollouts_df[rollouts_df["engine"] == e]
        pe, pt = np.exp(d["logp_engine"]), np.exp(d["logp_trainer"])
        r = np.corrcoef(pe, pt)[0, 1] if len(d) > 1 and pe.std() > 0 and pt.std() > 0 else np.nan
        ax.plot([0, 1], [0, 1], color="0.7", lw=0.8, zorder=0)
        ax.scatter(pt, pe, s=4, alpha=0.4, color=engine_color(e), linewidths=0, rasterized=True)
        rtxt = f"1 − r = {1 - r:.1e}" if np.isfinite(r) and r > 0.999 else f"r = {r:.4f}"
        ax.set_title(f"{e}\nPearson {rtxt}", fontsize="small")
        ax.set_xlabel("p trainer")
        ax.set_aspect("equal")
    axes[0][0].set_ylabel("p engine")
    fig.suptitle("Sampled-token probability: engine vs trainer")
    fig.tight_layout()
    return fig


def log_ratio_hist(rollouts_df, style: str = "notebook"):
    """Distribution of |log r| per engine on log-spaced bins (exact zeros drawn at the floor)."""
    engines = _order(rollouts_df["engine"])
    fig, ax = plt.subplots(figsize=figsize(style))
    bins = np.logspace(-9, 1, 61)
    for e in engines:
        d = rollouts_df[rollouts_df["engine"] == e]
        x = np.clip(np.abs(d["logp_trainer"] - d["logp_engine"]), FLOOR_VALUE * 1.01, 10)
        ax.hist(x, bins=bins, histtype="step", lw=1.5, color=engine_color(e), ls=engine_style(e), label=e,
                weights=np.full(len(x), 1 / max(1, len(x))))
    ax.set_xscale("log")
    ax.set_xlabel("|log r| = |logp trainer − logp engine| per token (exact 0 drawn at 1e-9)")
    ax.set_ylabel("fraction of tokens")
    ax.set_title("Per-token log-ratio distribution")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def mismatch_vs_position(rollouts_df, style: str = "notebook"):
    """Mean |log r| per position, one line per engine (log y)."""
    fig, ax = plt.subplots(figsize=figsize(style))
    for e in _order(rollouts_df["engine"]):
        d = rollouts_df[rollouts_df["engine"] == e]
        g = (d["logp_trainer"] - d["logp_engine"]).abs().groupby(d["position"]).mean()
        ax.plot(g.index, np.maximum(g.values, FLOOR_VALUE), color=engine_color(e), ls=engine_style(e), label=e,
                marker=".", ms=3)
    ax.set_yscale("log")
    ax.set_xlabel("position in the completion")
    ax.set_ylabel("mean |Δlogp|")
    ax.set_title("Mismatch vs position")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def mismatch_vs_prob(rollouts_df, style: str = "notebook"):
    """Mean |log r| per bin of the trainer's token probability (log y)."""
    edges = np.array([0, 0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0 + 1e-9])
    labels = ["<.01", ".01-.1", ".1-.3", ".3-.5", ".5-.7", ".7-.9", ".9-.99", ">.99"]
    fig, ax = plt.subplots(figsize=figsize(style))
    for e in _order(rollouts_df["engine"]):
        d = rollouts_df[rollouts_df["engine"] == e]
        b = np.digitize(np.exp(d["logp_trainer"]), edges) - 1
        g = (d["logp_trainer"] - d["logp_engine"]).abs().groupby(b).mean().reindex(range(len(labels)))
        ax.plot(range(len(labels)), np.maximum(g.values, FLOOR_VALUE), color=engine_color(e), ls=engine_style(e),
                label=e, marker="o", ms=3)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_yscale("log")
    ax.set_xlabel("trainer probability of the sampled token")
    ax.set_ylabel("mean |Δlogp|")
    ax.set_title("Mismatch vs token probability")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


MISMATCH_FIGURES = {"ablation_ladder": ("metrics", ablation_ladder), "prob_scatter": ("rollouts", prob_scatter),
                    "log_ratio_hist": ("rollouts", log_ratio_hist),
                    "mismatch_vs_position": ("rollouts", mismatch_vs_position),
                    "mismatch_vs_prob": ("rollouts", mismatch_vs_prob),
                    "reward_distributions": ("rewards", reward_distributions)}


# -- notebook 02: KL vs temperature -----------------------------------------------------------------
def _sweep_lines(ax, rows, metric: str, top_p: float = 1.0, top_k: int = 0, trainer: str = "renorm",
                 dashed: bool = False, label_suffix: str = ""):
    d = rows[(rows["metric"] == metric) & (rows["top_p"] == top_p) & (rows["top_k"] == top_k)
             & (rows["trainer"] == trainer)]
    ci = rows[(rows["top_p"] == top_p) & (rows["top_k"] == top_k) & (rows["trainer"] == trainer)]
    for e in _order(d["engine"]):
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
    for e in _order(d["engine"]):
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
    t = t.loc[_order(t.index)]
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


KL_FIGURES = {"kl_vs_temperature": ("sweep", kl_vs_temperature),
              "kl_vs_temperature_top_p": ("sweep", kl_vs_temperature_top_p),
              "analytic_scatter": ("tokens", analytic_scatter), "dlogp_heatmap": ("sweep", dlogp_heatmap)}


# -- notebook 03: toy GRPO ---------------------------------------------------------------------------
def t_quantile(n):
    """Two-sided 95% Student-t quantile for n samples (NaN for n < 2: no interval from one seed)."""
    from scipy import stats as st

    n = np.asarray(n, dtype=float)
    return np.where(n >= 2, st.t.ppf(0.975, np.maximum(n - 1, 1)), np.nan)


def _seed_band(d, column: str, smooth: int, log: bool = False):
    """Mean over seeds of each seed's `smooth`-step moving average, and its 95% Student-t band (NaN, no band,
    for one seed). `log`: of log10 values (a geometric mean, never below zero) for columns spanning decades."""
    per_seed = d.pivot_table(index="step", columns="seed", values=column, aggfunc="mean")
    per_seed = per_seed.rolling(smooth, center=True, min_periods=1).mean()
    if log:
        per_seed = np.log10(np.maximum(per_seed, FLOOR_VALUE))
    mean = per_seed.mean(axis=1)
    half = per_seed.sem(axis=1) * t_quantile(per_seed.count(axis=1))
    return mean, mean - half, mean + half


def _curve_panels(curves, column: str, ylabel: str, title: str, style: str, log: bool = False, smooth: int = 1,
                  bounds: tuple[float, float] | None = None):
    corrections = list(dict.fromkeys(curves["correction"]))
    fig, axes = plt.subplots(1, len(corrections), figsize=figsize(style, 0.55 * len(corrections) + 0.3),
                             sharey=True, squeeze=False)
    for ax, c in zip(axes[0], corrections):
        for e in _order(curves["engine"]):
            d = curves[(curves["engine"] == e) & (curves["correction"] == c)]
            if d.empty:
                continue
            mean, lo, hi = _seed_band(d, column, smooth, log)
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
    engines = _order(curves["engine"])
    means = curves.groupby("engine")[[p for p, _ in parts]].mean().loc[engines]
    fig, ax = plt.subplots(figsize=figsize(style, 0.8))
    left = np.zeros(len(engines))
    for (col, label), color in zip(parts, OKABE_ITO[1:]):
        ax.barh(engines, means[col], left=left, label=label, color=color)
        left += means[col].values
    for y, total in enumerate(left):
        ax.text(total, y, f" {total:.2f} s", va="center", fontsize="small")
    if "concurrent_runs" in curves:  # a run's wall time while others shared the cores reads longer: say so
        shared = curves.groupby("engine")["concurrent_runs"].max().loc[engines]
        ax.set_yticks(range(len(engines)), [e if k <= 1 else f"{e}\n({k} runs at a time)" for e, k in shared.items()])
    ax.set_xlim(0, 1.15 * left.max())  # room for the totals
    ax.set_xlabel("seconds per GRPO step (mean)")
    ax.set_title("Where a GRPO step's time goes")
    ax.grid(axis="y", visible=False)
    ax.legend(fontsize="small", ncols=4, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    fig.tight_layout()
    return fig


GRPO_FIGURES = {"reward_curves": ("curves", reward_curves), "clip_curves": ("curves", clip_curves),
                "mismatch_curves": ("curves", mismatch_curves), "time_breakdown": ("curves", time_breakdown)}


# -- notebook 07: which correction --------------------------------------------------------------------
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
            m, lo, hi = _seed_band(base, column, smooth)
            if bounds is not None:
                lo, hi = lo.clip(*bounds), hi.clip(*bounds)
            ax.plot(m.index, m.values, color="0.55", lw=2.2, label=f"baseline ({levels[0]}, none)", zorder=1)
            ax.fill_between(m.index, lo.values, hi.values, color="0.55", alpha=0.15, lw=0)
        for i, c in enumerate(corrections):
            d = curves[(curves["engine"] == lvl) & (curves["correction"] == c)]
            if d.empty or (lvl == levels[0] and c == "none" and baseline):
                continue
            m, lo, hi = _seed_band(d, column, smooth)
            if bounds is not None:
                lo, hi = lo.clip(*bounds), hi.clip(*bounds)
            ax.plot(m.index, m.values, color=correction_color(i), ls=CORRECTION_STYLES[i % 4], label=c, lw=1.3)
            ax.fill_between(m.index, lo.values, hi.values, color=correction_color(i), alpha=0.08, lw=0)
        ax.set_title(f"level: {lvl}")
        ax.set_xlabel("GRPO step")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    axes[0][0].set_ylabel(ylabel)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize="small", ncols=min(4, len(labels)), loc="lower center",
               bbox_to_anchor=(0.5, -0.02))
    avg = f", {smooth}-step moving average" if smooth > 1 else ""
    fig.suptitle(f"{title} (mean over seeds{avg}; band: 95% CI)")
    fig.tight_layout(rect=(0, 0.1 + 0.035 * ((len(labels) - 1) // 4), 1, 1))
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
                m, lo, hi = _seed_band(d, col, 1)
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
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize="small", ncols=min(4, len(labels)), loc="lower center",
               bbox_to_anchor=(0.5, -0.01))
    fig.suptitle("Correction health over training (mean over seeds; band: 95% CI)")
    fig.tight_layout(rect=(0, 0.07 + 0.025 * ((len(labels) - 1) // 4), 1, 1))
    return fig


def race_gaps(ranking, style: str = "notebook"):
    """Final reward minus the baseline's, paired by seed, with its 95% CI: one row per correction, one
    panel per mismatch level, best on top; the dashed line is the baseline (gap 0)."""
    levels = [lvl for lvl in dict.fromkeys(ranking["level"])
              if (ranking.loc[ranking["level"] == lvl, "verdict"] != "baseline").any()]
    n = max(len(ranking[ranking["level"] == lvl]) for lvl in levels) if levels else 1
    fig, axes = plt.subplots(1, max(1, len(levels)), figsize=figsize(style, 0.55 * len(levels) + 0.45,
                                                                    0.3 + 0.12 * n),
                             sharex=True, squeeze=False)
    verdict_color = {"recovers": "#009E73", "above baseline": "#0072B2", "falls short": "#D55E00",
                     "n/a": "0.5", "baseline": "0.5"}
    for ax, lvl in zip(axes[0], levels):
        d = ranking[ranking["level"] == lvl].sort_values("rank", ascending=False)
        y = np.arange(len(d))
        lo = (d["gap"] - d["gap_ci_low"]).clip(lower=0).fillna(0)
        hi = (d["gap_ci_high"] - d["gap"]).clip(lower=0).fillna(0)
        for k, (_, r) in enumerate(d.iterrows()):
            ax.errorbar(r["gap"], y[k], xerr=[[lo.iloc[k]], [hi.iloc[k]]], fmt="o", ms=5, capsize=3,
                        color=verdict_color.get(r["verdict"], "0.3"))
        ax.axvline(0, color="0.4", ls="--", lw=1)
        ax.set_yticks(y, d["correction"])
        ax.set_title(f"level: {lvl}")
        ax.set_xlabel("final reward − baseline")
        ax.grid(axis="y", visible=False)
    from matplotlib.lines import Line2D

    used = [v for v in ("recovers", "above baseline", "falls short", "n/a") if v in set(ranking["verdict"])]
    fig.legend([Line2D([], [], marker="o", ls="", color=verdict_color[v]) for v in used], used, fontsize="small",
               ncols=len(used), loc="lower center", bbox_to_anchor=(0.5, -0.02))
    fig.suptitle("What recovers the baseline (95% CI over seeds, paired by seed)")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


RACE_FIGURES = {"race_reward_curves": ("curves", race_reward_curves), "race_gaps": ("ranking", race_gaps),
                "race_health": ("curves", race_health), "time_breakdown": ("curves", time_breakdown)}


# -- notebook 06: engine knobs ------------------------------------------------------------------------
KNOB_HEAT = [("abs_dlogp_mean", "mean |Δlogp|"), ("abs_dlogp_max", "max |Δlogp|"), ("k3_mean", "k3 KL"),
             ("chi2_token", "χ² token"), ("ess_frac", "1 − ESS"), ("mult_prob_error", "mult. prob. error − 1")]


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
            if m == "ess_frac":
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
        x, y = t.loc[k, "throughput_ratio"], max(t.loc[k, "k3_mean"], FLOOR_VALUE)
        lo = max(t.loc[k].get("k3_mean_ci_low", np.nan), FLOOR_VALUE)
        hi = max(t.loc[k].get("k3_mean_ci_high", np.nan), FLOOR_VALUE)
        yerr = [[y - lo], [hi - y]] if np.isfinite(lo) and np.isfinite(hi) else None
        color = "0.2" if k == "baseline" else OKABE_ITO[1 + i % 7]
        ax.errorbar(x, y, yerr=yerr, fmt="o", ms=6, capsize=3, color=color)
        ax.annotate(k, (x, y), textcoords="offset points", xytext=(6, 4 if i % 2 else -10), fontsize=7.5)
    ax.set_yscale("log")
    ax.axvline(1.0, color="0.5", ls="--", lw=1)
    ax.set_xlabel("throughput relative to the baseline (×, same run)")
    ax.set_ylabel(f"k3 KL engine vs trainer (log; ≤ {FLOOR_VALUE:.0e} drawn at it)")
    ax.set_title("What each knob costs in mismatch, and what it buys in speed")
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


KNOB_FIGURES = {"knob_heatmap": ("metrics", knob_heatmap), "knob_price": ("metrics", knob_price),
                "router_agreement": ("routing", router_agreement)}


# -- notebook 04: determinism and staleness ---------------------------------------------------------
DETERMINISM_MEASURES = [("batch_invariant_frac", "batch-invariant fraction", False),
                        ("rerun_identical_frac", "rerun-identical fraction", False),
                        ("stale_cache_abs_dlogp_max", "max |Δlogp|, stale cache", True),
                        ("after_reset_abs_dlogp_max", "max |Δlogp|, after reset", True)]


def determinism_bars(summary, style: str = "notebook"):
    """The four measures per engine (fractions on a linear axis, |Δlogp| on a shared log axis), values printed."""
    engines = _order(summary["engine"])
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
        for e in _order(d["engine"]):
            g = d[d["engine"] == e]
            m = g.groupby(g["position"] - g["prompt_len"])["abs_dlogp"].mean()
            ax.plot(m.index, np.maximum(m.values, FLOOR_VALUE), color=engine_color(e), ls=ls, alpha=alpha,
                    marker=".", ms=3, label=f"{e}, {'stale cache' if case == 'stale' else 'after reset'}")
    prefix = int(stale_rows["prompt_len"].min()) if len(stale_rows) else 0
    ax.set_yscale("log")
    ax.set_xlabel(f"position in the completion (after a ≥{prefix}-token prompt sharing one cached prefix)")
    ax.set_ylabel("mean |Δlogp| vs trainer (new weights)")
    ax.set_title("In-flight weight update: stale prefix cache vs reset")
    ax.legend(fontsize="x-small", ncols=2)
    fig.tight_layout()
    return fig


DETERMINISM_FIGURES = {"determinism_bars": ("summary", determinism_bars),
                       "stale_vs_position": ("stale", stale_vs_position)}


def validate_cases(cases, style: str = "notebook", tolerance: float | None = None):
    """Validator: every drawn case's max |Δlogp| (one dot per case, grey = outside the tolerance), the
    distribution of KLΔ per case, and the pass rate with its 95% Wilson interval (error bars)."""
    from rlwb.core.stats import proportion_ci

    engines = _order(cases["engine"])
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
    engines = _order(t.index)
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
    engines = _order(rows["engine"])
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


STRESS_FIGURES = {"validate_cases": ("cases", validate_cases), "pressure_bars": ("summary", pressure_bars),
                  "longctx_vs_position": ("longctx", longctx_vs_position)}


# -- the index: trends across reruns ----------------------------------------------------------------
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
