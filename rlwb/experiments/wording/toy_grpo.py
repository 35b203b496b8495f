"""Notebook 03's sentences: the setup, one line per engine + correction, the learning check, the paired gaps to the
reference, the drift monitor. `rlwb.experiments.toy_grpo` decides what ran and passes plain values; nothing here
computes a metric.
"""

from __future__ import annotations

import numpy as np

from rlwb.experiments.wording import floor_lines
from rlwb.formatting import KL_FLOOR, metric


def setup_line(steps: int, prompts_per_step: int, group_size: int, temperature: float, lr: float,
               old_logprobs: str, num_seeds: int, timing_note: str) -> str:
    return (f"**Setup.** {steps} steps × {prompts_per_step} prompts × {group_size} completions, "
            f"T={temperature:g}, lr={lr:g}, old logprobs from the {old_logprobs}, {num_seeds} seeds "
            f"(means over seeds; first/last = first/last 10% of steps). {timing_note}")


def skipped_lines(skipped_k3_max: dict[str, float], others: list[str]) -> list[str]:
    """Which engines ran `none` alone because their `none` runs measured no mismatch (`skip_at_floor`), with the
    largest per-step k3 that decision rests on (`skipped_k3_max`: engine -> that k3; `others`: the corrections not
    run there)."""
    if not others or not skipped_k3_max:
        return []
    where = ", ".join(f"`{e}` (largest per-step k3 {metric('k3', k3, '.1e')})" for e, k3 in skipped_k3_max.items())
    return [f"\nNot run on {where}: {', '.join(f'`{c}`' for c in others)}. Their `none` runs measured "
            f"engine-trainer k3 at the float floor (≤ {KL_FLOOR:g}) on every step, so every correction's weight is 1 "
            f"and its run would repeat `none`'s (`skip_at_floor: false` runs them anyway)."]


def run_line(metrics: dict, label: str) -> str:
    """One `<engine>+<correction>`: reward first → last (the last one's 95% interval where it has one), clip
    fraction, engine-trainer k3, seconds per step."""
    a, b = metrics[f"{label}/reward_first"], metrics[f"{label}/reward_last"]
    lo, hi = metrics.get(f"{label}/reward_last_ci_low"), metrics.get(f"{label}/reward_last_ci_high")
    ci = f" [95% CI {lo:.3f}, {hi:.3f}]" if lo is not None and np.isfinite(lo) else ""
    return (f"- `{label}`: reward {a:.3f} → {b:.3f}{ci} ({b - a:+.3f}); clip fraction "
            f"{metrics[f'{label}/clip_frac_mean']:.1%}; "
            f"engine-trainer k3 {metric('k3', metrics[f'{label}/mismatch_k3_mean'], '.1e')}; "
            f"{metrics[f'{label}/step_s_mean']:.2f} s/step.")


def learning_check_line(label: str, gain: float, ci_low: float | None, ci_high: float | None,
                        min_gain: float) -> str:
    """Does the correct configuration learn on this budget: its reward gain against the criterion `min_gain`."""
    verdict = "learns" if gain >= min_gain else "does NOT learn"
    ci = f" [95% CI over seeds {ci_low:+.3f}, {ci_high:+.3f}]" if ci_low is not None and np.isfinite(ci_low) else ""
    return (f"\n**Learning check.** The correct configuration `{label}` {verdict} on this budget: reward "
            f"{gain:+.3f}{ci} (criterion: ≥ {min_gain:+.2f}).")


def paired_gaps_line(reference: str, gaps: dict[str, tuple[float, float, float]], num_seeds: int) -> str:
    """Each configuration's final reward minus the reference's, seed by seed (`gaps`: label -> (mean, 95% low,
    high)); an interval that holds 0 is said to show no cost, not an absent one."""
    return (f"\n**Paired gaps to `{reference}`** (final reward minus its, seed by seed; 95% CI over "
            f"{num_seeds} seeds): " + "; ".join(f"`{L}` {g:+.3f} [{lo:+.3f}, {hi:+.3f}]"
                                                 for L, (g, lo, hi) in gaps.items())
            + ". An interval that holds 0 shows no cost at this budget, which is not a cost shown absent "
              "(notebook 08 sizes the smallest cost a budget can detect).")


def drift_monitor_line(what: str, side: str, threshold: float, patience: int, window: int,
                       tripped: dict[str, tuple[float, float]], quiet: list[str]) -> str:
    """Where the drift monitor stopped runs (`tripped`: label -> (fraction of seeds, mean step)) and where not."""
    trip = [f"`{L}` ({frac:.0%} of seeds, at step {step:.0f} on average)" for L, (frac, step) in tripped.items()]
    return (f"\n**Drift monitor** ({what} {side} {threshold:g} in {patience} consecutive {window}-step windows): "
            f"tripped on " + (", ".join(trip) or "none") + "; quiet on " + (", ".join(f"`{L}`" for L in quiet)
                                                                            or "none") + ".")


def no_gain_line(best_gain: float, steps: int, min_gain: float = 0.05) -> str:
    """"" unless no configuration improved its reward by `min_gain` within the run."""
    if best_gain >= min_gain:
        return ""
    return (f"\nNo configuration improved its reward by {min_gain:g} or more within {steps} steps "
            f"(best: {best_gain:+.3f}).")


def conclusion(metrics: dict, setup: dict) -> str:
    """Notebook 03's answer in Markdown. `setup`: the plain values `toy_grpo.conclusion` collects (the run's
    settings, `labels` in order, `skipped_k3_max`, `others`, `reference` with `learning_min_gain`, the paired
    `reference` and its `gaps`, `drift` (None or `drift_monitor_line`'s arguments))."""
    s = setup
    lines = [setup_line(s["steps"], s["prompts_per_step"], s["group_size"], s["temperature"], s["lr"],
                        s["old_logprobs"], s["num_seeds"], s["timing_note"])]
    lines += [f"\n{w}" for w in floor_lines(metrics)]
    lines += skipped_lines(s["skipped_k3_max"], s["others"])
    lines += [run_line(metrics, L) for L in s["labels"]]
    gains = s["gains"]
    learning = s["learning_reference"]
    if learning in gains:
        lines.append(learning_check_line(learning, gains[learning], metrics.get(f"{learning}/reward_gain_ci_low"),
                                         metrics.get(f"{learning}/reward_gain_ci_high"), s["learning_min_gain"]))
    if s["paired_reference"] and s["gaps"] and s["num_seeds"] > 1:
        lines.append(paired_gaps_line(s["paired_reference"], s["gaps"], s["num_seeds"]))
    if s["drift"] is not None:
        lines.append(drift_monitor_line(**s["drift"]))
    if gains and (line := no_gain_line(max(gains.values()), s["steps"])):
        lines.append(line)
    return "\n".join(lines)
