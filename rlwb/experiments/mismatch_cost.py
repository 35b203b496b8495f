"""Notebook 08's experiment: what engine-trainer mismatch costs a GRPO run, at known doses.

Notebook 03's loop (`rlwb.core.grpo`) on one fp32 engine whose logprobs match the trainer's to the float floor,
with mismatch injected at set doses on the real engine path (`rlwb.core.doses`): *ratio* mismatch (noise on
the logprobs the engine reports; it samples correctly) and *distribution* mismatch (the engine samples with
perturbed weights). Every arm (a correction in an old_logprobs mode) trains at every dose from the same initial
weights with the same seeds, prompts and noise, so each dose's cost is a *paired* gap to the same arm's dose 0,
seed by seed, with a Student-t interval and the smallest gap the budget could detect beside every null.

Controls: `none@trainer` under ratio doses must cost exactly nothing (the reported logprobs never reach its
update: the behaviour policy is the trainer's and `none` reads no ratio); the clean arm must learn (a cost is only
measurable where there is a gain to lose). A control that fails says the design, not the engine, is wrong.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from rlwb.core import stats, tokenizer
from rlwb.core.doses import logprob_noise_sigma
from rlwb.core.grpo import train, trainer_device
from rlwb.core.grpo_config import GRPOConfig
from rlwb.core.trainer import completion_logprobs
from rlwb.engines.worker import EngineWorker
from rlwb.experiments.base import OnStart, Result, iter_engines, run_in_lanes
from rlwb.experiments.toy_grpo import lanes_for, timing_note
from rlwb.formatting import metric

FINAL_FRAC = 0.2  # "final reward" = mean reward over the last 20% of steps, per seed (as notebook 07)
KINDS = {"ratio": "ratio mismatch (reported logprobs off, sampling right)",
         "weights": "distribution mismatch (engine samples with perturbed weights)"}


@dataclass
class CostResult(Result):
    curves: pd.DataFrame  # one row per (kind, dose, arm, seed, step): notebook 03's columns
    doses: pd.DataFrame  # one row per (kind, dose, arm): achieved k3, outcomes, paired gaps with CIs, MDE

    def frames(self) -> dict[str, pd.DataFrame]:
        return {"curves": self.curves, "doses": self.doses}

    def summary(self) -> pd.DataFrame:
        cols = ["kind", "dose", "arm", "k3_achieved", "reward_final", "gap", "gap_ci_low", "gap_ci_high", "mde",
                "verdict", "auc_gap", "entropy_gap", "kl_to_clean", "clip_frac"]
        return self.doses[self.doses["kind"] != "clean"][cols].set_index(["kind", "dose", "arm"])

    def conclusion(self) -> str:
        return conclusion(self.metrics, self.doses, self.params)

    def answer(self) -> str:
        """The first arm's verdict per kind of mismatch, in one line."""
        from rlwb.experiments.base import one_line

        bullets = [b[2:] for b in answer_lines(self.metrics, self.doses, self.params)]
        first = self.params.arm_labels[0]
        return one_line(" ".join(b for b in bullets if f"`{first}`" in b) or " ".join(bullets), limit=400)


def jobs(p) -> list[tuple[str, float, str, int]]:
    """(kind, dose, arm, seed) of every run: each arm clean (dose 0) and at every dose of each kind."""
    doses = [("clean", 0.0)] + [("ratio", d) for d in p.ratio_k3] + [("weights", d) for d in p.weight_noise]
    return [(k, d, a, s) for k, d in doses for a in p.arm_labels for s in p.seeds]


def config(p, kind: str, dose: float, arm: str, seed: int) -> GRPOConfig:
    from dataclasses import replace

    corr, _, mode = arm.partition("@")
    cfg = GRPOConfig.from_settings(p, correction=corr, seed=seed, logprob_noise_k3=dose if kind == "ratio" else 0.0,
                                   engine_weight_noise=dose if kind == "weights" else 0.0)
    return replace(cfg, old_logprobs=mode)


def run(params, model_path, *, on_start: OnStart = None, progress: bool = True,
        data_dir: str | Path | None = None) -> CostResult:
    """Every (kind, dose, arm, seed) from the same initial weights on one engine (started once; with
    `concurrent_runs` > 1 more processes of the same preset train other runs at the same time)."""
    from transformers import AutoModelForCausalLM

    p = params
    torch.set_num_threads(min(2, torch.get_num_threads()))
    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32).to(trainer_device())
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    codec = tokenizer.PromptCodec(model_path, p.chat_template)
    probe = probe_batch(codec, p)
    todo = jobs(p)
    frames, clean_dists, pending, kl = [], {}, {}, {}
    lock = threading.Lock()

    def one_run(lane, job, should_stop) -> pd.DataFrame:
        (m, engine), (kind, dose, arm, seed) = lane, job
        cfg = config(p, kind, dose, arm, seed)
        df = train(m, engine, cfg, initial, progress=progress, desc=f"{kind} {dose:g} {arm} seed {seed}",
                   codec=codec, on_step=lambda _res: should_stop())
        with torch.no_grad():  # the trained policy's sampling distributions on the fixed probe
            full = completion_logprobs(m, probe, p.temperature, full=True)["full"].float().cpu()
        # KL as soon as the clean twin exists; only the clean twins and runs waiting for theirs are held
        # (a real vocabulary makes each [tokens, V] tensor tens of MB)
        with lock:  # two lanes finish runs in their own threads
            pair(job, full)
        for i, (k, v) in enumerate((("kind", kind), ("dose", dose), ("arm", arm), ("seed", seed))):
            df.insert(1 + i, k, v)
        return df

    def pair(job, full) -> None:
        kind, _, arm, seed = job
        if kind == "clean":
            clean_dists[(arm, seed)] = full
            for key in [k for k in pending if (k[2], k[3]) == (arm, seed)]:
                kl[key] = kl_divergence(full, pending.pop(key))
            kl[job] = 0.0
        elif (arm, seed) in clean_dists:
            kl[job] = kl_divergence(clean_dists[(arm, seed)], full)
        else:
            pending[job] = full

    for w in iter_engines(p.engines, model_path, p.dtype, progress, on_start):
        n = min(lanes_for(w.preset, p.concurrent_runs), len(todo))
        extra = [EngineWorker(w.preset, model_path, dtype=p.dtype, wait=False) for _ in range(n - 1)]
        try:
            models = [model] + [copy.deepcopy(model) for _ in range(n - 1)]
            frames = [df.assign(engine=w.preset.name, concurrent_runs=n)
                      for df in run_in_lanes(todo, list(zip(models, [w, *extra])), one_run)]
        finally:
            for e in extra:
                e.close()
    curves = pd.concat(frames, ignore_index=True)
    table = dose_table(curves, p, kl)
    return CostResult(p, dose_metrics(table, curves), curves, table)


PROBE_SEED, PROBE_PROBLEMS = 999_983, 32


def probe_batch(codec, p):
    """A fixed probe: task prompts no run trains on, each followed by its correct answer (teacher-forced), where the
    trained policies' distributions are compared (`kl_to_clean`)."""
    from rlwb.core import tasks
    from rlwb.core.trainer import make_batch

    problems = tasks.make_problems(PROBE_PROBLEMS, seed=PROBE_SEED, max_digits=p.max_digits)
    return make_batch([codec.encode_task(q) for q in problems],
                      [codec.encode_continuation(str(q.a + q.b)) for q in problems])


def kl_divergence(ref: torch.Tensor, lp: torch.Tensor) -> float:
    """Mean over probe tokens of KL(ref ‖ lp), both [tokens, V] log-distributions (in float64): a dosed run's
    trained policy against its clean twin's (same arm and seed at dose 0), how far a dose moved the policy
    whether or not reward shows it."""
    ref, lp = ref.double(), lp.double()
    return float((ref.exp() * (ref - lp)).sum(-1).mean())


def per_seed(curves: pd.DataFrame) -> pd.DataFrame:
    """Per (kind, dose, arm, seed): final reward (last FINAL_FRAC of steps), area under the reward curve (mean
    reward over all steps), final entropy, mean gradient norm, clip fraction and engine-trainer k3."""
    steps = sorted(curves["step"].unique())
    last = set(steps[-max(1, round(FINAL_FRAC * len(steps))):])
    keys = ["kind", "dose", "arm", "seed"]
    g = curves.groupby(keys, sort=False)
    out = pd.DataFrame({"auc": g["reward_mean"].mean(), "grad_norm": g["grad_norm"].mean(),
                        "clip_frac": g["clip_frac"].mean(), "k3": g["mismatch_k3"].mean()})
    fin = curves[curves["step"].isin(last)].groupby(keys, sort=False)
    out["reward_final"] = fin["reward_mean"].mean()
    out["entropy"] = fin["entropy"].mean()
    return out.reset_index()


def dose_table(curves: pd.DataFrame, p, kl: dict | None = None) -> pd.DataFrame:
    """One row per (kind, dose, arm): the dose as intended and as achieved (mean k3 per token over steps and
    seeds), the outcomes, and each outcome's gap to the same arm's clean run paired by seed (95% t interval),
    with the smallest reward gap the seeds could detect (`mde`: 80% power at the Holm family's strictest level).
    verdict: a t test of gap = 0 per dosed row, Holm-corrected over every dosed row: "costs" / "gains" where it
    rejects, "no cost shown" where it does not (read the MDE beside it)."""
    s = per_seed(curves)
    s["kl_to_clean"] = [(kl or {}).get(k, float("nan")) for k in zip(s["kind"], s["dose"], s["arm"], s["seed"])]
    clean = s[s["kind"] == "clean"].set_index(["arm", "seed"])
    rows = []
    for (kind, dose, arm), d in s.groupby(["kind", "dose", "arm"], sort=False):
        d = d.set_index("seed")
        base = clean.loc[arm]
        row = {"kind": kind, "dose": dose, "arm": arm,
               "k3_intended": dose if kind == "ratio" else float("nan"),
               "k3_achieved": float(d["k3"].mean()), "reward_final": float(d["reward_final"].mean()),
               "auc": float(d["auc"].mean()), "entropy": float(d["entropy"].mean()),
               "grad_norm": float(d["grad_norm"].mean()), "clip_frac": float(d["clip_frac"].mean()),
               "kl_to_clean": float(d["kl_to_clean"].mean()),
               "seeds": len(d)}
        gap = (d["reward_final"] - base["reward_final"]).dropna().to_numpy()
        row["gap"] = float(gap.mean())
        row["gap_ci_low"], row["gap_ci_high"] = stats.seed_ci(gap)
        cur = curves[(curves["kind"] == kind) & (curves["dose"] == dose) & (curves["arm"] == arm)]
        twin = curves[(curves["kind"] == "clean") & (curves["arm"] == arm)]
        same = [c.sort_values(["seed", "step"])["reward_mean"].to_numpy() for c in (cur, twin)]
        row["identical"] = bool(gap.size == len(p.seeds) and len(same[0]) == len(same[1])
                                and (same[0] == same[1]).all())  # every seed's whole reward curve
        row["gap_sd"] = float(gap.std(ddof=1)) if gap.size > 1 else float("nan")
        row["mde"] = float("nan")  # set below, at the Holm family's level
        for col in ("auc", "entropy", "grad_norm", "clip_frac"):
            row[f"{col}_gap"] = float((d[col] - base[col]).mean())
        row["p"] = stats.paired_gap_test(gap, margin=1.0).p_diff
        rows.append(row)
    t = pd.DataFrame(rows)
    dosed = (t["kind"] != "clean") & t["p"].notna()
    m = int(dosed.sum())
    t["p_holm"], t["verdict"] = np.nan, np.where(t["kind"] == "clean", "clean", "n/a")
    if m:  # every dosed row is a test: Holm over all of them, the MDE at the family's strictest level
        t.loc[dosed, "p_holm"] = stats.holm(t.loc[dosed, "p"])
        t.loc[dosed, "mde"] = [stats.minimal_detectable_gap(sd, n, stats.ALPHA / m) for sd, n in
                               zip(t.loc[dosed, "gap_sd"], t.loc[dosed, "seeds"])]
        t.loc[dosed, "verdict"] = ["costs" if ph < stats.ALPHA and g < 0 else "gains" if ph < stats.ALPHA
                                   else "no cost shown" for ph, g in zip(t.loc[dosed, "p_holm"], t.loc[dosed, "gap"])]
    return t.drop(columns=["p"])


def dose_metrics(table: pd.DataFrame, curves: pd.DataFrame) -> dict[str, float]:
    """`<kind>/<arm>@<dose>/<outcome>` for every row, the clean arms' learning (`clean/<arm>/reward_gain` with
    its interval: last minus first 10% of steps, paired by seed), and per kind and arm the gap at its largest
    dose (`max_dose_gap`) and the smallest dose that measurably costs reward (`threshold_k3`, NaN: none did)."""
    out = {}
    for r in table.itertuples():
        L = f"clean/{r.arm}" if r.kind == "clean" else f"{r.kind}@{r.dose:g}/{r.arm}"
        for col in ("k3_achieved", "reward_final", "auc", "gap", "gap_ci_low", "gap_ci_high", "mde", "entropy_gap",
                    "clip_frac", "grad_norm_gap", "kl_to_clean"):
            out[f"{L}/{col}"] = float(getattr(r, col))
        out[f"{L}/identical_to_clean"] = float(r.identical)
    steps = sorted(curves["step"].unique())
    k = max(1, round(0.1 * len(steps)))
    for arm, d in curves[curves["kind"] == "clean"].groupby("arm", sort=False):
        first = d[d["step"].isin(steps[:k])].groupby("seed")["reward_mean"].mean()
        last = d[d["step"].isin(steps[-k:])].groupby("seed")["reward_mean"].mean()
        gain = (last - first).to_numpy()
        out[f"clean/{arm}/reward_gain"] = float(gain.mean())
        out[f"clean/{arm}/reward_gain_ci_low"], out[f"clean/{arm}/reward_gain_ci_high"] = stats.seed_ci(gain)
    for (kind, arm), d in table[table["kind"] != "clean"].groupby(["kind", "arm"], sort=False):
        d = d.sort_values("dose")
        out[f"{kind}/{arm}/max_dose_gap"] = float(d["gap"].iloc[-1])
        # the smallest dose from which every larger dose measurably costs too (one noisy row is not a threshold)
        costs = (d["verdict"] == "costs").to_numpy()
        from_here = [i for i in range(len(d)) if costs[i:].all()]
        out[f"{kind}/{arm}/threshold_k3"] = float(d["k3_achieved"].iloc[from_here[0]]) if from_here else float("nan")
    return out


def _fmt_gap(r) -> str:
    return f"{r.gap:+.3f} [{r.gap_ci_low:+.3f}, {r.gap_ci_high:+.3f}]"


def answer_lines(metrics: dict, table: pd.DataFrame, p) -> list[str]:
    """One bullet per (kind, arm): the smallest measured k3 that costs reward, or the null with its MDE."""
    out, arms = [], list(p.arm_labels)
    for kind in ("ratio", "weights"):
        d = table[table["kind"] == kind]
        if d.empty:
            continue
        for arm in arms:
            a = d[d["arm"] == arm].sort_values("dose")
            if a.empty:
                continue
            thr = metrics.get(f"{kind}/{arm}/threshold_k3", float("nan"))
            top = a.iloc[-1]
            if np.isfinite(thr):
                out.append(f"- {kind} mismatch, `{arm}`: measurably costs reward from k3 {metric('k3', thr, '.1e')} "
                           f"per token on, at every larger dose too (largest dose: {_fmt_gap(top)}).")
            else:
                out.append(f"- {kind} mismatch, `{arm}`: no dose up to k3 {metric('k3', top.k3_achieved, '.1e')} "
                           f"measurably cost reward (largest dose: {_fmt_gap(top)}; MDE {top.mde:.3f}): a cost "
                           f"below the MDE is not ruled out.")
    return out


def conclusion(metrics: dict, table: pd.DataFrame, p) -> str:
    arms = list(p.arm_labels)
    lines = [f"**Setup.** One engine (`{p.engines[0]}`, {p.dtype}), {p.steps} steps × {p.prompts_per_step} prompts × "
             f"{p.group_size} completions, T={p.temperature:g}, lr={p.lr:g}, {p.num_seeds} seeds paired across "
             f"every arm and dose (same initial weights, prompts, sampling seeds and noise). Cost = final reward "
             f"(last {FINAL_FRAC:.0%} of steps) minus the same arm's clean run, seed by seed, with a 95% t interval; "
             f"a cost is a t test of that gap Holm-corrected over every dosed row; MDE = the smallest cost these "
             f"seeds detect with 80% power at the corrected level. {timing_note(p)}"]
    answer = answer_lines(metrics, table, p)
    lines.append("**Answer.** Where training measurably degrades, per kind of mismatch and arm:\n" + "\n".join(answer))
    # controls
    ctl = []
    clean = [a for a in arms if f"clean/{a}/reward_gain" in metrics]
    for a in clean:
        g, lo = metrics[f"clean/{a}/reward_gain"], metrics[f"clean/{a}/reward_gain_ci_low"]
        ok = np.isfinite(lo) and lo > 0
        ctl.append(f"clean `{a}` learns: reward {g:+.3f} [{lo:+.3f}, {metrics[f'clean/{a}/reward_gain_ci_high']:+.3f}] "
                   + ("(passes)" if ok else "(**fails**: with no gain to lose, a cost cannot be measured here)"))
    if "none@trainer" in arms and p.ratio_k3:
        same = table[(table["kind"] == "ratio") & (table["arm"] == "none@trainer")]
        ok = bool(same["identical"].all())
        ok = ok and bool((same["kl_to_clean"] == 0).all())
        ctl.append("`none@trainer` under ratio mismatch trains bitwise as its clean run at every dose (every seed's "
                   "reward curve equal, KL to its clean twin 0) "
                   + ("(passes: the reported logprobs never reach its update)" if ok else
                      "(**fails**: the reported logprobs reached an update that should not read them; the design "
                      "or the loop is wrong)"))
    if ctl:
        lines.append("**Controls.** " + "; ".join(ctl) + ".")
    ach = table[table["kind"] == "ratio"].drop_duplicates("dose")
    if len(ach):
        lines.append("**Doses achieved** (ratio mismatch: noise of std sqrt(2 ln(1 + k3)) on the reported logprobs; "
                     "intended → measured mean k3 per token, first arm): " + ", ".join(
                         f"{metric('k3', r.k3_intended, '.0e')} → {metric('k3', r.k3_achieved, '.2e')} "
                         f"(σ {logprob_noise_sigma(r.k3_intended):.3f})" for r in ach.itertuples())
                     + ". Distribution mismatch: " + (", ".join(
                         f"weight noise {r.dose:g} → k3 {metric('k3', r.k3_achieved, '.2e')}" for r in
                         table[table["kind"] == "weights"].drop_duplicates("dose").itertuples()) or "none run") + ".")
    lines.append("`kl_to_clean`: mean KL per token from the clean twin's trained policy (same arm and seed, dose 0) to "
                 "this run's, on a fixed probe of held-out prompts with their correct answers: what a dose did to the "
                 "policy whether or not reward shows it. Not in this run: the T = 1 control and real engines placed "
                 "on the curve (notebooks 01/06 measure their k3: read it against the x axis).")
    return "\n\n".join(lines)
