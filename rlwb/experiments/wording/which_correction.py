"""Notebook 07's sentences: the baseline's final reward, how the race's verdicts are reached (Holm-corrected
equivalence and difference tests, the budget's MDE), per mismatch level the highest final reward and the verdict
groups (`race_verdict_line`), what `none` at a level means, the timing. Takes the metrics, the ranking table and plain
values (`setup`: `baseline`, `steps`, `num_seeds`, `old_logprobs`, `margin`, `engines`, `final_frac`,
`same_sampler` (engine -> whether it samples as the first engine), `timing_note`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rlwb.experiments.wording import floor_lines

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


def finding(rank: pd.DataFrame, levels: list[str], margin: float) -> str:
    """The paragraph the answer leads with: per mismatch level, the corrections shown to recover the baseline (within
    ±margin), those shown to fall short or to beat it (with their paired gaps), and how many rows are inconclusive;
    or that no row could be tested. The verdicts are the experiment's (the ranking's `verdict` column)."""
    ran = [e for e in levels if (rank["level"] == e).any()]
    if not ran:
        return "No mismatch level ran: only the baseline, so no correction was raced."
    if not rank["verdict"].isin(RACE_VERDICTS).any():
        return ("No correction could be tested against the baseline (one seed gives no interval): "
                + ", ".join(f"`{e}`" for e in ran) + " raced without a verdict.")
    any_rec = (rank["verdict"] == "recovers").any()
    parts = []
    for e in ran:
        d = rank[rank["level"] == e]
        said = []
        for v in ("recovers", "falls short", "above baseline"):
            g = d[d["verdict"] == v]
            if len(g):
                said.append(f"{v} " + ", ".join(f"`{r.correction}` ({r.gap:+.3f})" for r in g.itertuples()))
        n = int((d["verdict"] == "inconclusive").sum())
        if n:
            said.append(f"{n} inconclusive")
        if said:
            parts.append(f"`{e}`: " + ", ".join(said))
    lead = ("" if any_rec else
            f"No correction is shown to recover the baseline (within ±{margin:g}) at any mismatch level. ")
    return lead + "; ".join(parts) + "."


def conclusion(metrics: dict, rank: pd.DataFrame, setup: dict) -> str:
    s = setup
    base = s["baseline"]
    b = metrics[f"{base}/reward_final"]
    blo, bhi = metrics[f"{base}/reward_final_ci_low"], metrics[f"{base}/reward_final_ci_high"]
    ci = f" [95% CI {blo:.3f}, {bhi:.3f}]" if np.isfinite(blo) else ""
    tested = rank[rank["p_diff_holm"].notna()]
    lines = [finding(rank, s["engines"][1:], s["margin"]), "",
             f"**Baseline.** `{base}` (no mismatch) reaches a final reward of {b:.3f}{ci} "
             f"(mean over the last {s['final_frac']:.0%} of {s['steps']} steps, {s['num_seeds']} seeds; behaviour "
             f"logprobs from the {s['old_logprobs']})."]
    lines += [f"\n{w}" for w in floor_lines(metrics)]
    if len(tested):
        lines.append(f"\n**How verdicts are reached.** Each gap to the baseline is paired by seed and tested twice, "
                     f"Holm-corrected as one family over the race's {len(tested)} tested rows ({2 * len(tested)} "
                     f"p-values): *recovers* = shown inside ±{s['margin']:g} of the baseline (equivalence, TOST); "
                     f"*falls short* / *above baseline* = shown to differ from 0; *inconclusive* = neither. The "
                     f"smallest gap this budget detects (80% power at the corrected level) is "
                     f"{np.nanmin(tested['mde']):.3f} to {np.nanmax(tested['mde']):.3f} reward, and equivalence can "
                     f"only be shown where the per-seed gaps spread less than {np.nanmax(tested['equiv_sd_max']):.4f} "
                     f"(sd): with {s['num_seeds']} seeds most rows are inconclusive by design, not by evidence; more "
                     f"seeds or fewer corrections per race narrow it.")
    for e in s["engines"][1:]:
        d = rank[rank["level"] == e]
        if d.empty:
            continue
        k3 = metrics.get(f"{e}+none/mismatch_k3_mean", float(d["mismatch_k3"].mean()))
        best = d.iloc[0]
        lines.append(f"\n**`{e}`** (engine-trainer k3 {k3:.2g} per token under `none`): highest final reward "
                     f"`{best['correction']}` at {best['reward_final']:.3f} ({best['gap']:+.3f} vs baseline; the "
                     f"order within a level is descriptive, not a test).")
        verdicts = race_verdict_line(d)
        if verdicts:
            lines.append(verdicts)
        if s["old_logprobs"] == "trainer" and "none" in set(d["correction"]) and s["same_sampler"][e]:
            same = metrics.get(f"{e}+none/same_as_baseline") == 1.0
            lines.append(f"`none` here trains bitwise as the baseline by construction: `{e}` differs from "
                         f"`{s['engines'][0]}` only in the logprobs it reports, and with behaviour logprobs from the "
                         "trainer `none` never reads them; only a correction sees this level"
                         + (" (measured: the same final reward on every seed)." if same else
                            ". **Measured otherwise** (the final rewards differ): the pipeline is not doing what "
                            "this level assumes; look at the engine's sampling settings."))
        elif metrics.get(f"{e}+none/same_as_baseline") == 1.0:
            lines.append("Uncorrected, this level trains exactly as the baseline (the same final reward on every "
                         "seed).")
    if (rank["verdict"] == "n/a").any():
        lines.append("\nWith one seed no interval exists: every verdict is n/a (run with num_seeds ≥ 3).")
    lines.append(f"\n**Timing.** {s['timing_note']}")
    return "\n".join(lines)
