"""`rlwb engines check`: does each installed engine preset behave as what it is meant to be?

Each preset is started, samples task prompts at T = 1 and T = 0.7, and is compared with the fp32 trainer. What
it is held to follows from the settings the *running* engine reports (`info()`), not from its name:

- **float floor** (fp32 weights and KV cache, processed logprobs): max |Δlogp| ≤ 1e-4 at both temperatures.
- **raw gap** (fp32, raw logprobs, vLLM V1's default): at the floor against the trainer's *raw* logprobs
  (`log softmax(z)`) at both temperatures, and off the trainer's processed ones at T = 0.7 (the gap that
  makes V1's default wrong for RL is there, and is exactly the temperature's).
- **low-precision band** (bf16/fp16 weights or an fp8 KV cache): k3 ≤ 1e-3 per token and max |Δlogp| ≤ 1 at
  both temperatures against the logprobs of the mode it reports: rounding noise passes, a wrong tokenizer,
  temperature or weights do not.

A preset whose environment is not installed (`rlwb engines setup NAME` makes it) is listed as such and does not
fail the check; one that cannot start, or misses its expectation, does (exit code 1: something is wrong).
"""

from __future__ import annotations

import time

import numpy as np

from rlwb.core.data import tasks, tokenizer
from rlwb.core.measure import metrics
from rlwb.core.models.store import resolve_model
from rlwb.core.scoring.rollouts import sample_and_score
from rlwb.core.scoring.trainer import TrainerScorer
from rlwb.engines.presets import available_presets, resolve_preset
from rlwb.engines.worker import EngineWorker, Sampling, expected_agreement, reports_raw_logprobs
from rlwb.errors import PresetError

FLOOR = 1e-4  # max |Δlogp| of an fp32 engine against the fp32 trainer (measured floors are 4e-6 to 2e-5)
BAND_K3, BAND_MAX = 1e-3, 1.0  # a low-precision engine: bf16 measured k3 ~1e-5..1e-4, max |Δlogp| 0.03..0.05
TEMPERATURES = (1.0, 0.7)


def verdict(expected: str, measured: dict[float, dict]) -> tuple[bool, str]:
    """(ok, why) for one preset; `measured[T]` has max/k3 against the trainer's processed and raw logprobs."""
    if expected == "float floor":
        worst = max(m["max_abs_dlogp"] for m in measured.values())
        return worst <= FLOOR, f"max |Δlogp| {worst:.1e} (≤ {FLOOR:g})"
    if expected == "raw gap":
        worst = max(m["max_abs_dlogp_vs_raw"] for m in measured.values())
        gap = measured[0.7]["max_abs_dlogp"]
        return (worst <= FLOOR and gap > FLOOR,
                f"vs the trainer's raw logprobs max |Δlogp| {worst:.1e} (≤ {FLOOR:g}); vs processed at T=0.7 "
                f"{gap:.2g} (> {FLOOR:g})")
    key = "vs_raw" if measured[1.0].get("raw") else ""
    k3 = max(m["k3_mean" + ("_" + key if key else "")] for m in measured.values())
    worst = max(m["max_abs_dlogp" + ("_" + key if key else "")] for m in measured.values())
    return (k3 <= BAND_K3 and worst <= BAND_MAX,
            f"k3 {k3:.1e} (≤ {BAND_K3:g}), max |Δlogp| {worst:.2g} (≤ {BAND_MAX:g})")


def check_engines(presets: list[str] | None = None, model: str = "default", prompts: int = 8) -> dict:
    """One row per preset: `status` ok | FAILED | not installed, `expected`, `why`, the measured numbers."""
    presets = presets or available_presets()
    path = resolve_model(model, progress=False)
    scorer = TrainerScorer(path, "float32")
    codec = tokenizer.PromptCodec(path)
    ids = [codec.encode_task(p) for p in tasks.make_problems(prompts, seed=123)]
    report = {}
    for name in presets:
        r = {"status": "FAILED", "ok": False, "expected": None, "why": None, "vllm_version": None, "engine": None,
             "dtype": None, "raw_logprobs": None, "start_s": None, "error": None}
        try:
            preset = resolve_preset(name)
            try:
                preset.check_interpreter()
            except PresetError as e:
                r.update(status="not installed", ok=None, error=str(e))
                report[name] = r
                continue
            t0 = time.time()
            with EngineWorker(preset, path) as w:
                r["start_s"] = round(time.time() - t0, 1)
                info = w.info()
                raw = reports_raw_logprobs(info)
                settings = info.get("settings") or {}
                r.update(vllm_version=info.get("vllm_version"), engine=info.get("engine"), raw_logprobs=raw,
                         dtype=str(settings.get("dtype")), expected=expected_agreement(settings, raw))
                measured = {}
                for T in TEMPERATURES:
                    ro = sample_and_score(w, scorer, ids, Sampling(temperature=T, max_tokens=24, seed=0), raw=True)
                    e = np.concatenate(ro.logp_engine).astype(np.float64)
                    t = np.concatenate(ro.logp_trainer).astype(np.float64)
                    t_raw = np.concatenate(ro.logp_trainer_raw).astype(np.float64)
                    measured[T] = {"raw": raw, "max_abs_dlogp": float(np.max(np.abs(e - t))),
                                   "max_abs_dlogp_vs_raw": float(np.max(np.abs(e - t_raw))),
                                   "k3_mean": metrics.mismatch_metrics(e, t)["k3_mean"],
                                   "k3_mean_vs_raw": metrics.mismatch_metrics(e, t_raw)["k3_mean"]}
                    r[f"max_abs_dlogp_T{T:g}"] = measured[T]["max_abs_dlogp"]
                ok, why = verdict(r["expected"], measured)
                r.update(ok=ok, why=why, status="ok" if ok else "FAILED")
        except Exception as e:  # report every preset, even when one cannot start
            r["error"] = f"{type(e).__name__}: {e}"
        report[name] = r
    return report


def exit_code(report: dict) -> int:
    """0 when every installed preset met its expectation, else 1."""
    return 0 if all(r["status"] in ("ok", "not installed") for r in report.values()) else 1
