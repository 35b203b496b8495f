"""Figures: one function per figure, used by the notebooks and by `rlwb figures` alike.

Why fixed colours: a reader comparing the mismatch, KL and GRPO figures should recognise `vllm-v1` by
colour everywhere. The palette is Okabe-Ito (colour-blind safe). Saved files are deterministic (no
dates or random ids in PDF/SVG metadata) so regenerating a run's figures reproduces them.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
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
    """Greedy accuracy of the default policy per operand size (max digits of a, b)."""
    import pandas as pd

    df = pd.DataFrame(samples)
    df["digits"] = df["prompt"].str.rstrip("=").str.split("+").map(lambda ab: max(len(x) for x in ab))
    acc = df.groupby("digits")["reward"].agg(["mean", "count"])
    fig, ax = plt.subplots(figsize=figsize(style, 0.7))
    ax.bar(acc.index.astype(str), acc["mean"], color=ENGINE_COLORS["hf"], alpha=0.8)
    for x, (m, c) in enumerate(zip(acc["mean"], acc["count"])):
        ax.text(x, m + 0.02, f"{m:.2f}\n(n={c})", ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, 1.15)
    ax.grid(axis="x", visible=False)
    ax.set_xlabel("digits in the larger operand")
    ax.set_ylabel("greedy accuracy")
    ax.set_title("Default policy: accuracy by problem size")
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
    """One bar group per metric, engines in ladder order, log scale."""
    engines = _order(metrics_df["engine"])
    mets = [(k, lbl) for k, lbl in LADDER_METRICS if k in set(metrics_df["metric"])]
    table = metrics_df.pivot_table(index="engine", columns="metric", values="value", aggfunc="first")
    fig, ax = plt.subplots(figsize=figsize(style, 1.2))
    width = 0.8 / max(1, len(engines))
    for i, e in enumerate(engines):
        vals = [abs(table.loc[e, k]) if e in table.index and np.isfinite(table.loc[e, k]) else np.nan for k, _ in mets]
        vals = np.maximum(np.asarray(vals, float), FLOOR_VALUE)
        ax.bar(np.arange(len(mets)) + (i - (len(engines) - 1) / 2) * width, vals, width, label=e,
               color=engine_color(e))
    ax.set_yscale("log")
    ax.set_ylim(FLOOR_VALUE / 2, None)
    ax.set_xticks(np.arange(len(mets)), [lbl for _, lbl in mets])
    ax.set_ylabel("engine vs trainer (log scale)")
    ax.set_title("Mismatch ablation ladder")
    ax.grid(axis="x", visible=False)
    ax.legend(ncols=min(5, len(engines)), loc="upper center", bbox_to_anchor=(0.5, -0.12), fontsize="small")
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


def mismatch_vs_position(rollouts_df, style: str = "notebook", position_col: str = "position",
                         xlabel: str = "position in the completion"):
    """Mean |log r| per position, one line per engine (log y)."""
    fig, ax = plt.subplots(figsize=figsize(style))
    for e in _order(rollouts_df["engine"]):
        d = rollouts_df[rollouts_df["engine"] == e]
        g = (d["logp_trainer"] - d["logp_engine"]).abs().groupby(d[position_col]).mean()
        ax.plot(g.index, np.maximum(g.values, FLOOR_VALUE), color=engine_color(e), ls=engine_style(e), label=e,
                marker=".", ms=3)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
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
                    "mismatch_vs_prob": ("rollouts", mismatch_vs_prob)}
