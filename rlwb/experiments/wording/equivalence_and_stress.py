"""Notebook 05's sentences: per engine, the validator's pass rate with its Wilson interval, memory pressure against
a free KV cache, and long context, each statement with its interval. Takes the metrics and the engines and
tolerance as plain values.
"""

from __future__ import annotations

from rlwb.formatting import metric, number


def _names(engines: list[str]) -> str:
    return ", ".join(f"`{e}`" for e in engines)


def finding(metrics: dict, validate_tolerance: float, failing: list[str], passing: list[str],
            shrunk: dict[str, str], pressure_off: list[str], pressure_floor: list[str], longctx_off: list[str],
            longctx_floor: list[str]) -> str:
    """The paragraph the answer leads with: the engines that fail the property-based validator (pass rate with its
    interval, worst max |Δlogp|, the shrunk case), those that pass, then memory pressure and long context (the engines
    off the float floor, or that every engine checked stays at it). The lists, and `shrunk` (engine -> its minimal
    failing case in words), are the experiment's decisions."""
    g = lambda e, k: metrics.get(f"{e}/{k}")
    v = lambda e, k: metric(k, g(e, k), ".1e")
    if failing:
        text = "Fail the validator: " + "; ".join(
            f"`{e}` {g(e, 'validate_pass_rate'):.0%} of {int(g(e, 'validate_cases'))} cases within "
            f"{validate_tolerance:g} (95% CI {g(e, 'validate_pass_rate_ci_low'):.0%}-"
            f"{g(e, 'validate_pass_rate_ci_high'):.0%})" for e in failing) + "."
        if passing:
            text += f" Pass: {_names(passing)}."
    else:
        text = (f"Every engine passes the validator ({_names(passing)}: every case within {validate_tolerance:g})."
                if passing else "No engine ran the validator.")
    checks = (("memory pressure", pressure_off, pressure_floor, "pressure_abs_dlogp_max"),
              ("long context", longctx_off, longctx_floor, "longctx_abs_dlogp_max"))
    quiet = [what for what, off, floor, _ in checks if floor and not off]
    if quiet:
        text += (f" {' and '.join(quiet).capitalize()} {'keep' if len(quiet) > 1 else 'keeps'} every engine checked "
                 "at the float floor.")
    for what, off, _, key in checks:
        if off:
            text += (f" Off the float floor under {what}: "
                     + ", ".join(f"`{e}` (max |Δlogp| {v(e, key)})" for e in off) + ".")
    for e in failing:
        if e in shrunk:
            text += f" `{e}`'s shrunk failing case: {shrunk[e]}."
    return text


def conclusion(metrics: dict, engines: list[str], validate_tolerance: float, failing: list[str] = (),
               passing: list[str] = (), shrunk: dict[str, str] | None = None, pressure_off: list[str] = (),
               pressure_floor: list[str] = (), longctx_off: list[str] = (), longctx_floor: list[str] = ()) -> str:
    """The finding (`finding`), then per engine every statement with its interval (95%)."""
    lines = [finding(metrics, validate_tolerance, list(failing), list(passing), shrunk or {}, list(pressure_off),
                     list(pressure_floor), list(longctx_off), list(longctx_floor)), ""]
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
