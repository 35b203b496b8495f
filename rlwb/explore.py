"""A short path for poking at an engine in JupyterLab: start a preset, sample a few prompts, score them with the
trainer, read the mismatch, plot it. The notebooks' experiments are one `run()` of minutes each; this is the same
machinery one step at a time, for a researcher who wants to look at a handful of tokens.

    from rlwb import explore
    model = explore.model("default")                         # an embedded model (built or cached), a dir, an HF id
    prompts = explore.task_prompts(model, 16)                # token ids of 16 task prompts (chat template if any)
    with explore.engine("vllm-v1", model) as eng:            # any preset, knob (`vllm-v1-fixed@bf16`) or served URL
        ro = explore.sample(eng, prompts, temperature=0.7)   # rollouts + the fp32 trainer's logprobs of them
    explore.metrics(ro)                                      # notebook 01's numbers: |Δlogp|, k3 with 95% CIs, ...
    explore.worst_tokens(ro, model)                          # where engine and trainer disagree most
    explore.plot(ro)                                         # p_engine vs p_trainer

Every function is the one the notebooks use (`rlwb.core.scoring.rollouts.sample_and_score`, notebook 01's
`engine_metrics`, its `prob_scatter` figure); nothing here is archived (use `rlwb run` for a report).
`notebooks/explore.ipynb` is this docstring as a notebook; the tests execute it.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pandas as pd

from rlwb.core.data import tasks, tokenizer
from rlwb.core.models.store import resolve_model
from rlwb.core.scoring.rollouts import Rollouts, sample_and_score
from rlwb.core.scoring.trainer import TrainerScorer
from rlwb.engines.worker import EngineWorker, Sampling


def model(name: str = "default") -> Path:
    """The model's directory: an embedded model is built (minutes, once) or read from the cache."""
    return Path(resolve_model(name))


def task_prompts(model_path, n: int = 16, seed: int = 0, chat_template: str = "auto") -> list[list[int]]:
    """`n` addition-task prompts as token ids, through the model's chat template where it has one."""
    codec = tokenizer.PromptCodec(model_path, chat_template)
    return [codec.encode_task(p) for p in tasks.make_problems(n, seed=seed)]


def engine(preset: str, model_path, dtype: str = "float32") -> EngineWorker:
    """A started engine worker (use it as a context manager, or `close()` it: it is a process)."""
    return EngineWorker(preset, model_path, dtype=dtype)


@functools.cache
def _scorer(model_path: str, dtype: str) -> TrainerScorer:
    return TrainerScorer(model_path, dtype)


def sample(eng: EngineWorker, prompts: list[list[int]], temperature: float = 1.0, max_tokens: int = 24,
           top_p: float = 1.0, top_k: int = 0, seed: int = 0, trainer_dtype: str = "float32") -> Rollouts:
    """Sample `prompts` from `eng` and score the completions with the trainer (its logprobs under the sampling
    distribution, and the raw `log softmax(z)` ones)."""
    scorer = _scorer(str(eng.model), trainer_dtype)
    sampling = Sampling(temperature=temperature, max_tokens=max_tokens, top_p=top_p, top_k=top_k, seed=seed)
    return sample_and_score(eng, scorer, prompts, sampling)


def metrics(ro: Rollouts, clip_eps: float = 0.2) -> pd.Series:
    """Notebook 01's mismatch metrics of one engine's rollouts (95% sequence-bootstrap intervals as `_ci_low`,
    `_ci_high`)."""
    from rlwb.experiments.base import engine_metrics

    return pd.Series(engine_metrics(ro, clip_eps), name=ro.engine)


def worst_tokens(ro: Rollouts, model_path, n: int = 10) -> pd.DataFrame:
    """The `n` completion tokens where engine and trainer disagree most, with their text and context."""
    codec = tokenizer.PromptCodec(model_path)
    rows = []
    for i, c in enumerate(ro.completions):
        d = ro.logp_trainer[i].astype(np.float64) - c.logprobs.astype(np.float64)
        for pos in np.argsort(-np.abs(d))[:n]:
            rows.append({"sequence": i, "position": int(pos), "token": codec.decode([c.token_ids[pos]]),
                         "before": codec.decode(list(c.token_ids[max(0, pos - 8):pos])),
                         "logp_engine": float(c.logprobs[pos]), "logp_trainer": float(ro.logp_trainer[i][pos]),
                         "dlogp": float(d[pos])})
    out = pd.DataFrame(rows)
    return out.reindex(out["dlogp"].abs().sort_values(ascending=False).index).head(n).reset_index(drop=True)


def plot(ro: Rollouts):
    """p_engine against p_trainer for every sampled token (notebook 01's `prob_scatter`)."""
    from rlwb.plots.logprob_mismatch import prob_scatter

    return prob_scatter(ro.to_frame())
