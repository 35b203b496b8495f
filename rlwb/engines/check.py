"""`rlwb engines check`: the floor check every engine preset must pass before any experiment.

fp32 engine vs fp32 trainer must agree to float precision at T=1. At T=0.7 the engines that report
processed logprobs still agree; `vllm-v1` (raw logprobs by default) does not - by design, and the check
reports it as such rather than failing it.
"""

from __future__ import annotations

import time

import numpy as np

from rlwb.core import tasks, tokenizer
from rlwb.core.models import resolve_model
from rlwb.core.rollouts import sample_and_score
from rlwb.core.trainer import TrainerScorer
from rlwb.engines.presets import available_presets, resolve_preset
from rlwb.engines.worker import EngineWorker, Sampling, reports_raw_logprobs

FLOOR = 1e-4


def check_engines(presets: list[str] | None = None, model: str = "default", prompts: int = 8) -> dict:
    presets = presets or available_presets()
    path = resolve_model(model, progress=False)
    scorer = TrainerScorer(path, "float32")
    problems = tasks.make_problems(prompts, seed=123)
    codec = tokenizer.PromptCodec(path)
    ids = [codec.encode_task(p) for p in problems]
    report = {}
    for name in presets:
        r = {"ok": False, "vllm_version": None, "engine": None, "max_abs_dlogp_T1": None,
             "max_abs_dlogp_T07": None, "raw_logprobs": None, "start_s": None, "error": None}
        try:
            preset = resolve_preset(name)
            t0 = time.time()
            with EngineWorker(preset, path) as w:
                r["start_s"] = round(time.time() - t0, 1)
                info = w.info()
                r.update(vllm_version=info.get("vllm_version"), engine=info.get("engine"),
                         raw_logprobs=reports_raw_logprobs(info))
                for T, key in ((1.0, "max_abs_dlogp_T1"), (0.7, "max_abs_dlogp_T07")):
                    ro = sample_and_score(w, scorer, ids, Sampling(temperature=T, max_tokens=24, seed=0))
                    e, t = ro.flat()
                    r[key] = float(np.max(np.abs(e - t)))
            at_t07_ok = (r["max_abs_dlogp_T07"] > FLOOR) if r["raw_logprobs"] else (r["max_abs_dlogp_T07"] <= FLOOR)
            r["ok"] = bool(r["max_abs_dlogp_T1"] <= FLOOR and at_t07_ok)
        except Exception as e:  # report every preset, even when one cannot start
            r["error"] = f"{type(e).__name__}: {e}"
        report[name] = r
    return report
