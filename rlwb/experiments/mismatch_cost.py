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

import re
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from rlwb.core.data import tasks, tokenizer
from rlwb.core.measure import dose_response, stats
from rlwb.core.rl.grpo import train
from rlwb.core.rl.grpo_config import GRPOConfig, step_problem_seed
from rlwb.core.rl.mismatch_doses import logprob_noise_sigma
from rlwb.core.scoring.trainer import completion_logprobs, greedy_rewards
from rlwb.engines.worker import reports_raw_logprobs
from rlwb.experiments.base import OnStart, Result
from rlwb.experiments.grpo_grid import (
    FINAL_FRAC,
    edge_steps,
    floor_breaches,
    one_phase,
    reward_gain,
    run_grid,
    timing_note,
)
from rlwb.experiments.wording import (
    dose_answer_lines,
    dose_control_lines,
    engine_point_lines,
    floor_lines,
    one_line,
)
from rlwb.experiments.wording.mismatch_cost import (
    benchmark_line,
    contrast_lines,
    horizon_lines,
    placebo_line,
    regime_line,
)
from rlwb.formatting import metric

DOSED = ("ratio", "weights", "stale")  # kinds with a numeric dose, in the order the report shows them
KINDS = {"ratio": "ratio mismatch (reported logprobs off, sampling right)",
         "weights": "distribution mismatch (engine samples with perturbed weights)",
         "stale": "distribution mismatch (engine samples with weights some updates behind)",
         "engine": "a real engine setting (notebooks 01/06), placed on the axes by its measured k3"}
DOSE_UNIT = {"ratio": "intended k3", "weights": "relative weight noise", "stale": "updates behind"}


@dataclass(frozen=True)
class Job:
    """One GRPO run: which mismatch (`kind` and `dose`, or a real engine `point`), which arm, which seed, on which
    engine and at which temperature. Its clean twin is the clean run of the same arm and seed at the same
    temperature."""

    kind: str  # clean | ratio | weights | stale | engine | placebo | rerun
    dose: float  # intended k3 (ratio), relative weight noise (weights), updates behind (stale); 0 clean; NaN engine
    arm: str
    seed: int
    engine: str
    temperature: float
    label: str  # the row's name in tables and metric keys: clean, clean@T0.5, ratio@0.01, vllm-v1@T0.5, rerun,
    # placebo, and in a further PPO regime the label + `+ppo<updates>` (clean+ppo4, ratio@1+ppo4)
    updates: int = 1  # policy updates per rollout batch (the PPO regime)
    stream: int = 0  # sampling-seed stream: 0, or 1 for a placebo (the clean run with independent sampling)
    steps: int = 0  # the run's GRPO steps: 0 the study's `steps`, else `long_steps` (label + `+long`)

    @property
    def twin(self) -> tuple[float, int, int, str, int]:
        return self.temperature, self.updates, self.steps, self.arm, self.seed

    @property
    def name(self) -> str:
        """What its files in the job store are named by (`job_store.job_key`: with a hash of every field)."""
        return f"{self.label}.{self.arm}.s{self.seed}"


@dataclass
class CostResult(Result):
    curves: pd.DataFrame  # one row per (label, arm, seed, step): notebook 03's columns
    doses: pd.DataFrame  # one row per (label, arm): achieved k3, outcomes, paired gaps with CIs, MDE, verdict
    # one row per (kind, PPO regime, arm): the trend across doses and the benchmark dose (`benchmark_table`)
    benchmarks: pd.DataFrame = field(default_factory=pd.DataFrame)
    # one row per paired contrast the conclusion states (`contrast_table`)
    contrasts: pd.DataFrame = field(default_factory=pd.DataFrame)
    # one row per long-horizon row and block of steps: the training-reward gap's trajectory (`horizon_table`)
    horizon: pd.DataFrame = field(default_factory=pd.DataFrame)

    def frames(self) -> dict[str, pd.DataFrame]:
        return {"curves": self.curves, "doses": self.doses, "benchmarks": self.benchmarks,
                "contrasts": self.contrasts, "horizon": self.horizon}

    def summary(self) -> pd.DataFrame:
        cols = ["kind", "label", "arm", "k3_achieved", "reward_final", "gap", "gap_ci_low", "gap_ci_high", "mde",
                "verdict", "train_gap", "heldout_gap", "auc_gap", "entropy_gap", "kl_to_clean", "clip_frac"]
        return self.doses[~self.doses["kind"].isin(["clean", "rerun"])][cols].set_index(["kind", "label", "arm"])

    def conclusion(self) -> str:
        return conclusion(self.metrics, self.doses, self.params, self.benchmarks, self.contrasts, self.horizon)

    def answer(self) -> str:
        """The finding first, in one line (the index's answer column): the one-sided vs symmetric contrast where the
        run has one, then the first arm's tolerable k3 per kind (its BMDL, or why there is none), then the first
        arm's verdict per kind of mismatch."""
        return one_line(answer_line(self.params.arm_labels[0], self.benchmarks, self.contrasts,
                                    [b[2:] for b in dose_answer_lines(self.metrics, first_regime(self.doses), DOSED,
                                                                      self.params.arm_labels)]), limit=400)


def answer_line(first: str, bench: pd.DataFrame, contrasts: pd.DataFrame, bullets: list[str]) -> str:
    """`CostResult.answer`'s text: the contrast a follow-up run exists for, the tolerable k3 of arm `first` per kind
    (first PPO regime, study horizon), then the dose-by-dose verdicts of that arm (all arms' when it has none)."""
    parts = []
    if len(contrasts) and "contrast" in contrasts:
        for r in contrasts[contrasts["contrast"] == "one-sided vs symmetric"].itertuples():
            parts.append(f"One-sided ({r.label}) vs symmetric ratio error at matched k3, `{r.arm}`: "
                         + (f"{'worse' if r.diff < 0 else 'better'} by {r.diff:+.3f} (Holm p {r.p_holm:.2g})."
                            if r.verdict == "differs" else f"no difference shown ({r.diff:+.3f}, MDE {r.mde:.3f})."))
    if len(bench) and "status" in bench:
        rows = dose_response.first_regime_benchmarks(bench)
        rows = rows[rows["arm"] == first]
        said = {dose_response.BOUNDED: lambda r: f"{r.kind} < {r.bmdl:.1e}",
                dose_response.BELOW_RANGE: lambda r: f"{r.kind} below the smallest dose ({r.k3_min:.1e})",
                dose_response.NOT_BOUNDED: lambda r: f"{r.kind} no bound up to {r.k3_max:.1e}"}
        keep = [said[r.status](r) for r in rows.itertuples() if r.status in said]
        if keep:
            parts.append(f"Tolerable k3 for `{first}` (BMDL): " + "; ".join(keep) + ".")
    parts += [b for b in bullets if f"`{first}`" in b] or bullets
    return " ".join(parts)


def jobs(p) -> list[Job]:
    """Every run: each arm clean (dose 0) at the notebook's temperature (and at every other temperature a point
    uses, the arms of the points there), at every dose of each kind, each point engine with `point_arms`, the
    placebo arms' clean runs again on an independent sampling-seed stream (same prompts), and the first clean run
    again (the reproducibility control), all in the first PPO regime (`updates_per_batch[0]`); a row named in
    `row_arms` trains only the arms listed there. Each further regime trains `regime_arms` (every arm if empty)
    clean and at `regime_doses` (every dose if empty). Clean runs first, so dosed runs find their twins' policies
    ready."""
    base, T = p.engines[0], p.temperature
    u0, further = p.updates_per_batch[0], p.updates_per_batch[1:]
    doses = [(kind, float(d), f"{kind}@{d:g}") for kind, values in (("ratio", p.ratio_k3),
                                                                  ("weights", p.weight_noise),
                                                                  ("stale", p.stale_steps)) for d in values]
    points = [(e, t, p.arms_of(entry, p.point_arm_labels)) for entry, (e, t) in zip(p.engine_points, p.points)]
    out = [Job("clean", 0.0, a, s, base, T, "clean", u0) for a in p.arm_labels for s in p.seeds]
    for t in dict.fromkeys(t for _, t, _ in points if t != T):  # the points' own temperatures: their arms only
        used = {a for _, pt, arms in points if pt == t for a in arms}
        out += [Job("clean", 0.0, a, s, base, t, clean_label(t, T), u0) for a in p.arm_labels if a in used
                for s in p.seeds]
    regime_arms = [a for a in p.arm_labels if not p.regime_arms or a in {p._label(r) for r in p.regime_arms}]
    out += [Job("clean", 0.0, a, s, base, T, "clean" + regime_suffix(u, u0), u) for u in further
            for a in regime_arms for s in p.seeds]
    out += [Job(kind, d, a, s, base, T, label, u0) for kind, d, label in doses
            for a in p.arms_of(label, p.arm_labels) for s in p.seeds]
    out += [Job(kind, d, a, s, base, T, label + regime_suffix(u, u0), u) for u in further
            for kind, d, label in doses if not p.regime_doses or label in p.regime_doses
            for a in regime_arms for s in p.seeds]
    out += [Job("engine", float("nan"), a, s, e, t, point_label(e, t, T), u0) for e, t, arms in points
            for a in arms for s in p.seeds]
    out += [Job("placebo", 0.0, a, s, base, T, "placebo", u0, stream=1) for a in p.placebo_arm_labels
            for s in p.seeds]
    if p.long_steps:  # the long horizon: its own clean twins, first regime only
        long_arms = [a for a in p.arm_labels if not p.long_arms or a in {p._label(r) for r in p.long_arms}]
        out[:0] = [Job("clean", 0.0, a, s, base, T, "clean" + LONG, u0, steps=p.long_steps) for a in long_arms
                   for s in p.seeds]
        out += [Job(kind, d, a, s, base, T, label + LONG, u0, steps=p.long_steps) for kind, d, label in doses
                if label in p.long_doses for a in long_arms for s in p.seeds]
    first = next(j for j in out if j.steps == 0)
    return out + [replace(first, kind="rerun", label="rerun")]


LONG = "+long"  # what a long-horizon row's label gains


def first_regime(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of the first PPO regime at the study's horizon: the dose-by-dose answer reads these, so that a
    `+ppo<k>` or `+long` row of the same dose never stands in for the largest dose."""
    label = table["label"].astype(str)
    return table[~label.str.contains("+ppo", regex=False) & ~label.str.contains(LONG, regex=False)]


def regime_suffix(updates: int, first: int) -> str:
    """What a row's label gains in a further PPO regime: `+ppo<updates>` (none in the first regime)."""
    return "" if updates == first else f"+ppo{updates}"


def clean_label(t: float, base_t: float) -> str:
    return "clean" if t == base_t else f"clean@T{t:g}"


def point_label(engine: str, t: float, base_t: float) -> str:
    return engine if t == base_t else f"{engine}@T{t:g}"


def config(p, job: Job) -> GRPOConfig:
    corr, _, mode = job.arm.partition("@")
    dose = {job.kind: job.dose}
    cfg = GRPOConfig.from_settings(p, correction=corr, seed=job.seed, logprob_noise_k3=dose.get("ratio", 0.0),
                                   engine_weight_noise=dose.get("weights", 0.0),
                                   engine_lag=int(dose.get("stale", 0)))
    return replace(cfg, old_logprobs=mode, temperature=job.temperature, updates_per_batch=job.updates,
                   sampling_stream=job.stream, steps=job.steps or p.steps)


def run(params, model_path, *, on_start: OnStart = None, progress: bool = True, store=None) -> CostResult:
    """Every job from the same initial weights (`grpo_grid.run_grid`): the base engine's jobs first, then each
    point engine's. Every run's tested outcome is sampled by a clean engine (`CleanScorer`). The analysis is
    `analyze`, a function of the curves alone (every per-run number it needs is a column of them).

    With `store` (the run's job store, `archive.Run.jobs()`) each job is kept the moment it finishes, so an
    interrupted study keeps its finished jobs; in a run that resumes one (`rlwb run --resume-from`) the store offers
    that run's finished jobs, which are reused instead of trained again (`reuse`). Jobs are seeded and independent,
    so a resumed study's curves are the uninterrupted study's, bar the wall-time columns."""
    p = params
    todo = jobs(p)
    engines = list(dict.fromkeys(j.engine for j in todo))
    order = [j for e in engines for j in todo if j.engine == e]  # run_grid's order: engine by engine
    kl, raw = TwinKL(todo, store), {}
    start: dict[str, float] = {}  # the initial policy's outcomes, measured once (`initial_outcomes`)
    done: dict[Job, pd.DataFrame] = {}
    reused = reuse(store, todo, kl, start, done) if store is not None and store.resuming else []
    if store is not None:
        store.start(len(todo))
    if on_start and reused:
        for info in reused_engines(store, todo, done):
            on_start(info)
    codec = tokenizer.PromptCodec(model_path, p.chat_template)
    probe = probe_batch(codec, p)
    heldout, _ = held_out(p, HELDOUT_PROBLEMS, HELDOUT_SEED)
    scorer = CleanScorer(p.engines[0], model_path, p.dtype, on_start)
    start_lock, done_lock = threading.Lock(), threading.Lock()
    from rlwb.progress import progress_bar

    bar = progress_bar(total=len(todo), initial=len(done), desc="jobs (reused: done)" if done else "jobs",
                       disable=not progress)

    def one_run(m, engine, job: Job, initial, should_stop) -> pd.DataFrame:
        t0 = time.time()
        with start_lock:
            if not start and job.engine == scorer.preset:
                start.update(initial_outcomes(m, engine, initial, codec, heldout, p))
                if store is not None:
                    store.put_shared("start", start)
        df = train(m, engine, config(p, job), initial, progress=progress,
                   desc=f"{job.label} {job.arm} seed {job.seed}", codec=codec, on_step=lambda _res: should_stop())
        with torch.no_grad():  # the trained policy's sampling distributions on the fixed probe
            full = completion_logprobs(m, probe, p.temperature, full=True)["full"].float().cpu()
        kl.add(job, full)
        df["heldout_greedy_acc"] = float(greedy_rewards(m, codec, heldout, p.max_tokens).mean())
        if p.policy_samples:
            df["policy_reward"] = scorer.policy_reward(m, job, engine, codec, heldout, p)
            df["outcome_engine"], df["outcome_temperature"] = scorer.preset, p.temperature
        for i, (k, v) in enumerate((("kind", job.kind), ("label", job.label), ("dose", job.dose),
                                    ("arm", job.arm), ("seed", job.seed), ("temperature", job.temperature),
                                    ("updates", job.updates))):
            df.insert(1 + i, k, v)
        return df.assign(engine=job.engine, stream=job.stream, **start).assign(_wall_s=time.time() - t0)

    def finished(job: Job, df: pd.DataFrame) -> pd.DataFrame:
        wall = float(df.pop("_wall_s").iloc[0])
        df = df.assign(raw_logprobs=raw[job.engine])
        if store is not None:
            df = store.save(job, df, wall)  # read back: a fresh job's frame is what a reused one's is
        with done_lock:
            done[job] = df
            bar.update(1)
        return df

    def plan(w):
        raw[w.preset.name] = reports_raw_logprobs(w.info())
        return one_phase([j for j in todo if j.engine == w.preset.name and j not in done])

    left = list(dict.fromkeys(j.engine for j in todo if j not in done))
    try:
        if left:
            run_grid(p, model_path, left, plan, one_run, on_start=on_start, progress=progress, on_done=finished)
    finally:
        scorer.close()
        bar.close()
    curves = pd.concat([done[j] for j in order], ignore_index=True)
    curves["raw_logprobs"] = curves["raw_logprobs"].astype(bool)
    # each run's KL to its clean twin, known once both finished: a column of the curves, so `analyze` needs no more
    by_run = {(j.label, j.arm, j.seed): v for j, v in kl.values.items()}
    curves["kl_to_clean"] = [by_run.get(k, float("nan")) for k in zip(curves["label"], curves["arm"],
                                                                        curves["seed"])]
    if store is not None:
        store.finish(drop=("probe.pt",))  # every KL is in the curves now
    result = analyze(curves, p)
    result.metrics.update({"resume/reused_jobs": float(len(reused)),
                           "resume/trained_jobs": float(len(todo) - len(reused))})
    return result


def reused_engines(store, todo: list[Job], done: dict) -> list[dict]:
    """The engines no job of this run needs (every job of theirs reused): their records in the run resumed from,
    each tagged `from_run` (the run's record then says which were started here and which were not)."""
    engines = dict.fromkeys(j.engine for j in todo)
    return [info for e in engines if all(j in done for j in todo if j.engine == e) and (info := store.reused_engine(e))]


def reuse(store, todo: list[Job], kl: TwinKL, start: dict, done: dict) -> list[Job]:
    """Take over every job of `todo` the run resumed from finished (`store.offered`) and whose KL to its clean twin
    can be had: its curve into `done`, its KL (or its probe, while the KL waits for its twin) into `kl`, the initial
    policy's outcomes into `start`. A clean run's probe is what its twins' KLs need (a finished study dropped them:
    such a clean run trains again). Returns the jobs reused."""
    start.update(store.shared("start") or {})
    reused = []
    for job in sorted(todo, key=lambda j: j.kind != "clean"):  # clean first: their twins' KLs need them
        have_kl, have_probe = store.offered(job, "kl.json"), store.offered(job, "probe.pt")
        usable = have_probe if job.kind == "clean" else have_kl or have_probe
        if not store.offered(job) or not usable or not start:
            continue
        done[job] = store.take(job)
        if have_kl and job.kind != "clean":
            kl.known(job, store.get_json(job, "kl.json")["kl_to_clean"])
        else:
            kl.add(job, store.get_tensor(job, "probe.pt"))
        reused.append(job)
    return reused


def analyze(curves: pd.DataFrame, p) -> CostResult:
    """Every table, metric and verdict of the study from its curves (`data/curves.parquet` of an archived run)
    and its params: what `run` returns, so an archived run's analysis can be redone without retraining (a
    changed test, a changed BMR). The trained policies are not kept: an outcome not measured in the run (another
    held-out set, another temperature) needs the runs again. Every test of the study is in one Holm family
    (`one_family`)."""
    table = dose_table(curves, p)
    q = outcome_resolution(p, table["outcome"].iloc[0]) if len(table) else 0.0
    bench = benchmark_table(table, curves, dose_metrics(table, curves), p.bmr_fraction)
    con = contrast_table(table, curves, q)
    hz, hm = horizon_table(curves, p.steps, 1.0 / (p.prompts_per_step * p.group_size * p.steps))
    family = one_family(table, bench, con, hm)
    metrics = dose_metrics(table, curves)  # after the family: the rows' verdicts and the placebo's rate are final
    metrics.update(benchmark_metrics(bench))
    metrics.update(contrast_metrics(con))
    metrics.update(hm)
    metrics.update(family)
    return CostResult(p, metrics, curves, table, bench, con, hz)


def one_family(table: pd.DataFrame, bench: pd.DataFrame, con: pd.DataFrame, hm: dict) -> dict[str, float]:
    """One Holm family per study (issue 46): every dosed row and engine point that is not a control (the placebo
    rows included), every trend test across doses, every paired contrast and every long-horizon change test, Holm
    over all m of them at once; a row's or contrast's MDE at alpha / m, the family's strictest level (noncentral t).
    Why one: the conclusion reads them together, and a reader cannot tell which of several families a claim was
    adjusted in; separate families each at 5% would let the study as a whole call a false cost with a probability
    that grows with the number of families. Controls stay outside, tested alone unadjusted (the stricter test for a
    null). Sets `p_holm`, `mde` and `verdict` in `table` and `con`, `trend_p_holm` in `bench` and `<label>/<arm>/
    gap_change_p_holm` in `hm`, in place; returns the family's size by part (`family/...`)."""
    rows = (~table["kind"].isin(["clean", "rerun"]) & table["p"].notna() & (table["control"] == "")).to_numpy()
    trends = bench["trend_p"].notna().to_numpy() if len(bench) else np.zeros(0, bool)
    hz_keys = [k for k, v in hm.items() if k.endswith("/gap_change_p") and np.isfinite(v)]
    ps = np.concatenate([table.loc[rows, "p"].to_numpy(float), bench.loc[trends, "trend_p"].to_numpy(float)
                         if len(bench) else [], con["p"].to_numpy(float), [hm[k] for k in hz_keys]])
    m = len(ps)
    adj = np.asarray(stats.holm(ps)) if m else np.zeros(0)
    n_rows, n_trends, n_con = int(rows.sum()), int(trends.sum()), len(con)
    level = stats.ALPHA / max(m, 1)
    if n_rows:
        t = table.loc[rows]
        table.loc[rows, "p_holm"] = adj[:n_rows]
        table.loc[rows, "mde"] = mdes(t, "gap_sd", level)
        table.loc[rows, "verdict"] = ["costs" if ph < stats.ALPHA and g < 0 else "gains" if ph < stats.ALPHA
                                      else "no cost shown" for ph, g in zip(adj[:n_rows], t["gap"])]
    if len(bench):
        bench["trend_p_holm"] = np.nan
        bench.loc[trends, "trend_p_holm"] = adj[n_rows:n_rows + n_trends]
    if n_con:
        c = adj[n_rows + n_trends:n_rows + n_trends + n_con]
        con["p_holm"] = c
        con["mde"] = mdes(con, "sd", level)
        con["verdict"] = ["differs" if ph < stats.ALPHA else "no difference shown" for ph in c]
    for k, ph in zip(hz_keys, adj[n_rows + n_trends + n_con:]):
        hm[k + "_holm"] = float(ph)
    return {"family/tests": float(m), "family/rows": float(n_rows), "family/trends": float(n_trends),
            "family/contrasts": float(n_con), "family/horizon": float(len(hz_keys))}


def mdes(t: pd.DataFrame, sd: str, level: float) -> list[float]:
    """Each row's MDE at `level` for the test its p comes from: its seeds' spread (column `sd`) floored by its
    outcome's step (`q_eff`, `stats.floored_sd`), so a row whose seeds tie reads the MDE of that test, not 0."""
    q = t["q_eff"] if "q_eff" in t else pd.Series(0.0, index=t.index)
    return [stats.minimal_detectable_gap(stats.floored_sd(s, qe), n, level)
            for s, qe, n in zip(t[sd], q, t["seeds"])]


def reanalyze(run_dir: str | Path, params) -> CostResult:
    """An archived run's analysis redone from its `data/curves.parquet` (`analyze`) and its params (the caller loads
    the run's `params.yaml`: `rlwb.params.load("08_mismatch_cost", [run_dir / "params.yaml"])`, infrastructure this
    layer does not import): what the run would report under today's tests, without retraining. Runs archived before
    `kl_to_clean` was a column of the curves come back without it (NaN), and before the clean scorer with their own
    engines' outcomes."""
    return analyze(pd.read_parquet(Path(run_dir) / "data" / "curves.parquet"), params)


POLICY_SEED = 999_961


def initial_outcomes(model, engine, initial: dict, codec, problems, p) -> dict[str, float]:
    """The tested outcomes of the *initial* policy, as every trained one is scored (`initial_policy_reward`: sampled
    by the base engine at the study's T with the same fixed seed; `initial_heldout_greedy_acc`: greedy, no engine):
    what a clean run's gain in the tested outcome is measured from (the benchmark response). `model` and `engine`
    are a lane's trainer and base engine before its run; `train` reloads the initial weights into both after."""
    model.load_state_dict(initial)
    out = {"initial_heldout_greedy_acc": float(greedy_rewards(model, codec, problems, p.max_tokens).mean())}
    if p.policy_samples:
        out["initial_policy_reward"] = policy_reward(model, engine, codec, problems, p, p.temperature)
    return out


class CleanScorer:
    """Where every run's tested outcome is sampled: the study's base preset (`engines[0]`, fp32 at `dtype`: the
    trainer's distribution to the float floor) at the study's temperature, holding the trained weights
    unperturbed, whatever engine and temperature the run trained with. A run on the base preset is scored by its
    own engine (the same preset); an engine point's run by a base-preset engine of the scorer's own, started on
    first use and shared by the lanes (a lock): a point is a way of *training*, and its trained policy is scored as
    every other row's is, so each row's outcome is comparable with its clean run's (a bf16 point scored by its
    bf16 engine, or V1 at T 1 scored at T 1, would mix the engine's sampling into the outcome)."""

    def __init__(self, preset: str, model_path, dtype: str, on_start: OnStart = None):
        self.preset, self._model, self._dtype, self._on_start = preset, model_path, dtype, on_start
        self._own = None
        self._lock = threading.Lock()

    def policy_reward(self, model, job: Job, engine, codec, problems, p) -> float:
        if job.engine == self.preset:
            return policy_reward(model, engine, codec, problems, p, p.temperature)
        with self._lock:
            if self._own is None:
                from rlwb.engines.worker import EngineWorker

                self._own = EngineWorker(self.preset, self._model, dtype=self._dtype)
                if self._on_start:  # run.json's record of it, beside the base engine's (the same preset)
                    self._on_start({**self._own.info(), "preset": self.scorer_key, "role": "clean scorer"})
            return policy_reward(model, self._own, codec, problems, p, p.temperature)

    @property
    def scorer_key(self) -> str:
        return f"{self.preset}#clean-scorer"

    def close(self) -> None:
        if self._own is not None:
            self._own.close()
            self._own = None


def policy_reward(model, engine, codec, problems, p, temperature: float) -> float:
    """The trained policy's mean task reward on `problems` (`p.policy_samples` completions each at `temperature`,
    one fixed sampling seed for every run: paired), sampled by `engine` after the trained weights are loaded into
    it unperturbed: no dose between the policy and its reward. Under a distribution dose the training reward is
    what the perturbed or stale engine sampled; this is what the run trained. `CleanScorer` picks the engine (the
    base preset) and the temperature (the study's) for every run."""
    from rlwb.core.data import tasks as task_mod
    from rlwb.engines.worker import Sampling

    engine.update_weights({k: v.detach() for k, v in model.state_dict().items()})
    engine.reset_prefix_cache()
    prompts = [codec.encode_task(q) for q in problems for _ in range(p.policy_samples)]
    comps = engine.generate(prompts, Sampling(temperature=temperature, max_tokens=p.max_tokens, seed=POLICY_SEED))
    return float(np.mean([task_mod.reward(problems[i // p.policy_samples], codec.decode(c.token_ids))
                          for i, c in enumerate(comps)]))


class TwinKL:
    """KL from each run's clean twin's trained policy to its own, on the probe, computed as soon as both exist.
    Only clean policies still awaited by a run and runs still awaiting their twin are held (on a real vocabulary
    each [tokens, V] tensor is tens of MB). Two lanes finish runs in their own threads, hence the lock. With a
    job store each value is kept as soon as it is known, and each probe a later value needs (a clean run's; a
    run's whose twin has not finished) until then, so a resumed study computes the same KLs."""

    def __init__(self, todo: list[Job], store=None):
        self.values: dict[Job, float] = {}
        self._users = {}
        for j in todo:
            if j.kind != "clean":
                self._users[j.twin] = self._users.get(j.twin, 0) + 1
        self._clean: dict = {}
        self._pending: dict[Job, torch.Tensor] = {}
        self._lock = threading.Lock()
        self._store = store

    def add(self, job: Job, full: torch.Tensor) -> None:
        with self._lock:
            if job.kind == "clean":
                self.values[job] = 0.0
                if self._store is not None:
                    self._store.put_tensor(job, "probe.pt", full)
                    self._store.put_json(job, "kl.json", {"kl_to_clean": 0.0})
                self._clean[job.twin] = full
                for other in [o for o in self._pending if o.twin == job.twin]:
                    self._use(other, self._pending.pop(other))
                if not self._users.get(job.twin):  # no run left that needs it
                    self._clean.pop(job.twin, None)
            elif job.twin in self._clean:
                self._use(job, full)
            else:
                self._pending[job] = full
                if self._store is not None:
                    self._store.put_tensor(job, "probe.pt", full)

    def known(self, job: Job, value: float) -> None:
        """A run whose KL a resumed study reuses (`reuse`): its twin's probe is one user less needed."""
        with self._lock:
            self.values[job] = value
            self._users[job.twin] -= 1
            if not self._users[job.twin]:
                self._clean.pop(job.twin, None)

    def _use(self, job: Job, full: torch.Tensor) -> None:
        self.values[job] = kl_divergence(self._clean[job.twin], full)
        if self._store is not None:
            self._store.put_json(job, "kl.json", {"kl_to_clean": self.values[job]})
            self._store.drop(job, "probe.pt")
        self._users[job.twin] -= 1
        if not self._users[job.twin]:
            del self._clean[job.twin]


PROBE_SEED, PROBE_PROBLEMS = 999_983, 32
# the trained policy's own greedy accuracy, no engine in between (`trainer.greedy_rewards`): on distribution doses
# the training reward is what the perturbed or stale engine sampled, not what the run trained
HELDOUT_SEED, HELDOUT_PROBLEMS = 999_979, 128


def trained_problems(p) -> set[tuple[int, int]]:
    """Every (a, b) some run of this study trains on: each seed's fresh problems per step (`step_problem_seed`),
    known before any run starts."""
    return {(q.a, q.b) for s in p.seeds for step in range(max(p.steps, p.long_steps))
            for q in tasks.make_problems(p.prompts_per_step, seed=step_problem_seed(s, step), max_digits=p.max_digits)}


def held_out(p, n: int, seed: int) -> tuple[list[tasks.Problem], str]:
    """Up to `n` distinct problems from the task's distribution that no run of the study trains on, and what they
    are in words. A task too small to hold any out (1-digit sums: 100 problems, nearly all drawn in training)
    gets its distinct problems instead, named as such: an accuracy on problems the runs trained on."""
    trained = trained_problems(p)
    pool = list(dict.fromkeys((q.a, q.b) for q in tasks.make_problems(50 * n, seed=seed, max_digits=p.max_digits)))
    unseen = [ab for ab in pool if ab not in trained]
    if len(unseen) >= n // 4:
        unseen = unseen[:n]
        return [tasks.Problem(a, b) for a, b in unseen], f"{len(unseen)} held-out problems (none trained on)"
    return ([tasks.Problem(a, b) for a, b in pool[:n]],
            f"{min(n, len(pool))} distinct problems of the task, not held out (it has {len(pool)}, and the runs train "
            f"on {len(trained)} of them)")


def probe_batch(codec, p):
    """A fixed probe: task prompts no run trains on (`held_out`), each followed by its correct answer
    (teacher-forced), where the trained policies' distributions are compared (`kl_to_clean`)."""
    from rlwb.core.scoring.trainer import make_batch

    problems, _ = held_out(p, PROBE_PROBLEMS, PROBE_SEED)
    return make_batch([codec.encode_task(q) for q in problems],
                      [codec.encode_continuation(str(q.a + q.b)) for q in problems])


def kl_divergence(ref: torch.Tensor, lp: torch.Tensor) -> float:
    """Mean over probe tokens of KL(ref ‖ lp), both [tokens, V] log-distributions (in float64): a dosed run's
    trained policy against its clean twin's (same arm and seed at dose 0), how far a dose moved the policy
    whether or not reward shows it."""
    ref, lp = ref.double(), lp.double()
    return float((ref.exp() * (ref - lp)).sum(-1).mean())


KEYS = ["kind", "label", "dose", "temperature", "updates", "horizon", "arm", "seed"]


def with_defaults(curves: pd.DataFrame) -> pd.DataFrame:
    """Curves archived before the PPO regimes and the policy outcome existed: one update per batch, no policy
    reward (the training reward is then the tested outcome)."""
    if "updates" not in curves:
        curves = curves.assign(updates=1)
    if "policy_reward" not in curves:
        curves = curves.assign(policy_reward=np.nan)
    # each run's horizon (its step count): a long-horizon row pairs with the clean run of its own length
    return curves.assign(horizon=curves.groupby(["label", "arm", "seed"])["step"].transform("max") + 1)


def per_seed(curves: pd.DataFrame) -> pd.DataFrame:
    """Per run: final reward (last FINAL_FRAC of steps), area under the reward curve (mean reward over all steps),
    final entropy, mean gradient norm, clip fraction, engine-trainer k3, the trained policy's own greedy
    accuracy and its reward sampled with no dose in between (`policy_reward`)."""
    curves = with_defaults(curves)
    # each horizon's own last steps (a long-horizon row's final window is its own, not the short runs')
    final = pd.concat([curves[(curves["horizon"] == h) & curves["step"].isin(edge_steps(range(int(h)), FINAL_FRAC))]
                       for h in curves["horizon"].unique()])
    g = curves.groupby(KEYS, sort=False, dropna=False)
    out = pd.DataFrame({"auc": g["reward_mean"].mean(), "grad_norm": g["grad_norm"].mean(),
                        "clip_frac": g["clip_frac"].mean(), "k3": g["mismatch_k3"].mean(),
                        "k1": g["mismatch_k1"].mean() if "mismatch_k1" in curves else np.nan,
                        "raw_logprobs": g["raw_logprobs"].first(),
                        # runs archived before the held-out score have no such column: they recompute without it
                        "heldout_acc": g["heldout_greedy_acc"].first() if "heldout_greedy_acc" in curves else np.nan,
                        "policy_reward": g["policy_reward"].first(),
                        "kl_to_clean": g["kl_to_clean"].first() if "kl_to_clean" in curves else np.nan})
    fin = final.groupby(KEYS, sort=False, dropna=False)
    out["reward_final"] = fin["reward_mean"].mean()
    out["entropy"] = fin["entropy"].mean()
    return out.reset_index()


def control_of(kind: str, arm: str, temperature: float, raw: bool) -> str:
    """Which null control a row is ("" if none): `ratio-blind` (the update never reads the reported logprobs:
    `none@trainer` under ratio doses), `T=1` (an engine reporting raw logprobs at T = 1, where raw = processed)."""
    if kind == "ratio" and arm == "none@trainer":
        return "ratio-blind"
    if kind == "engine" and raw and temperature == 1.0:
        return "T=1"
    return ""


def panel_of(kind: str, raw: bool) -> str:
    """The dose-response panel a row belongs to: its kind; a real engine joins `ratio` when it reports raw logprobs
    (it samples right, reports wrong) and `weights` (distribution mismatch) otherwise."""
    return kind if kind != "engine" else "ratio" if raw else "weights"


def outcome_of(s: pd.DataFrame) -> str:
    """The tested outcome: the trained policy's reward sampled with no dose in between (`policy_reward`) where every
    run has one, else the final training reward (runs with `policy_samples` 0, or archived before it existed)."""
    return "policy_reward" if s["policy_reward"].notna().all() else "reward_final"


def late_slope(curves: pd.DataFrame) -> float:
    """The clean runs' reward slope per step over the second half of their steps (least squares on the mean over
    seeds): what a stale engine's lag of k updates alone takes off the training reward (k x this), since the
    engine's reward is that of weights k steps back."""
    c = curves.groupby("step")["reward_mean"].mean()
    c = c[c.index >= c.index.max() / 2]
    if len(c) < 2:
        return float("nan")
    return float(np.polyfit(c.index.to_numpy(dtype=float), c.to_numpy(), 1)[0])


def outcome_resolution(p, outcome: str) -> float:
    """The step of the tested outcome (`stats.paired_gap_test`'s `resolution`): the trained policy's reward is a mean
    of held-out problems x `policy_samples` rewards of 0 or 1; the final training reward a mean over the last
    FINAL_FRAC of steps of prompts x group rewards."""
    if outcome == "policy_reward":
        return 1.0 / (len(held_out(p, HELDOUT_PROBLEMS, HELDOUT_SEED)[0]) * max(1, p.policy_samples))
    return 1.0 / (p.prompts_per_step * p.group_size * len(edge_steps(range(p.steps), FINAL_FRAC)))


def seed_gaps(s: pd.DataFrame) -> pd.DataFrame:
    """Per run that is not a clean run: its outcomes minus its clean twin's (same temperature, PPO regime, arm and
    seed): `gap` (the tested outcome, `outcome_of`), `train_gap` (final training reward) and `heldout_gap` (own
    greedy accuracy). One row per (label, arm, seed)."""
    outcome = outcome_of(s)
    on = ["temperature", "updates", "horizon", "arm", "seed"]
    cols = list(dict.fromkeys([outcome, "reward_final", "heldout_acc"]))
    clean = s.loc[s["kind"] == "clean", on + cols].rename(columns={c: c + "_clean" for c in cols})
    d = s[s["kind"] != "clean"].merge(clean, on=on, how="left")
    return d.assign(gap=d[outcome] - d[outcome + "_clean"], train_gap=d["reward_final"] - d["reward_final_clean"],
                    heldout_gap=d["heldout_acc"] - d["heldout_acc_clean"])


def dose_table(curves: pd.DataFrame, p, kl: dict | None = None) -> pd.DataFrame:
    """One row per (label, arm): the dose as intended and as achieved (mean k3 per token over steps and seeds), the
    outcomes, and each outcome's gap to the same arm's clean run at the same temperature and PPO regime, paired by
    seed (95% t interval), with the smallest gap the seeds could detect (`mde`: 80% power at the Holm family's
    strictest level, noncentral t). `outcome` names the tested one (`outcome_of`: the trained policy's reward with
    no dose in between; the training reward's gap is `train_gap`, secondary, and for stale rows `lag_bias` is what
    the lag alone takes off it). verdict: a t test of gap = 0 per dosed row, Holm-corrected over every dosed row
    that is not a control, the placebo rows included (the clean run again on independent sampling: a "costs" or
    "gains" there is a false positive): "costs" / "gains" where it rejects, "no cost shown" where it does not (read
    the MDE beside it). Controls (`control_of`) are tested alone, unadjusted (the stricter test for a null): "null
    (passes)" / "**fails**"."""
    curves = with_defaults(curves)
    s = per_seed(curves)
    if kl:  # KL values by job (runs archived before `kl_to_clean` was a column of the curves)
        by_run = {(j.label, j.arm, j.seed): v for j, v in kl.items()}
        s["kl_to_clean"] = [by_run.get(k, float("nan")) for k in zip(s["label"], s["arm"], s["seed"])]
    outcome = outcome_of(s)
    q = outcome_resolution(p, outcome)
    gaps = seed_gaps(s)
    slope = {k: late_slope(d) for k, d in
             curves[curves["kind"] == "clean"].groupby(["temperature", "updates", "horizon", "arm"])}
    rows = []
    for (label, arm), d in s.groupby(["label", "arm"], sort=False):
        kind, dose, temp, raw = d["kind"].iloc[0], d["dose"].iloc[0], d["temperature"].iloc[0], bool(
            d["raw_logprobs"].iloc[0])
        updates, horizon = int(d["updates"].iloc[0]), int(d["horizon"].iloc[0])
        d = d.set_index("seed")
        row = {"kind": kind, "label": label, "dose": dose, "temperature": temp, "updates": updates,
               "horizon": horizon, "arm": arm,
               "engine": curves.loc[curves["label"] == label, "engine"].iloc[0], "raw_logprobs": raw,
               "panel": panel_of(kind, raw), "control": control_of(kind, arm, temp, raw), "outcome": outcome,
               "k3_intended": dose if kind == "ratio" else float("nan"),
               "k3_achieved": float(d["k3"].mean()), "k1_achieved": float(d["k1"].mean()),
               "reward_final": float(d["reward_final"].mean()), "policy_reward": float(d["policy_reward"].mean()),
               "auc": float(d["auc"].mean()), "entropy": float(d["entropy"].mean()),
               "grad_norm": float(d["grad_norm"].mean()), "clip_frac": float(d["clip_frac"].mean()),
               "kl_to_clean": float(d["kl_to_clean"].mean()), "seeds": len(d),
               "heldout_acc": float(d["heldout_acc"].mean())}
        g = gaps[(gaps["label"] == label) & (gaps["arm"] == arm)]
        for col in ("gap", "train_gap", "heldout_gap"):
            v = g[col].dropna().to_numpy()
            row[col] = float(v.mean()) if v.size else float("nan")
            row[f"{col}_ci_low"], row[f"{col}_ci_high"] = stats.seed_ci(v)
        gap = g["gap"].dropna().to_numpy()
        row["lag_bias"] = (-dose * slope.get((temp, updates, horizon, arm), float("nan")) if kind == "stale"
                           else float("nan"))
        row["identical"] = identical_curves(curves, label, arm, temp, d.index, updates, horizon)
        row["gap_sd"] = float(gap.std(ddof=1)) if gap.size > 1 else float("nan")
        row["q_eff"] = q  # the step of the tested outcome its test floors the spread with (`stats.floored_sd`)
        row["mde"] = float("nan")  # set below, at the Holm family's level
        base = s[(s["kind"] == "clean") & (s["temperature"] == temp) & (s["updates"] == updates)
                 & (s["horizon"] == horizon) & (s["arm"] == arm)].set_index("seed")
        for col in ("auc", "entropy", "grad_norm", "clip_frac"):
            row[f"{col}_gap"] = float((d[col] - base[col]).mean()) if kind != "clean" else 0.0
        row["p"] = stats.paired_gap_test(gap, margin=1.0, resolution=q).p_diff if kind != "clean" else float("nan")
        rows.append(row)
    t = pd.DataFrame(rows)
    # rewards are multiples of 1/(completions x steps averaged): a difference's last bits are rounding, not signal
    # (an identical pair of seeds reads -2.8e-17 otherwise)
    cols = [c for c in t.columns if c.endswith(("gap", "_ci_low", "_ci_high")) and c != "identical"]
    t[cols] = t[cols].round(12)
    t["p_holm"], t["verdict"] = np.nan, np.where(t["kind"].isin(["clean", "rerun"]), t["kind"], "n/a")
    tested = ~t["kind"].isin(["clean", "rerun"]) & t["p"].notna()
    family, ctl = tested & (t["control"] == ""), tested & (t["control"] != "")
    m = int(family.sum())
    if m:  # every dosed row that is not a control is a test: Holm over all of them, the MDE at the strictest level
        t.loc[family, "p_holm"] = stats.holm(t.loc[family, "p"])
        t.loc[family, "mde"] = mdes(t.loc[family], "gap_sd", stats.ALPHA / m)
        t.loc[family, "verdict"] = ["costs" if ph < stats.ALPHA and g < 0 else "gains" if ph < stats.ALPHA
                                    else "no cost shown" for ph, g in zip(t.loc[family, "p_holm"],
                                                                          t.loc[family, "gap"])]
    if ctl.any():
        t.loc[ctl, "mde"] = mdes(t.loc[ctl], "gap_sd", stats.ALPHA)
        t.loc[ctl, "verdict"] = ["null (passes)" if control_passes(r) else "fails" for r in t[ctl].itertuples()]
    return t


def control_passes(r) -> bool:
    """A `ratio-blind` control must train bitwise as its clean twin (the reported logprobs cannot reach it); a
    `T=1` control must show no cost at the unadjusted level (its gap's 95% interval holds 0)."""
    if r.control == "ratio-blind":
        return bool(r.identical) and r.kl_to_clean == 0
    return bool(r.gap_ci_low <= 0 <= r.gap_ci_high) if np.isfinite(r.gap_ci_low) else r.gap == 0


def identical_curves(curves: pd.DataFrame, label: str, arm: str, temperature: float, seeds, updates: int = 1,
                     horizon: int | None = None) -> bool:
    """Does every seed of (label, arm) have bitwise its clean twin's whole reward curve?"""
    curves = with_defaults(curves)
    cur = curves[(curves["label"] == label) & (curves["arm"] == arm)]
    horizon = int(cur["horizon"].max()) if horizon is None and len(cur) else horizon
    twin = curves[(curves["kind"] == "clean") & (curves["arm"] == arm) & (curves["temperature"] == temperature)
                  & (curves["updates"] == updates) & (curves["horizon"] == horizon) & curves["seed"].isin(list(seeds))]
    a, b = (c.sort_values(["seed", "step"])["reward_mean"].to_numpy() for c in (cur, twin))
    return bool(len(a) == len(b) and len(a) and (a == b).all())


def dose_metrics(table: pd.DataFrame, curves: pd.DataFrame) -> dict[str, float]:
    """`<label>/<arm>/<outcome>` for every row (`clean/<arm>/...` for the clean runs), the clean arms' learning
    (`clean/<arm>/reward_gain` with its interval: last minus first 10% of steps, paired by seed; `outcome_gain`, the
    same in the tested outcome, `outcome_gain`), per dosed kind
    and arm the gap at its largest dose (`max_dose_gap`; the tolerable k3 is the benchmark dose's, `benchmark_table`),
    and the controls (`control/...`: 1 passes, 0 fails)."""
    out = {}
    outcome = table["outcome"].iloc[0] if "outcome" in table and len(table) else "reward_final"
    for r in table.itertuples():
        for col in ("k3_achieved", "reward_final", "auc", "gap", "gap_ci_low", "gap_ci_high", "mde", "entropy_gap",
                    "clip_frac", "grad_norm_gap", "kl_to_clean", "heldout_acc", "heldout_gap", "heldout_gap_ci_low",
                    "heldout_gap_ci_high"):
            out[f"{r.label}/{r.arm}/{col}"] = float(getattr(r, col))
        out[f"{r.label}/{r.arm}/identical_to_clean"] = float(r.identical)
        if r.control:
            out[f"control/{r.label}/{r.arm}"] = float(r.verdict == "null (passes)")
    for (label, arm), d in curves[curves["kind"] == "clean"].groupby(["label", "arm"], sort=False):
        first, last = reward_gain(d)
        gain = (last - first).to_numpy()
        out[f"{label}/{arm}/reward_gain"] = float(gain.mean())
        out[f"{label}/{arm}/reward_gain_ci_low"], out[f"{label}/{arm}/reward_gain_ci_high"] = stats.seed_ci(gain)
        og = outcome_gain(d, outcome)
        out[f"{label}/{arm}/outcome_gain"] = float(og.mean()) if og.size else float("nan")
        out[f"{label}/{arm}/outcome_gain_ci_low"], out[f"{label}/{arm}/outcome_gain_ci_high"] = stats.seed_ci(og)
    for (kind, arm), d in table[table["kind"].isin(DOSED) & ~table["label"].str.contains("+ppo", regex=False)
                                & ~table["label"].str.endswith(LONG)].groupby(["kind", "arm"], sort=False):
        d = d.sort_values("dose")
        out[f"{kind}/{arm}/max_dose_gap"] = float(d["gap"].iloc[-1])
    out.update(rejection_metrics(curves))
    placebo = table[table["kind"] == "placebo"]
    if len(placebo):  # the clean run again on independent sampling: every rejection is a false positive
        out["placebo/rows"] = float(len(placebo))
        out["placebo/false_positive_rate"] = float((placebo["p"] < stats.ALPHA).mean())
        out["placebo/false_positive_rate_holm"] = float((placebo["p_holm"] < stats.ALPHA).mean())
    rerun = table[table["kind"] == "rerun"]
    if len(rerun):
        out["control/rerun/identical"] = float(rerun["identical"].iloc[0])
    out.update(floor_breaches(curves[curves["kind"].isin(["clean", "rerun"])]))  # the doses leave it on purpose
    return out


INITIAL = {"policy_reward": "initial_policy_reward", "heldout_acc": "initial_heldout_greedy_acc"}


def outcome_gain(clean: pd.DataFrame, outcome: str) -> np.ndarray:
    """One clean configuration's gain in the tested outcome, per seed: its trained policy's outcome minus the initial
    policy's, scored the same way (`initial_outcomes`; one value for the study). The benchmark response is a fraction
    of it, so the BMR and the gaps it is compared with are in the same outcome. For the training reward (runs
    with `policy_samples` 0, or archived before the policy outcome) the training reward's gain, last minus first
    GAIN_FRAC of steps; for a policy outcome without the initial policy's (archived before it was measured),
    empty: no benchmark response, said so."""
    if outcome == "reward_final":
        first, last = reward_gain(clean)
        return (last - first).to_numpy()
    col = INITIAL["policy_reward"]
    if col not in clean or clean[col].isna().all():
        return np.array([])
    per = clean.groupby("seed")[["policy_reward", col]].first()
    return (per["policy_reward"] - per[col]).to_numpy()


def rejection_metrics(curves: pd.DataFrame) -> dict[str, float]:
    """Per run label and arm of a sequence-rejecting correction (Geo-RS: `geo_rs` in its name), grouped under the
    `geo_rs/` prefix: the surviving sequences per step (mean, min over steps and seeds), the steps with none (the
    update then moves on momentum only), the fraction of tokens masked, and the mean completion length the finding
    is scoped to (Geo-RS's geometric-mean band is tighter on short completions than on long ones)."""
    out = {}
    if "kept_seqs" not in curves:
        return out
    rej = curves[curves["arm"].str.contains("geo_rs")]
    for (label, arm), d in rej.groupby(["label", "arm"], sort=False):
        k = f"geo_rs/{label}/{arm}"
        out.update({f"{k}/survivors_mean": float(d["kept_seqs"].mean()), f"{k}/survivors_min": float(
            d["kept_seqs"].min()), f"{k}/zero_survivor_steps": float((d["kept_seqs"] == 0).sum()),
                    f"{k}/masked_frac": float(d["masked_frac"].mean()),
                    f"{k}/completion_tokens": float(d["completion_tokens"].mean())})
    return out


def kind_label(kind: str, updates: int, first: int) -> str:
    """A (kind, PPO regime)'s name in metric keys: `ratio`, or `ratio+ppo4` in a further regime."""
    return kind + regime_suffix(updates, first)


def benchmark_table(table: pd.DataFrame, curves: pd.DataFrame, metrics: dict, bmr_fraction: float) -> pd.DataFrame:
    """Per dosed kind x PPO regime x arm (rows that are not controls): the trend of the tested outcome's paired gap
    across doses (`dose_response.dose_trend`, per-seed slope per decade of k3; `trend_p_holm` here is Holm over
    these trend tests alone, `analyze` puts them in the study's one family) and the benchmark dose in measured k3
    (`dose_response.benchmark_dose`) at BMR = `bmr_fraction` x that arm's clean gain *in the tested outcome* in that
    regime (`<clean label>/<arm>/outcome_gain`, `outcome_gain`: the same outcome as the gaps; no benchmark where the
    clean run gained nothing). Doses are the rows' mean achieved k3."""
    curves = with_defaults(curves)
    gaps = seed_gaps(per_seed(curves))
    first = int(table["updates"].iloc[0]) if len(table) else 1
    rows = []
    sel = table[table["kind"].isin(DOSED) & (table["control"] == "")]
    for (kind, updates, long, arm), d in sel.groupby(["kind", "updates", table["label"].str.endswith(LONG), "arm"],
                                                     sort=False):
        d = d.sort_values("dose")
        g = gaps[gaps["label"].isin(d["label"]) & (gaps["arm"] == arm)].pivot(index="seed", columns="label",
                                                                               values="gap")[list(d["label"])]
        g = g.dropna()
        clean = "clean" + regime_suffix(int(updates), first) + (LONG if long else "")
        gain = metrics.get(f"{clean}/{arm}/outcome_gain", float("nan"))
        bmr = bmr_fraction * gain if np.isfinite(gain) and gain > 0 else float("nan")
        x = d["k3_achieved"].to_numpy()
        row = {"kind": kind, "updates": int(updates), "arm": arm,
               "name": kind_label(kind, int(updates), first) + (LONG if long else ""),
               "doses": len(d), "seeds": len(g), "clean_gain": gain, "bmr": bmr,
               "k3_min": float(x.min()), "k3_max": float(x.max())}
        try:
            tr = dose_response.dose_trend(x, g.to_numpy())
            bd = dose_response.benchmark_dose(x, g.to_numpy(), bmr)
        except ValueError as e:  # doses that print alike in k3 or a k3 of 0: no curve to fit, said so
            row.update(trend_slope=np.nan, trend_ci_low=np.nan, trend_ci_high=np.nan, trend_p=np.nan, bmd=np.nan,
                       bmdl=np.nan, status=f"{dose_response.NO_BMR} ({e})")
        else:
            row.update(trend_slope=tr.slope, trend_ci_low=tr.ci_low, trend_ci_high=tr.ci_high, trend_p=tr.p,
                       bmd=bd.bmd, bmdl=bd.bmdl, status=bd.status)
        rows.append(row)
    b = pd.DataFrame(rows, columns=["kind", "updates", "arm", "name", "doses", "seeds", "clean_gain", "bmr", "k3_min",
                                    "k3_max", "trend_slope", "trend_ci_low", "trend_ci_high", "trend_p", "bmd",
                                    "bmdl", "status"])
    b["trend_p_holm"] = stats.holm(b["trend_p"]) if len(b) else []
    return b


def benchmark_metrics(bench: pd.DataFrame) -> dict[str, float]:
    """`<kind>[+ppo<u>]/<arm>/{trend_slope, trend_p_holm, bmr, bmd_k3, bmdl_k3, bmdl_bounded}` per benchmark row
    (`bmdl_bounded`: 1 where the BMDL lies inside the tested doses)."""
    out = {}
    for r in bench.itertuples():
        k = f"{r.name}/{r.arm}"
        out.update({f"{k}/trend_slope": float(r.trend_slope), f"{k}/trend_p_holm": float(r.trend_p_holm),
                    f"{k}/bmr": float(r.bmr), f"{k}/bmd_k3": float(r.bmd), f"{k}/bmdl_k3": float(r.bmdl),
                    f"{k}/bmdl_bounded": float(r.status == dose_response.BOUNDED)})
    return out


SPIKE, ENTROPY_DROP = 3.0, 0.5  # a gradient-norm spike: > 3 x the clean run's median; entropy collapse: < half


def horizon_table(curves: pd.DataFrame, block: int, resolution: float = 0.0) -> tuple[pd.DataFrame, dict[str, float]]:
    """The long-horizon rows (label ending `+long`): per dosed row and arm, the gap of the mean training reward to
    the long clean twin (same arm and seed) per block of `block` steps, with a 95% t interval over seeds, and
    whether it changes from the first block to the last (a paired t test of each seed's last-block minus
    first-block gap: `<label>/<arm>/gap_change` and `_p`). Per long row (clean ones included) the step where a
    collapse starts, if any: the first step whose seed-mean gradient norm exceeds `SPIKE` x the long clean run's
    median (`grad_spike_step`), or whose seed-mean entropy falls below `ENTROPY_DROP` x the clean run's first-step
    entropy (`entropy_collapse_step`); NaN: none. The training reward, because it is the only outcome measured per
    step (under a stale dose it carries the lag bias, `lag_bias`). `resolution`: the step of one block's mean
    training reward (`stats.paired_gap_test`; the change is a difference of four such means). `gap_change_p` is
    unadjusted here; `analyze` puts it in the study's one Holm family (`gap_change_p_holm`)."""
    curves = with_defaults(curves)
    long = curves[curves["label"].str.endswith(LONG)]
    rows, out = [], {}
    if long.empty:
        return pd.DataFrame(columns=["label", "arm", "block_start", "block_end", "gap", "ci_low", "ci_high",
                                     "seeds", "grad_spike_step", "entropy_collapse_step"]), out
    for (label, arm), d in long.groupby(["label", "arm"], sort=False):
        clean = long[(long["kind"] == "clean") & (long["arm"] == arm)]
        gm = clean.groupby("step")["grad_norm"].mean()
        em = clean.groupby("step")["entropy"].mean()
        own_g, own_e = d.groupby("step")["grad_norm"].mean(), d.groupby("step")["entropy"].mean()
        spike = own_g[own_g > SPIKE * gm.median()].index
        drop = own_e[own_e < ENTROPY_DROP * em.iloc[0]].index if len(em) else []
        out[f"{label}/{arm}/grad_spike_step"] = float(spike[0]) if len(spike) else float("nan")
        out[f"{label}/{arm}/entropy_collapse_step"] = float(drop[0]) if len(drop) else float("nan")
        if d["kind"].iloc[0] == "clean":
            continue
        per = (d.assign(b=d["step"] // block).groupby(["seed", "b"])["reward_mean"].mean()
               - clean.assign(b=clean["step"] // block).groupby(["seed", "b"])["reward_mean"].mean()).dropna()
        wide = per.unstack("b")
        for b in wide.columns:
            v = wide[b].dropna().to_numpy()
            lo, hi = stats.seed_ci(v)
            rows.append({"label": label, "arm": arm, "block_start": int(b * block),
                         "block_end": int(min((b + 1) * block, d["step"].max() + 1) - 1), "gap": float(v.mean()),
                         "ci_low": lo, "ci_high": hi, "seeds": int(v.size),
                         "grad_spike_step": out[f"{label}/{arm}/grad_spike_step"],
                         "entropy_collapse_step": out[f"{label}/{arm}/entropy_collapse_step"]})
        change = (wide[wide.columns[-1]] - wide[wide.columns[0]]).dropna().to_numpy()
        out[f"{label}/{arm}/gap_change"] = float(change.mean()) if change.size else float("nan")
        out[f"{label}/{arm}/gap_change_p"] = stats.paired_gap_test(change, margin=1.0,
                                                                  resolution=resolution * np.sqrt(2)).p_diff
    return pd.DataFrame(rows), out


UNCORRECTED = "none@trainer"  # the decoupled arm a correction is compared with: same mode, no correction
SCALED_BAND, VERL_BAND = "geo_rs_len@trainer", "verl.geo_rs@trainer"  # the `band` contrast
REGIME = re.compile(r"\+ppo\d+")  # a further PPO regime's label suffix
MATCHED_K3 = 2.0  # a symmetric dose matches a point's k3 when within this factor (as `dose_achieved`)


def contrast_table(table: pd.DataFrame, curves: pd.DataFrame, resolution: float = 0.0) -> pd.DataFrame:
    """The paired contrasts the conclusion's sentences rest on, each a per-seed difference of two rows' gaps (same
    seeds, prompts, sampling seeds and noise), with a 95% t interval and a t test (`resolution`: the tested
    outcome's step, `outcome_resolution`). `p_holm` and `mde` here are over these contrasts alone; `analyze` puts
    them in the study's one Holm family with every row, trend and horizon test.

    - `correction`: a correction arm in the decoupled mode minus the uncorrected decoupled arm `none@trainer` at the
      same dosed row or engine point (what the correction adds, not what the mode does: bypass is another mode);
    - `mode`: `none@engine` (bypass) minus `none@trainer` (decoupled) at the same row;
    - `one-sided vs symmetric`: an engine point reporting raw logprobs (a one-sided error) minus the symmetric ratio
      dose of matched k3 (within a factor `MATCHED_K3`) at the same temperature, PPO regime and arm;
    - `band`: the length-scaled Geo-RS band (`geo_rs_len@trainer`) minus verl's (`verl.geo_rs@trainer`) at the
      same row: what scaling the band by the completion length changes;
    - `regime`: the `mode` contrast at a dose in a further PPO regime (`<label>+ppo<k>`) minus the same contrast at
      that dose in the first regime, seed by seed (a difference of differences): does bypass-vs-decoupled hold
      when several updates per batch let the clip act in both modes?
    Rows that are controls (`none@trainer` under ratio doses is bitwise its clean run) are not contrasted."""
    curves = with_defaults(curves)
    g = seed_gaps(per_seed(curves)).set_index(["label", "arm", "seed"])["gap"].sort_index()
    rows = []

    def seeds_of(label: str, a: str):
        return g.loc[(label, a)]

    def add(kind: str, label: str, a: str, label_b: str, b: str, what: str, minus: tuple | None = None):
        try:
            x, y = seeds_of(label, a), seeds_of(label_b, b)
            d = x - y
            if minus:  # a difference of differences: (label a - label b) - (minus[0] a - minus[0] b)
                d = d - (seeds_of(minus[0], a) - seeds_of(minus[0], b))
        except KeyError:
            return
        d = d.dropna().to_numpy()
        if d.size < 2:
            return
        lo, hi = stats.seed_ci(d)
        q = resolution * (2.0 if minus else np.sqrt(2))  # 4 (or 8) scored outcomes in each seed's difference
        rows.append({"contrast": kind, "label": label, "arm": a, "vs_label": label_b, "vs_arm": b, "what": what,
                     "diff": float(d.mean()), "ci_low": lo, "ci_high": hi, "sd": float(d.std(ddof=1)),
                     "seeds": int(d.size), "q_eff": q,
                     "p": stats.paired_gap_test(d, margin=1.0, resolution=q).p_diff})

    dosed = table[~table["kind"].isin(["clean", "rerun", "placebo"])]
    for label, d in dosed.groupby("label", sort=False):
        arms = set(d["arm"])
        if UNCORRECTED in arms and (d.loc[d["arm"] == UNCORRECTED, "control"] == "").all():
            for a in sorted(x for x in arms if x.endswith("@trainer") and x != UNCORRECTED):
                add("correction", label, a, label, UNCORRECTED, f"`{a}` vs `{UNCORRECTED}` at {label}")
            if "none@engine" in arms:
                add("mode", label, "none@engine", label, UNCORRECTED, f"bypass vs decoupled at {label}")
        ok = set(d.loc[d["control"] == "", "arm"])
        if {SCALED_BAND, VERL_BAND} <= ok:
            add("band", label, SCALED_BAND, label, VERL_BAND, f"`{SCALED_BAND}` vs `{VERL_BAND}` at {label}")
        base = REGIME.sub("", label)
        if base != label and {"none@engine", UNCORRECTED} <= ok:
            b_ok = set(dosed.loc[(dosed["label"] == base) & (dosed["control"] == ""), "arm"])
            if {"none@engine", UNCORRECTED} <= b_ok:
                add("regime", label, "none@engine", label, UNCORRECTED,
                    f"bypass vs decoupled at {label} minus at {base}", minus=(base,))
    ratio = table[table["kind"] == "ratio"]
    for r in table[(table["kind"] == "engine") & table["raw_logprobs"] & (table["control"] == "")].itertuples():
        cand = ratio[(ratio["temperature"] == r.temperature) & (ratio["updates"] == r.updates)
                     & (ratio["arm"] == r.arm)]
        cand = cand[(cand["k3_intended"] / r.k3_achieved).between(1 / MATCHED_K3, MATCHED_K3)]
        if len(cand):
            m = cand.iloc[(np.log(cand["k3_intended"] / r.k3_achieved)).abs().argmin()]
            add("one-sided vs symmetric", r.label, r.arm, m["label"], r.arm,
                f"`{r.label}` (one-sided, k3 {r.k3_achieved:.1e}) vs {m['label']} (symmetric) `{r.arm}`")
    c = pd.DataFrame(rows, columns=["contrast", "label", "arm", "vs_label", "vs_arm", "what", "diff", "ci_low",
                                    "ci_high", "sd", "seeds", "q_eff", "p"])
    c["p_holm"] = stats.holm(c["p"]) if len(c) else []
    m = max(len(c), 1)
    c["mde"] = mdes(c, "sd", stats.ALPHA / m)
    c["verdict"] = ["differs" if ph < stats.ALPHA else "no difference shown" for ph in c["p_holm"]]
    return c


def contrast_metrics(con: pd.DataFrame) -> dict[str, float]:
    """`contrast/<contrast>/<label>/<arm>/{diff, ci_low, ci_high, p_holm, mde}`."""
    out = {}
    for r in con.itertuples():
        k = f"contrast/{r.contrast}/{r.label}/{r.arm}"
        out.update({f"{k}/{f}": float(getattr(r, f)) for f in ("diff", "ci_low", "ci_high", "p_holm", "mde")})
    return out


def conclusion(metrics: dict, table: pd.DataFrame, p, bench: pd.DataFrame | None = None,
               con: pd.DataFrame | None = None, hz: pd.DataFrame | None = None) -> str:
    first = int(table["updates"].iloc[0]) if "updates" in table and len(table) else 1
    regimes = table
    table = table[table["updates"] == first] if "updates" in table else table
    table = table[~table["label"].str.endswith(LONG)]
    outcome = table["outcome"].iloc[0] if "outcome" in table and len(table) else "reward_final"
    temps = sorted(set(table["temperature"]))
    lines = [f"**Setup.** Base engine `{p.engines[0]}` ({p.dtype}), {p.steps} steps × {p.prompts_per_step} prompts × "
             f"{p.group_size} completions, T={p.temperature:g}"
             + (f" (points also at T = {', '.join(f'{t:g}' for t in temps if t != p.temperature)})"
                if len(temps) > 1 else "")
             + f", lr={p.lr:g}, {p.num_seeds} seeds paired across every arm and dose (same initial weights, prompts, "
             f"sampling seeds and noise). Cost = {outcome_text(outcome, p)} minus the same arm's "
             f"clean run at the same temperature, seed by seed, with a 95% t interval; a cost is a t test of that gap "
             f"(the outcome's rounding step in its variance), Holm-corrected in **one family** of "
             f"{family_text(metrics)} (controls apart, tested alone); MDE = the smallest cost these seeds detect "
             f"with 80% power at α/m, the family's strictest level (noncentral t). "
             f"{timing_note(p, sorted(set(table['engine'])))}"]
    lines += floor_lines(metrics)
    lines.append("**Answer.** Where training measurably degrades, per kind of mismatch and arm:\n"
                 + "\n".join(dose_answer_lines(metrics, first_regime(table), DOSED, p.arm_labels)))
    if bench is not None and len(bench):
        lines.append(f"**Tolerable mismatch** (benchmark dose: per kind and arm, a line in log k3 fitted to the "
                     f"paired gaps of every dose, seed by seed; BMR = {p.bmr_fraction:.0%} of the arm's clean gain "
                     f"in the tested outcome, its trained policy's minus the initial policy's; the BMDL is the "
                     f"lower 95% bound of the k3 where the cost reaches it, a Fieller-type inversion, inside the "
                     f"tested doses only; trend p's are Holm-adjusted in the study's one family):\n"
                     + "\n".join(benchmark_line(r, p.bmr_fraction) for r in bench.itertuples()))
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
                     "minus under one, seed by seed):\n" + "\n".join(contrast_lines(con)))
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
    lines.append("**Doses achieved** (mean k3 per token over steps and seeds, first arm). " + doses_text(table, p))
    lines.append(f"Each gap above is the tested outcome ({outcome_text(outcome, p)}); after it, the trained "
                 f"policy's own greedy accuracy on {held_out(p, HELDOUT_PROBLEMS, HELDOUT_SEED)[1]} (no engine in "
                 f"between). The final training reward (what the run's engine sampled: under a distribution dose not "
                 f"the trained policy's) is the secondary outcome, `train_gap` in the table" + lag_text(table) + ".")
    lines.append("`kl_to_clean`: mean KL per token from the clean twin's trained policy (same arm and seed, dose 0) to "
                 f"this run's, on a fixed probe of {held_out(p, PROBE_PROBLEMS, PROBE_SEED)[1]} with their correct "
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


def outcome_text(outcome: str, p) -> str:
    """The tested outcome in words."""
    if outcome == "policy_reward":
        return (f"the trained policy's reward on {held_out(p, HELDOUT_PROBLEMS, HELDOUT_SEED)[1]}, "
                f"{p.policy_samples} sample{'s' if p.policy_samples != 1 else ''} each at T={p.temperature:g} from "
                f"the clean base engine `{p.engines[0]}` ({p.dtype}) holding the trained weights unperturbed, for "
                f"every row, engine points and other temperatures included (no dose between the policy and its "
                f"reward)")
    return f"the final training reward (last {FINAL_FRAC:.0%} of steps)"


def lag_text(table: pd.DataFrame) -> str:
    """The bias a stale engine's lag alone puts into the training reward: k x the clean run's late reward slope."""
    st = table[(table["kind"] == "stale") & table["lag_bias"].notna()] if "lag_bias" in table else table.iloc[:0]
    if st.empty:
        return ""
    return ("; on stale rows it is biased by the lag alone (k × the clean run's late reward slope per step): "
            + ", ".join(f"{r.label} `{r.arm}` {r.lag_bias:+.3f} (training-reward gap {r.train_gap:+.3f})"
                        for r in st.itertuples()))


def dose_achieved(r) -> bool:
    """An intended ratio dose is achieved when the measured k3 is within a factor 2 of it (the noise is drawn per
    token, so over a run's thousands of tokens the mean sits far closer; a factor 2 is a broken dose path)."""
    return bool(0.5 <= r.k3_achieved / r.k3_intended <= 2.0)


def doses_text(table: pd.DataFrame, p) -> str:
    first = table[table["arm"] == p.arm_labels[0]]
    parts = []
    ratio = first[first["kind"] == "ratio"]
    if len(ratio):
        parts.append("Ratio mismatch (zero-mean Gaussian noise of std sqrt(2 ln(1 + k3)) on the reported logprobs; "
                     "intended → measured k3, and the measured mean log r, which symmetric noise keeps near 0): "
                     + ", ".join(f"{metric('k3', r.k3_intended, '.0e')} → {metric('k3', r.k3_achieved, '.2e')} "
                                 f"(σ {logprob_noise_sigma(r.k3_intended):.3f}, mean log r {-r.k1_achieved:+.3f})"
                                 for r in ratio.itertuples()) + ".")
        off = [r for r in ratio.itertuples() if not dose_achieved(r)]
        if off:
            parts.append("**Warning: dose not achieved** (measured k3 outside [0.5, 2] × intended): "
                         + ", ".join(f"{r.label} {r.k3_achieved:.2e} for {r.k3_intended:.0e}" for r in off)
                         + ". The dose path is wrong, not the engine.")
    for kind, what in (("weights", "weight noise {:g} × rms"), ("stale", "{:g} update(s) behind")):
        d = first[first["kind"] == kind]
        if len(d):
            parts.append(f"{KINDS[kind][0].upper()}{KINDS[kind][1:]}: " + ", ".join(
                f"{what.format(r.dose)} → k3 {metric('k3', r.k3_achieved, '.2e')}" for r in d.itertuples()) + ".")
    return " ".join(parts) or "No doses in this run."
