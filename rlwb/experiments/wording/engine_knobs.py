"""Notebook 06's sentences: a knob's verdict word, a failed health rule, and the answer (which knobs stay at the
float floor, which move the engine off the trainer and by how much, what the engine refused, what could not be
verified, the versions and the MoE router). `rlwb.experiments.engine_knobs` applies the rules and groups the knobs;
everything here takes plain values.
"""

from __future__ import annotations

# a knob's verdict in the status table (`engine_knobs.verdict` picks one)
VERDICTS = {"floor": "at the float floor", "healthy": "healthy", "unhealthy": "fails a health rule"}


def failed_rule(name: str, value: float, op: str, bound: float, source: str) -> str:
    """One health rule a knob fails: the measured value and what the rule's source requires."""
    return f"{name} {value:.3g} (needs {op} {bound:g}, {source})"


def setup_line(baseline: str, model: str, prompts: int, prompt_source: str, temperature: float, max_tokens: int,
               trainer_dtype: str, baseline_abs_dlogp_max: float, baseline_tok_s: float) -> str:
    return (f"**Setup.** Baseline `{baseline}` on `{model}`, {prompts} {prompt_source.replace('_', '-')} "
            f"prompts, T={temperature:g}, {max_tokens} tokens, trainer {trainer_dtype}; every knob samples the "
            f"same prompts with the same seeds. Baseline: max |Δlogp| {baseline_abs_dlogp_max:.1e}, "
            f"{baseline_tok_s:.0f} tok/s.")


def floor_line(throughput_ratio: dict[str, float], floor: float) -> str:
    """The knobs whose max |Δlogp| stays at or under `floor`, as the baseline's (knob -> throughput ratio)."""
    bound = f"{floor:.0e}".replace("e-0", "e-")  # 1e-4, as people write it
    return (f"\n**Free of mismatch** (max |Δlogp| ≤ {bound}, as the baseline): "
            + ", ".join(f"`{k}` ({r:.2f}× throughput)" for k, r in throughput_ratio.items()) + ".")


def moved_lines(metrics: dict, failed: dict[str, list[str]]) -> list[str]:
    """The knobs that move the engine off the trainer, in the order given (worst first), each with its k3 interval,
    its max |Δlogp|, how many completions stay token-identical, its throughput and the health rules it fails
    (`failed`: knob -> `failed_rule` texts, empty when it passes them all)."""
    m = metrics
    lines = ["\n**Knobs that move the engine off the trainer**, worst first (k3 with its 95% interval; "
             "throughput relative to the baseline):"]
    for k, rules in failed.items():
        lines.append(f"- `{k}`: k3 = {m[f'{k}/k3_mean']:.2e} [{m[f'{k}/k3_mean_ci_low']:.2e}, "
                     f"{m[f'{k}/k3_mean_ci_high']:.2e}], max |Δlogp| = {m[f'{k}/abs_dlogp_max']:.2e}, "
                     f"{m[f'{k}/same_tokens_frac']:.0%} of completions token-identical to the baseline, "
                     f"{m[f'{k}/throughput_ratio']:.2f}× throughput; "
                     + ("fails " + "; ".join(rules) if rules else "passes the published health rules") + ".")
    return lines


def not_run_line(status: str, errors: dict[str, str]) -> str:
    """Knobs that did not run with the same `status` (e.g. "unsupported here"), each in the engine's own words."""
    return (f"\n**{status[0].upper() + status[1:]}** (the engine's own words): "
            + "; ".join(f"`{k}`: {e}" for k, e in errors.items()) + ".")


def not_verified_line(unverified: dict[str, str]) -> str:
    return ("\n**Not verified** (measured as configured: nothing the running engine reports confirms these "
            "settings): " + "; ".join(f"`{k}`: {v}" for k, v in unverified.items()) + ".")


def versions_line(metrics: dict, versions: list[dict]) -> str:
    """Other vLLM versions against the baseline: each a dict with `knob`, `status`, `vllm_version`, `error`."""
    parts = []
    for r in versions:
        k = r["knob"]
        if r["status"] == "ok":
            parts.append(f"`{k}` (vLLM {r['vllm_version']}): max |Δlogp| {metrics[f'{k}/abs_dlogp_max']:.1e}, "
                         f"{metrics[f'{k}/throughput_ratio']:.2f}× the baseline's throughput")
        else:
            parts.append(f"`{k}`: {r['status']} ({r['error']})")
    return "\n**Versions**: " + "; ".join(parts) + "."


def moe_line(metrics: dict, moe_model: str, groups: list[str]) -> str:
    """The MoE router's agreement, engine vs trainer, per `moe/<knob>` group."""
    m = metrics
    return (f"\n**MoE router** (`{moe_model}`, top-k set agreement engine vs trainer, mean over layers): "
            + ", ".join(f"`{k.split('/', 1)[1]}` {m[f'{k}/topk_set_agree']:.2%} "
                        f"({m[f'{k}/any_layer_differs_frac']:.1%} of tokens routed differently in some layer;"
                        f" k3 {m[f'{k}/k3_mean']:.1e})" for k in groups) + ".")


HOW = ("\nHealth rules: verl rollout correction (ESS of its token TIS weights, cap 2, ≥ 0.3; χ² ≤ 1; "
       "|KL| ≤ 0.1) and NeMo-RL (token_mult_prob_error ≤ 1.05). Intervals: 95%, bootstrap over sequences; "
       "changes against the baseline paired by prompt and seed. Every setting a knob changes was read back "
       "from the running engine before it was measured, except those marked not verified.")


def conclusion(metrics: dict, setup: dict) -> str:
    """Notebook 06's answer in Markdown. `setup`: `setup_line`'s arguments under `run`, then what
    `engine_knobs.conclusion` grouped: `float_floor`, `floor` (knob -> throughput ratio), `failed` (the moved knobs,
    worst first -> failed rules), `not_run` (status -> knob -> error), `unverified`, `versions`, `moe_model`, `moe`."""
    s = setup
    lines = [setup_line(**s["run"])]
    if s["floor"]:
        lines.append(floor_line(s["floor"], s["float_floor"]))
    if s["failed"]:
        lines += moved_lines(metrics, s["failed"])
    lines += [not_run_line(status, errors) for status, errors in s["not_run"].items()]
    if s["unverified"]:
        lines.append(not_verified_line(s["unverified"]))
    if s["versions"]:
        lines.append(versions_line(metrics, s["versions"]))
    if s["moe"]:
        lines.append(moe_line(metrics, s["moe_model"], s["moe"]))
    lines.append(HOW)
    return "\n".join(lines)
