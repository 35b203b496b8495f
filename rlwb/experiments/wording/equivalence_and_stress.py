"""Notebook 05's sentences: per engine, the validator's pass rate with its Wilson interval, memory pressure against
a free KV cache, and long context, each statement with its interval. Takes the metrics and the engines and
tolerance as plain values.
"""

from __future__ import annotations

from rlwb.formatting import metric, number


def conclusion(metrics: dict, engines: list[str], validate_tolerance: float) -> str:
    """Every statement with its interval (95%)."""
    lines = []
    for e in engines:
        g = lambda k: metrics.get(f"{e}/{k}")
        v = lambda k, spec=".1e": metric(k, g(k), spec)  # at the float floor: "≤ 1e-07", never noise
        if g("validate_pass_rate") is None:
            continue
        s = (f"- `{e}`: validator {g('validate_pass_rate'):.0%} of {int(g('validate_cases'))} cases within "
             f"{validate_tolerance:g} (95% CI {g('validate_pass_rate_ci_low'):.0%}-"
             f"{g('validate_pass_rate_ci_high'):.0%}), "
             f"worst max |Δlogp| {v('validate_worst_abs_dlogp')}. ")
        if g("pressure_abs_dlogp_max") is not None:
            pre = g("pressure_preemptions")
            s += (f"Under memory pressure ({int(g('pressure_kv_tokens'))}-token KV cache, "
                  f"{'preemptions not exposed' if pre is None or pre != pre else f'{int(pre)} preemptions'}): "
                  f"max |Δlogp| vs trainer "
                  f"{v('pressure_abs_dlogp_max')} (mean {v('pressure_abs_dlogp_mean')}, 95% CI "
                  f"{v('pressure_abs_dlogp_mean_ci_low')}-{v('pressure_abs_dlogp_mean_ci_high')}) vs "
                  f"{v('free_abs_dlogp_max')} without; {g('pressure_identical_frac'):.0%} of requests gave the "
                  f"same "
                  f"tokens as without pressure. ")
        else:
            s += "No paged KV cache, so no memory-pressure check. "
        s += (f"Long context up to position {int(g('longctx_max_position'))}: "
              f"max |Δlogp| {v('longctx_abs_dlogp_max')} "
              f"(over the whole vocabulary {number(g('longctx_dist_abs_dlogp_max'), '.1e', 'n/a')}: "
              f"shortest prompts {g('longctx_max_near'):.1e}, "
              f"longest {g('longctx_max_far'):.1e}; "
              f"mean {v('longctx_abs_dlogp_mean')}, 95% CI {v('longctx_abs_dlogp_mean_ci_low')}-"
              f"{v('longctx_abs_dlogp_mean_ci_high')}).")
        lines.append(s)
    return "\n".join(lines)
