"""Notebook 07's experiment: which off-policy correction recovers the no-mismatch baseline, per mismatch level.

A mismatch level is an engine preset that differs from the baseline (`vllm-v1-fixed`, fp32: engine and
trainer agree to the float floor) in one controlled knob: V1's raw logprobs, a bf16 engine, ... Every peer's
correction (`rlwb.core.rl.correction_catalog`) trains the same policy from the same weights on each level,
with the same seeds, in the *decoupled* mode the peers define their IS corrections in (the trainer
recomputes the behaviour logprobs; the correction weighs trainer vs engine). The answer is a ranked table:
final reward against the baseline's (paired by seed), the 95% interval of that gap, and a verdict from
equivalence and difference tests Holm-corrected over the race, with the smallest gap the budget can detect.

The GRPO loop and the grid over engines x corrections x seeds are notebook 03's (`grpo_grid.train_grid`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from rlwb.core.measure import stats
from rlwb.core.rl.correction_catalog import CATALOG, HEALTH
from rlwb.experiments.base import OnStart, Result
from rlwb.experiments.grpo_grid import FINAL_FRAC, final_reward, floor_breaches, timing_note, train_grid
from rlwb.experiments.wording import which_correction as wording_07


@dataclass
class RaceResult(Result):
    curves: pd.DataFrame  # one row per (engine, correction, seed, step): notebook 03's columns + health
    ranking: pd.DataFrame  # one row per (level, correction), ranked within each level

    def frames(self) -> dict[str, pd.DataFrame]:
        return {"curves": self.curves, "ranking": self.ranking}

    def summary(self) -> pd.DataFrame:
        cols = ["level", "rank", "correction", "reward_final", "gap", "gap_ci_low", "gap_ci_high", "verdict",
                "mde", "p_equiv_holm", "ess", "masked_frac", "step_s"]  # step_s: median seconds per step
        return self.ranking[cols].set_index(["level", "rank"])

    def conclusion(self) -> str:
        return conclusion(self.metrics, self.ranking, self.params)


def corrections_table(names) -> pd.DataFrame:
    """What each raced correction does, which peer setting it reproduces, and whose code it was held to (or that
    it is rlwb's own reading, with the source it follows)."""
    return pd.DataFrame([{"correction": n, "what": CATALOG[n].what, "peer setting": CATALOG[n].peer,
                          "checked against": CATALOG[n].checked_against}
                         for n in names]).set_index("correction")


def baseline_label(p) -> str:
    return f"{p.engines[0]}+none"


def run(params, model_path, *, on_start: OnStart = None, progress: bool = True,
        data_dir: str | Path | None = None, store=None) -> RaceResult:
    """The baseline level runs `none` (every correction too with `race_on_baseline`); every other level
    runs every correction. Each level's engine starts once. With `store` (the run's job store) each run is kept
    as it finishes, and a resumed run takes over the runs it resumes (`grpo_grid.train_grid`)."""
    curves = train_grid(params, model_path, on_start=on_start, progress=progress, drift_dir=data_dir,
                        corrections_for=params.corrections_for, store=store)
    metrics = race_metrics(curves, params)
    return RaceResult(params, metrics, curves, ranking(metrics, curves, params))


def final_rewards(curves: pd.DataFrame) -> pd.DataFrame:
    """Per (engine, correction, seed): mean reward over the last FINAL_FRAC of the steps."""
    return final_reward(curves, ["engine", "correction", "seed"]).rename("reward_final").reset_index()


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
    out.update(floor_breaches(curves))
    return out


def same_sampler(level: str, baseline: str) -> bool:
    """Does `level`'s preset differ from `baseline`'s only in `logprobs_mode` (what the engine *reports*, not
    what it samples)? Then, with behaviour logprobs from the trainer, `none` never reads the engine's logprobs
    and trains bitwise as the baseline by construction: only a correction can see such a level."""
    from dataclasses import asdict

    from rlwb.engines.presets import resolve_preset

    def key(name):
        d = asdict(resolve_preset(name))
        d.pop("name"), d.pop("description")
        d["vllm_kwargs"] = {k: v for k, v in d["vllm_kwargs"].items() if k != "logprobs_mode"}
        return repr(d)

    return level != baseline and key(level) == key(baseline)


def ranking(metrics: dict, curves: pd.DataFrame, p) -> pd.DataFrame:
    """One row per (level, correction), highest final reward first within each level (the order is descriptive:
    no test is run against a winner picked from the same data).

    Each gap to the baseline (paired by seed) is tested twice, both Holm-corrected over every tested row of the
    race, as one family of 2 x rows p-values (`stats.holm`): a t test of gap = 0 and an equivalence test (TOST)
    of |gap| < `p.margin`.
    verdict: "recovers" (equivalent within the margin), "falls short" / "above baseline" (the gap differs from 0),
    "inconclusive" (neither at this budget: `mde` says what it could have detected), "n/a" (one seed), and
    "= baseline (by construction)" for `none` on a level that only changes the reported logprobs in the decoupled
    mode (`same_sampler`, and measured so: else the row is tested). mde: the smallest gap the budget detects
    with 80% power at the Holm family's strictest level (alpha / p-values); equiv_sd_max: the largest spread of
    per-seed gaps at which a zero mean gap could still be shown inside the margin at that level."""
    fin = final_rewards(curves)
    base_e = p.engines[0]
    base = fin[(fin["engine"] == base_e) & (fin["correction"] == "none")].set_index("seed")["reward_final"]
    rows = []
    for e in p.engines:
        cs = list(dict.fromkeys(curves.loc[curves["engine"] == e, "correction"]))
        ranked = sorted(cs, key=lambda c: -metrics[f"{e}+{c}/reward_final"])
        for i, c in enumerate(ranked):
            L = f"{e}+{c}"
            f = fin[(fin["engine"] == e) & (fin["correction"] == c)].set_index("seed")["reward_final"]
            test = stats.paired_gap_test((f - base).dropna().to_numpy(), p.margin)
            if e == base_e and c == "none":
                kind = "baseline"
            elif (c == "none" and p.old_logprobs == "trainer" and same_sampler(e, base_e)
                  and metrics.get(f"{L}/same_as_baseline") == 1.0):  # claimed and measured: else it is tested
                kind = "= baseline (by construction)"
            else:
                kind = "test" if test.n >= 2 else "n/a"
            rows.append({"level": e, "rank": i + 1, "correction": c, "reward_final": metrics[f"{L}/reward_final"],
                         "gap": metrics[f"{L}/gap"], "gap_ci_low": metrics[f"{L}/gap_ci_low"],
                         "gap_ci_high": metrics[f"{L}/gap_ci_high"], "verdict": kind, "p_diff": test.p_diff,
                         "p_equiv": test.p_equiv, "sd": test.sd, "n": test.n, "ess": metrics[f"{L}/ess_mean"],
                         "masked_frac": metrics[f"{L}/masked_frac_mean"],
                         "truncated_frac": metrics[f"{L}/truncated_frac_mean"],
                         "mismatch_k3": metrics[f"{L}/mismatch_k3_mean"], "step_s": metrics[f"{L}/step_s_median"],
                         "peer": CATALOG[c].peer})
    r = pd.DataFrame(rows)
    tested = r["verdict"] == "test"
    m = int(tested.sum())
    r["p_diff_holm"], r["p_equiv_holm"], r["mde"], r["equiv_sd_max"] = np.nan, np.nan, np.nan, np.nan
    if m:
        # one family: both tests of every tested row (a verdict reads either), so the table's error rate is alpha
        both = stats.holm(np.r_[r.loc[tested, "p_diff"].to_numpy(), r.loc[tested, "p_equiv"].to_numpy()])
        r.loc[tested, "p_diff_holm"], r.loc[tested, "p_equiv_holm"] = both[:m], both[m:]
        r.loc[tested, "mde"] = [stats.minimal_detectable_gap(sd, n, stats.ALPHA / (2 * m))
                                for sd, n in zip(r.loc[tested, "sd"], r.loc[tested, "n"])]
        # the largest per-seed spread at which a zero gap could still be shown inside the margin at that level
        r.loc[tested, "equiv_sd_max"] = [stats.equivalence_sd_max(p.margin, n, stats.ALPHA / (2 * m))
                                         for n in r.loc[tested, "n"]]
        # The verdict words stay here, not in wording/: they are data (the `ranking` table's `verdict` column, archived
        # in data/ranking.parquet, coloured by rlwb/plots/which_correction.py and asserted by tests/test_race.py and
        # tests/test_notebooks.py); wording_07.race_verdict_line only groups rows by them (wording_07.RACE_VERDICTS).
        r.loc[tested, "verdict"] = [
            "recovers" if pe < stats.ALPHA else
            ("falls short" if g < 0 else "above baseline") if pdf < stats.ALPHA else "inconclusive"
            for pe, pdf, g in zip(r.loc[tested, "p_equiv_holm"], r.loc[tested, "p_diff_holm"], r.loc[tested, "gap"])]
    r["margin"] = p.margin  # the equivalence band the race figure shades
    return r.drop(columns=["sd"])


def conclusion(metrics: dict, rank: pd.DataFrame, p) -> str:
    """`wording.which_correction`, with what it needs decided here (the baseline, which levels sample as it)."""
    setup = {"baseline": baseline_label(p), "steps": p.steps, "num_seeds": p.num_seeds,
             "old_logprobs": p.old_logprobs, "margin": p.margin, "engines": list(p.engines), "final_frac": FINAL_FRAC,
             "same_sampler": {e: same_sampler(e, p.engines[0]) for e in p.engines[1:]}
             if p.old_logprobs == "trainer" else {},  # only read then: `none` reads no engine logprobs
             "timing_note": timing_note(p)}
    return wording_07.conclusion(metrics, rank, setup)
