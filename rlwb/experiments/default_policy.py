"""Notebook 00's experiment: what the embedded default policy can do before any RL.

Greedy accuracy on held-out problems, answer length, and the share of answers written reversed (the
habit only the reward reveals, which GRPO in notebook 03 can unlearn; why: `rlwb.core.models`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from rlwb.core.models import greedy_eval
from rlwb.experiments.base import OnStart, Result


@dataclass
class PolicyResult(Result):
    samples: pd.DataFrame  # one row per held-out problem: prompt, completion, reward, reversed, ...
    card: dict  # the model card of the build

    def frames(self) -> dict[str, pd.DataFrame]:
        return {"samples": self.samples}

    def summary(self) -> pd.DataFrame:
        m = self.metrics
        return pd.DataFrame({"value": [m["policy/params"], m["policy/greedy_accuracy"],
                                       m["policy/reversed_answer_frac"], m["policy/mean_completion_tokens"]]},
                            index=pd.Index(["parameters", "greedy accuracy", "reversed answers",
                                            "completion tokens (mean)"], name="measure"))

    def card_table(self) -> pd.DataFrame:
        """The model card, one row per field (nested fields as text)."""
        return pd.Series({k: str(v) for k, v in self.card.items()}, dtype=object).to_frame("value")

    def conclusion(self) -> str:
        return conclusion(self.metrics, self.params)


def evaluate_policy(path: str | Path, n: int = 200, seed: int = 0) -> dict:
    """Greedy accuracy / completion length / samples of a saved default-policy dir."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    card = json.loads((Path(path) / "model.json").read_text()) if (Path(path) / "model.json").exists() else {}
    ev = greedy_eval(model, n=n, seed=10**6 + seed, max_digits=card.get("recipe", {}).get("max_digits", 3))
    ev["params"] = sum(p.numel() for p in model.parameters())
    return ev


def policy_metrics(ev: dict) -> dict:
    """The metrics of `evaluate_policy`'s output."""
    return {"policy/greedy_accuracy": ev["greedy_accuracy"],
            "policy/reversed_answer_frac": ev["reversed_answer_frac"],
            "policy/mean_completion_tokens": ev["mean_completion_tokens"], "policy/params": ev["params"]}


def run(params, model_path, *, on_start: OnStart = None, progress: bool = True) -> PolicyResult:
    """Evaluate the policy at `model_path` greedily on `params.eval_prompts` held-out problems (no engines:
    `on_start` is never called)."""
    from rlwb.core.models import model_card

    ev = evaluate_policy(model_path, n=params.eval_prompts, seed=params.seed)
    return PolicyResult(params, policy_metrics(ev), pd.DataFrame(ev["samples"]), model_card(model_path) or {})


def conclusion(metrics: dict, p) -> str:
    return (f"**Conclusion.** The default policy has {metrics['policy/params']:,} parameters and solves "
            f"{metrics['policy/greedy_accuracy']:.1%} of {p.eval_prompts} held-out problems greedily, with "
            f"{metrics['policy/mean_completion_tokens']:.1f} completion tokens on average; "
            f"{metrics['policy/reversed_answer_frac']:.1%} of its answers are written reversed. Partly solved, "
            f"so GRPO has headroom, and long enough for per-token engine/trainer mismatch to add up over a "
            f"sequence.")
