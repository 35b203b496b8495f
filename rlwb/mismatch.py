"""Notebook 01's experiment: the same prompts through every engine preset, scored by one trainer.

The ablation ladder (ServiceNow's "correctness before corrections"): hf (reference) -> vllm-v0 -> vllm-v1
(defaults) -> vllm-v1-processed -> vllm-v1-fixed. Everything here is a function a test can call; the
notebook only wires them together and displays the results.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import metrics as M
from . import tasks, tokenizer
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
    from tqdm.auto import tqdm

    bar = tqdm(presets, desc="engines", disable=not progress)
    for name in bar:
        bar.set_postfix_str(name)
        with EngineWorker(name, model_path, dtype=dtype) as w:
            if on_start:
                on_start(w.info())
            yield w


@dataclass
class Audit:
    rollouts: dict[str, Rollouts]
    metrics: dict[str, float]

    def frame(self) -> pd.DataFrame:
        """`data/rollouts.parquet`: one row per completion token."""
        return pd.concat([r.to_frame() for r in self.rollouts.values()], ignore_index=True)

    def metrics_frame(self) -> pd.DataFrame:
        rows = [{"engine": k.rsplit("/", 1)[0], "metric": k.rsplit("/", 1)[1], "value": v}
                for k, v in self.metrics.items()]
        return pd.DataFrame(rows)


def engine_metrics(ro: Rollouts, clip_eps: float) -> dict[str, float]:
    e, t = ro.flat()
    return M.mismatch_metrics(e, t, seq_ids=ro.seq_ids(), clip_eps=clip_eps,
                              full_engine=ro.full_engine, full_trainer=ro.full_trainer)


def run_audit(p, model_path, on_start=None, progress: bool = True) -> Audit:
    """Sample `p.prompts` prompts from each engine in `p.engines`, score with the trainer, compute metrics."""
    scorer = TrainerScorer(model_path, p.trainer_dtype)
    prompts = task_prompts(p.prompts, p.seed, p.heterogeneous_batch, tokenizer.PromptCodec(model_path))
    sampling = Sampling(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, max_tokens=p.max_tokens, seed=p.seed)
    out, mets = {}, {}
    for w in iter_engines(p.engines, model_path, p.dtype, progress, on_start):
        ro = sample_and_score(w, scorer, prompts, sampling, full=p.full_vocab)
        out[w.preset.name] = ro
        mets.update(M.prefixed(w.preset.name, engine_metrics(ro, p.clip_eps)))
    return Audit(out, mets)


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
        lines.append(f"- `{e}`: max |Δlogp| = {g(e, 'abs_dlogp_max'):.2e}, mean = {g(e, 'abs_dlogp_mean'):.2e}, "
                     f"k3 = {g(e, 'k3_mean'):.2e}, clip fraction = {g(e, 'clip_frac'):.1%} "
                     f"over {g(e, 'n_tokens')} tokens.")
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
    return "\n".join(lines)
