"""Notebook 00's experiment: what the embedded default policy can do before any RL.

Greedy accuracy on held-out problems, answer length, and the share of answers written reversed (the
habit only the reward reveals, which GRPO in notebook 03 can unlearn; why: `rlwb.core.models.llama`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from rlwb.core.models.llama import greedy_eval
from rlwb.experiments.base import OnStart, Result
from rlwb.experiments.wording import default_policy as wording_00


@dataclass
class PolicyResult(Result):
    samples: pd.DataFrame  # one row per held-out problem: prompt, completion, reward, reversed, ...
    card: dict  # the model card of the build

    def frames(self) -> dict[str, pd.DataFrame]:
        return {"samples": self.samples}

    def summary(self) -> pd.DataFrame:
        m = self.metrics
        rows = {"parameters": m["policy/params"], "greedy accuracy": m["policy/greedy_accuracy"],
                "reversed answers": m["policy/reversed_answer_frac"],
                "completion tokens (mean)": m["policy/mean_completion_tokens"]}
        if "policy/held_out_entropy" in m:
            rows["held-out text entropy (nats)"] = m["policy/held_out_entropy"]
        return pd.DataFrame({"value": list(rows.values())}, index=pd.Index(list(rows), name="measure"))

    def card_table(self) -> pd.DataFrame:
        """The model card, one row per field (nested fields as text)."""
        return pd.Series({k: str(v) for k, v in self.card.items()}, dtype=object).to_frame("value")

    def conclusion(self) -> str:
        return conclusion(self.metrics, self.params)


def evaluate_policy(path: str | Path, n: int = 200, seed: int = 0) -> dict:
    """Greedy accuracy / completion length / samples of a saved embedded model's dir (the chat model is asked
    through its chat template)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    card = json.loads((Path(path) / "model.json").read_text()) if (Path(path) / "model.json").exists() else {}
    max_digits = card.get("recipe", {}).get("max_digits", 3)
    if card.get("name", "rlwb-default-policy") == "rlwb-default-policy":
        ev = greedy_eval(model, n=n, seed=10**6 + seed, max_digits=max_digits)
    else:
        from transformers import AutoTokenizer

        from rlwb.core.models import chat

        ev = chat.greedy_eval(model, AutoTokenizer.from_pretrained(str(path)), n=n, seed=10**6 + seed,
                                    max_digits=max_digits)
    ev["params"] = sum(p.numel() for p in model.parameters())
    return ev


def policy_metrics(ev: dict) -> dict:
    """The metrics of `evaluate_policy`'s output."""
    return {"policy/greedy_accuracy": ev["greedy_accuracy"],
            "policy/reversed_answer_frac": ev["reversed_answer_frac"],
            "policy/mean_completion_tokens": ev["mean_completion_tokens"], "policy/params": ev["params"]}


def run(params, model_path, *, on_start: OnStart = None, progress: bool = True) -> PolicyResult:
    """Evaluate the policy at `model_path` greedily on `params.eval_prompts` held-out problems (no engines:
    `on_start` is never called). A chat model's held-out text entropy comes from its card (measured at build)."""
    from rlwb.core.models.store import model_card

    ev = evaluate_policy(model_path, n=params.eval_prompts, seed=params.seed)
    card = model_card(model_path) or {}
    metrics = policy_metrics(ev)
    for k in ("held_out_entropy", "held_out_cross_entropy"):
        if k in card:
            metrics[f"policy/{k}"] = card[k]
    return PolicyResult(params, metrics, pd.DataFrame(ev["samples"]), card)


def conclusion(metrics: dict, p) -> str:
    """`wording.default_policy`."""
    return wording_00.conclusion(metrics, getattr(p, "model", "default"), p.eval_prompts)
