"""Notebook 04's sentences: per engine, batch invariance, seeded reruns and the stale prefix cache after an
in-flight update. Takes the metrics and plain values.
"""

from __future__ import annotations

from rlwb.formatting import metric


def conclusion(metrics: dict, engines: list[str], largest_batch: int) -> str:
    lines = []
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
