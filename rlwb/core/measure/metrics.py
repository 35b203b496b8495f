"""Engine-vs-trainer mismatch estimators. Pure numpy functions of per-token logprobs.

Notation (per completion token, over the tokens selected by `mask`):
    logp_e   the engine's reported logprob of the sampled token
    logp_t   the trainer's logprob of the same token under the sampling distribution
    log r    = logp_t - logp_e          r = pi_trainer / pi_engine (the importance ratio)

Tokens are sampled from the engine, so sample means estimate expectations under the engine's policy, and
k1/k2/k3 estimate KL(engine || trainer) (J. Schulman, "Approximating KL Divergence",
http://joschu.net/blog/kl-approx.html).

How these map onto the RL frameworks' logs (so a report can be read next to a training dashboard):
    k3_mean            verl `rollout_corr/k3_kl`, prime-rl `mismatch_kl`, PipelineRL `kl_new_old`
    k1_mean            verl `rollout_corr/kl` (the plain log-ratio estimator)
    abs_dlogp_mean     TRL `sampling/sampling_logp_difference/mean`
    abs_dlogp_max      TRL `sampling/sampling_logp_difference/max`
    clip_frac          PipelineRL `clamp_log_ratio_new_old_indicator`; PPO clip fraction at the first step
    ess_frac           normalised effective sample size of the raw ratios (Kong 1992)
    ess_tis            verl `rollout_corr/rollout_is_eff_sample_size` at verl's default token TIS (cap 2): the
                       ESS of the truncated weights, the number verl's health check holds to >= 0.3
    mult_prob_error    NeMo-RL `token_mult_prob_error` = mean exp(|log r|) (loss_functions.py; its tests want < 1.05)
    prob_pearson       MiniMax-M1 (arXiv:2506.13585) / verl `training/rollout_probs_pearson_corr`
"""

from __future__ import annotations

import numpy as np

METRICS = ("abs_dlogp_mean", "abs_dlogp_max", "k1_mean", "k2_mean", "k3_mean", "prob_pearson", "clip_frac",
           "ess_frac", "ess_tis", "chi2_token", "mult_prob_error", "seq_abs_log_ratio_mean", "full_kl_mean", "n_tokens")


def _as_logprobs(x, name: str, dosed: bool = False) -> np.ndarray:
    """`x` as a flat float64 array of logprobs: finite, and <= 0 unless `dosed` (an injected ratio-mismatch dose,
    `rlwb.core.rl.mismatch_doses.noisy_logprobs`, is symmetric noise on the reported values and may cross 0)."""
    a = np.asarray(x, dtype=np.float64).ravel()
    bad = ~np.isfinite(a)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"{name} has {int(bad.sum())} non-finite value(s) (first at token {i}: {a[i]}); "
                         f"a sampled token's logprob must be finite")
    if not dosed and (a > 1e-6).any():
        raise ValueError(f"{name} has positive values (max {a.max():.3g}): not logprobs")
    return a


def log_ratio(logp_engine, logp_trainer, mask=None, dosed: bool = False) -> np.ndarray:
    """log r = logp_trainer - logp_engine over the masked tokens (validated, float64; `dosed`: see `_as_logprobs`)."""
    e = _as_logprobs(logp_engine, "logp_engine", dosed)
    t = _as_logprobs(logp_trainer, "logp_trainer")
    if e.shape != t.shape:
        raise ValueError(f"logp_engine has {e.size} tokens but logp_trainer has {t.size}")
    if mask is None:
        return t - e
    m = np.asarray(mask, dtype=bool).ravel()
    if m.shape != e.shape:
        raise ValueError(f"mask has {m.size} entries for {e.size} tokens")
    return (t - e)[m]


def abs_mean(lr: np.ndarray) -> float:
    """Mean |log r| (TRL's sampling logp difference)."""
    return float(np.mean(np.abs(lr))) if lr.size else float("nan")


def k1(lr: np.ndarray) -> float:
    """Mean of -log r: unbiased for KL(engine||trainer), high variance, can be negative."""
    return float(np.mean(-lr)) if lr.size else float("nan")


def k2(lr: np.ndarray) -> float:
    """Mean of (log r)^2 / 2: low variance, biased; exact to second order."""
    return float(np.mean(0.5 * lr**2)) if lr.size else float("nan")


def k3(lr: np.ndarray) -> float:
    """Mean of r - 1 - log r: unbiased for KL(engine||trainer) and >= 0 per sample (Schulman's k3)."""
    return float(np.mean(np.expm1(lr) - lr)) if lr.size else float("nan")


def clip_frac(lr: np.ndarray, eps: float = 0.2) -> float:
    """Fraction of tokens whose ratio r lies outside PPO's trust region [1 - eps, 1 + eps]."""
    if not 0 < eps < 1:
        raise ValueError(f"clip eps must be in (0, 1), got {eps}")
    if not lr.size:
        return float("nan")
    r = np.exp(lr)
    return float(np.mean((r < 1 - eps) | (r > 1 + eps)))


def ess_frac(lr: np.ndarray) -> float:
    """Normalised effective sample size (sum r)^2 / (N sum r^2), in (0, 1]; 1 = no mismatch (Kong 1992)."""
    if not lr.size:
        return float("nan")
    r = np.exp(lr - lr.max())  # scale-free, so shift for stability
    return float(r.sum() ** 2 / (lr.size * np.sum(r**2)))


TIS_CAP = 2.0  # verl's default rollout_is_threshold (RolloutCorrectionConfig, token-level TIS)
SAFETY_BOUND = 20.0  # |log r| clamp before exp, as verl and SkyRL do (exp(20) ~ 5e8)


def ess_tis(lr: np.ndarray, cap: float = TIS_CAP) -> float:
    """verl's effective sample size of the IS weights it would train with: token TIS weights w = min(r, cap), r
    with |log r| clamped at 20; ESS = 1 / mean((w / mean w)^2) = (sum w)^2 / (N sum w^2), in (0, 1]
    (verl 0.9.1 `rollout_corr_helper.compute_is_metrics`, `rollout_is_eff_sample_size`, at `rollout_is="token"`
    and its default threshold 2). Unlike `ess_frac`, one huge raw ratio cannot drive it to 0: the cap bounds what
    a token can weigh, as in verl's loss. verl's docs warn below 0.3 (docs/algo/rollout_corr.md)."""
    if not lr.size:
        return float("nan")
    w = np.minimum(np.exp(np.clip(lr, -SAFETY_BOUND, SAFETY_BOUND)), cap)
    return float(w.sum() ** 2 / (lr.size * np.sum(w**2)))


def chi2_token(lr: np.ndarray) -> float:
    """mean(r^2) - 1: estimates the chi-square divergence chi2(trainer||engine), the IS variance driver."""
    return float(np.mean(np.exp(2 * lr)) - 1) if lr.size else float("nan")


def mult_prob_error(lr: np.ndarray) -> float:
    """NeMo-RL's `token_mult_prob_error`: mean over tokens of exp(|logp_trainer - logp_engine|), 1 = no mismatch
    (NVIDIA-NeMo/RL `nemo_rl/algorithms/loss_functions.py`, ClippedPGLossFn)."""
    return float(np.mean(np.exp(np.abs(lr)))) if lr.size else float("nan")


def prob_pearson(logp_engine, logp_trainer) -> float:
    """Pearson correlation of token probabilities exp(logp_e) vs exp(logp_t) (MiniMax-M1, verl)."""
    pe, pt = np.exp(np.asarray(logp_engine, float)), np.exp(np.asarray(logp_trainer, float))
    if pe.size < 2 or pe.std() == 0 or pt.std() == 0:
        return float("nan")
    return float(np.corrcoef(pe, pt)[0, 1])


def seq_abs_log_ratio_mean(lr: np.ndarray, seq_ids) -> float:
    """Mean over sequences of |sum_t log r|: the sequence-level IS weight's log-deviation."""
    if not lr.size:
        return float("nan")
    seq_ids = np.asarray(seq_ids).ravel()
    if seq_ids.shape != lr.shape:
        raise ValueError(f"seq_ids has {seq_ids.size} entries for {lr.size} tokens")
    _, inv = np.unique(seq_ids, return_inverse=True)
    return float(np.mean(np.abs(np.bincount(inv, weights=lr))))


def exact_kl(full_engine: np.ndarray, full_trainer: np.ndarray) -> np.ndarray:
    """Per-position KL(engine || trainer) = sum_v p_e(v) (log p_e(v) - log p_t(v)) from full log-distributions
    [n, V]. Tokens the engine gives zero mass contribute 0; mass where the trainer has none gives +inf."""
    le, lt = np.asarray(full_engine, np.float64), np.asarray(full_trainer, np.float64)
    if le.shape != lt.shape:
        raise ValueError(f"full distributions differ in shape: {le.shape} vs {lt.shape}")
    pe = np.exp(le)
    with np.errstate(invalid="ignore"):
        terms = np.where(pe > 0, pe * (le - lt), 0.0)
    return terms.sum(axis=-1)


def mismatch_metrics(logp_engine, logp_trainer, seq_ids=None, mask=None, clip_eps: float = 0.2,
                     full_engine: list[np.ndarray] | None = None,
                     full_trainer: list[np.ndarray] | None = None, dosed: bool = False) -> dict[str, float]:
    """All estimators above as a dict keyed by `METRICS` (NaN where undefined, e.g. no tokens). `dosed`: the
    engine's logprobs carry an injected ratio-mismatch dose (notebook 08) and may exceed 0."""
    e = _as_logprobs(logp_engine, "logp_engine", dosed)
    t = _as_logprobs(logp_trainer, "logp_trainer")
    lr = log_ratio(e, t, mask, dosed)
    m = np.ones_like(e, dtype=bool) if mask is None else np.asarray(mask, dtype=bool).ravel()
    seq = np.zeros(e.size, dtype=int) if seq_ids is None else np.asarray(seq_ids).ravel()
    out = {
        "abs_dlogp_mean": abs_mean(lr),
        "abs_dlogp_max": float(np.max(np.abs(lr))) if lr.size else float("nan"),
        "k1_mean": k1(lr), "k2_mean": k2(lr), "k3_mean": k3(lr),
        "prob_pearson": prob_pearson(e[m], t[m]),
        "clip_frac": clip_frac(lr, clip_eps), "ess_frac": ess_frac(lr), "ess_tis": ess_tis(lr),
        "chi2_token": chi2_token(lr),
        "mult_prob_error": mult_prob_error(lr),
        "seq_abs_log_ratio_mean": seq_abs_log_ratio_mean(lr, seq[m]) if seq_ids is not None else float("nan"),
        "full_kl_mean": float("nan"),
        "n_tokens": int(lr.size),
    }
    if full_engine is not None and full_trainer is not None:
        kl = exact_kl(np.concatenate(full_engine), np.concatenate(full_trainer))[m]
        out["full_kl_mean"] = float(np.mean(kl)) if kl.size else float("nan")
    return out


UNCERTAIN_P = 0.9  # a sampled token with probability below this is "uncertain" (issue #18's yardstick)


def policy_uncertainty(logp_trainer, entropy) -> dict[str, float]:
    """How uncertain the policy is at the tokens it sampled: the mean entropy (nats) of the sampling
    distribution and the share of sampled tokens with probability < 0.9 (both from the trainer's fp32
    recomputation, so they describe the policy, not an engine's error). Why it matters: errors that grow with
    entropy (raw logprobs, a bf16 head) are invisible where every sampled token has p ~ 1."""
    lp = _as_logprobs(logp_trainer, "logp_trainer")
    ent = np.asarray(entropy, dtype=np.float64)
    if lp.shape != ent.shape:
        raise ValueError(f"logp_trainer {lp.shape} and entropy {ent.shape} differ in shape")
    if lp.size == 0:
        return {"token_entropy_mean": float("nan"), "uncertain_token_frac": float("nan")}
    return {"token_entropy_mean": float(ent.mean()), "uncertain_token_frac": float(np.mean(np.exp(lp) < UNCERTAIN_P))}


def prefixed(group: str, metrics: dict) -> dict:
    """{"k3_mean": x} -> {"<group>/k3_mean": x}: the archive's `group/name` keys."""
    return {f"{group}/{k}": v for k, v in metrics.items()}
