"""Notebook 02's sentences: per engine the mismatch across temperatures against the analytical expectation, k3 at
one temperature with its interval, and the top-p renormalisation bias (TRL #6789). Takes the metrics and plain values;
`labels` maps (temperature, top_p) to the middle segment of the metric keys (`kl_vs_temperature.setting_label`).
"""

from __future__ import annotations

from rlwb.experiments.wording import ci_text
from rlwb.formatting import metric


def _names(engines: list[str]) -> str:
    return ", ".join(f"`{e}`" for e in engines)


def finding(metrics: dict, temps: list[float], labels: dict[tuple[float, float], str], off: list[str],
            explained: list[str], floor: list[str], truncation: dict[float, list[str]]) -> str:
    """The paragraph the answer leads with: which engines leave the float floor (k3 and max |Δlogp| at the lowest
    and highest T) and whether the analytical log ratio of raw logprobs accounts for it (then the engine drifts with
    temperature), which stay at the floor, then what a trainer that does not renormalise under top-p costs the engines
    at the floor. `off` (off the floor at some T), `explained` (those of `off` whose gap matches the raw-logprob
    expectation), `floor` and `truncation` (top_p -> engines at the floor) are the experiment's decisions."""
    lo, hi = temps[0], temps[-1]

    def at(e, T, name, spec):
        return metric(name, metrics.get(f"{e}/{labels[T, 1.0]}/{name}"), spec)

    def worst(e, name):
        return max((metrics.get(f"{e}/{labels[T, 1.0]}/{name}") or 0.0) for T in temps)

    parts = []
    for e in off:
        err = worst(e, "analytic_abs_err_max")
        parts.append(f"`{e}` " + ("drifts with T" if e in explained else "is off the float floor")
                     + f": k3 {at(e, lo, 'k3_mean', '.1e')} at T={lo:g}, "
                     f"{at(e, hi, 'k3_mean', '.1e')} at T={hi:g} (max |Δlogp| {at(e, lo, 'abs_dlogp_max', '.2f')}, "
                     f"{at(e, hi, 'abs_dlogp_max', '.2f')})"
                     + (f", matching raw logprobs' analytical log ratio to {err:.1e}" if e in explained
                        else f", which the analytical log ratio does not account for (off by up to {err:.1e})"))
    if floor:
        top = max(worst(e, "abs_dlogp_max") for e in floor)
        parts.append(f"{_names(floor)} {'stays' if len(floor) == 1 else 'stay'} at the float floor at every T "
                     f"(max |Δlogp| {top:.1e})")
    text = ("; ".join(parts) + "." if off else
            "No engine drifts with T: " + (parts[0] if parts else "none ran") + ".")
    for tp, es in truncation.items():
        keys = [(e, T) for e in es for T in temps if f"{e}+trainer_no_renorm/{labels[T, tp]}/k3_mean" in metrics]
        if not keys:
            continue
        e, T = max(keys, key=lambda k: metrics[f"{k[0]}+trainer_no_renorm/{labels[k[1], tp]}/k3_mean"])
        text += (f" A trainer that does not renormalise under top_p={tp:g} is off by k3 up to "
                 f"{metric('k3_mean', metrics[f'{e}+trainer_no_renorm/{labels[T, tp]}/k3_mean'], '.1e')} "
                 f"(`{e}`, T={T:g}; TRL #6789).")
    return text


def conclusion(metrics: dict, engines: list[str], temperatures: list[float], top_p_values: list[float],
               labels: dict[tuple[float, float], str], off: list[str] = (), explained: list[str] = (),
               floor: list[str] = (), truncation: dict[float, list[str]] | None = None) -> str:
    """The finding (`finding`), then per engine its mismatch across temperatures, k3 at one temperature, and the
    top-p renormalisation bias."""
    temps = sorted(temperatures)
    lines = [finding(metrics, temps, labels, list(off), list(explained), list(floor), truncation or {}), ""]
    for e in engines:
        vals = [metrics.get(f"{e}/{labels[T, 1.0]}/abs_dlogp_max") for T in temps]
        if all(v is None for v in vals):
            continue
        worst = max((v for v in vals if v is not None), default=float("nan"))
        at1 = metrics.get(f"{e}/{labels[1.0, 1.0]}/abs_dlogp_max") if 1.0 in temps else None
        err = max((metrics.get(f"{e}/{labels[T, 1.0]}/analytic_abs_err_max") or 0) for T in temps)
        lines.append(f"- `{e}`: max |Δlogp| over T ∈ [{temps[0]:g}, {temps[-1]:g}] is "
                     f"{metric('abs_dlogp_max', worst, '.2e')}"
                     + (f" ({metric('abs_dlogp_max', at1, '.2e')} at T=1)" if at1 is not None else "")
                     + f"; measured log r matches the analytical expectation to {err:.1e}.")
    T0 = 0.7 if 0.7 in temps else temps[0]
    for e in engines:
        k3 = metrics.get(f"{e}/{labels[T0, 1.0]}/k3_mean")
        if k3 is not None:
            ci = ci_text(metrics, f"{e}/{labels[T0, 1.0]}", "k3_mean")
            lines.append(f"- `{e}` at T={T0:g}: k3 = {metric('k3_mean', k3, '.2e')} {ci}.")
    for tp in [x for x in top_p_values if x < 1.0]:
        for e in engines:
            a = metrics.get(f"{e}/{labels[T0, tp]}/k3_mean")
            b = metrics.get(f"{e}+trainer_no_renorm/{labels[T0, tp]}/k3_mean")
            if a is not None and b is not None:
                ci_a = ci_text(metrics, f"{e}/{labels[T0, tp]}", "k3_mean")
                ci_b = ci_text(metrics, f"{e}+trainer_no_renorm/{labels[T0, tp]}", "k3_mean")
                lines.append(f"- top_p={tp:g}, `{e}`: k3 = {metric('k3_mean', a, '.1e')} {ci_a} "
                             f"against a renormalising trainer vs {metric('k3_mean', b, '.1e')} "
                             f"{ci_b} against one "
                             f"that does not renormalise (the TRL #6789 bias).")
    lines.append("\nBrackets: 95% intervals from resampling whole sequences.")
    return "\n".join(lines)
