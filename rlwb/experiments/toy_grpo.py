"""Notebook 03's experiment: toy GRPO with rollouts from real engines, per engine config and correction.

The loop itself (one step, a training run, in-flight weight sync) is `rlwb.core.rl.grpo`; the grid over it (engines x
corrections x seeds, all from the same initial weights) is `grpo_grid.train_grid`, shared with notebook 07; this
module turns the curves into metrics and gathers what the conclusion states (its sentences:
`rlwb.experiments.wording.toy_grpo`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from rlwb.core.measure import stats
from rlwb.core.rl.correction_catalog import LOWER_IS_WORSE
from rlwb.experiments.base import OnStart, Result
from rlwb.experiments.grpo_grid import (
    DRIFT_PATIENCE,
    DRIFT_WINDOW,
    at_floor,
    final_reward,
    floor_breaches,
    reward_gain,
    timing_note,
    train_grid,
)
from rlwb.experiments.wording import toy_grpo as wording_03

REFERENCE = "vllm-v1-fixed+none"  # the fixed engine, uncorrected: what notebook 03 pairs every run against
LEARNING_MIN_GAIN = 0.15  # reward_last - reward_first the correct configuration must reach (notebook 03)


@dataclass
class GRPOResult(Result):
    ANSWER_LEADS = ("Paired gaps", "Learning check")  # what mismatch did to the reward, not which arms were skipped
    curves: pd.DataFrame  # one row per (engine, correction, seed, step): CURVE_COLUMNS + drift_trip_step

    def frames(self) -> dict[str, pd.DataFrame]:
        return {"curves": self.curves}

    def summary(self) -> pd.DataFrame:
        """Per engine + correction, means over seeds: reward first/last 10% of steps and the gain with its
        95% interval, the final reward's gap to the reference paired by seed (95% interval), clip fraction,
        engine-trainer k3, seconds per step."""
        m, rows = self.metrics, []
        labels = list(dict.fromkeys(k.rsplit("/", 1)[0] for k in m if k.endswith("/reward_gain")))
        ref = reference(labels)
        for key in labels:
            rows.append({"run": key, "reward_first": m[f"{key}/reward_first"], "reward_last": m[f"{key}/reward_last"],
                         "reward_gain": m[f"{key}/reward_gain"], "gain_ci_low": m[f"{key}/reward_gain_ci_low"],
                         "gain_ci_high": m[f"{key}/reward_gain_ci_high"], "clip_frac": m[f"{key}/clip_frac_mean"],
                         "gap": m.get(f"{key}/gap", 0.0 if key == ref else float("nan")),
                         "gap_ci_low": m.get(f"{key}/gap_ci_low", float("nan")),
                         "gap_ci_high": m.get(f"{key}/gap_ci_high", float("nan")),
                         "mismatch_k3": m[f"{key}/mismatch_k3_mean"], "step_s": m[f"{key}/step_s_mean"]})
        return pd.DataFrame(rows).set_index("run")

    def conclusion(self) -> str:
        return conclusion(self.metrics, self.params)


def run(params, model_path, *, on_start: OnStart = None, progress: bool = True,
        data_dir: str | Path | None = None, store=None) -> GRPOResult:
    """Every engine x correction x seed from the same initial weights (only `none` on an engine whose `none`
    runs measured no mismatch, with `skip_at_floor`).
    Each engine starts once; every run reloads the initial weights into the trainer and (in flight) into the
    engine. With `drift_threshold` > 0 every run has a drift monitor (`drift_trip_step` records where it
    tripped; the offending batch goes to `data_dir`). With `store` (the run's job store) each run is kept as it
    finishes, and a resumed run takes over the runs it resumes (`grpo_grid.train_grid`)."""
    curves = train_grid(params, model_path, on_start=on_start, progress=progress, drift_dir=data_dir,
                        store=store)
    return GRPOResult(params, curve_metrics(curves), curves)


def curve_metrics(curves: pd.DataFrame) -> dict[str, float]:
    """Per `<engine>+<correction>`, means over seeds: reward over the first / last 10% of steps (with 95%
    Student-t intervals across seeds), clip fraction, engine-trainer k3 and seconds per step."""
    out = {}
    for (e, c), d in curves.groupby(["engine", "correction"], sort=False):
        L = f"{e}+{c}"
        per_seed = dict(zip(("reward_first", "reward_last"), reward_gain(d)))
        for name in ("reward_first", "reward_last"):
            out[f"{L}/{name}"] = float(per_seed[name].mean())
            out[f"{L}/{name}_ci_low"], out[f"{L}/{name}_ci_high"] = stats.seed_ci(per_seed[name].to_numpy())
        gain = (per_seed["reward_last"] - per_seed["reward_first"]).to_numpy()  # paired within each seed
        out[f"{L}/reward_gain"] = float(gain.mean())
        out[f"{L}/reward_gain_ci_low"], out[f"{L}/reward_gain_ci_high"] = stats.seed_ci(gain)
        out[f"{L}/clip_frac_mean"] = float(d["clip_frac"].mean())
        out[f"{L}/mismatch_k3_mean"] = float(d["mismatch_k3"].mean())
        out[f"{L}/mismatch_k3_max"] = float(d["mismatch_k3"].max())
        out[f"{L}/step_s_mean"] = float(d[["t_rollout", "t_score", "t_update", "t_sync"]].sum(axis=1).mean())
        if "drift_trip_step" in d:
            trips = d.groupby("seed")["drift_trip_step"].first()
            out[f"{L}/drift_trip_frac"] = float(trips.notna().mean())
            out[f"{L}/drift_trip_step_mean"] = float(trips.mean()) if trips.notna().any() else float("nan")
    for e in curves["engine"].unique():
        ran = set(curves.loc[curves["engine"] == e, "correction"])
        out[f"{e}/skipped_at_floor"] = float(ran == {"none"} and at_floor(curves[curves["engine"] == e]))
    out.update(paired_gaps(curves))
    out.update(floor_breaches(curves))
    return out


def reference(labels) -> str | None:
    """The configuration notebook 03's gaps are paired against: `vllm-v1-fixed+none` (the fixed engine) when it
    ran, else the first engine's `none`."""
    labels = list(labels)
    return REFERENCE if REFERENCE in labels else next((x for x in labels if x.endswith("+none")), None)


def paired_gaps(curves: pd.DataFrame) -> dict[str, float]:
    """Per `<engine>+<correction>`: its final reward (last FINAL_FRAC of steps) minus the reference's, paired by seed
    (same seed: same initial weights, prompts and sampling seeds), with a 95% Student-t interval over seeds.
    Unpaired gains hide what pairing removes: much of a run's reward noise is its seed's prompts."""
    fin = final_reward(curves, ["engine", "correction", "seed"])
    labels = {f"{e}+{c}": (e, c) for e, c, _ in fin.index}
    ref = reference(labels)
    if ref is None:
        return {}
    base = fin.loc[labels[ref]]
    out = {}
    for L, key in labels.items():
        if ref == L:
            continue
        gap = (fin.loc[key] - base).dropna().to_numpy()
        out[f"{L}/gap"] = float(gap.mean()) if gap.size else float("nan")
        out[f"{L}/gap_ci_low"], out[f"{L}/gap_ci_high"] = stats.seed_ci(gap)
    return out


def conclusion(metrics: dict, p) -> str:
    """Notebook 03's answer (`wording.toy_grpo`), from the plain values gathered here: which runs exist, which
    engines skipped their corrections, the gains, the paired gaps and the drift monitor's trips."""
    gains = {k.rsplit("/", 1)[0]: metrics[k.replace("reward_first", "reward_last")] - metrics[k]
             for k in metrics if k.endswith("/reward_first")}
    others = [c for c in p.corrections if c != "none"]
    skipped = {e: metrics[f"{e}+none/mismatch_k3_max"] for e in p.engines
               if metrics.get(f"{e}/skipped_at_floor") == 1.0} if others else {}
    drift = None
    if getattr(p, "drift_threshold", 0) > 0:
        dm = getattr(p, "drift_metric", "mismatch_k3")
        drift = {"what": "engine-trainer k3" if dm == "mismatch_k3" else f"`{dm}`",
                 "side": "below" if dm in LOWER_IS_WORSE else "above", "threshold": p.drift_threshold,
                 "patience": DRIFT_PATIENCE, "window": DRIFT_WINDOW,
                 "tripped": {L: (metrics[f"{L}/drift_trip_frac"], metrics[f"{L}/drift_trip_step_mean"])
                             for L in gains if (metrics.get(f"{L}/drift_trip_frac") or 0) > 0},
                 "quiet": [L for L in gains if metrics.get(f"{L}/drift_trip_frac") == 0]}
    setup = {"steps": p.steps, "prompts_per_step": p.prompts_per_step, "group_size": p.group_size,
             "temperature": p.temperature, "lr": p.lr, "old_logprobs": p.old_logprobs, "num_seeds": p.num_seeds,
             "timing_note": timing_note(p), "skipped_k3_max": skipped, "others": others,
             "labels": [f"{e}+{c}" for e in p.engines for c in p.corrections if f"{e}+{c}/reward_first" in metrics],
             "gains": gains, "learning_reference": REFERENCE, "learning_min_gain": LEARNING_MIN_GAIN,
             "paired_reference": reference(gains),
             "gaps": {L: (metrics[f"{L}/gap"], metrics[f"{L}/gap_ci_low"], metrics[f"{L}/gap_ci_high"])
                      for L in gains if f"{L}/gap" in metrics},
             "drift": drift}
    return wording_03.conclusion(metrics, setup)
