"""Notebook 01's experiment: the same prompts through every engine preset, scored by one trainer.

The ablation ladder (ServiceNow's "correctness before corrections"): hf (reference) -> vllm-v0 -> vllm-v1
(defaults) -> vllm-v1-processed -> vllm-v1-fixed. Everything here is a function a test can call; the
notebook only wires them together and displays the results.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
import itertools
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from . import metrics as M
from . import stats, tasks, tokenizer
from .engines.worker import EngineWorker, Sampling
from .rollouts import Rollouts, sample_and_score
from .trainer import TrainerScorer


def task_prompts(n: int, seed: int, heterogeneous: bool = False,
                 codec: tokenizer.PromptCodec | None = None) -> list[list[int]]:
    """Token ids of `n` task prompts. `heterogeneous`: every other prompt carries a long context of solved
    examples (up to ~40x longer), so one batch mixes very different lengths - the case where batch
    composition changes kernels and hence logprobs."""
    codec = codec or tokenizer.PromptCodec()
    probs = tasks.make_problems(n, seed=seed)
    if not heterogeneous:
        return [codec.encode(p.prompt) for p in probs]
    rng = np.random.default_rng(seed)
    shots = tasks.make_problems(64, seed=seed + 7919)
    out = []
    for i, p in enumerate(probs):
        k = 0 if i % 2 == 0 else int(rng.integers(4, 12))
        ctx = "".join(f"{s.prompt}{s.worked_answer};" for s in shots[:k])
        out.append(codec.encode(ctx + p.prompt))
    return out


def iter_engines(presets: list[str], model_path, dtype: str, progress: bool = True,
                 on_start: Callable[[dict], None] | None = None) -> Iterator[EngineWorker]:
    """Start each preset in turn (one engine process alive at a time), yield it, close it."""
    from .progress import progress_bar

    bar = progress_bar(presets, desc="engines", disable=not progress)
    for name in bar:
        bar.set_postfix_str(name)
        with EngineWorker(name, model_path, dtype=dtype) as w:
            if on_start:
                on_start(w.info())
            yield w


@dataclass
class Audit:
    rollouts: dict[str, Rollouts]
    metrics: dict[str, float]  # per engine: `<engine>/<metric>`
    rewards: dict[str, np.ndarray] = field(default_factory=dict)  # reward-equivalence rollouts per engine
    reward_metrics: dict[str, float] = field(default_factory=dict)

    def rewards_frame(self) -> pd.DataFrame:
        """`data/rewards.parquet`: one row per reward-equivalence rollout (prompt index = row // 8)."""
        return pd.DataFrame([{"engine": e, "prompt_index": i // REWARD_GROUP, "reward": float(x)}
                             for e, r in self.rewards.items() for i, x in enumerate(r)])

    def frame(self) -> pd.DataFrame:
        """`data/rollouts.parquet`: one row per completion token."""
        return pd.concat([r.to_frame() for r in self.rollouts.values()], ignore_index=True)

    def metrics_frame(self) -> pd.DataFrame:
        rows = [{"engine": k.rsplit("/", 1)[0], "metric": k.rsplit("/", 1)[1], "value": v}
                for k, v in self.metrics.items()]
        return pd.DataFrame(rows)


def engine_metrics(ro: Rollouts, clip_eps: float, seed: int = 0) -> dict[str, float]:
    """Every mismatch metric, plus 95% sequence-bootstrap intervals of the headline ones."""
    e, t = ro.flat()
    return {**M.mismatch_metrics(e, t, seq_ids=ro.seq_ids(), clip_eps=clip_eps,
                                 full_engine=ro.full_engine, full_trainer=ro.full_trainer),
            **stats.mismatch_cis(ro.log_ratios(), clip_eps, seed=seed)}


REWARD_GROUP = 8  # rollouts per prompt in the reward-equivalence sample


def reward_rollouts(w: EngineWorker, p, codec: tokenizer.PromptCodec) -> np.ndarray:
    """`p.reward_samples` task rewards from engine `w`: the same prompts and seeds for every engine, 8
    rollouts per prompt, sampled exactly as the audit samples (temperature, top-p, top-k, max_tokens)."""
    probs = tasks.make_problems(-(-p.reward_samples // REWARD_GROUP), seed=p.seed + 104_729)
    reqs = [q for q in probs for _ in range(REWARD_GROUP)][: p.reward_samples]
    s = Sampling(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, max_tokens=p.max_tokens, seed=p.seed + 1)
    comps = w.generate([codec.encode(q.prompt) for q in reqs], s)
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


def run_audit(p, model_path, on_start=None, progress: bool = True) -> Audit:
    """Sample `p.prompts` prompts from each engine in `p.engines`, score with the trainer, compute metrics."""
    scorer = TrainerScorer(model_path, p.trainer_dtype)
    prompts = task_prompts(p.prompts, p.seed, p.heterogeneous_batch, tokenizer.PromptCodec(model_path))
    sampling = Sampling(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, max_tokens=p.max_tokens, seed=p.seed)
    codec = tokenizer.PromptCodec(model_path)
    out, mets, rewards = {}, {}, {}
    for w in iter_engines(p.engines, model_path, p.dtype, progress, on_start):
        ro = sample_and_score(w, scorer, prompts, sampling, full=p.full_vocab)
        out[w.preset.name] = ro
        mets.update(M.prefixed(w.preset.name, engine_metrics(ro, p.clip_eps, p.seed)))
        if p.reward_samples:
            rewards[w.preset.name] = reward_rollouts(w, p, codec)
    return Audit(out, mets, rewards, reward_equivalence(rewards, p.seed) if rewards else {})


def conclusion(metrics: dict, p) -> str:
    """Markdown summary whose every number comes from `metrics`."""
    def g(engine, name):
        return metrics.get(f"{engine}/{name}")

    lines = [f"**Setup.** {p.prompts} prompts, T={p.temperature:g}, top_p={p.top_p:g}, top_k={p.top_k}, "
             f"engine dtype {p.dtype}, trainer dtype {p.trainer_dtype}"
             + (", heterogeneous batch" if p.heterogeneous_batch else "") + "."]
    for e in p.engines:
        if g(e, "abs_dlogp_max") is None:
            continue
        lines.append(f"- `{e}`: max |Δlogp| = {g(e, 'abs_dlogp_max'):.2e}, mean = {g(e, 'abs_dlogp_mean'):.2e} "
                     f"{ci_text(metrics, e, 'abs_dlogp_mean', '.2e')}, k3 = {g(e, 'k3_mean'):.2e} "
                     f"{ci_text(metrics, e, 'k3_mean', '.2e')}, clip fraction = {g(e, 'clip_frac'):.1%} "
                     f"{ci_text(metrics, e, 'clip_frac', '.1%')} over {g(e, 'n_tokens')} tokens.")
    floor = [e for e in p.engines if (g(e, "abs_dlogp_max") or 1) <= 1e-4]
    off = [e for e in p.engines if (g(e, "abs_dlogp_max") or 0) > 1e-4]
    if floor:
        lines.append(f"\nAt the float floor (max |Δlogp| ≤ 1e-4): {', '.join(f'`{e}`' for e in floor)}.")
    if off:
        lines.append(f"Above it: {', '.join(f'`{e}`' for e in off)}.")
    if "vllm-v1" in off and p.temperature != 1.0 and p.dtype == "float32":
        lines.append(f"`vllm-v1` reports raw (T=1) logprobs by default, so at T={p.temperature:g} its "
                     f"importance ratios are off by construction, not by numerics; "
                     f"`logprobs_mode=processed_logprobs` removes the gap.")
    lines += reward_conclusion(metrics, p)
    lines.append("\nIntervals: 95%, bootstrap over sequences (mismatch) or rollouts (reward).")
    return "\n".join(lines)


def ci_text(metrics: dict, group: str, name: str, fmt: str = ".1e") -> str:
    lo, hi = metrics.get(f"{group}/{name}_ci_low"), metrics.get(f"{group}/{name}_ci_high")
    if lo is None or hi is None or not (np.isfinite(lo) and np.isfinite(hi)):
        return ""
    return f"[{lo:{fmt}}, {hi:{fmt}}]"


def reward_conclusion(metrics: dict, p) -> list[str]:
    """Reward equivalence in words: every engine's mean reward with its interval, then the pairs whose
    reward distributions differ at the 5% level (permutation test)."""
    engines = [e for e in p.engines if f"{e}/reward_mean" in metrics]
    if not engines:
        return []
    lines = [f"\n**Reward equivalence** ({p.reward_samples} rollouts per engine, the same prompts and seeds): "
             + ", ".join(f"`{e}` {metrics[f'{e}/reward_mean']:.3f} {ci_text(metrics, e, 'reward_mean', '.3f')}"
                         for e in engines) + "."]
    pairs = [k.rsplit("/", 1)[0] for k in metrics if k.endswith("/reward_pvalue")]
    differ = [(k, metrics[f"{k}/reward_mean_diff"], metrics[f"{k}/reward_pvalue"]) for k in pairs
              if metrics[f"{k}/reward_pvalue"] < 0.05]
    if differ:
        lines.append("Pairs whose rewards differ (permutation p < 0.05): " + "; ".join(
            f"`{k}` Δ = {d:+.3f} {ci_text(metrics, k, 'reward_mean_diff', '+.3f')}, p = {pv:.3g}" for k, d, pv in differ) + ".")
    elif pairs:
        smallest = min(pairs, key=lambda k: metrics[f"{k}/reward_pvalue"])
        lines.append(f"No pair's rewards differ at the 5% level (smallest p = "
                     f"{metrics[f'{smallest}/reward_pvalue']:.3g}, `{smallest}`); on this sample size the engines are "
                     f"reward-equivalent although their logprobs are not.")
    return lines
