"""Notebook 02's experiment: engine-vs-trainer KL across temperatures and truncation settings.

Why it matters: V1's default returns raw logprobs, log softmax(z)[y], while the tokens were sampled from
softmax(z / T). Its per-token log ratio is then exactly  log softmax(z/T)[y] - log softmax(z)[y]  (zero
at T = 1, growing with |T - 1|): a bias, not noise. We compute that expectation from the trainer's logits
and check the measured gap against it.

Truncation (top-p / top-k): the sampling distribution is renormalised over the kept tokens. A trainer
that scores with a full-vocabulary softmax at temperature T is off by log(kept mass) on every token
(TRL issue 6789); `trainer="no_renorm"` rows measure that.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from rlwb.core.data.tokenizer import PromptCodec
from rlwb.core.measure import metrics as M
from rlwb.core.measure import stats
from rlwb.core.prompts.generated import make_prompts
from rlwb.core.scoring.rollouts import sample_and_score
from rlwb.core.scoring.trainer import TrainerScorer
from rlwb.engines.worker import Sampling, reports_raw_logprobs
from rlwb.experiments.base import OnStart, Result, iter_engines
from rlwb.experiments.wording import kl_vs_temperature as wording_02
from rlwb.experiments.wording.logprob_mismatch import FLOAT_FLOOR
from rlwb.formatting import KL_FLOOR

SWEEP_METRICS = ("k3_mean", "k1_mean", "abs_dlogp_mean", "abs_dlogp_max", "full_kl_mean", "n_tokens")
SWEEP_CIS = tuple(f"{k}_ci_{s}" for k in stats.CI_METRICS for s in ("low", "high"))


def setting_label(temperature: float, top_p: float = 1.0, top_k: int = 0) -> str:
    """`T=0.7`, `T=0.7,top_p=0.9`, `T=1,top_k=20`: the middle segment of the metric keys."""
    s = f"T={temperature:g}"
    if top_p < 1.0:
        s += f",top_p={top_p:g}"
    if top_k > 0:
        s += f",top_k={top_k}"
    return s


def grid(p) -> list[tuple[float, float, int]]:
    """(T, top_p, top_k) settings: every temperature untruncated, then with each top-p and top-k variant."""
    out = []
    for T in p.temperatures:
        out.append((T, 1.0, 0))
        out += [(T, tp, 0) for tp in p.top_p_values if tp < 1.0]
        out += [(T, 1.0, tk) for tk in p.top_k_values if tk > 0]
    return list(dict.fromkeys(out))


@dataclass
class SweepResult(Result):
    rows: pd.DataFrame  # engine, temperature, top_p, top_k, trainer, metric, value
    tokens: pd.DataFrame  # per token: engine, temperature, top_p, top_k, measured_log_r, expected_log_r

    def frames(self) -> dict[str, pd.DataFrame]:
        return {"sweep": self.rows, "tokens": self.tokens}

    def summary(self) -> pd.DataFrame:
        """k3 per engine and truncation (rows) by temperature (columns), the engines in params order."""
        r = self.rows[(self.rows.metric == "k3_mean") & (self.rows.trainer == "renorm")].copy()
        r["truncation"] = [setting_label(1.0, tp, tk).removeprefix("T=1").lstrip(",") or "none"
                           for tp, tk in zip(r.top_p, r.top_k)]
        t = r.pivot_table(index=["engine", "truncation"], columns="temperature", values="value")
        t = t.rename(columns=lambda T: f"k3 at T={T:g}")
        order = {e: i for i, e in enumerate(self.params.engines)}
        return t.sort_index(key=lambda ix: ix.map(order) if ix.name == "engine" else ix)

    def conclusion(self) -> str:
        return conclusion(self.metrics, self.params)


def run(params, model_path, *, on_start: OnStart = None, progress: bool = True) -> SweepResult:
    """Every engine at every (T, top_p, top_k) of `grid(params)`: mismatch metrics with intervals, the
    truncation ablation (a trainer that does not renormalise), and the analytic check of the raw gap."""
    from rlwb.progress import progress_bar

    p = params

    scorer = TrainerScorer(model_path, p.trainer_dtype)
    prompts = make_prompts(p.prompt_source, p.prompts, p.seed, PromptCodec(model_path, p.chat_template))
    settings = grid(p)
    rows, toks, mets = [], [], {}
    for w in iter_engines(p.engines, model_path, p.dtype, progress, on_start):
        raw_engine = reports_raw_logprobs(w.info())
        for T, tp, tk in progress_bar(settings, desc=w.preset.name, disable=not progress, leave=False):
            s = Sampling(temperature=T, top_p=tp, top_k=tk, max_tokens=p.max_tokens, seed=p.seed)
            ro = sample_and_score(w, scorer, prompts, s, full=p.full_vocab)
            e, t = ro.flat()
            seq = ro.seq_ids()
            label = setting_label(T, tp, tk)
            variants = {"renorm": (t, ro.full_trainer)}
            if tp < 1.0 or tk > 0:  # the same tokens scored by a trainer that applies T but does not truncate
                nr = scorer.score([c.prompt_token_ids for c in ro.completions], [c.token_ids for c in ro.completions],
                                  temperature=T, full=p.full_vocab)
                variants["no_renorm"] = (np.concatenate(nr["logp"]).astype(np.float64), nr.get("full"))
            splits = np.cumsum([len(c.token_ids) for c in ro.completions])[:-1]
            for trainer_kind, (tt, full_t) in variants.items():
                m = M.mismatch_metrics(e, tt, seq_ids=seq, full_engine=ro.full_engine, full_trainer=full_t)
                m.update(stats.mismatch_cis(np.split(tt - e, splits), n_boot=1000, seed=p.seed))
                group = w.preset.name if trainer_kind == "renorm" else f"{w.preset.name}+trainer_no_renorm"
                for k in SWEEP_METRICS + SWEEP_CIS:
                    mets[f"{group}/{label}/{k}"] = m[k]
                    rows.append({"engine": w.preset.name, "temperature": T, "top_p": tp, "top_k": tk,
                                 "trainer": trainer_kind, "metric": k, "value": m[k]})
            # analytical expectation of log r for this engine's logprob semantics
            raw_t = np.concatenate(ro.logp_trainer_raw).astype(np.float64)
            expected = (t - raw_t) if raw_engine else np.zeros_like(t)
            measured = t - e
            err = float(np.max(np.abs(measured - expected))) if measured.size else float("nan")
            mets[f"{w.preset.name}/{label}/analytic_abs_err_max"] = err
            rows.append({"engine": w.preset.name, "temperature": T, "top_p": tp, "top_k": tk, "trainer": "renorm",
                         "metric": "analytic_abs_err_max", "value": err})
            toks.append(pd.DataFrame({"engine": w.preset.name, "temperature": T, "top_p": tp, "top_k": tk,
                                      "measured_log_r": measured, "expected_log_r": expected}))
    return SweepResult(p, mets, pd.DataFrame(rows), pd.concat(toks, ignore_index=True))


def conclusion(metrics: dict, p) -> str:
    """`wording.kl_vs_temperature`, with the metric keys' labels of every (temperature, top_p) it may read and what
    the finding says decided here: which engines leave the float floor (max |Δlogp| > FLOAT_FLOOR at some T), which
    of those the analytical log ratio of raw logprobs accounts for (its error at the floor at every T: the engine
    drifts with temperature), which stay at the floor, and, per top_p < 1, the engines at the floor whose tokens a
    trainer that does not renormalise scores off the KL floor."""
    temps = sorted({*p.temperatures, 1.0})
    labels = {(T, tp): setting_label(T, tp) for T in temps for tp in (1.0, *p.top_p_values)}

    def at(e, T, tp, name, group=None):
        return metrics.get(f"{group or e}/{labels[T, tp]}/{name}")

    ran = [e for e in p.engines if any(at(e, T, 1.0, "abs_dlogp_max") is not None for T in p.temperatures)]
    off = [e for e in ran if any((at(e, T, 1.0, "abs_dlogp_max") or 0) > FLOAT_FLOOR for T in p.temperatures)]
    explained = [e for e in off if all((at(e, T, 1.0, "analytic_abs_err_max") or 0) <= FLOAT_FLOOR
                                       for T in p.temperatures)]
    floor = [e for e in ran if e not in off]
    truncation = {tp: [e for e in floor if any((at(e, T, tp, "k3_mean", f"{e}+trainer_no_renorm") or 0) > KL_FLOOR
                                               for T in p.temperatures)]
                  for tp in p.top_p_values if tp < 1.0}
    return wording_02.conclusion(metrics, list(p.engines), list(p.temperatures), list(p.top_p_values), labels,
                                 off=off, explained=explained, floor=floor, truncation=truncation)
