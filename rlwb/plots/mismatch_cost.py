"""Figures of notebook 08_mismatch_cost (what mismatch costs a GRPO run, dose by dose).

One function per figure, and `FIGURES`: figure name -> (the data/<table>.parquet it is drawn from, the
function), the recipes `rlwb figures` rebuilds a run's figures from."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from rlwb.core.rl.mismatch_doses import dose_kinds
from rlwb.plots.style import FLOOR_VALUE, OKABE_ITO, figsize, seed_band

MARKERS = "osD^v<>"
LONG = "+long"  # a long-horizon row's name suffix (`mismatch_study.design.LONG`: plots import no experiment)


ARM_ORDER = ("none@engine", "none@trainer", "tis@trainer")  # the studies' arms: bypass, decoupled, decoupled + TIS


def _arm_style(arms):
    """Each arm's colour and marker. The studies' three arms (`ARM_ORDER`) keep theirs in every figure, whichever arms
    a figure shows (a reader sets the figures of several runs side by side: a run that trains decoupled and TIS alone
    must not draw decoupled in bypass's colour); any other arm (a long-horizon series, another correction) takes the
    first slot no arm of the figure holds, in the order given, so a figure whose arms come in `ARM_ORDER`'s order draws
    as it always did."""
    slot = {a: ARM_ORDER.index(a) for a in arms if a in ARM_ORDER}
    free = (i for i in range(len(arms) + len(ARM_ORDER)) if i not in slot.values())
    slot.update({a: next(free) for a in arms if a not in slot})
    return {a: (OKABE_ITO[i % len(OKABE_ITO)], MARKERS[i % len(MARKERS)]) for a, i in slot.items()}


def kind_titles() -> dict[str, str]:
    """Each kind of dose's panel title, in the report's order (`mismatch_doses.DOSE_KINDS`)."""
    return {k.name: k.panel_title for k in dose_kinds()}


def point_name(label: str, base: str) -> str:
    """A point's label without the base preset it changes (`vllm-v1-fixed@bf16` -> `bf16`), temperature spelt out."""
    name = label[len(base) + 1:] if base and label.startswith(base + "@") else label
    engine, at, t = name.partition("@T")
    return f"{engine}, T {t}" if at else engine


def dose_response(fits, style: str = "notebook"):
    """Per kind of dose, the benchmark-dose fit of each arm (`benchmarks.benchmark_table`'s `fits`): the tested
    outcome as the share of the arm's clean gain it keeps (1: its clean runs' mean, 0: the untrained policy), so
    one BMR line serves every arm; each dose group's mean with its 95% interval over seeds against the k3 the dose
    gives the initial policy (log x); the model-average curve with its pointwise 95% bootstrap band over the tested
    doses only; dose 0 drawn apart in its own narrow axis, not joined across the untested decades below the
    smallest dose; the BMD (diamond) with its BMDL-BMDU bar on the BMR line where the row is bounded; real engines
    as stars (their paired gap to their own clean run, a control hollow). The first PPO regime only; a row of the
    long horizon (`+long`) is a series of its own beside its arm's at the study's horizon, on the same axis (its
    share is of its own long clean twins' gain, its BMR the same fraction)."""
    if "name" in fits and len(fits):
        fits = fits[~fits["name"].astype(str).str.contains("+ppo", regex=False)]
        arm = fits["arm"].astype(str)
        fits = fits.assign(arm=np.where(fits["name"].astype(str).str.endswith(LONG), arm + ", long horizon", arm))
    titles = kind_titles()
    kinds = [k for k in titles if (fits["kind"] == k).any()] if len(fits) else []
    arms = list(dict.fromkeys(fits["arm"])) if len(fits) else []
    sty = _arm_style(arms)
    nrow = max(1, len(kinds))
    fig, axes = plt.subplots(nrow, 1, figsize=figsize(style, 1.0, 0.55 * nrow + 0.3), squeeze=False)
    if not kinds:
        axes[0][0].text(0.5, 0.5, "no dose row with a benchmark fit", ha="center", va="center",
                        transform=axes[0][0].transAxes)
        axes[0][0].set_axis_off()
        return fig
    bmr_level = None
    for ax, kind in zip(axes[:, 0], kinds):
        k = fits[fits["kind"] == kind]
        shown = k.loc[k["dose"] > FLOOR_VALUE, "dose"]
        lo_d, hi_d = float(shown.min()), float(shown.max())
        decades = max(float(np.log10(hi_d / lo_d)), 0.5)
        # dose 0 drawn apart, a gap of a third of the tested decades left of the smallest dose shown: its own tick
        # "0", a break mark between, nothing joined across (the curve starts at the smallest tested dose)
        x_zero = lo_d / 10 ** max(0.5, decades / 3)
        named: set = set()
        for j, arm in enumerate(arms):
            d = k[k["arm"] == arm]
            if d.empty:
                continue
            base, gain = float(d["baseline"].iloc[0]), float(d["gain"].iloc[0])
            if not (np.isfinite(gain) and gain > 0):
                continue
            color, marker = sty[arm]

            def share(v):
                return (np.asarray(v, dtype=float) - base) / gain

            # arms apart, so the intervals do not overlap: a step of 1.2% of the panel's decades
            nudge = 10 ** (0.012 * decades * (j - (len(arms) - 1) / 2))
            g = d[d["part"] == "group"].sort_values("dose")
            x = np.where(g["dose"] > 0, g["dose"], x_zero) * nudge
            ax.errorbar(x, share(g["y"]), yerr=[share(g["y"]) - share(g["low"]), share(g["high"]) - share(g["y"])],
                        color=color, marker=marker, ms=4, capsize=2, lw=0, elinewidth=1, label=arm)
            c = d[(d["part"] == "fit") & (d["dose"] > 0)].sort_values("dose")
            if len(c):
                ax.plot(c["dose"], share(c["y"]), color=color, lw=1.2)
                ax.fill_between(c["dose"], share(c["low"]), share(c["high"]), color=color, alpha=0.12, lw=0)
            m = d[d["part"] == "mark"]
            if len(m):
                mk = m.iloc[0]
                bmr_level = float(share(mk["y"]))
                if mk["status"] == "bounded" and np.isfinite(mk["dose"]):
                    ax.plot([mk["low"], min(mk["high"], hi_d)], [bmr_level] * 2, color=color, lw=3, alpha=0.5,
                            solid_capstyle="butt")
                    ax.plot([mk["dose"]], [bmr_level], marker="D", ms=6, color=color, mec="0.2")
            for r in d[d["part"] == "engine"].itertuples():
                y = float(share(r.y))
                # an engine at the float floor (k3 ~1e-13: the T = 1 control) sits at dose 0, not decades left
                xe = (r.dose if r.dose > FLOOR_VALUE else x_zero) * nudge
                ax.errorbar([xe], [y], yerr=[[y - float(share(r.low))], [float(share(r.high)) - y]], color=color,
                            marker="*", ms=10, mfc="white" if r.control else color, capsize=2, lw=0, elinewidth=1)
                if r.label not in named:  # one name per engine, whichever arm trained there
                    named.add(r.label)
                    ax.annotate(str(r.label) + (" (control)" if r.control else ""), (xe, y),
                                textcoords="offset points", xytext=(6, 6), fontsize="x-small", color="0.25")
        ax.axhline(1.0, color="0.6", lw=0.8, ls=":")
        ax.axhline(0.0, color="0.6", lw=0.8, ls=":")
        if bmr_level is not None:
            ax.axhline(bmr_level, color="0.3", lw=1, ls="--")
        ax.set_xscale("log")
        ax.set_xlim(x_zero / 10 ** (0.08 * decades + 0.1), hi_d * 10 ** (0.08 * decades + 0.1))
        x_break = np.sqrt(x_zero * lo_d)
        ax.axvline(x_break, color="0.85", lw=6, zorder=0)  # the untested decades between dose 0 and the doses
        ticks = [t for t in ax.get_xticks() if lo_d / 1.5 <= t <= hi_d * 1.5]
        labels = [f"$10^{{{int(round(np.log10(t)))}}}$" for t in ticks]
        if not ticks:  # the doses span no decade mark (one dose, or a few within a decade): label the doses
            ticks = [lo_d, hi_d] if hi_d / lo_d >= 2 else [lo_d]  # two labels closer than 2x would overlap
            labels = [f"{t:.1e}" for t in ticks]
        ax.set_xticks([x_zero, *ticks], ["0", *labels])
        ax.minorticks_off()
        ax.set_title(titles[kind].replace("\n", " "), fontsize="medium", loc="left")
        ax.set_ylabel("share of clean gain kept")
    ax = axes[-1][0]
    ax.set_xlabel("k3(engine ‖ trainer) per token the dose gives the initial policy (dose 0 left of the grey band)")
    seen: dict = {}
    for a in axes[:, 0]:
        for h, label in zip(*a.get_legend_handles_labels()):
            seen.setdefault(label, h)
    order = [a for a in arms if a in seen]
    handles = [seen[a] for a in order]
    if bmr_level is not None:
        handles.append(plt.Line2D([], [], color="0.3", lw=1, ls="--"))
        order.append(f"BMR: {1 - bmr_level:.0%} of the clean gain lost")
    # under the last panel's x label, part of its axes (so the layout leaves room for it)
    ax.legend(handles, order, fontsize="x-small", loc="upper center", ncol=3, frameon=False,
              bbox_to_anchor=(0.5, -0.3))
    fig.suptitle("What mismatch costs a GRPO run: the trained policy's reward (no dose in between) as the share of "
                 "its arm's clean gain kept; benchmark-dose fits with 95% bands, ◆ BMD with BMDL–BMDU, ★ real "
                 "engines", fontsize="medium")
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


FIGURES = {"dose_response": ("dose_fits", dose_response), "cost_reward_curves": ("curves", reward_curves)}


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
    missing: dict[str, list[str]] = {}  # what was not seen -> the rows it was not seen in
    rows = list(dict.fromkeys(horizon["label"]))
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
            elif label not in missing.setdefault(what, []):
                missing[what].append(label)
    ax.axhline(0, color="0.5", lw=0.8)
    ax.legend(fontsize="x-small", loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    # what no row showed, said once per kind under the axes (a note per row ran off the figure's edge)
    notes = [f"no {what} in any row" if set(labs) == set(rows) else f"no {what}: {', '.join(labs)}"
             for what, labs in missing.items()]
    if notes:
        import textwrap

        text = textwrap.fill("; ".join(notes) + ".", 110)
        fig.text(0.01, 0.01, text, fontsize="x-small", va="bottom", ha="left")
        fig.tight_layout(rect=(0, 0.035 * (text.count("\n") + 2), 1, 1))
    else:
        fig.tight_layout()
    return fig


FIGURES["horizon_gaps"] = ("horizon", horizon_gaps)
