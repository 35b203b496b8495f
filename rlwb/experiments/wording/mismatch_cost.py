"""How notebook 08 (`rlwb.experiments.mismatch_cost`) words its verdicts: the conclusion and the one-line answer,
the dose-by-dose answer, the sequential seed rule, the benchmark doses, placebo rows, PPO regimes, the tested
contrasts, the long horizon, the real engines on the same axes, the controls and the doses achieved. Takes plain
values and tables (the experiment decides, and passes what it computed); imports nothing of rlwb above the leaf
utilities and the shared wording."""

from __future__ import annotations

import numpy as np

from rlwb.experiments.wording import floor_lines
from rlwb.formatting import metric

# The benchmark's statuses, as `rlwb.core.measure.benchmark_dose` names them (this layer imports no core module:
# tests/test_mismatch_cost.py checks the two agree).
BMD_BOUNDED, BMD_ABOVE, BMD_BELOW = "bounded", "above tested range", "below tested range"
BMD_NO_FIT, BMD_SATURATED, BMD_NO_BENCHMARK, BMD_NOT_BOUNDED = ("no fit passes", "saturated", "no benchmark",
                                                                "not bounded")
MIN_DOSES = 4  # as `mismatch_study.benchmarks.MIN_DOSES` (tests/test_mismatch_cost.py checks the two agree)


def quotable(r) -> bool:
    """A benchmark row with a level to quote as "keep k3 below" (`benchmarks.keep_below`: 4 doses or more, bounded on
    the linear dose scale with its BMD inside the tested doses, the log scale agreeing; the lower of the two scales'
    BMDLs)."""
    return bool(np.isfinite(getattr(r, "keep_below", float("nan"))))


def benchmark_reason(r) -> str:
    """Why a row gives no level to quote, and what design would, in a clause."""
    if r.status == BMD_BOUNDED and r.doses < MIN_DOSES:
        return (f"bounded on the linear dose scale (BMDL {r.bmdl:.1e}), but with {r.doses} dose(s) beside dose 0 "
                f"only the straight line is tested (every curved model is saturated), so no model's bound guards "
                f"against a curve that falls early; a level is quoted from {MIN_DOSES} doses up, between "
                f"{r.k3_min:.0e} and {r.k3_max:.0e} here")
    if r.status == BMD_BOUNDED and below_doses(r):
        return (f"bounded on the linear dose scale, but its BMD {r.bmd:.1e} lies below the smallest tested k3 "
                f"{r.k3_min:.1e} (the smallest dose already costs about the BMR), so the bound (BMDL {r.bmdl:.1e}) "
                f"rests on a stretch of curve no dose tested; smaller doses would place it")
    if r.status == BMD_BOUNDED:
        log = f"BMDL {r.bmdl_log:.1e}" if r.status_log == BMD_BOUNDED else f"'{r.status_log}'"
        return (f"bounded on the linear dose scale (BMDL {r.bmdl:.1e}) but the log scale says {log}: with "
                f"{r.doses} dose(s) the dose scale decides it; 4 or more doses between {r.k3_min:.0e} and "
                f"{r.k3_max:.0e} would tell the curves apart")
    noted = getattr(r, "fit_notes", "")  # what the fit said (e.g. why no bootstrap bound could be drawn)
    noted = noted if isinstance(noted, str) else ""  # NaN or absent in tables from before they were kept
    notes = f" ({noted})" if noted else ""
    if r.status == BMD_ABOVE:
        return (f"the fitted cost stays below the BMR up to the largest tested k3 {r.k3_max:.1e}"
                + (f" (the curve reaches it at {r.bmd:.1e} by extrapolation)" if np.isfinite(r.bmd) else "")
                + "; larger doses would place it" + notes)
    if r.status == BMD_BELOW:
        return (f"the fitted cost reaches the BMR more than 10x below the smallest tested k3 {r.k3_min:.1e}; "
                f"smaller doses would place it" + notes)
    if r.status == BMD_NO_FIT:
        return ("no model fits the dose groups' means (BMDS's test 4, p < 0.1, for every model): the outcome does "
                "not fall smoothly with the dose at this noise; more seeds per dose would tell")
    if r.status == BMD_SATURATED:
        return (f"{r.doses} dose(s) beside dose 0: every model has as many parameters as dose groups, so no fit can "
                f"be tested; 2 doses at least (4 to rule out the dose scale)")
    if r.status.startswith(BMD_NO_BENCHMARK):  # "no benchmark (why)" where the data could not be fitted at all
        why = r.status[len(BMD_NO_BENCHMARK):].strip()
        return f"the data cannot be fitted {why}" if why else "the clean run gained nothing to lose over the " \
                                                               "initial policy (no benchmark response)"
    if r.status == BMD_NOT_BOUNDED:  # the fit's notes say why (tables from before they were kept: the usual reason)
        bmd = getattr(r, "bmd", float("nan"))
        at = f" (the point BMD is {bmd:.1e})" if isinstance(bmd, float) and np.isfinite(bmd) else ""
        return (f"no finite bound{at}: {noted}" if noted
                else f"the bootstrap put the BMD beyond the tested doses too often for a finite bound{at}")
    return r.status


def below_doses(r) -> bool:
    """A row whose BMD lies below its smallest tested dose (`benchmarks.keep_below` quotes no level there)."""
    bmd, k3_min = getattr(r, "bmd", float("nan")), getattr(r, "k3_min", float("nan"))
    return bool(np.isfinite(bmd) and np.isfinite(k3_min) and bmd < k3_min)


def short_reason(r) -> str:
    """Why a row gives no level, in a few words (the index's answer line)."""
    if r.status == BMD_BOUNDED:
        if getattr(r, "doses", MIN_DOSES) < MIN_DOSES:
            return f"{r.doses} doses"
        return "its BMD below the tested doses" if below_doses(r) else "the dose scale decides it"
    return r.status


def fitted_seeds(r) -> str:
    """"; fitted on S seeds at dose 0 and n_1/.../n_J at its doses" where a row's dose groups have unequal seeds (a
    second pass extended some of them), else "" (every group the same seeds, or a table from before this was kept)."""
    ds = getattr(r, "dose_seeds", None)
    if not isinstance(ds, str) or not ds or set(ds.split()) == {str(int(r.seeds))}:
        return ""
    return f"; fitted on {int(r.seeds)} seeds at dose 0 and {ds.replace(' ', '/')} at its doses"


def benchmark_line(r, bmr_fraction: float) -> str:
    """One bullet for a (kind, PPO regime, horizon, arm) benchmark row of notebook 08 (`benchmarks.benchmark_table`):
    "keep k3 below X" with its BMD and BMDU where the row is `quotable`, else why not and the design that would
    answer; the trend across doses beside it (slope of the paired gap per decade of k3, 95% interval, Holm p in the
    study's one family)."""
    head = f"- {r.name}, `{r.arm}`: "
    trend = (f"trend {r.trend_slope:+.3f} per decade of k3 [{r.trend_ci_low:+.3f}, {r.trend_ci_high:+.3f}], "
             f"Holm p {r.trend_p_holm:.2g}" if np.isfinite(r.trend_slope) else "no trend test (fewer than 2 doses "
                                                                             "or seeds)")
    if quotable(r):
        return (head + f"**keep k3 below {metric('k3', r.keep_below, '.1e')}** (BMDL, the lower of the linear and "
                f"log dose scales'; linear-scale BMD {r.bmd:.1e}, BMDU {r.bmdu:.1e}: where the model-average curve "
                f"loses {bmr_fraction:.0%} of the clean gain, {r.bmr:.3f}; models passing: "
                f"{r.models_passing.replace(',', ', ')}{fitted_seeds(r)}); {trend}.")
    return head + f"no level to quote: {benchmark_reason(r)}; {trend}."


# where a benchmark row's baseline noise comes from, spelled as `benchmarks.MEASURED` / `BOUND` spell it (the wording
# imports no analysis module; test_the_wording_knows_every_benchmark_status_the_estimator_gives holds them equal)
SE_MEASURED, SE_BOUND = "measured", "binomial bound"


def baseline_noise_words(bench) -> str:
    """How the bounds treat the initial policy's outcome (the baseline the clean gain is measured from): one
    measurement, its sampling noise drawn in every bootstrap resample, at its standard error measured from the
    scored problems' repeated draws or at the binomial upper bound, whichever the benchmark table carries
    (`benchmarks.baseline_se`), else left out."""
    head = "the initial policy's outcome is one measurement"
    sources = bench.get("baseline_se_source")
    if sources is None:  # a table analysed before the source was kept: the bound where it has a noise at all
        se = bench.get("baseline_se")
        if se is None:
            return head + ", its noise not in the bounds"
        sources = (se.fillna(0) > 0).map({True: SE_BOUND, False: ""})
    said = []
    if (sources == SE_MEASURED).any():
        se = bench.loc[sources == SE_MEASURED, "baseline_se"].iloc[0]
        said.append(f"its standard error measured from each scored problem's repeated draws ({se:.3f})")
    if (sources == SE_BOUND).any():
        said.append("its binomial upper bound (so this part of the bounds' width is if anything overstated)")
    if not said:
        return head + ", its noise not in the bounds"
    shared = ("; the trained policies are scored with one shared sampling seed, whose common noise no resample over "
              "seeds holds")
    return head + ", its sampling noise drawn in every resample at " + " or ".join(said) + shared


def below_initial_line(table) -> str:
    """The rows whose trained policy ends below the untrained one in the tested outcome (its upper 95% limit over
    seeds under the initial policy's): a dose that does not just slow learning but undoes it; "" where none."""
    if "below_initial" not in table:
        return ""
    rows = table[table["below_initial"].fillna(False).astype(bool)]
    if rows.empty:
        return ""
    said = "; ".join(f"{r.label} `{r.arm}` {getattr(r, r.outcome):.3f}" for r in rows.itertuples())
    return (f"**Ends below where it started** (the trained policy's {rows['outcome'].iloc[0].replace('_', ' ')}, "
            f"its mean over seeds, listed where its upper 95% limit over seeds lies below the initial policy's "
            f"{rows['initial_outcome'].iloc[0]:.3f}): {said}.")


def placebo_line(metrics: dict) -> str:
    """Notebook 08's placebo rows (the clean run again on an independent stream of sampling seeds, same prompts,
    inside the Holm family): how often the tests call a cost or gain where there is none, over the independent
    streams, with the rate's 95% interval (exact for independent streams; `stats.shared_control_rate_ci` for streams
    sharing their clean runs); "" without placebo rows."""
    if "placebo/rows" not in metrics:
        return ""
    n, rows = int(metrics.get("placebo/streams", metrics["placebo/rows"])), int(metrics["placebo/rows"])
    fp, fph = metrics["placebo/false_positive_rate"], metrics["placebo/false_positive_rate_holm"]

    def ci(name):
        lo, hi = metrics.get(f"placebo/{name}_ci_low"), metrics.get(f"placebo/{name}_ci_high")
        return f" [{lo:.0%}, {hi:.0%}]" if lo is not None and np.isfinite(lo) else ""

    ok = fph == 0
    dup = f" ({rows - n} row{'s' if rows - n != 1 else ''} the same run as another, counted once)" if rows > n else ""
    refs = int(metrics.get("placebo/shared_controls", n))  # runs analysed before it was kept: taken as independent
    kind = ("exact 95% intervals" if refs >= n else
            f"95% intervals for {n} streams tested against {'the same' if refs == 1 else refs} clean reference"
            f"{'s' if refs != 1 else ''}: their calls are correlated, so the intervals, from the design's simulated "
            f"null, are wider than {n} independent trials would give")
    return (f"**Placebo** ({n} independent stream{'s' if n != 1 else ''}{dup}: the clean run trained again with an "
            f"independent stream of sampling seeds on the same prompts, tested in the Holm family like every dose): "
            f"false-positive rate {fp:.0%}{ci('false_positive_rate')} at the unadjusted 5% level, "
            f"{fph:.0%}{ci('false_positive_rate_holm')} after Holm ({kind}) "
            + ("(passes: the family calls no cost where there is none; with these streams that bounds its rate after "
               f"Holm only below {metrics.get('placebo/false_positive_rate_holm_ci_high', float('nan')):.0%})."
               if ok else
               "(**fails**: a placebo was called a cost or a gain; sampling noise between runs exceeds what the t "
               "intervals assume, and every verdict of this family is suspect)."))


def sequential_line(metrics: dict, num_seeds: int, max_seeds: int, target_power: float,
                    seed_power: str = "fixed-n", futility_power: float = 0.0) -> str:
    """Notebook 08's sequential seed rule in one sentence (`mismatch_study.sequential`): the rule as declared, and
    each dose row it gave more seeds, from how many to how many, with the power at the BMR before and after (from the
    first pass's spread; "capped" where `max_seeds` stopped short of the target) and the power of the two-look test
    the row gets at those seeds (lower than the fixed-n t test's; the rule sized by one or the other, `seed_power`);
    "" without a second pass. A reanalysis reporting the study's recorded decision (`sequential.reanalysis_decision`)
    says so."""
    if "sequential/rows" not in metrics:
        return ""
    m = int(metrics["sequential/family_tests"])
    recorded = (f" These are the seeds the study trained, as its run recorded them: this code's rule, redone on the "
                f"first pass (a Holm family or a rule changed since), would give "
                f"{int(metrics['sequential/rule_differs'])} row(s), clean twins counted, other seeds."
                if metrics.get("sequential/decision_recorded") else "")
    more, futile = [], []
    for k, n in metrics.items():
        head, _, field = k.rpartition("/")  # sequential/<label>/<arm>/<field>; a label may hold "/"
        if not head.startswith("sequential/") or head.count("/") < 2:
            continue
        label, arm = head[len("sequential/"):].rsplit("/", 1)
        if field == "futile" and n:
            futile.append(f"`{label}` `{arm}`")
        if field == "seeds" and n > num_seeds:
            power = metrics.get(f"sequential/{label}/{arm}/power", float("nan"))
            before = metrics.get(f"sequential/{label}/{arm}/power_first", float("nan"))
            two = metrics.get(f"sequential/{label}/{arm}/power_two_look", float("nan"))
            two = float("nan") if two is None else two
            sized = two if seed_power == "two-look" else power
            if np.isfinite(power):  # a dose row (a clean twin has no power of its own)
                capped = "capped; " if not sized >= target_power else ""
                more.append(f"`{label}` `{arm}` {num_seeds} → {int(n)} ({capped}power {before:.2f} → {power:.2f}"
                            + (f"; {two:.2f} for the two-look test" if np.isfinite(two) else "") + ")")
    return (f"**Seeds** (a sequential rule declared before the run: a first pass of {num_seeds} seeds, then, at each "
            f"benchmark row's doses whose gap interval holds −BMR or that bracket its BMD, the seeds that give "
            f"{target_power:.0%} power to detect a cost of the BMR at α/m = 0.05/{m} from the first pass's sd, at most "
            f"{max_seeds} ("
            + ("the power of the two-look test below" if seed_power == "two-look" else
               "a fixed-n paired t test's power, which the two-look test below falls short of")
            + "); every dose row it may extend tested at two looks, Pocock's boundary on the passes' inverse-normal "
            "combination): " + ("; ".join(more) + ", each with its clean twins; a benchmark fit takes every "
                                                "seed each dose group has" if more else
                                                "no dose row got more") + "."
            + (f" Declared futility bound {futility_power:.0%}: a row called only for its interval stays at "
               f"{num_seeds} seeds where even {max_seeds} would give its test less power; "
               + (f"left there: {', '.join(futile)}." if futile else "none was.") if futility_power > 0 else "")
            + recorded)


# where a declared kind of test confirms, what it needs there (`comparisons.standing`, `contrast_table`)
CONFIRMS_WHERE = {"*": "needs both its rows in the first PPO regime at the study's horizon",
                  "one-sided vs symmetric": "needs a raw-logprob engine point and a symmetric ratio dose within 2x of "
                                            "its k3 in training, same temperature and arm",
                  "regime": "needs a further PPO regime's row in both modes, and the same dose in the first regime",
                  "horizon": "needs a long-horizon row and its long clean twin"}


def untested_confirmations(confirms, con, hz) -> list[str]:
    """The kinds of test the params declared to confirm (`confirms`) that no confirmatory test in the contrasts
    (`con`) or the horizon table (`hz`) stands for: a declared confirmation the data could not make (a contrast
    needs both its rows; one-sided vs symmetric a ratio dose matched to the engine's k3) must be said, since a
    silent absence reads as nothing found."""
    held = set()
    for tab, kind in ((con, "contrast"), (hz, None)):
        if tab is not None and len(tab) and "standing" in tab:
            conf = tab[tab["standing"] == "confirmatory"]
            held |= set(conf[kind]) if kind else ({"horizon"} if len(conf) else set())
    return [c for c in confirms if c not in held]


def regime_words(updates: int, epochs: int) -> str:
    """A PPO regime in words: `4 updates per batch`, or `2 mini-batches x 2 epochs (4 updates) per batch`."""
    if epochs == 1:
        return f"{updates} update(s) per rollout batch" if updates == 1 else f"{updates} updates per batch"
    return f"{updates} mini-batch(es) x {epochs} epochs ({updates * epochs} updates) per batch"


def regime_line(table, first: int | tuple[int, int]) -> str:
    """Notebook 08's further PPO regimes (several policy updates per rollout batch: mini-batches, epochs over the
    batch) in one sentence: which regimes ran and, per regime, the rows whose verdict is a cost; "" with one regime.
    `first`: the first regime's (mini-batches, epochs), or its mini-batches alone (one epoch)."""
    first, table = ((first, 1) if isinstance(first, int) else tuple(first)), table.assign(epochs=table.get("epochs", 1))
    further = sorted({(int(u), int(e)) for u, e in zip(table["updates"], table["epochs"])} - {first})
    if not further:
        return ""
    parts = []
    for u, e in further:
        rows = table[(table["updates"] == u) & (table["epochs"] == e) & (table["kind"] != "clean")
                     & (table["control"] == "")]
        costs = [f"{r.label} `{r.arm}` {r.gap:+.3f} [{r.gap_ci_low:+.3f}, {r.gap_ci_high:+.3f}]"
                 for r in rows.itertuples() if r.verdict == "costs"]
        parts.append(f"{regime_words(u, e)} ({len(rows)} dosed rows, in the same Holm family): "
                     + ("costs shown at " + "; ".join(costs) if costs else "no cost shown at any dose"))
    return (f"**PPO regimes.** Besides {regime_words(*first)}, " + "; ".join(parts)
            + ". With several updates the decoupled ratio leaves 1 (logged as `ratio_abs_log_mean`), so the clip acts "
              "in both modes.")


def contrast_lines(con) -> list[str]:
    """One bullet per paired contrast of notebook 08 (`comparisons.contrast_table`): a difference shown with its
    interval, or a null as a null with its interval and MDE (never "the same")."""
    out = []
    for r in con.itertuples():
        ci = f"{r.diff:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}]"
        tag = f" *({r.standing})*" if getattr(r, "standing", "") else ""
        if r.verdict == "differs":
            side = "better" if r.diff > 0 else "worse"
            out.append(f"- {r.what}{tag}: {side} by {ci} (Holm p {r.p_holm:.2g}).")
        else:
            out.append(f"- {r.what}{tag}: no difference shown, {ci}; MDE {r.mde:.3f} (a difference below it is not "
                       f"ruled out).")
    return out


def horizon_lines(hz, metrics: dict) -> list[str]:
    """One bullet per long-horizon row of notebook 08 (`comparisons.horizon_table`): its gap per block of steps
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
        tag = f" *({d['standing'].iloc[0]})*" if "standing" in d else ""
        out.append(f"- {label} `{arm}`{tag}: {blocks}; {verdict} (change {ch:+.3f}, {which} {pv:.2g})"
                   + (f"; {', '.join(events)}" if events else "; no collapse seen") + ".")
    return out


def paired_gap_text(r) -> str:
    """A row's paired gap to its clean twin with its 95% interval, then the same for the trained policy's own greedy
    accuracy (a dose or point row)."""
    return (f"{r.gap:+.3f} [{r.gap_ci_low:+.3f}, {r.gap_ci_high:+.3f}], own greedy accuracy "
            f"{r.heldout_gap:+.3f} [{r.heldout_gap_ci_low:+.3f}, {r.heldout_gap_ci_high:+.3f}]")


def dose_answer_lines(metrics: dict, table, dosed, arms) -> list[str]:
    """One bullet per (dosed kind, arm): the doses at which a cost is shown (each row's own test, Holm
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
    """One bullet per real engine point (not the controls): its measured k3 and its cost per arm."""
    out = []
    pts = table[(table["kind"] == "engine") & (table["control"] == "")]
    for label, d in pts.groupby("label", sort=False):
        arms = "; ".join(f"`{r.arm}` {paired_gap_text(r)} ({r.verdict})" for r in d.itertuples())
        out.append(f"- `{label}` (k3 {metric('k3', d['k3_achieved'].mean(), '.1e')}, "
                   f"{'raw' if d['raw_logprobs'].iloc[0] else 'processed'} logprobs): {arms}.")
    return out


def dose_control_lines(metrics: dict, table, arms) -> list[str]:
    """The study's controls, each with whether it passes and what a failure means."""
    ctl = []
    for a in arms:
        if f"clean/{a}/reward_gain" not in metrics:
            continue
        g, lo = metrics[f"clean/{a}/reward_gain"], metrics[f"clean/{a}/reward_gain_ci_low"]
        ok = np.isfinite(lo) and lo > 0
        ctl.append(f"clean `{a}` learns: reward {g:+.3f} [{lo:+.3f}, {metrics[f'clean/{a}/reward_gain_ci_high']:+.3f}] "
                   + ("(passes)" if ok else "(**fails**: with no gain to lose, a cost cannot be measured here)"))
    blind = table[table["control"].str.endswith("-blind")] if len(table) else table
    for (kind, arm), rows in blind.groupby(["kind", "arm"], sort=False):  # an arm the kind's dose cannot reach
        ok = bool((rows["verdict"] == "null (passes)").all())
        ctl.append(f"`{arm}` under {kind} mismatch trains bitwise as its clean run at every dose (every seed's "
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


def answer_line(first: str, bench, contrasts, bullets: list[str]) -> str:
    """`CostResult.answer`'s text: the contrast a follow-up run exists for, the tolerable k3 of arm `first` per kind
    (`bench`: the benchmark rows of the first PPO regime at the study's horizon) and every other arm's level where it
    has one, then the dose-by-dose verdicts of that arm (all arms' when it has none)."""
    parts = []
    if len(contrasts) and "contrast" in contrasts:
        for r in contrasts[contrasts["contrast"] == "one-sided vs symmetric"].itertuples():
            parts.append(f"One-sided ({r.label}) vs symmetric ratio error at matched k3, `{r.arm}`: "
                         + (f"{'worse' if r.diff < 0 else 'better'} by {r.diff:+.3f} (Holm p {r.p_holm:.2g})."
                            if r.verdict == "differs" else f"no difference shown ({r.diff:+.3f}, MDE {r.mde:.3f})."))
    if len(bench) and "status" in bench:
        rows = bench[bench["arm"] == first]
        said = [f"{r.kind} < {r.keep_below:.1e} (BMD {r.bmd:.1e})" if quotable(r) else
                f"{r.kind} no level ({short_reason(r)})" for r in rows.itertuples()]
        if said:
            parts.append(f"Tolerable k3 for `{first}` (BMDL): " + "; ".join(said) + ".")
        # the other arms' levels too, where they have one: a run may exist for them (a bracketing run of decoupled
        # and TIS, whose first arm trains only its stale rows)
        others = [f"`{r.arm}` {r.kind} < {r.keep_below:.1e}" for r in bench[bench["arm"] != first].itertuples()
                  if quotable(r)]
        if others:
            parts.append("Other arms' levels: " + "; ".join(others) + ".")
    parts += [b for b in bullets if f"`{first}`" in b] or bullets
    return " ".join(parts)


def conclusion(metrics: dict, table, regimes, first: tuple, p, bench, con, hz, *, words: dict[str, str], answer_rows,
               doses, kinds: list[dict]) -> str:
    """Notebook 08's conclusion. `table`: the rows of the first PPO regime (`first`: updates, epochs) at the study's
    horizon; `regimes`: every row; `answer_rows`: the rows the dose-by-dose answer reads; `doses`: the first arm's
    rows with each ratio dose's noise `sigma` and whether it was `achieved`; `words`: the tested `outcome`, the
    `timing` note, the `heldout` and `probe` problem sets, in words; `kinds`: the kinds of dose, in order, each as
    `doses_text` reads it."""
    temps = sorted(set(table["temperature"]))
    lines = [f"**Setup.** Base engine `{p.engines[0]}` ({p.dtype}), {p.steps} steps × {p.prompts_per_step} prompts × "
             f"{p.group_size} completions, T={p.temperature:g}"
             + (f" (points also at T = {', '.join(f'{t:g}' for t in temps if t != p.temperature)})"
                if len(temps) > 1 else "")
             + f", lr={p.lr:g}, {p.num_seeds} seeds paired across every arm and dose (same initial weights, prompts, "
             f"sampling seeds and noise). Cost = {words['outcome']} minus the same arm's "
             f"clean run at the same temperature, seed by seed, with a 95% t interval; a cost is a t test of that gap "
             f"(the outcome's rounding step in its variance), Holm-corrected in **one family** of "
             f"{family_text(metrics)} (controls apart, tested alone); MDE = the smallest cost these seeds detect "
             f"with 80% power at α/m, the family's strictest level (noncentral t). "
             f"{words['timing']}"]
    seq = sequential_line(metrics, p.num_seeds, getattr(p, "max_seeds", 0), getattr(p, "target_power", 0.8),
                          getattr(p, "seed_power", "fixed-n"), getattr(p, "futility_power", 0.0))
    if seq:
        lines.append(seq)
    lines += floor_lines(metrics)
    lines.append("**Answer.** Where training measurably degrades, per kind of mismatch and arm:\n"
                 + "\n".join(dose_answer_lines(metrics, answer_rows, [k["name"] for k in kinds], p.arm_labels)))
    if bench is not None and len(bench):
        lines.append(f"**Tolerable mismatch** (benchmark dose by EPA's and EFSA's conventions, "
                     f"docs/benchmark_dose.md: per kind, PPO regime and arm, each seed's tested outcome at dose 0 "
                     f"(its clean run) and at every dose; dose = the k3 the dose gives the policy the run starts "
                     f"from (`k3_initial`: before any update, or for a lag after its first whole lag, per arm); "
                     f"linear, power, exponential and Hill models anchored at dose 0, "
                     f"test of fit (p < 0.1 fails), saturated fits never a bound, Akaike model average; BMR = "
                     f"{p.bmr_fraction:.0%} of the fitted clean gain over the initial policy; BMDL/BMDU one-sided 95% "
                     f"from a bootstrap over seeds that redraws each seed's clean run with its dosed runs (within "
                     f"the seeds run at the same doses, each pattern of doses drawn within itself: every resample "
                     f"keeps each dose's count), the lowest "
                     f"of the average's and every passing model's, each row alone (no adjustment across rows); a level "
                     f"is quoted only where the row has {MIN_DOSES} doses or more, the BMD lies inside them and the "
                     f"log dose scale agrees; {baseline_noise_words(bench)}; trend "
                     f"p's are Holm-adjusted in the study's one family):\n"
                     + "\n".join(benchmark_line(r, p.bmr_fraction) for r in bench.itertuples()))
    below = below_initial_line(regimes)
    if below:
        lines.append(below)
    plc = placebo_line(metrics)
    if plc:
        lines.append(plc)
    reg = regime_line(regimes, first) if "updates" in regimes else ""
    if reg:
        lines.append(reg)
    if con is not None and len(con):
        lines.append("**Contrasts** (each a per-seed difference of two rows' gaps, 95% t interval, Holm p in the "
                     "study's one family; corrections against the uncorrected decoupled arm `none@trainer`, not "
                     "against bypass; `regime`: the bypass-vs-decoupled contrast under several updates per batch "
                     "minus under one, seed by seed; *confirmatory*: declared before the run, in params "
                     "`confirms`, and run on fresh seeds; *exploratory*: every other):\n"
                     + "\n".join(contrast_lines(con)))
    untested = untested_confirmations(getattr(p, "confirms", []), con, hz)
    if untested:
        lines.append("**Declared to confirm, not tested in these data** (params `confirms`): "
                     + "; ".join(f"`{c}` ({CONFIRMS_WHERE.get(c, CONFIRMS_WHERE['*'])})" for c in untested)
                     + ". These runs hold no test of that kind where it confirms: the confirmation is missing, not "
                       "null.")
    if hz is not None and len(hz):
        lines.append(f"**Horizon** ({p.long_steps} steps; the training reward's gap to the long clean run per block "
                     f"of {p.steps} steps, 95% interval over seeds; change = last block minus first, paired t test, "
                     f"Holm p in the study's one family):\n" + "\n".join(horizon_lines(hz, metrics)))
    pts = engine_point_lines(table)
    if pts:
        lines.append("**Real engines on the same axes** (paired to the clean run at their temperature):\n"
                     + "\n".join(pts))
    ctl = dose_control_lines(metrics, table, p.arm_labels)
    if ctl:
        lines.append("**Controls.** " + "; ".join(ctl) + ".")
    lines.append("**Doses achieved** (mean k3 per token over steps and seeds, first arm). " + doses_text(doses, kinds))
    lines.append(f"Each gap above is the tested outcome ({words['outcome']}); after it, the trained "
                 f"policy's own greedy accuracy on {words['heldout']} (no engine in "
                 f"between). The final training reward (what the run's engine sampled: under a distribution dose not "
                 f"the trained policy's) is the secondary outcome, `train_gap` in the table" + lag_text(table) + ".")
    lines.append("`kl_to_clean`: mean KL per token from the clean twin's trained policy (same arm and seed, dose 0) to "
                 f"this run's, on a fixed probe of {words['probe']} with their correct "
                 "answers: what a dose did to the policy whether or not reward shows it.")
    return "\n\n".join(lines)


def family_text(metrics: dict) -> str:
    """The study's one Holm family in words: how many tests of each part."""
    if "family/tests" not in metrics:
        return "every dosed row that is not a control (placebo rows included)"
    parts = [(metrics.get(f"family/{k}", 0), w) for k, w in (("rows", "dosed rows and points (placebo rows "
                                                                       "included)"), ("trends", "trend tests"),
                                                              ("contrasts", "contrasts"), ("horizon", "horizon tests"))]
    return f"{int(metrics['family/tests'])} tests: " + ", ".join(f"{int(n)} {w}" for n, w in parts if n)


def outcome_text(outcome: str, p, heldout: str, final_frac: float) -> str:
    """The tested outcome in words (`heldout`: the held-out problems in words; `final_frac`: the share of the last
    steps the final training reward averages)."""
    if outcome == "policy_reward":
        return (f"the trained policy's reward on {heldout}, "
                f"{p.policy_samples} sample{'s' if p.policy_samples != 1 else ''} each at T={p.temperature:g} from "
                f"the clean base engine `{p.engines[0]}` ({p.dtype}) holding the trained weights unperturbed, for "
                f"every row, engine points and other temperatures included (no dose between the policy and its "
                f"reward)")
    return f"the final training reward (last {final_frac:.0%} of steps)"


def lag_text(table) -> str:
    """The bias a stale engine's lag alone puts into the training reward: k x the clean run's late reward slope
    (`lag_bias`, set on the rows of a kind whose dose is a lag)."""
    st = table[table["lag_bias"].notna()] if "lag_bias" in table else table.iloc[:0]
    if st.empty:
        return ""
    return (f"; on {' / '.join(dict.fromkeys(st['kind']))} rows it is biased by the lag alone (k × the clean run's "
            "late reward slope per step): "
            + ", ".join(f"{r.label} `{r.arm}` {r.lag_bias:+.3f} (training-reward gap {r.train_gap:+.3f})"
                        for r in st.itertuples()))


def doses_text(first, kinds: list[dict]) -> str:
    """The doses as intended and as measured, kind by kind (`first`: the first arm's rows, each intended-k3 dose with
    its noise's `sigma` (NaN where its kind draws none) and whether it was `achieved`; `kinds`: each kind's `name`,
    `title`, whether a dose is an `intended_k3`, and its doses in words: `intended_words` before an intended kind's
    doses, `dose_words` for one dose of a measured kind)."""
    parts = []
    for k in kinds:
        d = first[first["kind"] == k["name"]]
        if not len(d):
            continue
        title = k["title"][0].upper() + k["title"][1:]
        if not k["intended_k3"]:
            parts.append(f"{title}: " + ", ".join(
                f"{k['dose_words'].format(r.dose)} → k3 {metric('k3', r.k3_achieved, '.2e')}" for r in d.itertuples())
                + ".")
            continue
        parts.append(f"{k['intended_words'] or title}: "
                     + ", ".join(f"{metric('k3', r.k3_intended, '.1e')} → {metric('k3', r.k3_achieved, '.2e')} ("
                                 + (f"σ {r.sigma:.3f}, " if np.isfinite(r.sigma) else "")
                                 + f"mean log r {-r.k1_achieved:+.3f})" for r in d.itertuples()) + ".")
        off = [r for r in d.itertuples() if not r.achieved]
        if off:
            parts.append("**Warning: dose not achieved** (measured k3 outside [0.5, 2] × intended): "
                         + ", ".join(f"{r.label} {r.k3_achieved:.2e} for {r.k3_intended:.1e}" for r in off)
                         + ". The dose path is wrong, not the engine.")
    return " ".join(parts) or "No doses in this run."


def scoring_words(metrics: dict) -> str:
    """What the run's scoring adds to its gaps and what more draws would buy (`mismatch_study.scoring_noise`'s
    `scoring/*` metrics), or why this run cannot say."""
    if "scoring/draws" not in metrics:
        return ("This run kept no scores by draw index for every run (`policy_samples` below 2, or runs trained "
                "before they were kept): its scoring noise is not measured here.")
    s = int(metrics["scoring/draws"])
    ks = sorted(int(k.split("/")[1][1:]) for k in metrics if k.startswith("scoring/k") and k.endswith("/gap_sd"))
    sd = ", ".join(f"{metrics[f'scoring/k{k}/gap_sd']:.3f} at {k}" for k in ks)
    out = [f"**Scoring** ({s} draws a held-out problem, each draw's seed the same in every run): the dose rows' gap "
           f"sd over seeds (each to its clean twins; placebo and rerun rows left out), recomputed from k of the "
           f"draws, is {sd}."]
    if "scoring/k2/value_ratio" in metrics:
        best = max(ks, key=lambda k: metrics[f"scoring/k{k}/value_ratio"])
        out.append(f"Per second of a run, against the 2 draws the studies of record scored, {s} draws give "
                   f"{metrics[f'scoring/k{s}/value_ratio']:.2f}x the information (variance "
                   f"{metrics[f'scoring/k{s}/variance_ratio']:.2f}x lower, time "
                   f"{metrics[f'scoring/k{s}/time_ratio']:.2f}x); the best k here is {best} "
                   f"({metrics[f'scoring/k{best}/value_ratio']:.2f}x).")
    out.append(f"The draws' noise common to every run is sd {metrics['scoring/common_sd']:.4f} in a clean run's "
               f"outcome (F test p {metrics['scoring/common_p']:.2g}), beside a run's own scoring noise "
               f"{metrics['scoring/run_scoring_sd']:.4f} and the policies' spread {metrics['scoring/policy_sd']:.4f}.")
    if np.isfinite(metrics.get("scoring/gain_sd_k2", float("nan"))):
        out.append(f"The clean runs' gain over the initial policy, recomputed from each pair of draws, moves by sd "
                   f"{metrics['scoring/gain_sd_k2']:.4f} (the clean runs and the initial policy drawn on the same "
                   f"seeds; the bounds hold the initial policy's measured noise as the baseline's).")
    if "scoring/gap_common/pooled/sd_k2" in metrics:
        out.append(f"What of it a dose row's mean gap keeps, common to the row's seeds and so in no interval over "
                   f"them: sd {metrics['scoring/gap_common/pooled/sd_k2']:.4f} at 2 draws (pooled over the rows, F "
                   f"test p {metrics['scoring/gap_common/pooled/p']:.2g}), against the rows' se over seeds "
                   f"{metrics['scoring/gap_common/pooled/se_seeds_k2']:.4f}.")
    if "scoring/dispersion/ratio" in metrics:
        d = {k: metrics[f"scoring/dispersion/{k}"] for k in ("ratio", "low", "high", "p", "runs")}
        out.append(f"The outcome's standard error takes the draws as independent: over the {int(d['runs'])} distinct "
                   f"policies their draw-index means vary {d['ratio']:.2f}x [{d['low']:.2f}, {d['high']:.2f}] as "
                   f"much as it says (p {d['p']:.2g}), a score's sd {np.sqrt(d['low']):.2f}-{np.sqrt(d['high']):.2f}x "
                   f"its standard error. Every run is scored on the same {s} draw seeds, so that is one set of "
                   f"{s} draws' evidence, however many policies (95% interval from chi2({s - 1}), conservative).")
        if "scoring/dispersion/initial_ratio" in metrics:
            out.append(f"The initial policy's own: {metrics['scoring/dispersion/initial_ratio']:.2f}x (one-sided p "
                       f"{metrics['scoring/dispersion/initial_p']:.2g}; "
                       f"{metrics['scoring/dispersion/initial_p_adjusted']:.2g} as one of the "
                       f"{int(d['runs']) + 1} policies, rank {int(metrics['scoring/dispersion/initial_rank'])}).")
    if "scoring/seed_sets/ratio" in metrics:
        c = {k: metrics[f"scoring/seed_sets/{k}"] for k in ("sets", "ratio", "low", "high", "p", "mean", "sd", "se")}
        out.append(f"On independent seeds (`se_check_sets`): the initial policy scored on {int(c['sets'])} seed sets "
                   f"of {s} draws a problem gives {c['mean']:.4f} with sd {c['sd']:.4f} over the sets, against a "
                   f"standard error of {c['se']:.4f}: {c['ratio']:.2f}x [{c['low']:.2f}, {c['high']:.2f}] the "
                   f"variance it says (95% interval and two-sided p {c['p']:.2g} from chi2({int(c['sets']) - 1})), "
                   f"a score's sd {np.sqrt(c['low']):.2f}-{np.sqrt(c['high']):.2f}x its standard error.")
    return " ".join(out)
