"""Notebook 09's sentences: the setup, the float64 reference's control, one line per trainer setting, what did not
run, the head grid (engine × trainer fp32 lm_head) with its least and most mismatched cells, the one k3 scale beside
notebook 06's knobs, and the one-line answer. `rlwb.experiments.trainer_settings` decides (the order, whether the
reference is batch-invariant, whether two intervals separate, which side is larger, whether notebook 06 ran on the
same model) and passes plain values; nothing here compares or measures.
"""

from __future__ import annotations

import numpy as np

from rlwb.experiments.wording import ci_text
from rlwb.formatting import metric


def k3_interval(low, high) -> str:
    """`[low, high]` of a k3 interval as notebook 09 prints it (`metric`'s 3 significant digits, the float floor
    read as such), or "" without one (a bound missing or not finite)."""
    return ci_text({"x/k3_mean_ci_low": low, "x/k3_mean_ci_high": high}, "x", "k3_mean", ".2e")


def setup_line(sampler: str, model: str, prompt_sources: list[str], prompts: int, temperature: float,
               max_tokens: int) -> str:
    """`prompts`: how many were sampled over all `prompt_sources`."""
    return (f"**Setup.** `{sampler}` (fp32) sampled {prompts} prompts ({', '.join(prompt_sources)}; "
            f"T={temperature:g}, up to {max_tokens} tokens) on `{model}`; every trainer setting scored the same "
            f"sequences against a float64 forward of the same weights, one sequence per forward. k3 is per token, "
            f"with 95% intervals resampling sequences.")


def control_line(abs_dlogp_max: float, identical_frac: float, batch_invariant: bool) -> str:
    """The control `fp64` (float64 in the scorer's batches) against the per-sequence reference; `batch_invariant`:
    every sequence came out bitwise identical, so the reference agrees with itself across batch sizes."""
    return (f"\n**Control.** float64 in the scorer's batches vs the per-sequence reference: max |Δlogp| "
            f"{metric('abs_dlogp_max', abs_dlogp_max)}, {identical_frac:.0%} of sequences bitwise identical"
            + (" — the reference agrees with itself across batch sizes." if batch_invariant else
               " — the float64 reference is not batch-invariant here; it is run one sequence per forward, so it is "
               "fixed whatever the setting's batches."))


def setting_line(metrics: dict, setting: str) -> str:
    """One trainer setting from `metrics` (`<setting>/...`): k3 against float64 with its interval, max |Δlogp|,
    batch invariance (no `batch1_identical_frac`: it runs one sequence per forward itself), time relative to `fp32`
    ("–" without one) and, for a setting with grad, its PPO ratio at the first micro-step."""
    m, s = metrics, setting
    same = m.get(f"{s}/batch1_identical_frac")
    inv = "batch 1 itself" if same is None else f"{same:.0%} same as batch 1"
    extra = ""
    if f"{s}/ppo_ratio_abs_log_max" in m:
        r = m[f"{s}/ppo_ratio_abs_log_max"]
        extra = (f"; PPO ratio at the first micro-step exactly 1 on {m[f'{s}/ppo_ratio_identical_frac']:.0%} "
                 f"of sequences (max |log r| {metric('abs_dlogp_max', r)} against its old-logprob pass)")
    tr = m.get(f"{s}/time_ratio", float("nan"))
    time = f"{tr:.2f}×" if np.isfinite(tr) else "–"
    return (f"- `{s}`: k3 {metric('k3_mean', m[f'{s}/k3_mean'])} {ci_text(m, s, 'k3_mean', '.2e')}, max |Δlogp| "
            f"{metric('abs_dlogp_max', m[f'{s}/abs_dlogp_max'])}, {inv}, {time} time{extra}.")


def settings_lines(metrics: dict, ordered: list[str]) -> list[str]:
    """The trainer settings that ran (the control `fp64` aside), in the order given (largest k3 first)."""
    if not ordered:
        return []
    return ["\n**Trainer settings, largest k3 against float64 first** (max |Δlogp|; share of sequences bitwise equal "
            "to the same setting one sequence at a time; time relative to `fp32`):",
            *(setting_line(metrics, s) for s in ordered)]


def not_run_line(errors: dict[str, str]) -> str:
    """Trainer settings this machine could not run (setting -> the library's one-line error); "" when all ran."""
    if not errors:
        return ""
    return ("\n**Did not run here** (the library's own words): "
            + "; ".join(f"`{s}`: {e.rstrip('.')}" for s, e in errors.items()) + ".")


def grid_failed_line(failed: list[tuple[str, str, str]]) -> str:
    """Head-grid engines that did not run: (engine, status, the engine's error); "" when all ran."""
    if not failed:
        return ""
    return ("\n**Engines of the head grid that did not run here**: "
            + "; ".join(f"`{e}`: {status} ({error.rstrip('.')})" for e, status, error in failed) + ".")


def grid_lines(engines: list[dict]) -> list[str]:
    """The head grid's cells that ran, one bullet per engine: `engines` is a list of {"engine", "engine_k3" (the
    engine against the float64 reference), "cells": [{"trainer", "k3" (engine vs trainer), "trainer_k3" (the
    trainer against the reference)}]}."""
    if not engines:
        return []
    out = ["\n**fp32 lm_head on the engine side × on the trainer side** (k3 engine vs trainer on the engine's "
           "own samples; each side's k3 against the float64 reference in brackets):"]
    for e in engines:
        parts = [f"trainer `{c['trainer']}` {metric('k3_mean', c['k3'])} "
                 f"(trainer alone {metric('k3_mean', c['trainer_k3'])})" for c in e["cells"]]
        out.append(f"- `{e['engine']}` (engine alone {metric('k3_mean', e['engine_k3'])}): " + "; ".join(parts) + ".")
    return out


def grid_extremes_line(least: dict, most: dict, separate: bool) -> str:
    """The grid's least and most mismatched cells ({"engine", "trainer", "k3_mean", "k3_mean_ci_low",
    "k3_mean_ci_high"}); `separate`: their intervals do not overlap."""
    def cell(c: dict) -> str:
        return (f"`{c['engine']}` with trainer `{c['trainer']}` ({metric('k3_mean', c['k3_mean'])} "
                f"{k3_interval(c['k3_mean_ci_low'], c['k3_mean_ci_high'])})")

    return (f"\nLeast mismatch in the grid: {cell(least)}; most: {cell(most)}"
            + ("." if separate else "; their intervals overlap at this sample size."))


def knobs_source(knobs_run: dict, model: str, same_model: bool | None) -> str:
    """Which notebook 06 run's engine knobs join the scale (`knobs_run`: its `run_id`, `model`, `prompt_source`), and
    whether it ran on this run's `model`; or why none (`knobs_run["note"]`)."""
    if "run_id" not in knobs_run:
        return f"none ranked: {knobs_run.get('note', '')}"
    return (f"notebook 06's run `{knobs_run['run_id']}` (model `{knobs_run['model']}`, "
            f"{knobs_run['prompt_source']} prompts)"
            + ("" if same_model else f": another model than this run's `{model}`, so its knobs and this run's "
                                     f"settings compare only in order of magnitude"))


def ranking_lines(knobs_run: dict, model: str, same_model: bool | None, largest_trainer: dict | None,
                  largest_engine: dict | None, engine_bigger: bool, separate: bool) -> list[str]:
    """The one k3 scale: where notebook 06's knobs come from, and which side's largest setting is larger
    (`largest_*`: {"name", "k3_mean", "k3_mean_ci_low", "k3_mean_ci_high"}, None where that side has none;
    `engine_bigger` and `separate` (the two intervals do not overlap) decided by the experiment)."""
    out = [f"\n**One scale, k3 per token** (trainer settings against float64, engine settings against the fp32 "
           f"trainer). Engine knobs of notebook 06: {knobs_source(knobs_run, model, same_model)}."]
    if largest_trainer is not None and largest_engine is not None:
        t, e = largest_trainer, largest_engine
        bigger = "the engine's" if engine_bigger else "the trainer's"
        out.append(f"The largest trainer-side k3 is `{t['name']}` ({metric('k3_mean', t['k3_mean'])} "
                   f"{k3_interval(t['k3_mean_ci_low'], t['k3_mean_ci_high'])}), the largest engine-side "
                   f"`{e['name']}` ({metric('k3_mean', e['k3_mean'])} "
                   f"{k3_interval(e['k3_mean_ci_low'], e['k3_mean_ci_high'])}): of the settings measured, {bigger} "
                   f"side contributes more of the mismatch a user sees"
                   + ("." if separate else ", though their intervals overlap at this sample size."))
    return out


def answer(largest_trainer: dict | None, largest_engine: dict | None, fp32_identical_frac: float | None) -> str:
    """The index's one line: each side's largest k3, and how often rlwb's own fp32 scorer is bitwise equal to its
    batch-1 result; "" when there is nothing to say (the caller falls back to the conclusion's first finding)."""
    parts = []
    if largest_trainer is not None:
        parts.append(f"largest trainer-side k3 {largest_trainer['name']} {metric('k3', largest_trainer['k3_mean'])} "
                     f"(vs float64)")
    if largest_engine is not None:
        parts.append(f"largest engine-side k3 {largest_engine['name']} {metric('k3', largest_engine['k3_mean'])} "
                     f"(vs the fp32 trainer)")
    if fp32_identical_frac is not None:
        parts.append(f"rlwb's fp32 scorer bitwise equal to its batch-1 result on {fp32_identical_frac:.0%} of "
                     f"sequences")
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + "." if parts else ""


def conclusion(metrics: dict, setup: dict) -> str:
    """Notebook 09's answer in Markdown. `setup`: `setup_line`'s arguments under `run`; `control` (`control_line`'s
    arguments, None without an `fp64` row); `ordered` (the settings that ran, largest k3 first); `not_run`;
    `grid_failed`; `grid` (`grid_lines`'s engines); `grid_extremes` (`grid_extremes_line`'s arguments, None without
    a cell); `ranking` (`ranking_lines`'s arguments, None without a ranking)."""
    s = setup
    lines = [setup_line(**s["run"])]
    if s["control"] is not None:
        lines.append(control_line(**s["control"]))
    lines += settings_lines(metrics, s["ordered"])
    lines += [t for t in (not_run_line(s["not_run"]), grid_failed_line(s["grid_failed"])) if t]
    lines += grid_lines(s["grid"])
    if s["grid_extremes"] is not None:
        lines.append(grid_extremes_line(**s["grid_extremes"]))
    if s["ranking"] is not None:
        lines += ranking_lines(**s["ranking"])
    return "\n".join(lines)
