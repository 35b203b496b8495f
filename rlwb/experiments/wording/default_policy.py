"""Notebook 00's sentence: what the policy is (its size, how much of the task it solves greedily, how long it writes)
and why that makes it fit for the notebooks that follow. Takes the metrics and plain values.
"""

from __future__ import annotations


def conclusion(metrics: dict, model: str, eval_prompts: int) -> str:
    name = "default policy" if model == "default" else f"`{model}` model"
    text = ""
    if "policy/held_out_entropy" in metrics:
        text = (f" On held-out standard-library text its next-token entropy is "
                f"{metrics['policy/held_out_entropy']:.2f} nats (cross-entropy "
                f"{metrics['policy/held_out_cross_entropy']:.2f}): a policy that is uncertain where real models are.")
    return (f"**Conclusion.** The {name} has {metrics['policy/params']:,} parameters and solves "
            f"{metrics['policy/greedy_accuracy']:.1%} of {eval_prompts} held-out problems greedily, with "
            f"{metrics['policy/mean_completion_tokens']:.1f} completion tokens on average; "
            f"{metrics['policy/reversed_answer_frac']:.1%} of its answers are written reversed. Partly solved, "
            f"so GRPO has headroom, and long enough for per-token engine/trainer mismatch to add up over a "
            f"sequence." + text)
