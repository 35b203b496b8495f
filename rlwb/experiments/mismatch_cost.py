"""Notebook 08's experiment: what engine-trainer mismatch costs a GRPO run, at known doses.

Notebook 03's loop (`rlwb.core.rl.grpo`) on one fp32 engine whose logprobs match the trainer's to the float floor,
with mismatch injected at set doses on the real engine path (`rlwb.core.rl.mismatch_doses`): *ratio* mismatch (noise on
the logprobs the engine reports; it samples correctly) and two *distribution* mismatches (the engine samples
with perturbed weights, or with weights some updates behind). Real engines (notebook 01/06's presets and knobs,
at a temperature) are trained the same way and placed on the same axes as points. Every arm (a correction in an
old_logprobs mode) trains at every dose from the same initial weights with the same seeds, prompts and noise, so
each dose's cost is a *paired* gap to the same arm's clean run at the same temperature, seed by seed, with a
Student-t interval and the smallest gap the budget could detect beside every null.

Controls that must come out null (a failed control says the design, not the engine, is wrong):
- `none@trainer` under ratio doses trains bitwise as its clean twin: the reported logprobs never reach its update;
- a real engine reporting raw logprobs at T = 1 (where raw = processed) costs nothing measurable;
- the clean run of the first arm and seed, run twice, is bitwise the same: pairing by seed rests on it;
- and the clean arms must learn (gain CI above 0): a cost is only measurable where there is a gain to lose.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from rlwb.core.measure import dose_response
from rlwb.core.rl.mismatch_doses import DOSE_KINDS, dose_kinds
from rlwb.experiments.base import OnStart, Result
from rlwb.experiments.grpo_grid import FINAL_FRAC, timing_note
from rlwb.experiments.mismatch_study import sequential
from rlwb.experiments.mismatch_study.analysis import (
    dose_achieved,
    dose_metrics,
    regime_metrics,
    regime_ratios,
)
from rlwb.experiments.mismatch_study.benchmarks import benchmark_metrics, benchmark_view
from rlwb.experiments.mismatch_study.comparisons import (
    contrast_metrics,
    study_tests,
)
from rlwb.experiments.mismatch_study.design import (
    HELDOUT_PROBLEMS,
    HELDOUT_SEED,
    LONG,
    PROBE_PROBLEMS,
    PROBE_SEED,
    dosed_kinds,
    first_regime,
    held_out,
    training_runs,
)
from rlwb.experiments.mismatch_study.execution import train_study
from rlwb.experiments.mismatch_study.scoring_noise import scoring_analysis
from rlwb.experiments.wording import mismatch_cost as words_08
from rlwb.experiments.wording import one_line

# what tells one training run's rows of the curves from another's (`mismatch_study.design.TrainingRun`'s fields)
RUN_COLUMNS = ["engine", "kind", "label", "dose", "arm", "seed", "temperature", "updates", "epochs", "stream"]


@dataclass
class CostResult(Result):
    curves: pd.DataFrame  # one row per (label, arm, seed, step): notebook 03's columns
    doses: pd.DataFrame  # one row per (label, arm): achieved k3, outcomes, paired gaps with CIs, MDE, verdict
    # one row per (kind, PPO regime, arm): the trend across doses and the benchmark dose (`benchmark_table`)
    benchmarks: pd.DataFrame = field(default_factory=pd.DataFrame)
    # what the dose-response figure draws: dose groups, fitted curves with bands, BMR/BMD/BMDL marks (`benchmark_table`)
    dose_fits: pd.DataFrame = field(default_factory=pd.DataFrame)
    # one row per paired contrast the conclusion states (`contrast_table`)
    contrasts: pd.DataFrame = field(default_factory=pd.DataFrame)
    # one row per long-horizon row and block of steps: the training-reward gap's trajectory (`horizon_table`)
    horizon: pd.DataFrame = field(default_factory=pd.DataFrame)
    # one row per (PPO regime, arm) of the clean runs: the PPO ratio's |log r| and clip fraction (`regime_ratios`)
    regimes: pd.DataFrame = field(default_factory=pd.DataFrame)
    # per k draws a problem: the gap's sd, a run's wall time and their worth per second (`scoring_noise`); empty for
    # runs that kept no draws by index
    scoring: pd.DataFrame = field(default_factory=pd.DataFrame)
    # per dose row: the shared draws' noise its mean gap keeps, beside its se over seeds (`common_gap_noise`)
    scoring_common: pd.DataFrame = field(default_factory=pd.DataFrame)

    def frames(self) -> dict[str, pd.DataFrame]:
        return {"curves": self.curves, "doses": self.doses, "benchmarks": self.benchmarks,
                "dose_fits": self.dose_fits, "contrasts": self.contrasts, "horizon": self.horizon,
                "regimes": self.regimes, "scoring": self.scoring, "scoring_common": self.scoring_common}

    def scoring_words(self) -> str:
        return words_08.scoring_words(self.metrics)

    def scoring_views(self) -> list[pd.DataFrame]:
        """The scoring tables to show (none for runs that kept no draws by index), their columns for a reader."""
        if self.scoring.empty:
            return []
        by_k = [c for c in ("k", "groups", "seed_df", "gap_sd", "t_job_k", "variance_ratio", "time_ratio",
                            "value_ratio") if c in self.scoring]
        common = ["label", "arm", "seeds", "p_common", *[c for c in self.scoring_common if c.startswith("sd_common")],
                  "se_seeds_k2"]
        return [self.scoring[by_k].set_index("k"), self.scoring_common[common].set_index(["label", "arm"])]

    def summary(self) -> pd.DataFrame:
        cols = ["kind", "label", "arm", "k3_initial", "k3_achieved", "reward_final", "gap", "gap_ci_low",
                "gap_ci_high", "mde", "verdict", "train_gap", "heldout_gap", "auc_gap", "entropy_gap", "kl_to_clean",
                "clip_frac"]
        return self.doses[~self.doses["kind"].isin(["clean", "rerun"])][cols].set_index(["kind", "label", "arm"])

    def benchmark_view(self) -> pd.DataFrame:
        """The benchmark table with the columns a reader needs (`benchmarks.benchmark_view`)."""
        return benchmark_view(self.benchmarks)

    def conclusion(self) -> str:
        return conclusion(self.metrics, self.doses, self.params, self.benchmarks, self.contrasts, self.horizon)

    def answer(self) -> str:
        """The finding first, in one line (the index's answer column): the one-sided vs symmetric contrast where the
        run has one, then the first arm's tolerable k3 per kind (its BMDL, or why there is none), then the first
        arm's verdict per kind of mismatch."""
        bench = (dose_response.first_regime_benchmarks(self.benchmarks) if "name" in self.benchmarks
                 else self.benchmarks)
        bullets = words_08.dose_answer_lines(self.metrics, first_regime(self.doses), dosed_kinds(),
                                             self.params.arm_labels)
        return one_line(words_08.answer_line(self.params.arm_labels[0], bench, self.contrasts,
                                             [b[2:] for b in bullets]), limit=400)


def run(params, model_path, *, on_start: OnStart = None, progress: bool = True, store=None,
        reanalyzing: str | Path | None = None) -> CostResult:
    """Every training run of the study (`mismatch_study.design.training_runs`) on real engines from the same initial
    weights (`mismatch_study.execution.train_study`), then `analyze`, a function of the curves alone.

    With `store` (the run's job store, `archive.Run.jobs()`) each run is kept the moment it finishes, so an
    interrupted study keeps its finished runs; in a run that resumes one (`rlwb run --resume-from`) the store offers
    that run's finished runs, which are reused instead of trained again. Runs are seeded and independent, so a
    resumed study's curves are the uninterrupted study's, bar the wall-time columns.

    With `reanalyzing` (a finished run of the same params, `archive.Run.reanalyzes`: `rlwb run --reanalyze`) nothing
    trains: the result is that run's curves analysed by this code (`reanalyze`), every job counted as reused."""
    if reanalyzing is not None:
        result = reanalyze(reanalyzing, params)
        if sequential.enabled(params):  # the decision the study took: redone where it matches, else as recorded
            recorded = json.loads((Path(reanalyzing) / "metrics.json").read_text())
            try:
                kept, _ = sequential.reanalysis_decision(result.metrics, recorded, result.curves, params.num_seeds)
            except ValueError as e:
                raise ValueError(f"{reanalyzing}: {e}") from None
            for k in [k for k in result.metrics if k.startswith("sequential/")]:
                del result.metrics[k]
            result.metrics.update(kept)
        jobs = float(result.curves.groupby(RUN_COLUMNS, dropna=False).ngroups)
        result.metrics.update({"resume/reused_jobs": jobs, "resume/trained_jobs": 0.0})
        return result
    curves, reused, total = train_study(params, model_path, on_start=on_start, progress=progress, store=store)
    result = analyze(curves, params)
    result.metrics.update({"resume/reused_jobs": float(reused), "resume/trained_jobs": float(total - reused)})
    return result


def analyze(curves: pd.DataFrame, p) -> CostResult:
    """Every table, metric and verdict of the study from its curves (`data/curves.parquet` of an archived run)
    and its params: what `run` returns, so an archived run's analysis can be redone without retraining (a
    changed test, a changed BMR). The trained policies are not kept: an outcome not measured in the run (another
    held-out set, another temperature) needs the runs again. Every test of the study is in one Holm family
    (`one_family`)."""
    table, bench, fits, con, hz, hm, family = study_tests(curves, p)
    metrics = dose_metrics(table, curves)  # after the family: the rows' verdicts and the placebo's rate are final
    metrics.update(benchmark_metrics(bench))
    metrics.update(contrast_metrics(con))
    metrics.update(hm)
    metrics.update(family)
    ratios = regime_ratios(curves)
    metrics.update(regime_metrics(ratios))
    scoring, scoring_common, scoring_m = scoring_analysis(curves)  # runs that kept their draws by index
    metrics.update(scoring_m)
    if sequential.enabled(p):  # the rule's decision, redone from the first pass's curves as the study took it
        calls, m = sequential.first_pass(curves, p)
        metrics.update(sequential.sequential_metrics(calls, m, training_runs(p), p))
    return CostResult(p, metrics, curves, table, bench, fits, con, hz, ratios, scoring, scoring_common)


def reanalyze(run_dir: str | Path, params) -> CostResult:
    """An archived run's analysis redone from its `data/curves.parquet` (`analyze`) and its params (the caller loads
    the run's `params.yaml`: `rlwb.params.load("08_mismatch_cost", [run_dir / "params.yaml"])`, infrastructure this
    layer does not import): what the run would report under today's tests, without retraining. Runs archived before
    `kl_to_clean` was a column of the curves come back without it (NaN), and before the clean scorer with their own
    engines' outcomes."""
    return analyze(pd.read_parquet(Path(run_dir) / "data" / "curves.parquet"), params)


def conclusion(metrics: dict, table: pd.DataFrame, p, bench: pd.DataFrame | None = None,
               con: pd.DataFrame | None = None, hz: pd.DataFrame | None = None) -> str:
    """The study's conclusion (`wording.mismatch_cost.conclusion`), from its rows, tables and metrics: the rows of
    the first PPO regime at the study's horizon, and what the wording states in words."""
    regimes = table = table.assign(epochs=table.get("epochs", 1))
    first = (1, 1)
    if "updates" in table and len(table):  # the first regime: its mini-batches and its epochs
        first = (int(table["updates"].iloc[0]), int(table["epochs"].iloc[0]))
        table = table[(table["updates"] == first[0]) & (table["epochs"] == first[1])]
    table = table[~table["label"].str.endswith(LONG)]
    outcome = table["outcome"].iloc[0] if "outcome" in table and len(table) else "reward_final"
    heldout = held_out(p, HELDOUT_PROBLEMS, HELDOUT_SEED)[1]
    words = {"outcome": words_08.outcome_text(outcome, p, heldout, FINAL_FRAC),
             "timing": timing_note(p, sorted(set(table["engine"]))), "heldout": heldout,
             "probe": held_out(p, PROBE_PROBLEMS, PROBE_SEED)[1]}
    return words_08.conclusion(metrics, table, regimes, first, p, bench, con, hz, words=words,
                               answer_rows=first_regime(table), doses=first_arm_doses(table, p), kinds=kind_words())


def kind_words() -> list[dict]:
    """What the wording says of each kind of dose, in the report's order (`mismatch_doses.DoseKind`): its name,
    what it is, whether a dose is an intended k3, and how its doses read."""
    return [{"name": k.name, "title": k.title, "intended_k3": k.intended_k3, "dose_words": k.dose_words,
             "intended_words": k.intended_words} for k in dose_kinds()]


def first_arm_doses(table: pd.DataFrame, p) -> pd.DataFrame:
    """The first arm's rows, each intended-k3 dose (a ratio dose) with the noise's `sigma` it was drawn with (where
    its kind says) and whether the measured k3 `achieved` it (`dose_achieved`): what the conclusion's doses
    paragraph states."""
    first = table[table["arm"] == p.arm_labels[0]]
    rows = [(r, DOSE_KINDS[r.kind] if r.kind in DOSE_KINDS and DOSE_KINDS[r.kind].intended_k3 else None)
            for r in first.itertuples()]
    return first.assign(sigma=[k.noise_sd(r.k3_intended) if k and k.noise_sd else np.nan for r, k in rows],
                        achieved=[dose_achieved(r) if k else True for r, k in rows])
