"""Notebook 03's experiment: toy GRPO with rollouts from real engines, per engine config and correction.

The loop itself (one step, a training run, in-flight weight sync) is `rlwb.core.rl.grpo`; the grid over it (engines x
corrections x seeds, all from the same initial weights) is `grpo_grid.train_grid`, shared with notebook 07; this
module turns the curves into metrics and writes the conclusion.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
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
from rlwb.experiments.wording import floor_lines
from rlwb.formatting import KL_FLOOR, metric

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
        data_dir: str | Path | None = None) -> GRPOResult:
    """Every engine x correction x seed from the same initial weights (only `none` on an engine whose `none`
    runs measured no mismatch, with `skip_at_floor`).
    Each engine starts once; every run reloads the initial weights into the trainer and (in flight) into the
    engine. With `drift_threshold` > 0 every run has a drift monitor (`drift_trip_step` records where it
    tripped; the offending batch goes to `data_dir`)."""
    curves = train_grid(params, model_path, on_start=on_start, progress=progress, drift_dir=data_dir)
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


def skipped_lines(metrics: dict, p) -> list[str]:
    """Which engines ran `none` alone because their `none` runs measured no mismatch (`skip_at_floor`), with
    the largest per-step k3 that decision rests on."""
    others = [c for c in p.corrections if c != "none"]
    engines = [e for e in p.engines if metrics.get(f"{e}/skipped_at_floor") == 1.0]
    if not others or not engines:
        return []
    where = ", ".join(f"`{e}` (largest per-step k3 {metric('k3', metrics[f'{e}+none/mismatch_k3_max'], '.1e')})"
                      for e in engines)
    return [f"\nNot run on {where}: {', '.join(f'`{c}`' for c in others)}. Their `none` runs measured "
            f"engine-trainer k3 at the float floor (≤ {KL_FLOOR:g}) on every step, so every correction's weight is 1 "
            f"and its run would repeat `none`'s (`skip_at_floor: false` runs them anyway)."]


def conclusion(metrics: dict, p) -> str:
    lines = [f"**Setup.** {p.steps} steps × {p.prompts_per_step} prompts × {p.group_size} completions, "
             f"T={p.temperature:g}, lr={p.lr:g}, old logprobs from the {p.old_logprobs}, {p.num_seeds} seeds "
             f"(means over seeds; first/last = first/last 10% of steps). {timing_note(p)}"]
    lines += [f"\n{w}" for w in floor_lines(metrics)]
    lines += skipped_lines(metrics, p)
    for e in p.engines:
        for c in p.corrections:
            L = f"{e}+{c}"
            if f"{L}/reward_first" not in metrics:
                continue
            a, b = metrics[f"{L}/reward_first"], metrics[f"{L}/reward_last"]
            lo, hi = metrics.get(f"{L}/reward_last_ci_low"), metrics.get(f"{L}/reward_last_ci_high")
            ci = f" [95% CI {lo:.3f}, {hi:.3f}]" if lo is not None and np.isfinite(lo) else ""
            lines.append(f"- `{L}`: reward {a:.3f} → {b:.3f}{ci} ({b - a:+.3f}); clip fraction "
                         f"{metrics[f'{L}/clip_frac_mean']:.1%}; "
                         f"engine-trainer k3 {metric('k3', metrics[f'{L}/mismatch_k3_mean'], '.1e')}; "
                         f"{metrics[f'{L}/step_s_mean']:.2f} s/step.")
    deltas = {k.rsplit("/", 1)[0]: metrics[k.replace("reward_first", "reward_last")] - metrics[k]
              for k in metrics if k.endswith("/reward_first")}
    ref = "vllm-v1-fixed+none"
    if ref in deltas:
        verdict = "learns" if deltas[ref] >= LEARNING_MIN_GAIN else "does NOT learn"
        lo, hi = metrics.get(f"{ref}/reward_gain_ci_low"), metrics.get(f"{ref}/reward_gain_ci_high")
        ci = f" [95% CI over seeds {lo:+.3f}, {hi:+.3f}]" if lo is not None and np.isfinite(lo) else ""
        lines.append(f"\n**Learning check.** The correct configuration `{ref}` {verdict} on this budget: reward "
                     f"{deltas[ref]:+.3f}{ci} (criterion: ≥ {LEARNING_MIN_GAIN:+.2f}).")
    paired = reference(deltas)
    gaps = [L for L in deltas if f"{L}/gap" in metrics]
    if paired and gaps and p.num_seeds > 1:
        lines.append(f"\n**Paired gaps to `{paired}`** (final reward minus its, seed by seed; 95% CI over "
                     f"{p.num_seeds} seeds): " + "; ".join(
                         f"`{L}` {metrics[f'{L}/gap']:+.3f} [{metrics[f'{L}/gap_ci_low']:+.3f}, "
                         f"{metrics[f'{L}/gap_ci_high']:+.3f}]" for L in gaps) + ". An interval that holds 0 "
                     "shows no cost at this budget, which is not a cost shown absent (notebook 08 sizes the "
                     "smallest cost a budget can detect).")
    if getattr(p, "drift_threshold", 0) > 0:
        tripped = [f"`{L}` ({metrics[f'{L}/drift_trip_frac']:.0%} of seeds, at step "
                   f"{metrics[f'{L}/drift_trip_step_mean']:.0f} on average)" for L in deltas
                   if (metrics.get(f"{L}/drift_trip_frac") or 0) > 0]
        quiet = [f"`{L}`" for L in deltas if metrics.get(f"{L}/drift_trip_frac") == 0]
        dm = getattr(p, "drift_metric", "mismatch_k3")
        side = "below" if dm in LOWER_IS_WORSE else "above"
        what = "engine-trainer k3" if dm == "mismatch_k3" else f"`{dm}`"
        lines.append(f"\n**Drift monitor** ({what} {side} {p.drift_threshold:g} in {DRIFT_PATIENCE} "
                     f"consecutive {DRIFT_WINDOW}-step windows): tripped on " + (", ".join(tripped) or "none")
                     + "; quiet on " + (", ".join(quiet) or "none") + ".")
    if deltas and max(deltas.values()) < 0.05:
        lines.append(f"\nNo configuration improved its reward by 0.05 or more within {p.steps} steps (best: "
                     f"{max(deltas.values()):+.3f}).")
    return "\n".join(lines)
