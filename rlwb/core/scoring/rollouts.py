"""Sample with an engine, score the same tokens with the trainer: the measurement every notebook makes.

`Rollouts` keeps, per completion, the engine's reported logprobs next to the trainer's recomputation
under the same sampling distribution (and T=1, and the full distributions when asked), and flattens to
the per-token table archived as `data/*.parquet`.

Why that table carries each completion's prompt token ids and sampling settings on every row: an archived run
is then self-contained, so any trainer can re-score it later (`rlwb rescore RUN --trainer ...`,
`rollouts_from_frame`) without the engine, the prompts' source or the notebook's parameters.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from rlwb.core.scoring.trainer import TrainerScorer
from rlwb.engines.worker import Completion, EngineWorker, Sampling


@dataclass
class Rollouts:
    engine: str
    sampling: Sampling
    completions: list[Completion]
    logp_trainer: list[np.ndarray]
    logp_trainer_raw: list[np.ndarray] | None = None
    full_trainer: list[np.ndarray] | None = None
    entropy_trainer: list[np.ndarray] | None = None  # entropy of the sampling distribution at each token
    timings: dict = field(default_factory=dict)

    @property
    def logp_engine(self) -> list[np.ndarray]:
        return [c.logprobs for c in self.completions]

    @property
    def full_engine(self) -> list[np.ndarray] | None:
        if any(c.full is None for c in self.completions):
            return None
        return [c.full for c in self.completions]

    def log_ratios(self) -> list[np.ndarray]:
        """Per completion, log r = logp_trainer - logp_engine (float64): what the CIs resample."""
        return [t.astype(np.float64) - c.logprobs.astype(np.float64)
                for c, t in zip(self.completions, self.logp_trainer)]

    def flat(self) -> tuple[np.ndarray, np.ndarray]:
        """(logp_engine, logp_trainer) over all completion tokens."""
        e = np.concatenate(self.logp_engine) if self.completions else np.zeros(0)
        t = np.concatenate(self.logp_trainer) if self.completions else np.zeros(0)
        return e.astype(np.float64), t.astype(np.float64)

    def uncertainty(self) -> dict[str, float]:
        """How uncertain the policy is where it sampled (`rlwb.core.measure.metrics.policy_uncertainty`)."""
        from rlwb.core.measure.metrics import policy_uncertainty

        if self.entropy_trainer is None or not self.completions:
            return {}
        return policy_uncertainty(self.flat()[1], np.concatenate(self.entropy_trainer))

    def seq_ids(self) -> np.ndarray:
        """Sequence index of every flat token (for per-sequence estimators and the bootstrap)."""
        return np.concatenate([np.full(len(c.token_ids), i) for i, c in enumerate(self.completions)]) \
            if self.completions else np.zeros(0, dtype=int)

    def to_frame(self, **extra):
        import pandas as pd

        rows = []
        settings = asdict(self.sampling)
        for i, c in enumerate(self.completions):
            L = len(c.token_ids)
            d = {
                "engine": self.engine, "request_id": c.request_id, "sample_index": c.sample_index,
                "position": np.arange(L), "token_id": np.asarray(c.token_ids, dtype=np.int64),
                "logp_engine": c.logprobs.astype(np.float64), "logp_trainer": self.logp_trainer[i].astype(np.float64),
                "prompt_len": len(c.prompt_token_ids),
                # self-contained: what was sampled after what, and how (request i's seed is seed + i)
                "prompt_token_ids": [np.asarray(c.prompt_token_ids, dtype=np.int64)] * L,
                **{k: (None if v is None else v + c.request_id) if k == "seed" else v for k, v in settings.items()},
            }
            if self.logp_trainer_raw is not None:
                d["logp_trainer_raw"] = self.logp_trainer_raw[i].astype(np.float64)
            if self.entropy_trainer is not None:
                d["entropy_trainer"] = self.entropy_trainer[i].astype(np.float64)
            rows.append(pd.DataFrame(d))
        df = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()
        for k, v in extra.items():
            df[k] = v
        return df


# columns of the archived per-token table that vary within a completion; every other column is the completion's
PER_TOKEN = ("position", "token_id", "logp_engine", "logp_trainer", "logp_trainer_raw", "entropy_trainer")
SAMPLING_COLUMNS = tuple(f.name for f in fields(Sampling))


def rollouts_from_frame(df) -> dict[str, Rollouts]:
    """The inverse of `Rollouts.to_frame` for what re-scoring needs: per engine (and sampling setting, where a
    table holds several), the completions with their prompt ids, token ids and the engine's reported logprobs;
    `logp_trainer` is the archived trainer's. Raises ValueError naming what a table written before rollouts were
    self-contained lacks."""
    missing = [c for c in ("engine", "request_id", "sample_index", "position", "token_id", "logp_engine",
                           "logp_trainer", "prompt_token_ids", *SAMPLING_COLUMNS) if c not in df.columns]
    if missing:
        raise ValueError(f"the rollouts table lacks {', '.join(missing)}: it was archived before rollouts carried "
                         f"their prompts and sampling settings; rerun the notebook to re-score it")
    keys = [c for c in df.columns if c not in PER_TOKEN and c != "prompt_token_ids"]
    group_keys = [c for c in keys if c not in ("request_id", "sample_index", "prompt_len", "seed")]
    out: dict[str, Rollouts] = {}
    for gkey, g in df.groupby(group_keys, sort=False, dropna=False):
        first = dict(zip(group_keys, gkey if isinstance(gkey, tuple) else (gkey,)))
        base_seed = g["seed"].iloc[0] - g["request_id"].iloc[0] if g["seed"].notna().all() else None
        sampling = Sampling(**{k: _plain(first[k]) for k in SAMPLING_COLUMNS if k != "seed"},
                           seed=None if base_seed is None else int(base_seed))
        comps, trainer = [], []
        for (rid, si), c in g.sort_values("position").groupby(["request_id", "sample_index"], sort=True):
            comps.append(Completion(int(rid), int(si), [int(t) for t in c["prompt_token_ids"].iloc[0]],
                                    c["token_id"].astype(int).tolist(), c["logp_engine"].to_numpy(np.float32),
                                    "", "archived"))
            trainer.append(c["logp_trainer"].to_numpy(np.float64))
        label = str(first["engine"])
        extra = [f"{k}={first[k]}" for k in group_keys if k not in ("engine", *SAMPLING_COLUMNS)]
        label = "/".join([label, *extra]) if extra else label
        if label in out:  # one engine at several sampling settings
            label = f"{label}/T={sampling.temperature:g},top_p={sampling.top_p:g},top_k={sampling.top_k}"
        out[label] = Rollouts(label, sampling, comps, trainer)
    return out


def _plain(v):
    """numpy scalars from a parquet column as the Python types `Sampling` checks for."""
    return v.item() if hasattr(v, "item") else v


def sample_and_score(worker: EngineWorker, scorer: TrainerScorer, prompts: list[list[int]], sampling: Sampling,
                     full: bool = False, raw: bool = True) -> Rollouts:
    t0 = time.perf_counter()
    comps = worker.generate(prompts, sampling, full=full)
    t1 = time.perf_counter()
    s = scorer.score([c.prompt_token_ids for c in comps], [c.token_ids for c in comps],
                     temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, raw=raw, full=full,
                     entropy=True)
    t2 = time.perf_counter()
    return Rollouts(worker.preset.name, sampling, comps, s["logp"], s.get("logp_raw"), s.get("full"), s.get("entropy"),
                    {"generate_s": t1 - t0, "score_s": t2 - t1})


def common_prefix_max_dlogp(a: Completion, b: Completion) -> float:
    """Largest |Δlogp| between two completions of one request over the tokens they share before the first
    difference (0 when they differ at once): compares runs of an engine, not engine and trainer."""
    n = 0
    while n < min(len(a.token_ids), len(b.token_ids)) and a.token_ids[n] == b.token_ids[n]:
        n += 1
    return float(np.max(np.abs(a.logprobs[:n].astype(np.float64) - b.logprobs[:n].astype(np.float64)))) if n else 0.0
