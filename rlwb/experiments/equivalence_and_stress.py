"""Notebook 05's measurements: the equivalence validator per preset, memory pressure, and long contexts.

Memory pressure, why: when the paged KV cache is full, vLLM *preempts* running requests - frees their
blocks and later recomputes them from the prompt and the tokens generated so far (AI21's Jamba
investigation traced wrong logprobs to this path). V0 and V1 preempt differently (V0: whole sequence
groups, counted per scheduler step; V1: requests, recomputed with prefix reuse), so the check runs one
engine per preset with a KV cache of `kv_tokens` tokens (`num_gpu_blocks_override`) and compares its
logprobs with the trainer and with the same requests on the same preset without pressure.

Long context, why: RoPE angles and attention sums grow with absolute position; kernels that are exact at
position 50 can drift at position 4,000. The check places completions after prompts of increasing length,
up to the model's maximum context, and records |Δlogp| against the trainer at every absolute position.

Both checks compare with the trainer in the engine's *own* logprob semantics (raw for `vllm-v1`,
processed for the others): the raw-vs-processed gap is notebook 01's subject; here only what the stress
adds should show. At the default T = 1 without truncation the two semantics coincide anyway.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rlwb.core.data.tokenizer import PromptCodec
from rlwb.core.measure import stats
from rlwb.core.prompts.generated import make_prompts
from rlwb.core.scoring import equivalence as V
from rlwb.core.scoring.rollouts import common_prefix_max_dlogp
from rlwb.core.scoring.trainer import TrainerScorer
from rlwb.engines.worker import Completion, EngineWorker, Sampling, reports_raw_logprobs
from rlwb.experiments.base import OnStart, Result, iter_engines, measures_table, prefetch_engines, split_metrics
from rlwb.experiments.wording import equivalence_and_stress as wording_05
from rlwb.experiments.wording.logprob_mismatch import FLOAT_FLOOR


def trainer_logp(scorer: TrainerScorer, comps: list[Completion], sampling: Sampling, raw: bool,
                 batch_size: int = 64) -> list[np.ndarray]:
    """The trainer's logprobs of each completion's tokens, in the semantics the engine reports."""
    s = scorer.score([c.prompt_token_ids for c in comps], [c.token_ids for c in comps],
                     temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, raw=raw,
                     batch_size=batch_size)
    return s["logp_raw"] if raw else s["logp"]


def _abs_diffs(comps: list[Completion], logp: list[np.ndarray]) -> list[np.ndarray]:
    return [np.abs(c.logprobs.astype(np.float64) - t.astype(np.float64)) for c, t in zip(comps, logp)]


def _max(arrays: list[np.ndarray]) -> float:
    return float(max((a.max() for a in arrays if a.size), default=0.0))


# -- memory pressure --------------------------------------------------------------------------------
def pressure_kwargs(kv_tokens: int, block_size: int, max_context: int) -> dict:
    """vLLM keyword arguments for a KV cache of at least `kv_tokens` tokens (whole blocks), with stats on
    (V1 counts preemptions only then). max_model_len is one block less than the cache: vLLM V1 refuses
    a cache that cannot hold one request of max_model_len plus a block (measured: 8 blocks of 128 serve
    at most 896 tokens)."""
    if kv_tokens < 1 or block_size < 1:
        raise ValueError(f"kv_tokens and block_size must be >= 1, got {kv_tokens} and {block_size}")
    blocks = max(2, math.ceil(kv_tokens / block_size))
    return {"num_gpu_blocks_override": blocks, "max_model_len": min((blocks - 1) * block_size, max_context),
            "disable_log_stats": False}


@dataclass
class Pressure:
    metrics: dict[str, float]  # without the engine prefix
    rows: pd.DataFrame  # engine, case (free | pressure), request_id, position, abs_dlogp


def pressure_settings(free: EngineWorker, prompts: list[list[int]], sampling: Sampling, kv_tokens: int,
                      max_context: int) -> tuple[dict, int]:
    """The pressure engine's vLLM keyword arguments and the tokens its cache holds, for `free`'s block size;
    a clear error if that cache cannot hold the longest request."""
    block = int(free.info()["settings"].get("block_size") or 16)
    kw = pressure_kwargs(kv_tokens, block, max_context)
    need = max(len(p) for p in prompts) + sampling.max_tokens
    if need > kw["max_model_len"]:
        raise ValueError(f"pressure_kv_tokens={kv_tokens} ({kw['num_gpu_blocks_override']} blocks of {block}) cannot "
                         f"hold the longest request ({need} tokens): raise pressure_kv_tokens")
    return kw, kw["num_gpu_blocks_override"] * block


def pressure_engine(free: EngineWorker, prompts: list[list[int]], sampling: Sampling, kv_tokens: int,
                    max_context: int, wait: bool = True) -> EngineWorker:
    """A second engine of `free`'s preset whose KV cache holds only `kv_tokens` tokens (`wait=False`: launched,
    starting in the background)."""
    kw, _ = pressure_settings(free, prompts, sampling, kv_tokens, max_context)
    return EngineWorker(free.preset, free.model, dtype=free.dtype, extra_vllm_kwargs=kw, wait=wait)


def memory_pressure(free: EngineWorker, prompts: list[list[int]], sampling: Sampling, scorer: TrainerScorer,
                    kv_tokens: int, max_context: int, pressed: EngineWorker | None = None) -> Pressure:
    """The same seeded requests on `free` (the preset as configured) and on a second engine of the same
    preset whose KV cache holds only `kv_tokens` tokens (`pressed`, when the caller launched it ahead)."""
    info = free.info()
    _, cache_tokens = pressure_settings(free, prompts, sampling, kv_tokens, max_context)
    if pressed is None:
        pressed = pressure_engine(free, prompts, sampling, kv_tokens, max_context)
    raw = reports_raw_logprobs(info)
    free.reset_prefix_cache()
    free_comps = free.generate(prompts, sampling)
    free_pre = free.stats()["preemptions"]
    with pressed as w:
        before = w.stats()["preemptions"]
        press = w.generate(prompts, sampling)
        after = w.stats()["preemptions"]
    d_free = _abs_diffs(free_comps, trainer_logp(scorer, free_comps, sampling, raw))
    d_press = _abs_diffs(press, trainer_logp(scorer, press, sampling, raw))
    same = [a.token_ids == b.token_ids for a, b in zip(free_comps, press)]
    lo, hi = stats.sequence_bootstrap_ci(d_press, np.mean)
    m = {"pressure_abs_dlogp_max": _max(d_press), "pressure_abs_dlogp_mean": float(np.mean(np.concatenate(d_press))),
         "pressure_abs_dlogp_mean_ci_low": lo, "pressure_abs_dlogp_mean_ci_high": hi,
         "free_abs_dlogp_max": _max(d_free),
         "pressure_preemptions": float("nan") if after is None else float(after - (before or 0)),
         "pressure_identical_frac": float(np.mean(same)),
         "pressure_vs_free_abs_dlogp_max": max(common_prefix_max_dlogp(a, b) for a, b in zip(free_comps, press)),
         "pressure_kv_tokens": float(cache_tokens)}
    if free_pre is not None:  # V0 always counts; V1 only with stats logging on (not the presets' default)
        m["free_preemptions"] = float(free_pre)
    rows = [pd.DataFrame({"engine": free.preset.name, "case": case, "request_id": i,
                          "prompt_len": len(c.prompt_token_ids), "position": np.arange(len(d)), "abs_dlogp": d})
            for case, comps, ds in (("free", free_comps, d_free), ("pressure", press, d_press))
            for i, (c, d) in enumerate(zip(comps, ds))]
    return Pressure(m, pd.concat(rows, ignore_index=True))


# -- long context -----------------------------------------------------------------------------------
@dataclass
class LongContext:
    metrics: dict[str, float]
    rows: pd.DataFrame  # engine, prompt_len, request_id, position (absolute), abs_dlogp, dist_abs_dlogp_max


def _dist_max(engine_full: np.ndarray, trainer_full: np.ndarray) -> np.ndarray:
    """Per position, the largest |Δlogp| over the whole vocabulary (tokens both sides report)."""
    e, t = engine_full.astype(np.float64), trainer_full.astype(np.float64)
    d = np.where(np.isfinite(e) & np.isfinite(t), np.abs(e - t), 0.0)
    return d.max(-1)


def long_context(w: EngineWorker, scorer: TrainerScorer, lengths: list[int], per_length: int, sampling: Sampling,
                 codec: PromptCodec, progress: bool = False) -> LongContext:
    """Completions after prompts of each length in `lengths` (task text, solved examples as context).
    `sampling.ignore_eos` should be on: every request then yields max_tokens positions to compare.

    Why the full distribution too: far into the context this policy grows confident, its sampled tokens
    get probability ~1 and their logprobs round to the same float on both sides, so the sampled-token
    |Δlogp| alone can read 0 where the logits do differ. The error of a logit does not shrink with its
    probability, so the largest |Δlogp| over the vocabulary (`dist_abs_dlogp_max`, small vocabularies
    only) shows the position dependence at every position."""
    from rlwb.progress import progress_bar

    raw = reports_raw_logprobs(w.info())
    # full distributions compare in processed semantics; a raw engine's equal them only at T = 1, no truncation
    full = (scorer.model.config.vocab_size <= w.preset.full_vocab_limit
            and (not raw or (sampling.temperature == 1.0 and sampling.top_k == 0 and sampling.top_p == 1.0)))
    frames, diffs, dists, by_len = [], [], [], {}
    for L in progress_bar(sorted(lengths), desc=f"long context {w.preset.name}", disable=not progress, leave=False):
        prompts = [V.prompt_ids(L, 1000 * L + i, codec) for i in range(per_length)]
        w.reset_prefix_cache()
        comps = w.generate(prompts, sampling, full=full)
        sc = scorer.score([c.prompt_token_ids for c in comps], [c.token_ids for c in comps],
                          temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, raw=raw,
                          full=full, batch_size=1)  # one long sequence at a time: [L x L] attention
        ds = _abs_diffs(comps, sc["logp_raw"] if raw else sc["logp"])
        dd = ([_dist_max(c.full, f) for c, f in zip(comps, sc["full"])] if full
              else [np.full(len(d), np.nan) for d in ds])
        diffs += ds
        dists += dd
        by_len[L] = max(_max(ds), float(np.nanmax(np.concatenate(dd))) if full else 0.0)
        for i, (d, x) in enumerate(zip(ds, dd)):
            frames.append(pd.DataFrame({"engine": w.preset.name, "prompt_len": L, "request_id": i,
                                        "position": L + np.arange(len(d)), "abs_dlogp": d, "dist_abs_dlogp_max": x}))
    lo, hi = stats.sequence_bootstrap_ci(diffs, np.mean)
    m = {"longctx_abs_dlogp_max": _max(diffs), "longctx_abs_dlogp_mean": float(np.mean(np.concatenate(diffs))),
         "longctx_abs_dlogp_mean_ci_low": lo, "longctx_abs_dlogp_mean_ci_high": hi,
         "longctx_dist_abs_dlogp_max": float(np.nanmax(np.concatenate(dists))) if full else float("nan"),
         "longctx_max_near": by_len[min(by_len)], "longctx_max_far": by_len[max(by_len)],
         "longctx_max_position": float(max(lengths) + sampling.max_tokens - 1)}
    return LongContext(m, pd.concat(frames, ignore_index=True))


# -- the notebook's run ------------------------------------------------------------------------------
@dataclass
class StressResult(Result):
    measures: pd.DataFrame  # engine, measure, value (the metrics as a table; the pressure figure reads it)
    cases: pd.DataFrame  # validator: one row per drawn case
    shrunk: pd.DataFrame  # validator: the minimal failing case per failing engine
    pressure_rows: pd.DataFrame
    longctx_rows: pd.DataFrame

    def frames(self) -> dict[str, pd.DataFrame]:
        return {"summary": self.measures, "cases": self.cases, "shrunk": self.shrunk,
                "pressure": self.pressure_rows, "longctx": self.longctx_rows}

    def summary(self) -> pd.DataFrame:
        return measures_table(self.measures, self.params.engines)

    def conclusion(self) -> str:
        shrunk = dict(zip(self.shrunk["engine"], self.shrunk["description"])) if len(self.shrunk) else {}
        return conclusion(self.metrics, self.params, shrunk)


def equivalence_metrics(rep: V.Report) -> dict[str, float]:
    """The validator's report as metrics: pass rate (with a 95% interval), worst case, median k3."""
    passed = np.array([r.passed for r in rep.results])
    lo, hi = stats.proportion_ci(int(passed.sum()), passed.size)
    k3 = np.array([r.k3_mean for r in rep.results])
    return {"validate_pass_rate": rep.pass_rate, "validate_pass_rate_ci_low": lo, "validate_pass_rate_ci_high": hi,
            "validate_worst_abs_dlogp": max(r.abs_dlogp_max for r in rep.results),
            "validate_k3_median": float(np.median(k3)), "validate_cases": float(len(rep.results))}


def check_lengths(p, max_context: int) -> None:
    """Clear errors before any engine starts: every long-context request must fit the model's context."""
    too_long = [L for L in p.longctx_lengths if L + p.longctx_max_tokens > max_context]
    if too_long:
        raise ValueError(f"longctx_lengths {too_long} + longctx_max_tokens {p.longctx_max_tokens} exceed the model's "
                         f"context of {max_context} tokens")


def run(params, model_path, *, on_start: OnStart = None, progress: bool = True) -> StressResult:
    """Per engine: the equivalence validator, memory pressure (paged engines) and long contexts."""
    p = params
    codec = PromptCodec(model_path, p.chat_template)
    scorer = TrainerScorer(model_path, "float32")
    max_context = int(scorer.model.config.max_position_embeddings)
    check_lengths(p, max_context)
    if p.validate_max_context > max_context:
        raise ValueError(f"validate_max_context={p.validate_max_context} is beyond the model's {max_context} positions")
    validate_context = p.validate_max_context or max_context
    pressure_prompts = make_prompts(p.prompt_source, p.pressure_prompts, p.seed, codec,
                                    heterogeneous=p.prompt_source == "task")
    s_press = Sampling(temperature=p.stress_temperature, max_tokens=p.max_tokens, seed=p.seed, ignore_eos=True)
    s_long = Sampling(temperature=p.stress_temperature, max_tokens=p.longctx_max_tokens, seed=p.seed, ignore_eos=True)
    metrics: dict[str, float] = {}
    cases, shrunk, press_rows, long_rows = [], [], [], []
    for w in iter_engines(p.engines, model_path, p.dtype, progress, on_start):
        e = w.preset.name
        # the memory-pressure engine starts while the validator runs (on CPU, as `iter_engines` prefetches)
        paged = w.preset.backend != "hf"  # the HF engine has no paged KV cache: nothing to preempt
        pressed = (pressure_engine(w, pressure_prompts, s_press, p.pressure_kv_tokens, max_context, wait=False)
                   if paged and prefetch_engines() else None)
        try:
            rep = V.validate(w, scorer, p.validate_cases, p.seed, p.validate_tolerance,
                             max_context=validate_context, progress=progress)
            m = equivalence_metrics(rep)
            cases.append(pd.DataFrame([{**V.case_row(r), "engine": e, "tolerance": p.validate_tolerance}
                                       for r in rep.results]))
            if rep.shrunk_result is not None:
                shrunk.append({**V.case_row(rep.shrunk_result), "engine": e, "description": V.describe(rep.shrunk)})
            if paged:
                pr = memory_pressure(w, pressure_prompts, s_press, scorer, p.pressure_kv_tokens, max_context,
                                     pressed=pressed)
                m.update(pr.metrics)
                press_rows.append(pr.rows)
        finally:
            if pressed is not None:
                pressed.close()
        lc = long_context(w, scorer, p.longctx_lengths, p.longctx_prompts, s_long, codec, progress)
        m.update(lc.metrics)
        long_rows.append(lc.rows)
        metrics.update({f"{e}/{k}": v for k, v in m.items()})
    return StressResult(p, metrics, split_metrics(metrics, name="measure"), pd.concat(cases, ignore_index=True),
                        pd.DataFrame(shrunk),
                        pd.concat(press_rows, ignore_index=True) if press_rows else pd.DataFrame(),
                        pd.concat(long_rows, ignore_index=True))


def conclusion(metrics: dict, p, shrunk: dict[str, str] | None = None) -> str:
    """Every statement with its interval (95%): `wording.equivalence_and_stress`, with what its finding says decided
    here: an engine fails the validator when a case fell outside the tolerance (pass rate < 1), and is off the float
    floor under memory pressure or at long context when its max |Δlogp| there exceeds FLOAT_FLOOR. `shrunk`: engine
    -> its minimal failing case in words (the `shrunk` frame)."""
    g = lambda e, k: metrics.get(f"{e}/{k}")
    ran = [e for e in p.engines if g(e, "validate_pass_rate") is not None]
    pressed = [e for e in ran if g(e, "pressure_abs_dlogp_max") is not None]
    long = [e for e in ran if g(e, "longctx_abs_dlogp_max") is not None]
    return wording_05.conclusion(
        metrics, list(p.engines), p.validate_tolerance, shrunk=shrunk,
        failing=[e for e in ran if g(e, "validate_pass_rate") < 1.0],
        passing=[e for e in ran if g(e, "validate_pass_rate") >= 1.0],
        pressure_off=[e for e in pressed if g(e, "pressure_abs_dlogp_max") > FLOAT_FLOOR],
        pressure_floor=[e for e in pressed if g(e, "pressure_abs_dlogp_max") <= FLOAT_FLOOR],
        longctx_off=[e for e in long if g(e, "longctx_abs_dlogp_max") > FLOAT_FLOOR],
        longctx_floor=[e for e in long if g(e, "longctx_abs_dlogp_max") <= FLOAT_FLOOR])
