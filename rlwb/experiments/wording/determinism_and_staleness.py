"""Notebook 04's sentences: per engine, batch invariance, seeded reruns and the stale prefix cache after an
in-flight update. Takes the metrics and plain values.
"""

from __future__ import annotations

from rlwb.formatting import metric


def _names(engines: list[str]) -> str:
    return ", ".join(f"`{e}`" for e in engines)


def finding(metrics: dict, largest_batch: int, stale: list[str], reset_fixes: list[str], fresh: list[str],
            variant: list[str], invariant: list[str], rerun_differs: list[str]) -> str:
    """The paragraph the answer leads with: the engines that served a stale prefix cache after an in-flight weight
    update (max |Δlogp| vs the trainer without a reset, then after `reset_prefix_cache()`), or that none did; then
    batch invariance (the engines whose greedy requests change with the batch, and those that do not); then seeded
    reruns that differ, if any. The lists are the experiment's decisions."""
    g = lambda e, k: metrics.get(f"{e}/{k}")
    v = lambda e, k: metric(k, g(e, k), ".1e")
    if stale:
        text = "Stale prefix cache after an in-flight weight update: " + "; ".join(
            f"`{e}` max |Δlogp| vs the trainer {v(e, 'stale_cache_abs_dlogp_max')} without a reset, "
            f"{v(e, 'after_reset_abs_dlogp_max')} after reset_prefix_cache()"
            + ("" if e in reset_fixes else " (still off the float floor)") for e in stale) + "."
        if fresh:
            text += f" {_names(fresh)}: no stale cache."
    else:
        top = max((g(e, "stale_cache_abs_dlogp_max") or 0.0) for e in fresh) if fresh else float("nan")
        text = (f"No engine served a stale prefix cache after an in-flight weight update (max |Δlogp| vs the trainer "
                f"{metric('stale_cache_abs_dlogp_max', top, '.1e')} without a reset).")
    if variant or invariant:
        text += (f" Greedy requests bitwise identical alone vs in a batch of {largest_batch}: "
                 + "; ".join([f"`{e}` {g(e, 'batch_invariant_frac'):.0%}" for e in variant]
                             + ([f"{_names(invariant)} 100%"] if variant and invariant else
                                ["100% for every engine"] if invariant else []))
                 + ".")
    if rerun_differs:
        text += " Seeded reruns differ: " + ", ".join(
            f"`{e}` ({g(e, 'rerun_identical_frac'):.0%} identical)" for e in rerun_differs) + "."
    return text


def conclusion(metrics: dict, engines: list[str], largest_batch: int, stale: list[str] = (),
               reset_fixes: list[str] = (), fresh: list[str] = (), variant: list[str] = (),
               invariant: list[str] = (), rerun_differs: list[str] = ()) -> str:
    """The finding (`finding`), then a line per engine that ran."""
    lines = [finding(metrics, largest_batch, list(stale), list(reset_fixes), list(fresh), list(variant),
                     list(invariant), list(rerun_differs)), ""]
    for e in engines:
        g = lambda k: metrics.get(f"{e}/{k}")
        v = lambda k, spec=".1e": metric(k, g(k), spec)  # at the float floor: "≤ 1e-07", never noise
        if g("batch_invariant_frac") is None:
            continue
        lines.append(
            f"- `{e}` (prefix caching {'on' if g('prefix_caching') else 'off'}): "
            f"{g('batch_invariant_frac'):.0%} of greedy requests bitwise identical alone vs in a batch of "
            f"{largest_batch} (max |Δlogp| {v('batch_max_abs_dlogp')}); "
            f"{g('rerun_identical_frac'):.0%} of seeded reruns identical; after an in-flight update without a "
            f"cache reset max |Δlogp| vs the trainer = {v('stale_cache_abs_dlogp_max')}, after a reset "
            f"{v('after_reset_abs_dlogp_max')}.")
    return "\n".join(lines)
