"""Notebook 08's sequential seed rule, declared in the params before the run (`num_seeds`, `max_seeds`,
`target_power`): a first pass trains every run at `num_seeds` seeds; its analysis decides which dose rows need more,
and a second pass trains those rows and their clean twins at the seeds `num_seeds` ... n - 1. Why: the seeds that
matter are where a benchmark dose is decided, and a first pass of 8 seeds at a gap sd of ~0.085 has ~25% power to
detect the BMR at the family's level (~30 seeds give 80%); spending them on every row would multiply the study.

The rule (`decide`), per benchmark row (kind x PPO regime x horizon x arm, `benchmarks.row_studies`) with a
benchmark response (BMR = `bmr_fraction` of the fitted clean gain, > 0), on the first pass alone:
- a dose row needs a decision where its paired gap's 95% interval holds -BMR (it cannot tell "costs less than the
  BMR" from "costs more"), or where it brackets the row's BMD (the largest tested `k3_initial` at or below the BMD
  and the smallest at or above it: one dose where the BMD lies outside the tested doses, none without a BMD);
- such a row gets the fewest seeds n >= num_seeds whose two-sided paired t test at alpha / m (m: the first pass's
  one Holm family, `comparisons.one_family`; the level notebook 08's MDE uses) detects a gap equal to the BMR with
  power >= `target_power` (`stats.paired_t_power`, noncentral t), the spread being the first pass's per-seed sd of
  the row's gap floored by the outcome's step (`stats.floored_sd`, the spread its test uses), at most `max_seeds`,
  and at least num_seeds + 2 once it gets more (the second look's own t test needs 2).
  A row with no spread (a gap sd of 0 and no outcome step, or fewer than 2 gaps) gets none: there is no sd to size by;
- `futility_power` (0: off): a row called only because its interval holds -BMR (not one bracketing the BMD) whose
  power at `max_seeds` (by `seed_power`) stays below it gets none beyond the first pass (`futile`): the cap cannot
  give its test the target power, so the seeds would buy a test that most likely misses the BMR anyway. A row that
  brackets the BMD keeps its seeds whatever its test's power: there they narrow the benchmark fit's bounds, which
  this power does not measure. Non-binding: the two-look test's boundary is the one fixed before the run (every row
  may continue), so a row stopped early only loses rejection chances and the level holds. The row is still tested
  by the two-look test, as every row the rule may extend. The BMDL's coverage under the rule
  (`sequential_coverage`) is simulated without the bound;
- each clean twin (same arm, temperature, PPO regime and horizon) trains as many seeds as the most its dose rows get.

The decision is a function of the first pass's curves (the runs with the first pass's seeds), so `analyze` redoes it
from an archived run's curves (`first_pass`) and the metrics say which rows got how many seeds
(`sequential/<label>/<arm>/seeds`). The benchmark fit (`benchmarks.row_studies`) takes every seed each dose group
has: every clean run of the row's cell at dose 0 (the twin is shared by the cell's rows of every kind, so another
row's extension adds its clean runs here too), the first pass's seeds at a dose the rule left alone and all of them
at one it extended (unequal groups, as BMDS's summary data allow); its bootstrap redraws whole seeds within the seeds
run at the same doses (`benchmark_dose.resample_seeds`: each pattern of doses a stratum of its own, so a resample
keeps each dose's count). So the second pass tightens the bounds where it extends, not only the per-dose tests.
The fit does not adjust for the rule having looked: the doses it extends are those whose first-pass interval held
the BMR, and a fit on the pooled seeds is what the two-look test (below) avoids for the tests; `sequential_coverage`
simulates the rule itself (first pass, this decision, the fit on the pooled seeds) and measures the BMDL's coverage
with the selection in it.

How an extended row is tested: not by one t test over both passes. The first pass's seeds were picked for more by
their own mean (their interval held -BMR), so under no cost they lean toward one: pooled, a null row's false-positive
rate at 5% came out 5.4-7.9% (simulated, tests/test_mismatch_cost.py). In a study with a second pass every dose row the
rule may extend is tested by a two-look group-sequential test on the inverse-normal combination of the passes
(`analysis.two_look_p`: Pocock's boundary, weights fixed by num_seeds / max_seeds before the run), which holds the
level whatever the rule decides; a row left at the first pass pays for the second look it might have had (its p a
little above its one-look p). The sizing above is by default the plan's fixed-n power; the two-look test's own
power at those seeds is lower (on the default policy's study, 0.44-0.74 where the plan said 0.8), and each call
reports it (`power_two_look`, `analysis.two_look_power`). `seed_power: two-look` sizes by the test the row gets.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from rlwb.core.measure import stats
from rlwb.experiments.mismatch_study.analysis import two_look_power
from rlwb.experiments.mismatch_study.benchmarks import row_studies
from rlwb.experiments.mismatch_study.comparisons import study_tests
from rlwb.experiments.mismatch_study.design import TrainingRun

STRADDLES, BRACKETS = "interval holds -BMR", "brackets the BMD"


@dataclass(frozen=True)
class SeedCall:
    """One dose row the rule looked at: why (`STRADDLES`, `BRACKETS` or both), the BMR it sizes for, the spread it
    sizes with, the power of the first pass's seeds and of the `seeds` it gets (`capped`: `max_seeds` stopped it
    short of `target_power`)."""

    label: str
    arm: str
    benchmark: str  # the benchmark row's name (`ratio`, `weights+ppo4`, ...)
    why: tuple[str, ...]
    bmr: float
    sd: float
    power_first: float
    seeds: int
    power: float
    capped: bool
    power_two_look: float = float("nan")  # the two-look test's own power at `seeds` (`analysis.two_look_power`)
    futile: bool = False  # below `futility_power` at the cap: left at the first pass's seeds


def enabled(p) -> bool:
    """Does the study declare a second pass (`max_seeds` above `num_seeds`)?"""
    return getattr(p, "max_seeds", 0) > p.num_seeds


def sizing_power(bmr: float, sd: float, first: int, n: int, cap: int, level: float, rule: str = "fixed-n") -> float:
    """The power the rule sizes a row by at n seeds (`seed_power`): "fixed-n", a paired t test over the n seeds
    (`stats.paired_t_power`, the plan's); "two-look", the two-look test the row gets (`analysis.two_look_power`)."""
    if rule == "two-look":
        return two_look_power(bmr, sd, first, n, cap, level)
    return stats.paired_t_power(bmr, sd, n, level)


def seeds_for(bmr: float, sd: float, first: int, cap: int, level: float, power: float, rule: str = "fixed-n") -> int:
    """The fewest seeds n in [first, cap] whose test (`sizing_power` under `rule`) at `level` detects a gap of `bmr`
    with probability >= `power` given per-seed spread `sd` (at least first + 2 where more than `first`: the second
    look's own t test needs 2); `cap` where none does; `first` where there is no spread to size by."""
    if not (np.isfinite(sd) and sd > 0) or cap < first + 2 or not np.isfinite(
            sizing_power(bmr, sd, first, cap, cap, level, rule)):  # no power to size by (NaN): none
        return first
    n = next((n for n in range(first, cap + 1) if sizing_power(bmr, sd, first, n, cap, level, rule) >= power), cap)
    return n if n == first else max(n, first + 2)  # a second pass of at least 2 seeds: its own t test


def bracketing(labels, doses: np.ndarray, bmd: float) -> list[str]:
    """The dose labels that bracket `bmd`: the largest tested dose at or below it and the smallest at or above it (one
    where the BMD lies outside the tested doses, none without a BMD)."""
    if not np.isfinite(bmd):
        return []
    below, above = doses[doses <= bmd], doses[doses >= bmd]
    return [labels[int(np.flatnonzero(doses == v)[0])] for v in
            ([below.max()] if below.size else []) + ([above.min()] if above.size else [])]


def decide(table: pd.DataFrame, bench: pd.DataFrame, studies, m: int, *, num_seeds: int, max_seeds: int,
           target_power: float, seed_power: str = "fixed-n", futility_power: float = 0.0,
           level: float | None = None) -> list[SeedCall]:
    """The rule (the module's docstring) on a first pass: `table` its `dose_table` with the family's adjustment,
    `bench` its `benchmark_table`, `studies` its `row_studies` (which dose labels each benchmark row holds), `m` its
    family's size. One `SeedCall` per dose row the rule looks at, in the benchmark rows' order. `level`: the two-sided
    level to size at instead of alpha / m (a what-if of `scripts/two_look_size.py`); a study never passes it."""
    rows = table.set_index(["label", "arm"])
    doses = {(r.name, r.arm): (r.labels, np.asarray(r.doses, float)) for r in studies}
    level = stats.ALPHA / max(int(m), 1) if level is None else float(level)
    calls = []
    for b in bench.itertuples():
        bmr = float(b.bmr)
        if not (np.isfinite(bmr) and bmr > 0) or (b.name, b.arm) not in doses:
            continue  # no benchmark response (the clean arm did not learn, or was not measured): nothing to size for
        labels, x = doses[(b.name, b.arm)]
        bracket = set(bracketing(labels, x, float(b.bmd)))
        for label in labels:
            r = rows.loc[(label, b.arm)]
            why = tuple(w for w, hit in ((STRADDLES, bool(r.gap_ci_low <= -bmr <= r.gap_ci_high)),
                                         (BRACKETS, label in bracket)) if hit)
            if not why:
                continue
            sd = stats.floored_sd(float(r.gap_sd), float(r.q_eff)) if np.isfinite(r.gap_sd) else float("nan")
            n = seeds_for(bmr, sd, num_seeds, max_seeds, level, target_power, seed_power)
            sized = sizing_power(bmr, sd, num_seeds, n, max_seeds, level, seed_power)
            # below the bound (< target) at the cap: `seeds_for` stopped there, so `sized` is the cap's power
            futile = bool(futility_power > 0 and why == (STRADDLES,) and n == max_seeds > num_seeds
                          and sized < futility_power)
            if futile:
                n, sized = num_seeds, sizing_power(bmr, sd, num_seeds, num_seeds, max_seeds, level, seed_power)
            calls.append(SeedCall(label=label, arm=b.arm, benchmark=b.name, why=why, bmr=bmr, sd=sd,
                                  power_first=stats.paired_t_power(bmr, sd, num_seeds, level), seeds=n,
                                  power=stats.paired_t_power(bmr, sd, n, level),
                                  capped=n == max_seeds and not sized >= target_power,
                                  power_two_look=sized if seed_power == "two-look" else
                                  two_look_power(bmr, sd, num_seeds, n, max_seeds, level), futile=futile))
    return calls


def first_pass_curves(curves: pd.DataFrame, p) -> pd.DataFrame:
    """The first pass's runs (the seeds `num_seeds` gives), without what only the whole study knows (each run's KL
    to its clean twin: no test reads it): what the rule decides on, in the study and in `analyze` alike."""
    return curves[curves["seed"].isin(p.seeds)].drop(columns=["kl_to_clean"], errors="ignore").reset_index(drop=True)


def first_pass(curves: pd.DataFrame, p, level: float | None = None) -> tuple[list[SeedCall], int]:
    """(the rule's calls, the family size m) on the first pass of `curves` (`first_pass_curves`: a study's curves so
    far, or an archived run's whole curves), sized at alpha / m, or at the two-sided `level` given (`decide`)."""
    first = first_pass_curves(curves, p)
    tests = study_tests(first, p)
    m = int(tests.family["family/tests"])
    return decide(tests.table, tests.bench, row_studies(first, tests.table), m, num_seeds=p.num_seeds,
                  max_seeds=p.max_seeds, target_power=p.target_power,
                  seed_power=getattr(p, "seed_power", "fixed-n"),
                  futility_power=getattr(p, "futility_power", 0.0), level=level), m


def twin_seeds(calls: list[SeedCall], first_runs: list[TrainingRun]) -> dict[TrainingRun, int]:
    """Each first-pass run (at the study's first seed) whose row the second pass extends, with the seeds its row
    gets: each called dose row's, and its clean twin's (same arm, temperature, regime, horizon and epochs) at the
    most of its dose rows. Clean runs first, so dosed runs find their twins' policies ready."""
    want = {(c.label, c.arm): c.seeds for c in calls if c.seeds > 0}
    seed0 = min(j.seed for j in first_runs) if first_runs else 0
    dosed = {j: want[(j.label, j.arm)] for j in first_runs if j.seed == seed0 and (j.label, j.arm) in want}
    twins: dict[tuple, int] = {}
    for j, n in dosed.items():
        twins[j.twin[:4] + j.twin[5:]] = max(n, twins.get(j.twin[:4] + j.twin[5:], 0))
    clean = {j: twins[j.twin[:4] + j.twin[5:]] for j in first_runs
             if j.seed == seed0 and j.kind == "clean" and j.twin[:4] + j.twin[5:] in twins}
    return {**clean, **dosed}


def second_pass_runs(calls: list[SeedCall], first_runs: list[TrainingRun], p) -> list[TrainingRun]:
    """The second pass: each extended row's runs at the seeds `num_seeds` ... n - 1 (`twin_seeds`), clean runs first."""
    return [replace(j, seed=p.seed + i) for j, n in twin_seeds(calls, first_runs).items()
            for i in range(p.num_seeds, n)]


def sequential_metrics(calls: list[SeedCall], m: int, first_runs: list[TrainingRun], p) -> dict[str, float]:
    """`sequential/<label>/<arm>/{seeds, power_first, power, power_two_look}` per dose row the rule looked at (seeds:
    what it gets; power: at the BMR, alpha / m, from the first pass's sd, of a fixed-n t test with the first pass's
    seeds and with those; power_two_look: that of the two-look test the row gets, `analysis.two_look_power`; the rule
    sized by one or the other, `seed_power`),
    `sequential/<label>/<arm>/seeds` per extended clean twin, and `sequential/{family_tests, rows, runs}`: the m it
    sized at, the dose rows given more seeds and the second pass's runs."""
    out = {"sequential/family_tests": float(m), "sequential/rows": float(sum(c.seeds > p.num_seeds for c in calls))}
    if getattr(p, "futility_power", 0.0) > 0:
        out["sequential/futile_rows"] = float(sum(c.futile for c in calls))
    for c in calls:
        k = f"sequential/{c.label}/{c.arm}"
        out.update({f"{k}/seeds": float(c.seeds), f"{k}/power_first": c.power_first, f"{k}/power": c.power,
                    f"{k}/power_two_look": c.power_two_look})
        if c.futile:
            out[f"{k}/futile"] = 1.0
    for j, n in twin_seeds(calls, first_runs).items():
        if j.kind == "clean" and n > p.num_seeds:
            out[f"sequential/{j.label}/{j.arm}/seeds"] = float(n)
    out["sequential/runs"] = float(len(second_pass_runs(calls, first_runs, p)))
    return out


def unmatched(metrics: dict[str, float], curves: pd.DataFrame, num_seeds: int) -> list[str]:
    """Where the rule's decision (`sequential_metrics`, redone from a study's first pass) differs from the seeds its
    curves hold, both ways: each row the rule names against the distinct seeds of that row in the curves, and each
    row of the curves with more than `num_seeds` seeds against the rule's. Empty for a study this rule ran; in a
    reanalysis by another commit's code (`rlwb run --reanalyze`), a rule changed since, or a Holm family grown since
    (its level sizes the rule), would report a decision the study did not take (`reanalysis_decision`)."""
    have = curves.groupby(["label", "arm"])["seed"].nunique()
    said = {tuple(k[len("sequential/"):-len("/seeds")].rsplit("/", 1)): int(n) for k, n in metrics.items()
            if k.startswith("sequential/") and k.endswith("/seeds")}
    out = [f"{lab} {arm}: the rule gives {n} seeds, the data hold {int(have.get((lab, arm), 0))}"
           for (lab, arm), n in said.items() if int(have.get((lab, arm), 0)) != n]
    out += [f"{lab} {arm}: the data hold {int(n)} seeds, the rule gives none beyond {num_seeds}"
            for (lab, arm), n in have.items() if n > num_seeds and (lab, arm) not in said]
    return out


def reanalysis_decision(redone: dict[str, float], recorded: dict[str, float], curves: pd.DataFrame,
                        num_seeds: int) -> tuple[dict[str, float], list[str]]:
    """The sequential metrics a reanalysis (`rlwb run --reanalyze`) reports, and where this code's rule would differ.
    The seeds a study trained are the decision it took, not one redone later: a rule changed since, or a Holm family
    grown since (its level sizes the rule), redone on the first pass, may give other rows other seeds. So: this
    code's decision (`redone`) where it is the one the data hold (`unmatched` empty; nothing differs); else the
    decision the study recorded in its metrics (`recorded`, its `sequential/*`, with `sequential/decision_recorded`
    1 and `sequential/rule_differs` the rows where this code's rule would differ) where that one is what the data
    hold; else (neither: the data are not what any rule took) a ValueError naming the rows, and the reanalysis stops
    before it reports a decision nobody took."""
    wrong = unmatched(redone, curves, num_seeds)
    if not wrong:
        return {k: v for k, v in redone.items() if k.startswith("sequential/")}, []
    kept = {k: v for k, v in recorded.items() if k.startswith("sequential/") and k not in
            ("sequential/decision_recorded", "sequential/rule_differs")}
    theirs = unmatched(kept, curves, num_seeds) if "sequential/rows" in kept else ["no sequential decision recorded"]
    if theirs:
        raise ValueError(f"this code's sequential seed rule, redone on the study's first pass, is not the decision its "
                         f"data hold ({'; '.join(wrong)}), and neither is the decision the study recorded "
                         f"({'; '.join(theirs)}): its analysis would report seeds the study did not train")
    return {**kept, "sequential/decision_recorded": 1.0, "sequential/rule_differs": float(len(wrong))}, wrong
