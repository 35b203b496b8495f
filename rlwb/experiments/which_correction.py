"""Notebook 07's experiment: which off-policy correction recovers the no-mismatch baseline, per mismatch level.

A mismatch level is an engine preset that differs from the baseline (`vllm-v1-fixed`, fp32: engine and
trainer agree to the float floor) in one controlled knob: V1's raw logprobs, a bf16 engine, ... Every peer's
correction (`rlwb.core.correction_catalog`) trains the same policy from the same weights on each level,
with the same seeds, in the *decoupled* mode the peers define their IS corrections in (the trainer
recomputes the behaviour logprobs; the correction weighs trainer vs engine). The answer is a ranked table:
final reward against the baseline's (paired by seed), the 95% interval of that gap, and whether the CIs
separate a correction from the best one at its level.

The GRPO loop and the grid over engines x corrections x seeds are notebook 03's (`toy_grpo.train_grid`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from rlwb.core import stats
from rlwb.core.correction_catalog import CATALOG, HEALTH
from rlwb.experiments.base import OnStart, Result
from rlwb.experiments.toy_grpo import timing_note, train_grid

FINAL_FRAC = 0.2  # "final reward" = mean reward over the last 20% of steps, per seed


@dataclass
class RaceResult(Result):
    curves: pd.DataFrame  # one row per (engine, correction, seed, step): notebook 03's columns + health
    ranking: pd.DataFrame  # one row per (level, correction), ranked within each level

    def frames(self) -> dict[str, pd.DataFrame]:
        return {"curves": self.curves, "ranking": self.ranking}

    def summary(self) -> pd.DataFrame:
        cols = ["level", "rank", "correction", "reward_final", "gap", "gap_ci_low", "gap_ci_high", "verdict",
                "vs_best", "ess", "masked_frac", "step_s"]  # step_s: median seconds per step
        return self.ranking[cols].set_index(["level", "rank"])

    def conclusion(self) -> str:
        return conclusion(self.metrics, self.ranking, self.params)


def corrections_table(names) -> pd.DataFrame:
    """What each raced correction does and which peer setting it reproduces."""
    return pd.DataFrame([{"correction": n, "what": CATALOG[n].what, "peer setting": CATALOG[n].peer}
                         for n in names]).set_index("correction")


def baseline_label(p) -> str:
    return f"{p.engines[0]}+none"


def run(params, model_path, *, on_start: OnStart = None, progress: bool = True,
        data_dir: str | Path | None = None) -> RaceResult:
    """The baseline level runs `none` (every correction too with `race_on_baseline`); every other level
    runs every correction. Each level's engine starts once."""
    curves = train_grid(params, model_path, on_start=on_start, progress=progress, drift_dir=data_dir,
                        corrections_for=params.corrections_for)
    metrics = race_metrics(curves, params)
    return RaceResult(params, metrics, curves, ranking(metrics, curves, params))


def final_rewards(curves: pd.DataFrame) -> pd.DataFrame:
    """Per (engine, correction, seed): mean reward over the last FINAL_FRAC of the steps."""
    steps = sorted(curves["step"].unique())
    last = steps[-max(1, round(FINAL_FRAC * len(steps))):]
    return (curves[curves["step"].isin(last)].groupby(["engine", "correction", "seed"], sort=False)["reward_mean"]
            .mean().rename("reward_final").reset_index())


def race_metrics(curves: pd.DataFrame, p) -> dict[str, float]:
    """Per `<level>+<correction>`: final reward (95% CI over seeds), its gap to the baseline's final reward
    paired by seed (same seed = same prompts and sampling seeds at step 0), the correction's health means
    over training, the engine-trainer k3 and seconds per step."""
    fin = final_rewards(curves)
    base_e, base_c = p.engines[0], "none"
    base = fin[(fin["engine"] == base_e) & (fin["correction"] == base_c)].set_index("seed")["reward_final"]
    out = {}
    for (e, c), d in curves.groupby(["engine", "correction"], sort=False):
        L = f"{e}+{c}"
        f = fin[(fin["engine"] == e) & (fin["correction"] == c)].set_index("seed")["reward_final"]
        out[f"{L}/reward_final"] = float(f.mean())
        out[f"{L}/reward_final_ci_low"], out[f"{L}/reward_final_ci_high"] = stats.seed_ci(f.to_numpy())
        gap = (f - base).dropna().to_numpy()
        out[f"{L}/gap"] = float(gap.mean()) if gap.size else float("nan")
        out[f"{L}/gap_ci_low"], out[f"{L}/gap_ci_high"] = stats.seed_ci(gap)
        for h in HEALTH:
            out[f"{L}/{h}_mean"] = float(d[h].mean())
        out[f"{L}/ess_min"] = float(d["ess"].min())
        out[f"{L}/mismatch_k3_mean"] = float(d["mismatch_k3"].mean())
        out[f"{L}/step_s_median"] = float(d["t_step"].median())  # a median: each engine's first step warms up
        same = f.reindex(base.index)
        out[f"{L}/same_as_baseline"] = float(bool(len(f) == len(base) and (same == base).all()))
        out[f"{L}/correction_ms_mean"] = 1e3 * float(d["t_correction"].mean())
    return out


def _paired_ci(fin: pd.DataFrame, e: str, a: str, b: str) -> tuple[float, float]:
    """95% interval of final(a) - final(b) at level e, paired by seed."""
    x = fin[(fin["engine"] == e) & (fin["correction"] == a)].set_index("seed")["reward_final"]
    y = fin[(fin["engine"] == e) & (fin["correction"] == b)].set_index("seed")["reward_final"]
    return stats.seed_ci((x - y).dropna().to_numpy())


def ranking(metrics: dict, curves: pd.DataFrame, p) -> pd.DataFrame:
    """One row per (level, correction), best final reward first within each level.

    verdict: "recovers" when the gap's 95% CI reaches 0 (not shown to fall short of the baseline),
    "falls short" when the whole CI is below 0, "above baseline" when it is above; "n/a" with one seed.
    vs_best: whether the paired CI of (this - the level's best) excludes 0 ("worse than best") or not
    ("not separated from best")."""
    fin = final_rewards(curves)
    rows = []
    for e in p.engines:
        cs = list(dict.fromkeys(curves.loc[curves["engine"] == e, "correction"]))
        ranked = sorted(cs, key=lambda c: -metrics[f"{e}+{c}/reward_final"])
        for i, c in enumerate(ranked):
            L = f"{e}+{c}"
            lo, hi = metrics[f"{L}/gap_ci_low"], metrics[f"{L}/gap_ci_high"]
            is_base = e == p.engines[0] and c == "none"
            if is_base:
                verdict = "baseline"
            elif not np.isfinite(lo):
                verdict = "n/a"
            else:
                verdict = "falls short" if hi < 0 else ("above baseline" if lo > 0 else "recovers")
            if i == 0:
                vs = "best"
            else:
                blo, bhi = _paired_ci(fin, e, c, ranked[0])
                vs = "n/a" if not np.isfinite(blo) else ("worse than best" if bhi < 0 else "not separated")
            rows.append({"level": e, "rank": i + 1, "correction": c, "reward_final": metrics[f"{L}/reward_final"],
                         "gap": metrics[f"{L}/gap"], "gap_ci_low": lo, "gap_ci_high": hi, "verdict": verdict,
                         "vs_best": vs, "ess": metrics[f"{L}/ess_mean"],
                         "masked_frac": metrics[f"{L}/masked_frac_mean"],
                         "truncated_frac": metrics[f"{L}/truncated_frac_mean"],
                         "mismatch_k3": metrics[f"{L}/mismatch_k3_mean"], "step_s": metrics[f"{L}/step_s_median"],
                         "peer": CATALOG[c].peer})
    return pd.DataFrame(rows)


def conclusion(metrics: dict, rank: pd.DataFrame, p) -> str:
    base = baseline_label(p)
    b = metrics[f"{base}/reward_final"]
    blo, bhi = metrics[f"{base}/reward_final_ci_low"], metrics[f"{base}/reward_final_ci_high"]
    ci = f" [95% CI {blo:.3f}, {bhi:.3f}]" if np.isfinite(blo) else ""
    lines = [f"**Baseline.** `{base}` (no mismatch) reaches a final reward of {b:.3f}{ci} "
             f"(mean over the last {FINAL_FRAC:.0%} of {p.steps} steps, {p.num_seeds} seeds; behaviour "
             f"logprobs from the {p.old_logprobs})."]
    for e in p.engines[1:]:
        d = rank[rank["level"] == e]
        if d.empty:
            continue
        k3 = metrics.get(f"{e}+none/mismatch_k3_mean", float(d["mismatch_k3"].mean()))
        rec = d[d["verdict"].isin(["recovers", "above baseline"])]["correction"].tolist()
        short = [f"{r.correction} (removes {r.masked_frac:.0%} of tokens, ESS {r.ess:.2f})"
                 for r in d[d["verdict"] == "falls short"].itertuples()]
        best = d.iloc[0]
        tied = d[d["vs_best"] == "not separated"]["correction"].tolist()
        lines.append(f"\n**`{e}`** (engine-trainer k3 {k3:.2g} per token under `none`): best `{best['correction']}` "
                     f"at {best['reward_final']:.3f} ({best['gap']:+.3f} vs baseline).")
        lines.append("Recover the baseline (gap CI reaches 0): " + (", ".join(f"`{c}`" for c in rec) or "none")
                     + "; fall short (whole CI below 0): " + (", ".join(f"`{c}`" for c in short) or "none") + ".")
        if metrics.get(f"{e}+none/same_as_baseline") == 1.0:
            lines.append(f"Uncorrected, this level trains exactly as the baseline (the same final reward on every "
                         f"seed): with behaviour logprobs from the {p.old_logprobs}, the engine's reported logprobs "
                         "reach the update only through a correction, so here a correction can only add the "
                         "engine's error." if p.old_logprobs == "trainer" else
                         "Uncorrected, this level trains exactly as the baseline (the same final reward on every "
                         "seed).")
        if tied:
            lines.append(f"The CIs do not separate {', '.join(f'`{c}`' for c in tied)} from the best: on this "
                         f"budget ({p.num_seeds} seeds) the data cannot rank them.")
    if (rank["verdict"] == "n/a").any():
        lines.append("\nWith one seed no interval exists: every verdict is n/a (run with num_seeds ≥ 3).")
    lines.append(f"\n**Timing.** {timing_note(p)}")
    return "\n".join(lines)
