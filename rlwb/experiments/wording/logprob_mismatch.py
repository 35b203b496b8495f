"""Notebook 01's sentences: each engine's logprob mismatch with its intervals, which engines sit at the float floor,
why raw logprobs miss at T != 1, and the reward-equivalence verdict (the pairs whose rewards differ, or the smallest
p when none does). Takes the metrics and the run's parameters as a plain dict (`params.to_dict()`).
"""

from __future__ import annotations

from rlwb.experiments.wording import ci_text
from rlwb.formatting import metric

FLOAT_FLOOR = 1e-4  # max |Δlogp| at or under this: engine and trainer agree to float precision
REWARD_ALPHA = 0.05  # a pair's rewards differ when its permutation p is under this


def conclusion(metrics: dict, p: dict) -> str:
    """Markdown summary whose every number comes from `metrics`."""
    def g(engine, name):
        return metrics.get(f"{engine}/{name}")

    def v(engine, name, spec):  # at the float floor: "≤ 1e-08", never noise
        return metric(name, g(engine, name), spec)

    lines = [f"**Setup.** {p['prompts']} prompts, T={p['temperature']:g}, top_p={p['top_p']:g}, top_k={p['top_k']}, "
             f"engine dtype {p['dtype']}, trainer dtype {p['trainer_dtype']}"
             + (", heterogeneous batch" if p["heterogeneous_batch"] else "")
             + f", {p['prompt_source'].replace('_', '-')} prompts."]
    trainer_view = next((e for e in p["engines"] if g(e, "token_entropy_mean") is not None), None)
    if trainer_view is not None:  # the trainer's fp32 view of the policy where it sampled
        lines.append(f"**Policy uncertainty** where it sampled (`{trainer_view}`'s tokens, trainer fp32): mean entropy "
                     f"{g(trainer_view, 'token_entropy_mean'):.2f} nats, "
                     f"{g(trainer_view, 'uncertain_token_frac'):.0%} of sampled tokens with p < 0.9.")
    for e in p["engines"]:
        if g(e, "abs_dlogp_max") is None:
            continue
        lines.append(f"- `{e}`: max |Δlogp| = {v(e, 'abs_dlogp_max', '.2e')}, mean = {v(e, 'abs_dlogp_mean', '.2e')} "
                     f"{ci_text(metrics, e, 'abs_dlogp_mean', '.2e')}, k3 = {v(e, 'k3_mean', '.2e')} "
                     f"{ci_text(metrics, e, 'k3_mean', '.2e')}, clip fraction = {g(e, 'clip_frac'):.1%} "
                     f"{ci_text(metrics, e, 'clip_frac', '.1%')} over {g(e, 'n_tokens')} tokens.")
    floor = [e for e in p["engines"] if (g(e, "abs_dlogp_max") or 1) <= FLOAT_FLOOR]
    off = [e for e in p["engines"] if (g(e, "abs_dlogp_max") or 0) > FLOAT_FLOOR]
    if floor:
        lines.append(f"\nAt the float floor (max |Δlogp| ≤ 1e-4): {', '.join(f'`{e}`' for e in floor)}.")
    if off:
        lines.append(f"Above it: {', '.join(f'`{e}`' for e in off)}.")
    if "vllm-v1" in off and p["temperature"] != 1.0 and p["dtype"] == "float32":
        lines.append(f"`vllm-v1` reports raw (T=1) logprobs by default, so at T={p['temperature']:g} its "
                     f"importance ratios are off by construction, not by numerics; "
                     f"`logprobs_mode=processed_logprobs` removes the gap.")
    lines += reward_lines(metrics, p["engines"], p["reward_samples"])
    lines.append("\nIntervals: 95%, bootstrap over sequences (mismatch) or rollouts (reward).")
    return "\n".join(lines)


def reward_lines(metrics: dict, engines: list[str], reward_samples: int) -> list[str]:
    """Reward equivalence in words: every engine's mean reward with its interval, then the pairs whose
    reward distributions differ at the 5% level (permutation test), or the smallest p when none does."""
    engines = [e for e in engines if f"{e}/reward_mean" in metrics]
    if not engines:
        return []
    lines = [f"\n**Reward equivalence** ({reward_samples} rollouts per engine, the same prompts and seeds): "
             + ", ".join(f"`{e}` {metrics[f'{e}/reward_mean']:.3f} {ci_text(metrics, e, 'reward_mean', '.3f')}"
                         for e in engines) + "."]
    pairs = [k.rsplit("/", 1)[0] for k in metrics if k.endswith("/reward_pvalue")]
    differ = [(k, metrics[f"{k}/reward_mean_diff"], metrics[f"{k}/reward_pvalue"]) for k in pairs
              if metrics[f"{k}/reward_pvalue"] < REWARD_ALPHA]
    if differ:
        lines.append("Pairs whose rewards differ (permutation p < 0.05): " + "; ".join(
            f"`{k}` Δ = {d:+.3f} {ci_text(metrics, k, 'reward_mean_diff', '+.3f')}, p = {pv:.3g}"
            for k, d, pv in differ) + ".")
    elif pairs:
        smallest = min(pairs, key=lambda k: metrics[f"{k}/reward_pvalue"])
        lines.append(f"No pair's rewards differ at the 5% level (smallest p = "
                     f"{metrics[f'{smallest}/reward_pvalue']:.3g}, `{smallest}`); on this sample size the engines are "
                     f"reward-equivalent although their logprobs are not.")
    return lines
