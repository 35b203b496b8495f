"""How notebook 08 (`rlwb.experiments.mismatch_cost`) words its verdicts (issue 46): benchmark doses, placebo rows,
PPO regimes, the tested contrasts and the long horizon. Takes plain values and tables; imports nothing of rlwb above
the leaf utilities."""

from __future__ import annotations

import numpy as np

from rlwb.formatting import metric

# The benchmark's statuses, as `rlwb.core.measure.dose_response` names them (this layer imports no core module:
# tests/test_mismatch_cost.py checks the two agree).
BMD_BOUNDED, BMD_BELOW, BMD_NOT_BOUNDED = "bounded", "below the tested range", "not bounded"


def benchmark_line(r, bmr_fraction: float) -> str:
    """One bullet for a (kind, PPO regime, arm) benchmark row of notebook 08 (`mismatch_cost.benchmark_table`):
    "keep k3 below X" where the data bound X (the BMDL inside the tested doses), "the data cannot bound X" where
    they do not, with the trend across doses beside it (slope of the paired gap per decade of k3, 95% interval,
    Holm-adjusted p in the study's one family)."""
    head = f"- {r.name}, `{r.arm}`: "
    trend = (f"trend {r.trend_slope:+.3f} per decade of k3 [{r.trend_ci_low:+.3f}, {r.trend_ci_high:+.3f}], "
             f"Holm p {r.trend_p_holm:.2g}" if np.isfinite(r.trend_slope) else "no trend test (fewer than 2 doses "
                                                                             "or seeds)")
    if r.status == BMD_BOUNDED:
        bmd = (f"the fitted cost reaches it at k3 {metric('k3', r.bmd, '.1e')}" if np.isfinite(r.bmd) else
               "the fitted mean cost stays below it over the tested doses")
        return (head + f"**keep k3 below {metric('k3', r.bmdl, '.1e')}** (BMDL: lower 95% bound of the k3 at which "
                f"the cost reaches {r.bmr:.3f} reward, {bmr_fraction:.0%} of the clean run's gain; {bmd}); {trend}.")
    if r.status == BMD_BELOW:
        return (head + f"the data cannot bound the tolerable k3 from below: the cost's upper 95% limit reaches "
                f"{r.bmr:.3f} ({bmr_fraction:.0%} of the clean gain) already at the smallest tested k3 "
                f"{metric('k3', r.k3_min, '.1e')}, so keep k3 below that at least (smaller doses were not tested); "
                f"{trend}.")
    if r.status == BMD_NOT_BOUNDED:
        return (head + f"the data cannot bound the tolerable k3: up to the largest tested k3 "
                f"{metric('k3', r.k3_max, '.1e')} the cost stays below {r.bmr:.3f} ({bmr_fraction:.0%} of the clean "
                f"gain) at the upper 95% limit; where it would reach it lies beyond the tested doses; {trend}.")
    why = ("the clean run gained nothing to lose" if not (np.isfinite(r.clean_gain) and r.clean_gain > 0) else
           f"{r.doses} dose: no curve to fit" if r.doses < 2 else f"{r.seeds} seed(s): no interval" if r.seeds < 2
           else r.status)
    return head + f"no benchmark dose ({why}); {trend}."


def placebo_line(metrics: dict) -> str:
    """Notebook 08's placebo rows (the clean run again on an independent sampling-seed stream, same prompts, inside
    the Holm family): how often the tests call a cost or gain where there is none; "" without placebo rows."""
    if "placebo/rows" not in metrics:
        return ""
    n = int(metrics["placebo/rows"])
    fp, fph = metrics["placebo/false_positive_rate"], metrics["placebo/false_positive_rate_holm"]
    ok = fph == 0
    return (f"**Placebo** ({n} row{'s' if n != 1 else ''}: the clean run trained again with an independent stream of "
            f"sampling seeds on the same prompts, tested in the Holm family like every dose): false-positive rate "
            f"{fp:.0%} at the unadjusted 5% level, {fph:.0%} after Holm "
            + ("(passes: the family calls no cost where there is none)." if ok else
               "(**fails**: a placebo was called a cost or a gain; sampling noise between runs exceeds what the t "
               "intervals assume, and every verdict of this family is suspect)."))


def regime_line(table, first: int) -> str:
    """Notebook 08's further PPO regimes (several policy updates per rollout batch) in one sentence: which regimes
    ran and, per regime, the rows whose verdict is a cost; "" with one regime."""
    further = sorted({int(u) for u in table["updates"]} - {first})
    if not further:
        return ""
    parts = []
    for u in further:
        rows = table[(table["updates"] == u) & (table["kind"] != "clean") & (table["control"] == "")]
        costs = [f"{r.label} `{r.arm}` {r.gap:+.3f} [{r.gap_ci_low:+.3f}, {r.gap_ci_high:+.3f}]"
                 for r in rows.itertuples() if r.verdict == "costs"]
        parts.append(f"{u} updates per batch ({len(rows)} dosed rows, in the same Holm family): "
                     + ("costs shown at " + "; ".join(costs) if costs else "no cost shown at any dose"))
    return (f"**PPO regimes.** Besides {first} update(s) per rollout batch, " + "; ".join(parts)
            + ". With several updates the decoupled ratio leaves 1 (logged as `ratio_abs_log_mean`), so the clip acts "
              "in both modes.")


def contrast_lines(con) -> list[str]:
    """One bullet per paired contrast of notebook 08 (`mismatch_cost.contrast_table`): a difference shown with its
    interval, or a null as a null with its interval and MDE (never "the same")."""
    out = []
    for r in con.itertuples():
        ci = f"{r.diff:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}]"
        if r.verdict == "differs":
            side = "better" if r.diff > 0 else "worse"
            out.append(f"- {r.what}: {side} by {ci} (Holm p {r.p_holm:.2g}).")
        else:
            out.append(f"- {r.what}: no difference shown, {ci}; MDE {r.mde:.3f} (a difference below it is not "
                       f"ruled out).")
    return out


def horizon_lines(hz, metrics: dict) -> list[str]:
    """One bullet per long-horizon row of notebook 08 (`mismatch_cost.horizon_table`): its gap per block of steps
    with intervals, whether the gap grows, shrinks or shows no change (last block minus first, unadjusted paired t
    at 5%), and the step a collapse starts where one was seen."""
    out = []
    for (label, arm), d in hz.groupby(["label", "arm"], sort=False):
        blocks = "; ".join(f"steps {r.block_start}-{r.block_end} {r.gap:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}]"
                           for r in d.itertuples())
        ch = metrics.get(f"{label}/{arm}/gap_change", np.nan)
        # Holm-adjusted in the study's family where it was (notebook 08's `one_family`), else unadjusted
        pv = metrics.get(f"{label}/{arm}/gap_change_p_holm", metrics.get(f"{label}/{arm}/gap_change_p", np.nan))
        verdict = ("no change shown" if not (np.isfinite(pv) and pv < 0.05) else
                   "the cost grows" if ch < 0 else "the gap closes")
        events = [f"{what} from step {int(metrics[k])}" for what, k in
                  (("gradient-norm spikes", f"{label}/{arm}/grad_spike_step"),
                   ("entropy collapse", f"{label}/{arm}/entropy_collapse_step"))
                  if np.isfinite(metrics.get(k, np.nan))]
        which = "Holm p" if f"{label}/{arm}/gap_change_p_holm" in metrics else "p"
        out.append(f"- {label} `{arm}`: {blocks}; {verdict} (change {ch:+.3f}, {which} {pv:.2g})"
                   + (f"; {', '.join(events)}" if events else "; no collapse seen") + ".")
    return out
