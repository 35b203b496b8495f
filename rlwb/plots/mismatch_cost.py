"""Figures of notebook 08_mismatch_cost (what mismatch costs a GRPO run, dose by dose).

One function per figure, and `FIGURES`: figure name -> (the data/<table>.parquet it is drawn from, the
function), the recipes `rlwb figures` rebuilds a run's figures from."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from rlwb.core.rl.mismatch_doses import dose_kinds
from rlwb.plots.style import FLOOR_VALUE, OKABE_ITO, figsize, seed_band

MARKERS = "osD^v<>"


def _arm_style(arms):
    return {a: (OKABE_ITO[i % len(OKABE_ITO)], MARKERS[i % len(MARKERS)]) for i, a in enumerate(arms)}


def kind_titles() -> dict[str, str]:
    """Each kind of dose's panel title, in the report's order (`mismatch_doses.DOSE_KINDS`)."""
    return {k.name: k.panel_title for k in dose_kinds()}


def point_name(label: str, base: str) -> str:
    """A point's label without the base preset it changes (`vllm-v1-fixed@bf16` -> `bf16`), temperature spelt out."""
    name = label[len(base) + 1:] if base and label.startswith(base + "@") else label
    engine, at, t = name.partition("@T")
    return f"{engine}, T {t}" if at else engine


def dose_response(doses, style: str = "notebook"):
    """Per kind of mismatch: the paired reward gap to the same arm's clean run (95% CI over seeds) against the
    measured engine-trainer k3 per token (log x), one line per arm, dose 0 drawn at the left edge (its gap is 0 by
    definition). Real engines (notebooks 01/06) are points on the panel of their kind (raw logprobs: ratio;
    otherwise distribution), labelled; a null control is drawn hollow. The first PPO regime at the study's horizon
    only (further regimes and long rows have their own tables)."""
    if "updates" in doses:  # one regime and one horizon per line
        doses = doses.assign(epochs=doses.get("epochs", 1))  # a regime is its mini-batches and its epochs
        doses = doses[(doses["updates"] == doses["updates"].iloc[0]) & (doses["epochs"] == doses["epochs"].iloc[0])
                      & ~doses["label"].str.endswith("+long")]
    titles = kind_titles()
    kinds = [k for k in titles if (doses["kind"] == k).any()]
    base = doses.loc[doses["kind"] == "clean", "engine"].iloc[0] if (doses["kind"] == "clean").any() else ""
    arms = list(dict.fromkeys(doses["arm"]))
    sty = _arm_style(arms)
    ncol = max(1, len(kinds))
    fig, axes = plt.subplots(1, ncol, figsize=figsize(style, 0.42 * ncol + 0.4, 1.15), sharey=True, squeeze=False)
    # dose 0 sits a decade left of the smallest dosed k3; anything below (the float floor) is drawn there too
    measured = doses[~doses["kind"].isin(["clean", "rerun", "placebo"]) & (doses["control"] == "")]["k3_achieved"]
    measured = measured[measured > FLOOR_VALUE]  # an engine point at the float floor sits at dose 0, not below it
    lo_x = measured.min() / 10 if len(measured) else 1e-6
    for ax, kind in zip(axes[0], kinds):
        for j, a in enumerate(arms):
            d = doses[(doses["kind"] == kind) & (doses["arm"] == a) & (doses["control"] == "")].sort_values("dose")
            if d.empty:
                continue
            x = np.r_[lo_x, d["k3_achieved"].clip(lower=lo_x).to_numpy()]
            y = np.r_[0.0, d["gap"].to_numpy()]
            lo = np.r_[0.0, (d["gap"] - d["gap_ci_low"]).clip(lower=0).fillna(0).to_numpy()]
            hi = np.r_[0.0, (d["gap_ci_high"] - d["gap"]).clip(lower=0).fillna(0).to_numpy()]
            x = x * (1.0 + 0.08 * (j - (len(arms) - 1) / 2))  # nudge arms apart so the intervals do not overlap
            color, marker = sty[a]
            ax.errorbar(x, y, yerr=[lo, hi], color=color, marker=marker, ms=4, capsize=3, lw=1.2, label=a)
        pts = doses[(doses["kind"] == "engine") & (doses["panel"] == kind)]
        for r in pts.itertuples():
            color, marker = sty[r.arm]
            x = max(r.k3_achieved, lo_x)
            ax.errorbar([x], [r.gap], yerr=[[max(r.gap - r.gap_ci_low, 0)], [max(r.gap_ci_high - r.gap, 0)]],
                        color=color, marker="*", ms=10, mfc="white" if r.control else color, capsize=3, lw=0,
                        elinewidth=1)
        # one name per engine point (every arm trained there shares it), left of the group's lowest whisker end;
        # the control, at dose 0, below right
        for (label, control), g in pts.groupby(["label", "control"], sort=False):
            x = max(g["k3_achieved"].min(), lo_x)
            low = g["gap_ci_low"].where(np.isfinite(g["gap_ci_low"]), g["gap"])
            below = g["gap"].min() if control else min(g["gap"].min(), low.min())
            ax.annotate(point_name(label, base) + (" (control)" if control else ""), (x, below),
                        textcoords="offset points", xytext=(8, -12) if control else (-6, 0),
                        va="top" if control else "center", ha="left" if control else "right", fontsize="x-small",
                        color="0.25",
                        bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.6})
        ax.axhline(0, color="0.4", ls="--", lw=1)
        ax.axvline(lo_x, color="0.8", lw=0.8, zorder=0)
        ax.set_xscale("log")
        ax.set_title(titles[kind], fontsize="medium")
    narrow = ncol < 3  # one or two panels: the long titles wrap
    fig.supxlabel("measured k3(engine ‖ trainer) per token" + ("\n" if narrow else " ")
                  + "(grey line: dose 0, the float floor; ★ real engines)", fontsize="medium")
    axes[0][0].set_ylabel("final reward − clean run (paired)")
    # every arm of the figure in the legend: an arm trained at some kinds only (row_arms) has no line in the last panel
    seen: dict = {}
    for ax in axes[0]:
        for h, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, h)
    order = [a for a in arms if a in seen]  # the study's arm order, whichever panel drew the arm first
    axes[0][-1].legend([seen[a] for a in order], order, fontsize="small", title="arm", title_fontsize="small")
    fig.suptitle("What mismatch costs a GRPO run" + ("\n" if narrow else " ") + "(95% CI over seeds, paired by seed)")
    fig.tight_layout()
    return fig


def reward_curves(curves, style: str = "notebook"):
    """Reward per step per arm: the clean run and the largest dose of each kind (mean over seeds, 95% band)."""
    arms = list(dict.fromkeys(curves["arm"]))
    sty = _arm_style(arms)
    base_t = curves.loc[curves["label"] == "clean", "temperature"]
    shown = ["clean"] + [curves.loc[curves["dose"] == curves.loc[curves["kind"] == k, "dose"].max(), "label"]
                         .loc[lambda s, k=k: s.str.startswith(k + "@") & ~s.str.contains("+", regex=False)].iloc[0]
                         for k in kind_titles() if (curves["kind"] == k).any()]
    fig, axes = plt.subplots(1, len(shown), figsize=figsize(style, 0.4 * len(shown) + 0.3), sharey=True,
                             squeeze=False)
    for ax, label in zip(axes[0], shown):
        for a in arms:
            d = curves[(curves["label"] == label) & (curves["arm"] == a)]
            if d.empty:
                continue
            mean, lo, hi = seed_band(d, "reward_mean", 5)
            color, _ = sty[a]
            ax.plot(mean.index, mean.values, color=color, label=a)
            ax.fill_between(mean.index, lo.clip(0, 1).values, hi.clip(0, 1).values, color=color, alpha=0.15, lw=0)
        t = f", T = {base_t.iloc[0]:g}" if len(base_t) else ""
        ax.set_title(f"clean (dose 0){t}" if label == "clean" else f"largest dose: {label}", fontsize="medium")
        ax.set_xlabel("GRPO step")
    axes[0][0].set_ylabel("mean reward")
    axes[0][0].legend(fontsize="small")
    fig.suptitle("Reward (5-step moving average per seed; line: mean over seeds; band: 95% CI over seeds)")
    fig.tight_layout()
    return fig


FIGURES = {"dose_response": ("doses", dose_response), "cost_reward_curves": ("curves", reward_curves)}


def geo_rs_survivors(curves, style: str = "notebook"):
    """Sequence-rejecting arms (Geo-RS): the sequences that survive into the loss per step (mean over seeds, 95%
    band) for the clean run (the whole batch at the float floor) and each dose; steps with none move Adam on
    momentum only. Empty
    axes with a note where no arm rejects sequences."""
    fig, ax = plt.subplots(figsize=figsize(style, 0.9))
    rej = curves[curves["arm"].str.contains("geo_rs")] if "kept_seqs" in curves else curves.iloc[:0]
    if rej.empty:
        ax.text(0.5, 0.5, "no sequence-rejecting arm in this run", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    labels = list(dict.fromkeys(rej["label"]))
    for i, (label, arm) in enumerate(dict.fromkeys(zip(rej["label"], rej["arm"]))):
        d = rej[(rej["label"] == label) & (rej["arm"] == arm)]
        mean, lo, hi = seed_band(d, "kept_seqs", 1)
        color = OKABE_ITO[labels.index(label) % len(OKABE_ITO)]
        ax.plot(mean.index, mean.values, color=color, marker=MARKERS[i % len(MARKERS)], ms=3,
                label=f"{label}, {arm}")
        ax.fill_between(mean.index, lo.clip(lower=0).values, hi.values, color=color, alpha=0.15, lw=0)
    ax.set_yscale("symlog", linthresh=1)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("sequences kept in the loss")
    ax.set_title(f"Geo-RS: sequences surviving into the loss per step\n(mean completion "
                 f"{rej['completion_tokens'].mean():.0f} tokens; 95% band over seeds)", fontsize="medium")
    ax.legend(fontsize="x-small")
    fig.tight_layout()
    return fig


FIGURES["geo_rs_survivors"] = ("curves", geo_rs_survivors)


def horizon_gaps(horizon, style: str = "notebook"):
    """The long-horizon rows (`comparisons.horizon_table`): per dosed row and arm, the training reward's gap to
    the long clean run per block of steps (mean over seeds at the block's middle, 95% t interval as error bars),
    and the step any collapse starts (gradient-norm spikes: dashed; entropy collapse: dotted), or a note that none
    was seen. Empty axes with a note where the run has no long rows."""
    fig, ax = plt.subplots(figsize=figsize(style, 0.9))
    ax.set_xlabel("GRPO step (middle of each block)")
    ax.set_ylabel("training-reward gap to the long clean run")
    ax.set_title("Long horizon: the gap per block of steps\n(95% t interval over seeds)", fontsize="medium")
    if horizon is None or len(horizon) == 0:
        ax.text(0.5, 0.5, "no long-horizon rows in this run\n(long_steps 0: the study's horizon only)", ha="center",
                va="center", transform=ax.transAxes)
        fig.tight_layout()
        return fig
    notes = []
    for i, ((label, arm), d) in enumerate(horizon.groupby(["label", "arm"], sort=False)):
        color = OKABE_ITO[i % len(OKABE_ITO)]
        mid = (d["block_start"] + d["block_end"]) / 2
        ax.errorbar(mid, d["gap"], yerr=[d["gap"] - d["ci_low"], d["ci_high"] - d["gap"]], color=color,
                    marker=MARKERS[i % len(MARKERS)], capsize=3, label=f"{label}, {arm}")
        for col, ls, what in (("grad_spike_step", "--", "grad-norm spikes"), ("entropy_collapse_step", ":",
                                                                              "entropy collapse")):
            step = d[col].iloc[0] if col in d else np.nan
            if np.isfinite(step):
                ax.axvline(step, color=color, ls=ls, lw=1, label=f"{what} from step {int(step)}")
            else:
                notes.append(f"{label}: no {what}")
    ax.axhline(0, color="0.5", lw=0.8)
    if notes:
        ax.text(0.01, 0.01, "; ".join(dict.fromkeys(notes)), transform=ax.transAxes, fontsize="x-small", va="bottom")
    ax.legend(fontsize="x-small")
    fig.tight_layout()
    return fig


FIGURES["horizon_gaps"] = ("horizon", horizon_gaps)
