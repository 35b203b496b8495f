"""Notebook 01's experiment: the same prompts through every engine preset, scored by one trainer.

The ablation ladder (ServiceNow's "correctness before corrections"): hf (reference) -> vllm-v0 -> vllm-v1
(defaults) -> vllm-v1-processed -> vllm-v1-fixed. `run` returns a `MismatchResult` (the shape every
experiment shares: `base.py`); the rest are functions a test can call.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from rlwb.core.data import tasks, tokenizer
from rlwb.core.measure import metrics as M
from rlwb.core.measure import stats
from rlwb.core.prompts.generated import make_prompts
from rlwb.core.scoring.rollouts import Rollouts, sample_and_score
from rlwb.core.scoring.trainer import TrainerScorer
from rlwb.engines.worker import EngineWorker, Sampling
from rlwb.experiments.base import OnStart, Result, engine_metrics, iter_engines, split_metrics
from rlwb.experiments.wording import logprob_mismatch as wording_01


@dataclass
class MismatchResult(Result):
    ANSWER_LEADS = ("At the float floor", "Above it")  # the ladder's verdict, not the first engine's numbers
    rollouts: dict[str, Rollouts]  # per engine preset
    ladder_metrics: dict[str, float]  # `<engine>/<metric>`: the mismatch ladder
    rewards: dict[str, np.ndarray] = field(default_factory=dict)  # reward-equivalence rollouts per engine

    def rewards_frame(self) -> pd.DataFrame:
        """`data/rewards.parquet`: one row per reward-equivalence rollout (prompt index = row // 8)."""
        return pd.DataFrame([{"engine": e, "prompt_index": i // REWARD_GROUP, "reward": float(x)}
                             for e, r in self.rewards.items() for i, x in enumerate(r)])

    def rollouts_frame(self) -> pd.DataFrame:
        """`data/rollouts.parquet`: one row per completion token."""
        return pd.concat([r.to_frame() for r in self.rollouts.values()], ignore_index=True)

    def metrics_frame(self) -> pd.DataFrame:
        """`data/metrics.parquet`: (engine, metric, value), the ladder's long form."""
        return split_metrics(self.ladder_metrics)

    def frames(self) -> dict[str, pd.DataFrame]:
        out = {"rollouts": self.rollouts_frame(), "metrics": self.metrics_frame()}
        if self.rewards:
            out["rewards"] = self.rewards_frame()
        return out

    def summary(self) -> pd.DataFrame:
        table = self.metrics_frame().pivot(index="engine", columns="metric", values="value")
        cols = [c for c in SUMMARY_COLUMNS if c in table.columns]
        return table.loc[[e for e in self.params.engines if e in table.index], cols]

    def reward_table(self) -> pd.DataFrame:
        """Pairwise reward comparisons: difference, permutation p-value, Cliff's delta."""
        m = self.metrics
        return pd.DataFrame([{"pair": k.rsplit("/", 1)[0], "mean diff": v,
                              "p (permutation)": m[k.replace("reward_mean_diff", "reward_pvalue")],
                              "Cliff's delta": m[k.replace("reward_mean_diff", "reward_cliffs_delta")]}
                             for k, v in m.items() if k.endswith("/reward_mean_diff")])

    def conclusion(self) -> str:
        return conclusion(self.metrics, self.params)


SUMMARY_COLUMNS = ["abs_dlogp_mean", "abs_dlogp_max", "k3_mean", "full_kl_mean", "clip_frac", "ess_frac",
                   "prob_pearson", "token_entropy_mean", "uncertain_token_frac", "n_tokens"]


REWARD_GROUP = 8  # rollouts per prompt in the reward-equivalence sample


def reward_rollouts(w: EngineWorker, p, codec: tokenizer.PromptCodec) -> np.ndarray:
    """`p.reward_samples` task rewards from engine `w`: the same prompts and seeds for every engine, 8
    rollouts per prompt, sampled exactly as the audit samples (temperature, top-p, top-k, max_tokens)."""
    probs = tasks.make_problems(-(-p.reward_samples // REWARD_GROUP), seed=p.seed + 104_729)
    reqs = [q for q in probs for _ in range(REWARD_GROUP)][: p.reward_samples]
    s = Sampling(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, max_tokens=p.max_tokens, seed=p.seed + 1)
    comps = w.generate([codec.encode_task(q) for q in reqs], s)
    return np.array([tasks.reward(q, codec.decode(c.token_ids)) for q, c in zip(reqs, comps)])


def reward_equivalence(rewards: dict[str, np.ndarray], seed: int = 0) -> dict[str, float]:
    """Per engine the mean reward with a 95% CI; per engine pair the difference (CI), permutation and
    Mann-Whitney p-values and Cliff's delta (`A_vs_B/reward_*`)."""
    out: dict[str, float] = {}
    for e, r in rewards.items():
        out[f"{e}/reward_mean"] = float(r.mean())
        out[f"{e}/reward_mean_ci_low"], out[f"{e}/reward_mean_ci_high"] = stats.mean_ci(r, seed=seed)
    for a, b in itertools.combinations(rewards, 2):
        c = stats.compare_rewards(rewards[a], rewards[b], seed=seed)
        out.update({f"{a}_vs_{b}/reward_mean_diff": c.mean_diff, f"{a}_vs_{b}/reward_mean_diff_ci_low": c.diff_ci[0],
                    f"{a}_vs_{b}/reward_mean_diff_ci_high": c.diff_ci[1], f"{a}_vs_{b}/reward_pvalue": c.perm_pvalue,
                    f"{a}_vs_{b}/reward_mw_pvalue": c.mw_pvalue, f"{a}_vs_{b}/reward_cliffs_delta": c.cliffs_delta})
    return out


def run(params, model_path, *, on_start: OnStart = None, progress: bool = True) -> MismatchResult:
    """Sample `params.prompts` prompts from each engine in `params.engines`, score with the trainer, compute
    the ladder's metrics and (with `reward_samples`) the reward-equivalence test."""
    p = params
    codec = tokenizer.PromptCodec(model_path, p.chat_template)
    scorer = TrainerScorer(model_path, p.trainer_dtype)
    prompts = make_prompts(p.prompt_source, p.prompts, p.seed, codec, p.heterogeneous_batch)
    sampling = Sampling(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, max_tokens=p.max_tokens, seed=p.seed)
    out, mets, rewards = {}, {}, {}
    for w in iter_engines(p.engines, model_path, p.dtype, progress, on_start):
        ro = sample_and_score(w, scorer, prompts, sampling, full=p.full_vocab)
        out[w.preset.name] = ro
        mets.update(M.prefixed(w.preset.name, engine_metrics(ro, p.clip_eps, p.seed)))
        if p.reward_samples:
            rewards[w.preset.name] = reward_rollouts(w, p, codec)
    reward_metrics = reward_equivalence(rewards, p.seed) if rewards else {}
    return MismatchResult(p, {**mets, **reward_metrics}, out, mets, rewards)


def conclusion(metrics: dict, p) -> str:
    """Markdown summary whose every number comes from `metrics` (`wording.logprob_mismatch`)."""
    return wording_01.conclusion(metrics, p.to_dict())
