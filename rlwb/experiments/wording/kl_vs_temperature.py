"""Notebook 02's sentences: per engine the mismatch across temperatures against the analytical expectation, k3 at
one temperature with its interval, and the top-p renormalisation bias (TRL #6789). Takes the metrics and plain values;
`labels` maps (temperature, top_p) to the middle segment of the metric keys (`kl_vs_temperature.setting_label`).
"""

from __future__ import annotations

from rlwb.experiments.wording import ci_text
from rlwb.formatting import metric


def conclusion(metrics: dict, engines: list[str], temperatures: list[float], top_p_values: list[float],
               labels: dict[tuple[float, float], str]) -> str:
    lines = []
    temps = sorted(temperatures)
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
