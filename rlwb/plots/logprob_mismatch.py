"""Figures of notebook 01_logprob_mismatch (engine vs trainer logprobs, the V0 -> V1 -> V1-fixed ladder).

One function per figure, and `FIGURES`: figure name -> (the data/<table>.parquet it is drawn from, the
function), the recipes `rlwb figures` rebuilds a run's figures from."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from rlwb.plots.style import FLOOR_VALUE, engine_color, engine_order, engine_style, figsize

LADDER_METRICS = [("abs_dlogp_mean", "mean |Δlogp|"), ("abs_dlogp_max", "max |Δlogp|"),
                  ("k3_mean", "k3 KL"), ("full_kl_mean", "exact KL"), ("chi2_token", "|χ²|")]


def ablation_ladder(metrics_df, style: str = "notebook"):
    """One bar group per metric, engines in ladder order, log scale; 95% sequence-bootstrap intervals as
    error bars where the run has them (`<metric>_ci_low/high`)."""
    engines = engine_order(metrics_df["engine"])
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
    from rlwb.core.measure import stats

    engines = engine_order(rewards_df["engine"])
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
    engines = engine_order(rollouts_df["engine"])
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
    engines = engine_order(rollouts_df["engine"])
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
    for e in engine_order(rollouts_df["engine"]):
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
    for e in engine_order(rollouts_df["engine"]):
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


FIGURES = {"ablation_ladder": ("metrics", ablation_ladder), "prob_scatter": ("rollouts", prob_scatter),
                    "log_ratio_hist": ("rollouts", log_ratio_hist),
                    "mismatch_vs_position": ("rollouts", mismatch_vs_position),
                    "mismatch_vs_prob": ("rollouts", mismatch_vs_prob),
                    "reward_distributions": ("rewards", reward_distributions)}


