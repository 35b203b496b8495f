"""Notebook 04's measurements: batch invariance, rerun determinism, and stale prefix caches after in-flight
weight updates (the bug class of vLLM #9744 / NeMo-RL #4018).

Stale cache, the mechanism: with prefix caching on, the KV blocks of a shared prompt prefix are computed
once and reused. An in-flight weight update changes the model but not those cached blocks, so the next
requests with the same prefix attend to keys/values from the *old* weights. The trainer, holding the new
weights, recomputes everything - and the two disagree until the cache is reset.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from rlwb.core.data import tasks
from rlwb.core.data.tokenizer import PromptCodec
from rlwb.core.prompts.generated import make_prompts
from rlwb.core.scoring.rollouts import common_prefix_max_dlogp
from rlwb.core.scoring.trainer import TrainerScorer
from rlwb.engines.worker import Completion, EngineWorker, Sampling
from rlwb.experiments.base import OnStart, Result, iter_engines, measures_table
from rlwb.experiments.wording import determinism_and_staleness as wording_04
from rlwb.experiments.wording.logprob_mismatch import FLOAT_FLOOR


def _identical(a: Completion, b: Completion) -> bool:
    return a.token_ids == b.token_ids and np.array_equal(a.logprobs, b.logprobs)


def filler_prompts(n: int, seed: int, codec: PromptCodec) -> list[list[int]]:
    """Prompts of very different lengths (0 to ~15 solved examples of context) to fill a batch."""
    rng = np.random.default_rng(seed)
    shots = tasks.make_problems(32, seed=seed + 1)
    return [codec.encode_task(p, shots[: int(rng.integers(0, 16))]) for p in tasks.make_problems(n, seed=seed + 2)]


def batch_invariance(w: EngineWorker, prompts, fillers, max_tokens: int) -> tuple[float, float]:
    """Greedy: each request alone vs inside one big heterogeneous batch (cache reset before each pass)."""
    greedy = Sampling(temperature=0.0, max_tokens=max_tokens, seed=None)
    alone = []
    for p in prompts:
        w.reset_prefix_cache()
        alone += w.generate([p], greedy)
    w.reset_prefix_cache()
    mixed = w.generate(list(prompts) + list(fillers), greedy)[: len(prompts)]
    same = [_identical(a, b) for a, b in zip(alone, mixed)]
    return float(np.mean(same)), max(common_prefix_max_dlogp(a, b) for a, b in zip(alone, mixed))


def rerun_identical(w: EngineWorker, prompts, fillers, max_tokens: int, seed: int) -> float:
    """Seeded sampling, the same requests twice in fresh batches (other requests reshuffled)."""
    s = [Sampling(temperature=1.0, max_tokens=max_tokens, seed=seed + i) for i in range(len(prompts))]
    fill = [Sampling(temperature=1.0, max_tokens=max_tokens, seed=10_000 + i) for i in range(len(fillers))]
    w.reset_prefix_cache()
    a = w.generate(list(prompts) + list(fillers), s + fill)[: len(prompts)]
    w.reset_prefix_cache()
    b = w.generate(list(fillers[::-1]) + list(prompts), fill[::-1] + s)[len(fillers):]
    return float(np.mean([_identical(x, y) for x, y in zip(a, b)]))


def perturbed_state(model: torch.nn.Module, seed: int, scale: float = 0.02) -> dict:
    """A known weight perturbation (seeded Gaussian noise), standing in for one training step.

    Noise is drawn once per *tensor*, not per state-dict entry: with tied embeddings (Qwen2.5-0.5B)
    `lm_head.weight` and `model.embed_tokens.weight` are one parameter. Perturbing the two entries
    independently gave the trainer the last one loaded and the engine the embedding's (vLLM skips
    `lm_head.weight` of a tied model), so notebook 04 would have reported a mismatch of its own making."""
    g = torch.Generator().manual_seed(seed)
    drawn: dict[int, torch.Tensor] = {}
    out = {}
    for k, v in model.state_dict(keep_vars=True).items():  # keep_vars: aliases stay the same object
        if id(v) not in drawn:
            t = v.detach()
            drawn[id(v)] = t + (torch.randn(t.shape, generator=g) * scale).to(t.device) if t.is_floating_point() \
                else t.clone()
        out[k] = drawn[id(v)]
    return out


def shared_prefix_shots(codec: PromptCodec, n_tokens: int, seed: int, limit: int) -> list[tasks.Problem]:
    """Solved examples until they make a prefix of at least `n_tokens` tokens under the model's tokenizer (text,
    or earlier chat turns when the chat template is on): every prompt behind them shares that prefix.
    Raises when that cannot fit the context `limit` (the gpu.yaml of this notebook once asked for 2,048
    tokens and silently got a shorter prefix, because a fixed number of examples ran out first)."""
    if n_tokens >= limit:
        raise ValueError(f"prefix_tokens={n_tokens} does not fit the model's context of {limit} tokens "
                         f"(leave room for the prompt and max_tokens)")
    shots: list[tasks.Problem] = []
    probe = tasks.Problem(0, 0)  # the prompt behind the prefix does not change its length much
    batch = 0
    while len(codec.encode_task(probe, shots)) < n_tokens:
        for s in tasks.make_problems(64, seed=seed + 99 + 1000 * batch):
            shots.append(s)
            if len(codec.encode_task(probe, shots)) >= n_tokens:
                break
        batch += 1
    return shots


def staleness(w: EngineWorker, prompts, new_state: dict, new_scorer: TrainerScorer, old_state: dict,
              max_tokens: int, seed: int) -> tuple[dict, pd.DataFrame]:
    """Warm the prefix cache, update weights in flight without a reset, sample, compare with the trainer
    (new weights); then reset and repeat. Restores the old weights at the end."""
    # ignore_eos: every request yields max_tokens tokens to compare (the default policy tends to stop
    # right after an unfamiliar long context)
    s = Sampling(temperature=1.0, max_tokens=max_tokens, seed=seed, ignore_eos=True)
    w.reset_prefix_cache()
    w.generate(prompts, s)  # warm: prefix blocks now hold KV from the old weights
    w.update_weights(new_state, reset_prefix_cache=False)  # whatever the preset says: the stale case
    stale = w.generate(prompts, s)
    w.reset_prefix_cache()
    fresh = w.generate(prompts, s)
    rows, out = [], {}
    for label, comps in (("stale", stale), ("after_reset", fresh)):
        sc = new_scorer.score([c.prompt_token_ids for c in comps], [c.token_ids for c in comps])
        d = np.concatenate([np.abs(c.logprobs.astype(np.float64) - t) for c, t in zip(comps, sc["logp"])])
        out[label] = float(d.max())
        for c, t in zip(comps, sc["logp"]):
            L = len(c.token_ids)
            rows.append(pd.DataFrame({"engine": w.preset.name, "case": label, "prompt_len": len(c.prompt_token_ids),
                                      "position": len(c.prompt_token_ids) + np.arange(L),
                                      "abs_dlogp": np.abs(c.logprobs.astype(np.float64) - t)}))
    w.update_weights(old_state)
    w.reset_prefix_cache()
    return out, pd.concat(rows, ignore_index=True)


@dataclass
class DeterminismResult(Result):
    measures: pd.DataFrame  # engine, measure, value (the metrics as a table; the bar figure reads it)
    stale_rows: pd.DataFrame  # per token after an in-flight update: engine, position, abs_dlogp, ...

    def frames(self) -> dict[str, pd.DataFrame]:
        return {"summary": self.measures, "stale": self.stale_rows}

    def summary(self) -> pd.DataFrame:
        return measures_table(self.measures, self.params.engines)

    def conclusion(self) -> str:
        return conclusion(self.metrics, self.params)


def run(params, model_path, *, on_start: OnStart = None, progress: bool = True) -> DeterminismResult:
    """Per engine: batch invariance, seeded-rerun identity and the stale prefix cache after an update."""
    p = params
    codec = PromptCodec(model_path, p.chat_template)
    probs = tasks.make_problems(p.prompts, seed=p.seed)
    prompts = make_prompts(p.prompt_source, p.prompts, p.seed, codec)
    big = max(p.batch_sizes)
    fillers = filler_prompts(max(0, big - len(prompts)), p.seed, codec)
    scorer = TrainerScorer(model_path, "float32")
    context = int(scorer.model.config.max_position_embeddings)
    shots = shared_prefix_shots(codec, p.prefix_tokens, p.seed, context - p.max_tokens - 64)
    prefixed = [codec.encode_task(x, shots) for x in probs]
    old_state = {k: v.clone() for k, v in scorer.model.state_dict().items()}
    new_state = perturbed_state(scorer.model, p.seed)
    new_scorer = TrainerScorer(model_path, "float32")
    new_scorer.load_state_dict(new_state)
    metrics, rows, stale_frames = {}, [], []
    for w in iter_engines(p.engines, model_path, p.dtype, progress, on_start):
        e = w.preset.name
        inv = [batch_invariance(w, prompts, fillers[: max(0, b - len(prompts))], p.max_tokens) for b in p.batch_sizes
               if b > 1]
        m = {"batch_invariant_frac": min(x[0] for x in inv) if inv else float("nan"),
             "batch_max_abs_dlogp": max(x[1] for x in inv) if inv else float("nan"),
             "rerun_identical_frac": rerun_identical(w, prompts, fillers, p.max_tokens, p.seed)}
        st, frame = staleness(w, prefixed, new_state, new_scorer, old_state, p.max_tokens, p.seed)
        m["stale_cache_abs_dlogp_max"], m["after_reset_abs_dlogp_max"] = st["stale"], st["after_reset"]
        m["prefix_caching"] = float(bool(w.info()["settings"].get("enable_prefix_caching")))
        m["stale_prompt_tokens_min"] = float(min(len(x) for x in prefixed))  # what the run really used
        stale_frames.append(frame)
        for k, v in m.items():
            metrics[f"{e}/{k}"] = v
            rows.append({"engine": e, "measure": k, "value": v})
    return DeterminismResult(p, metrics, pd.DataFrame(rows), pd.concat(stale_frames, ignore_index=True))


def conclusion(metrics: dict, p) -> str:
    """`wording.determinism_and_staleness`, with what its finding says decided here: a stale cache is max |Δlogp|
    vs the trainer above FLOAT_FLOOR after an in-flight update without a reset (fixed where a reset brings it to the
    floor); an engine is batch-invariant when every greedy request is bitwise identical alone and in the batch."""
    ran = [e for e in p.engines if f"{e}/batch_invariant_frac" in metrics]
    g = lambda e, k: metrics.get(f"{e}/{k}")
    stale = [e for e in ran if (g(e, "stale_cache_abs_dlogp_max") or 0) > FLOAT_FLOOR]
    return wording_04.conclusion(
        metrics, list(p.engines), max(p.batch_sizes), stale=stale,
        reset_fixes=[e for e in stale if (g(e, "after_reset_abs_dlogp_max") or 0) <= FLOAT_FLOOR],
        fresh=[e for e in ran if e not in stale],
        variant=[e for e in ran if g(e, "batch_invariant_frac") < 1.0],
        invariant=[e for e in ran if g(e, "batch_invariant_frac") == 1.0],
        rerun_differs=[e for e in ran if (g(e, "rerun_identical_frac") if g(e, "rerun_identical_frac") is not None
                                          else 1.0) < 1.0])
