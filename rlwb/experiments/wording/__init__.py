"""How rlwb words what it found, in one place: the phrases the notebooks' conclusions and one-line answers share.

Experiments compute; the sentences that state a verdict (an interval, a warning, a paired gap, the one-line answer
cut from a conclusion) are written here, so that every notebook says the same thing the same way. Imports nothing
of rlwb above the leaf utilities.
"""

from __future__ import annotations

import numpy as np

from rlwb.formatting import KL_FLOOR, metric


def one_line(markdown: str, limit: int = 320, leads: tuple[str, ...] = ()) -> str:
    """The conclusion's finding as plain text of at most `limit` characters (cut at a word): the first paragraph that
    starts with one of `leads` (a notebook's finding, tried in the order given; Markdown emphasis ignored), else the
    first paragraph that does not describe the setup. Why `leads`: a conclusion states its setup and per-arm detail
    before its verdict (01: each engine before the ladder's floor; 03: skipped arms before the paired gaps), and the
    index's answer column must open with the verdict."""
    import re

    paras = [p.strip() for p in re.split(r"\n\s*\n|\n(?=[-*] )", markdown or "") if p.strip()]
    plain = [re.sub(r"\*\*|__", "", p) for p in paras]
    para = next((p for lead in leads for p, t in zip(paras, plain) if t.startswith(lead)), None)
    if para is None:
        para = next((p for p in paras if not re.match(r"\*\*(Setup|How)\b", p)), paras[0] if paras else "")
    text = re.sub(r"\*\*|__|`|^[-*#>]+\s*", "", para, flags=re.M)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " …"


def ci_text(metrics: dict, group: str, name: str, fmt: str = ".1e") -> str:
    """`[low, high]` of `group/name`'s 95% interval (bounds at the float floor read as such), or "" when the
    metrics have none."""
    lo, hi = metrics.get(f"{group}/{name}_ci_low"), metrics.get(f"{group}/{name}_ci_high")
    if lo is None or hi is None or not (np.isfinite(lo) and np.isfinite(hi)):
        return ""
    return f"[{metric(name, lo, fmt)}, {metric(name, hi, fmt)}]"


def floor_lines(metrics: dict) -> list[str]:
    """The report's warning for every `floor_breach_k3` in `metrics`."""
    return [f"**Warning:** `{k.rsplit('/', 1)[0]}` runs fp32 weights and reports processed logprobs, so it should sit "
            f"at the float floor against the fp32 trainer, yet measured per-step k3 up to {v:.1e} (> {KL_FLOOR:g}) in "
            f"this run: its engine did not reproduce its float floor here, and these runs measure other numerics than "
            f"its name says." for k, v in metrics.items() if k.endswith("/floor_breach_k3")]


def paired_gap_text(r) -> str:
    """A row's paired gap to its clean twin with its 95% interval, then the same for the trained policy's own greedy
    accuracy (notebook 08's dose and point rows)."""
    return (f"{r.gap:+.3f} [{r.gap_ci_low:+.3f}, {r.gap_ci_high:+.3f}], own greedy accuracy "
            f"{r.heldout_gap:+.3f} [{r.heldout_gap_ci_low:+.3f}, {r.heldout_gap_ci_high:+.3f}]")


def dose_answer_lines(metrics: dict, table, dosed, arms) -> list[str]:
    """One bullet per (dosed kind, arm) of notebook 08: the doses at which a cost is shown (each row's own test, Holm
    in the study's family), or the null with its MDE. Which k3 is tolerable is the benchmark dose's answer (its BMDL),
    not the first dose that showed a cost (a NOAEL-style threshold depends on which doses were tried)."""
    out = []
    for kind in dosed:
        d = table[table["kind"] == kind]
        for arm in arms:
            a = d[(d["arm"] == arm) & (d["control"] == "")].sort_values("dose")
            if a.empty:
                continue
            top = a.iloc[-1]
            costs = a[a["verdict"] == "costs"]
            if len(costs):
                at = ", ".join(f"k3 {metric('k3', r.k3_achieved, '.1e')} ({r.gap:+.3f})" for r in costs.itertuples())
                out.append(f"- {kind} mismatch, `{arm}`: a cost shown at {at} of {len(a)} dose(s) tested (largest "
                           f"dose: {paired_gap_text(top)}).")
            else:
                out.append(f"- {kind} mismatch, `{arm}`: no dose up to k3 {metric('k3', top.k3_achieved, '.1e')} "
                           f"measurably cost reward (largest dose: {paired_gap_text(top)}; MDE {top.mde:.3f}): a cost "
                           f"below the MDE is not ruled out.")
    return out


def engine_point_lines(table) -> list[str]:
    """One bullet per real engine point of notebook 08 (not the controls): its measured k3 and its cost per arm."""
    out = []
    pts = table[(table["kind"] == "engine") & (table["control"] == "")]
    for label, d in pts.groupby("label", sort=False):
        arms = "; ".join(f"`{r.arm}` {paired_gap_text(r)} ({r.verdict})" for r in d.itertuples())
        out.append(f"- `{label}` (k3 {metric('k3', d['k3_achieved'].mean(), '.1e')}, "
                   f"{'raw' if d['raw_logprobs'].iloc[0] else 'processed'} logprobs): {arms}.")
    return out


def dose_control_lines(metrics: dict, table, arms) -> list[str]:
    """Notebook 08's controls, each with whether it passes and what a failure means."""
    ctl = []
    for a in arms:
        if f"clean/{a}/reward_gain" not in metrics:
            continue
        g, lo = metrics[f"clean/{a}/reward_gain"], metrics[f"clean/{a}/reward_gain_ci_low"]
        ok = np.isfinite(lo) and lo > 0
        ctl.append(f"clean `{a}` learns: reward {g:+.3f} [{lo:+.3f}, {metrics[f'clean/{a}/reward_gain_ci_high']:+.3f}] "
                   + ("(passes)" if ok else "(**fails**: with no gain to lose, a cost cannot be measured here)"))
    blind = table[table["control"] == "ratio-blind"]
    if len(blind):
        ok = bool((blind["verdict"] == "null (passes)").all())
        ctl.append("`none@trainer` under ratio mismatch trains bitwise as its clean run at every dose (every seed's "
                   "reward curve equal, KL to its clean twin 0) "
                   + ("(passes: the reported logprobs never reach its update)" if ok else
                      "(**fails**: the reported logprobs reached an update that should not read them; the design "
                      "or the loop is wrong)"))
    t1 = table[table["control"] == "T=1"]
    for r in t1.itertuples():
        ok = r.verdict == "null (passes)"
        ctl.append(f"`{r.label}` `{r.arm}` at T = 1, where raw logprobs are the processed ones (k3 "
                   f"{metric('k3', r.k3_achieved, '.1e')}): gap {paired_gap_text(r)}, MDE {r.mde:.3f} "
                   + ("(passes: no cost shown)" if ok else "(**fails**: a cost with no ratio mismatch means the "
                                                           "design is wrong)"))
    if "control/rerun/identical" in metrics:
        ok = metrics["control/rerun/identical"] == 1.0
        ctl.append("the first clean run, trained twice, gives bitwise the same reward curve "
                   + ("(passes: pairing by seed compares like with like)" if ok else
                      "(**fails**: the engine or the loop does not reproduce a run, so seed pairing leaves noise "
                      "in every gap; the intervals still hold, the power is lower)"))
    return ctl


RACE_VERDICTS = ("recovers", "falls short", "above baseline", "inconclusive")


def race_verdict_line(level) -> str:
    """Notebook 07's rows of one level grouped by verdict (`recovers: ...; falls short: ...`), each correction with
    its paired gap, interval and MDE (and, where it falls short, what it removes); "" when no row has a verdict."""
    parts = []
    for v in RACE_VERDICTS:
        g = level[level["verdict"] == v]
        if len(g):
            parts.append(f"{v}: " + ", ".join(
                f"`{r.correction}` ({r.gap:+.3f} [{r.gap_ci_low:+.3f}, {r.gap_ci_high:+.3f}], MDE {r.mde:.3f}"
                + (f"; removes {r.masked_frac:.0%} of tokens, ESS {r.ess:.2f}" if v == "falls short" else "")
                + ")" for r in g.itertuples()))
    return "; ".join(parts) + "." if parts else ""
