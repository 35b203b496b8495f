"""The engine-trainer mismatch under the names, and against the thresholds, that each RL framework logs.

Why: a team reads its training dashboard, not rlwb's metric names. The audit reports the same tokens' mismatch as
verl, NeMo-RL, slime, SkyRL and prime-rl would log it, each estimator written from the framework's own code and
each threshold quoted from the framework's own repository (file and commit below: read there, 2026-11-25), so a
number can be put next to the dashboard a team already watches. Where a framework logs the quantity without a
threshold, the panel says "no threshold" rather than borrowing one.

Every estimator is a pure function of one array `x` of shape [tokens, 3]: the engine's logprob of each sampled
token, the trainer's, and 1 where a completion starts (so sequence-level quantities survive resampling whole
sequences: `panel` gives each a 95% sequence-bootstrap interval through `rlwb.core.measure.stats`). Notation: log r =
logp_trainer - logp_engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rlwb.core.measure import metrics as M
from rlwb.core.measure.metrics import SAFETY_BOUND  # verl clamps log ratios to +-20 before exp (rollout_corr_helper)
from rlwb.core.measure.stats import N_BOOT, sequence_bootstrap_ci

VERL = "volcengine/verl@b178a3cd"
NEMO = "NVIDIA-NeMo/RL@7ea279ab"
SLIME = "THUDM/slime@624b824a"
SKYRL = "NovaSky-AI/SkyRL@a9564572"
PRIME = "PrimeIntellect-ai/prime-rl@559b4477"


def _parts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(logp_engine, logp_trainer, sequence id) of the [tokens, 3] array."""
    x = np.asarray(x, dtype=np.float64)
    return x[:, 0], x[:, 1], np.cumsum(x[:, 2]).astype(int) - 1


def _per_seq(values: np.ndarray, seq: np.ndarray, how: str) -> np.ndarray:
    sums = np.bincount(seq, weights=values)
    return sums / np.bincount(seq) if how == "mean" else sums


def verl_kl(x) -> float:
    """verl `rollout_corr/kl` = mean(logp_rollout - logp_train): rlwb's k1 (`compute_offpolicy_metrics`)."""
    e, t, _ = _parts(x)
    return float(np.mean(e - t))


def k3(x) -> float:
    """mean(r - 1 - log r): verl `rollout_corr/k3_kl`, NeMo-RL `gen_kl_error` (kl_type k3, log ratio
    prev - generation), prime-rl `mismatch_kl` (importance_ratio - log_importance_ratio - 1): all rlwb's k3."""
    e, t, _ = _parts(x)
    return M.k3(t - e)


def verl_chi2_token(x) -> float:
    """verl `rollout_corr/chi2_token` = mean(r^2) - 1, log r clamped to +-20."""
    e, t, _ = _parts(x)
    return float(np.mean(np.exp(2 * np.clip(t - e, -SAFETY_BOUND, SAFETY_BOUND))) - 1)


def verl_chi2_seq(x) -> float:
    """verl `rollout_corr/chi2_seq` = mean over sequences of (prod r)^2 - 1, the summed log ratio clamped to +-20."""
    e, t, seq = _parts(x)
    s = np.clip(_per_seq(t - e, seq, "sum"), -SAFETY_BOUND, SAFETY_BOUND)
    return float(np.mean(np.exp(2 * s)) - 1)


def verl_log_ppl_abs_diff(x) -> float:
    """verl `rollout_corr/log_ppl_abs_diff` = mean over sequences of |mean logp_rollout - mean logp_train|."""
    e, t, seq = _parts(x)
    return float(np.mean(np.abs(_per_seq(e, seq, "mean") - _per_seq(t, seq, "mean"))))


def verl_probs_diff_mean(x) -> float:
    """verl `training/rollout_probs_diff_mean` = mean |p_train - p_rollout| of the sampled tokens' probabilities
    (`verl/utils/debug/metrics.py` passes exp(logprobs) to `calculate_log_prob_diff`)."""
    e, t, _ = _parts(x)
    return float(np.mean(np.abs(np.exp(t) - np.exp(e))))


def verl_probs_diff_max(x) -> float:
    """verl `training/rollout_probs_diff_max` = max |p_train - p_rollout|."""
    e, t, _ = _parts(x)
    return float(np.max(np.abs(np.exp(t) - np.exp(e))))


def verl_probs_pearson(x) -> float:
    """verl `training/rollout_actor_probs_pearson_corr`: Pearson correlation of the two probabilities."""
    e, t, _ = _parts(x)
    return M.prob_pearson(e, t)


def nemo_mult_prob_error(x) -> float:
    """NeMo-RL `token_mult_prob_error` = mean exp(|logp_generation - logp_prev|)."""
    e, t, _ = _parts(x)
    return M.mult_prob_error(t - e)


def slime_abs_diff(x) -> float:
    """slime `train_rollout_logprob_abs_diff` = mean over samples of each sample's mean |logp_train - logp_rollout|
    (`sum_of_sample_mean`, reported per sample)."""
    e, t, seq = _parts(x)
    return float(np.mean(_per_seq(np.abs(t - e), seq, "mean")))


def token_abs_diff_mean(x) -> float:
    """SkyRL `policy/rollout_train_logprobs_abs_diff_mean` = mean over response tokens of
    |logp_rollout - logp_train|."""
    e, t, _ = _parts(x)
    return M.abs_mean(t - e)


def token_abs_diff_max(x) -> float:
    """SkyRL `policy/rollout_train_logprobs_abs_diff_max` = max over response tokens of |logp_rollout - logp_train|."""
    e, t, _ = _parts(x)
    return float(np.max(np.abs(t - e)))


@dataclass(frozen=True)
class FrameworkMetric:
    framework: str
    name: str  # as the framework logs it
    estimator: Callable[[np.ndarray], float]
    source: str  # where the framework computes it
    threshold: float | None = None  # None: the framework logs it without one
    alert: str = ""  # "above" or "abs above": the framework flags values (their magnitude) above the threshold
    threshold_source: str = ""  # where the threshold is written, and what the framework says of it
    neutral: float = 0.0  # its value without any mismatch (1 for NeMo-RL's multiplicative error)
    rlwb_name: str = ""  # the rlwb metric it equals or resembles (`rlwb.core.measure.metrics`): how a report formats it

    def distance(self, value: float) -> float:
        """How far `value` has gone from no mismatch towards the threshold: 0 = none, 1 = where the framework
        alerts (the figure's axis)."""
        v = abs(value) if self.alert == "abs above" else value
        return (v - self.neutral) / (self.threshold - self.neutral)

    def verdict(self, value: float) -> str:
        """"ok", "flagged" (on the side of the threshold the framework alerts on) or "no threshold"."""
        if self.threshold is None or not np.isfinite(value):
            return "no threshold" if self.threshold is None else "–"
        return "flagged" if (abs(value) if self.alert == "abs above" else value) > self.threshold else "ok"


VERL_ALERTS = (f"{VERL} docs/algo/rollout_corr.md, check_rollout_correction_health: warns when "
               "abs(rollout_corr/kl) > 0.1 and when rollout_corr/chi2_token > 1.0")
PANEL: tuple[FrameworkMetric, ...] = (
    FrameworkMetric("verl", "rollout_corr/kl", verl_kl, f"{VERL} verl/trainer/ppo/rollout_corr_helper.py "
                    "compute_offpolicy_metrics", 0.1, "abs above", VERL_ALERTS, rlwb_name="k1_mean"),
    FrameworkMetric("verl", "rollout_corr/k3_kl", k3, f"{VERL} verl/trainer/ppo/rollout_corr_helper.py "
                    "compute_offpolicy_metrics", rlwb_name="k3_mean"),
    FrameworkMetric("verl", "rollout_corr/chi2_token", verl_chi2_token, f"{VERL} verl/trainer/ppo/"
                    "rollout_corr_helper.py compute_offpolicy_metrics", 1.0, "above", VERL_ALERTS,
                    rlwb_name="chi2_token"),
    FrameworkMetric("verl", "rollout_corr/chi2_seq", verl_chi2_seq, f"{VERL} verl/trainer/ppo/rollout_corr_helper.py "
                    "compute_offpolicy_metrics", rlwb_name="chi2_seq"),
    FrameworkMetric("verl", "rollout_corr/log_ppl_abs_diff", verl_log_ppl_abs_diff, f"{VERL} verl/trainer/ppo/"
                    "rollout_corr_helper.py compute_offpolicy_metrics", rlwb_name="abs_dlogp_seq_mean"),
    FrameworkMetric("verl", "training/rollout_probs_diff_mean", verl_probs_diff_mean, f"{VERL} verl/utils/debug/"
                    "metrics.py calculate_debug_metrics", 0.01, "above",
                    f"{VERL} docs/faq/faq.rst: \"should be below 0.005\"; \"higher than 0.01 ... indicates a precision "
                    "issue from the inference engine\"", rlwb_name="abs_dp_mean"),
    FrameworkMetric("verl", "training/rollout_probs_diff_max", verl_probs_diff_max, f"{VERL} verl/utils/debug/"
                    "metrics.py calculate_debug_metrics", rlwb_name="abs_dp_max"),
    FrameworkMetric("verl", "training/rollout_actor_probs_pearson_corr", verl_probs_pearson, f"{VERL} "
                    "verl/utils/debug/metrics.py calculate_debug_metrics", rlwb_name="prob_pearson"),
    FrameworkMetric("NeMo-RL", "train/token_mult_prob_error", nemo_mult_prob_error, f"{NEMO} nemo_rl/algorithms/"
                    "loss/loss_functions.py ClippedPGLossFn", 1.05, "above",
                    f"{NEMO} nemo_rl/algorithms/grpo.py: \"track example with high token mult prob error above "
                    "1.05\" (logs the batch's plot)", neutral=1.0, rlwb_name="mult_prob_error"),
    FrameworkMetric("NeMo-RL", "train/gen_kl_error", k3, f"{NEMO} nemo_rl/algorithms/loss/loss_functions.py "
                    "ClippedPGLossFn (calculate_kl, kl_type k3)", 1e-3, "above",
                    f"{NEMO} docs/guides/grpo.md: \"values below 1e-3 considered acceptable\"", rlwb_name="k3_mean"),
    FrameworkMetric("slime", "train/train_rollout_logprob_abs_diff", slime_abs_diff, f"{SLIME} slime/backends/"
                    "megatron_utils/loss.py", 0.1, "above",
                    f"{SLIME} slime/utils/arguments.py --ci-train-rollout-logprob-abs-diff-threshold (default 0.1, "
                    "asserted in slime/backends/megatron_utils/model.py under --ci-test; its deterministic gate "
                    "tests/test_glm52_6layer_deterministic_e2e.py uses 1e-6)", rlwb_name="abs_dlogp_seq_mean"),
    FrameworkMetric("SkyRL", "policy/rollout_train_logprobs_abs_diff_mean", token_abs_diff_mean, f"{SKYRL} "
                    "skyrl/train/trainer.py", rlwb_name="abs_dlogp_mean"),
    FrameworkMetric("SkyRL", "policy/rollout_train_logprobs_abs_diff_max", token_abs_diff_max, f"{SKYRL} "
                    "skyrl/train/trainer.py", rlwb_name="abs_dlogp_max"),
    FrameworkMetric("prime-rl", "mismatch_kl/all/mean", k3, f"{PRIME} src/prime_rl/trainer/rl/loss.py "
                    "compute_importance_ratio_and_mismatch_kl; logged by src/prime_rl/trainer/rl/train.py",
                    rlwb_name="k3_mean"),
)


def stacked(logp_engine: list[np.ndarray], logp_trainer: list[np.ndarray]) -> list[np.ndarray]:
    """Per completion, the [tokens, 3] array the estimators take (engine, trainer, 1 at the first token)."""
    out = []
    for e, t in zip(logp_engine, logp_trainer):
        start = np.zeros(len(e))
        start[:1] = 1
        out.append(np.column_stack([np.asarray(e, np.float64), np.asarray(t, np.float64), start]))
    return out


def panel(logp_engine: list[np.ndarray], logp_trainer: list[np.ndarray], n_boot: int = N_BOOT,
          seed: int = 0) -> list[dict]:
    """One row per `PANEL` entry: the framework's name for it, its value on these completions with a 95%
    interval resampling whole completions, its threshold and what the framework would say."""
    groups = [g for g in stacked(logp_engine, logp_trainer) if len(g)]
    if not groups:
        return []
    flat = np.concatenate(groups)
    rows = []
    for fm in PANEL:
        value = fm.estimator(flat)
        lo, hi = sequence_bootstrap_ci(groups, fm.estimator, n_boot=n_boot, seed=seed)
        far = [fm.distance(v) for v in (value, lo, hi)] if fm.threshold is not None else [np.nan] * 3
        if fm.alert == "abs above" and lo <= 0 <= hi:  # |x|'s interval reaches 0 when x's straddles it
            far[1], far[2] = 0.0, max(far[1], far[2])
        rows.append({"framework": fm.framework, "metric": fm.name, "value": value, "ci_low": lo, "ci_high": hi,
                     "threshold": fm.threshold, "alert": fm.alert or None, "verdict": fm.verdict(value),
                     "distance": far[0], "distance_ci_low": min(far[1:]), "distance_ci_high": max(far[1:]),
                     "rlwb_metric": fm.rlwb_name,
                     "source": fm.source, "threshold_source": fm.threshold_source or None})
    return rows
