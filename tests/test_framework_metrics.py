"""The cross-framework panel (rlwb/core/measure/framework_metrics.py): verl's numbers from verl's own code on the same
tensors; the others against their frameworks' expressions on a case worked by hand; thresholds and verdicts."""

import numpy as np
import pytest
import torch

from rlwb.core.measure import framework_metrics as F


def _completions(seed: int = 0, n: int = 12, sigma: float = 0.05):
    """Engine and trainer logprobs of `n` completions of different lengths, the trainer off by ~`sigma` nats."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, 9, n)
    e = [-rng.exponential(1.0, L) for L in lens]
    t = [x + rng.normal(0, sigma, len(x)) for x in e]
    return e, [np.minimum(x, 0) for x in t]


def _padded(seqs):
    width = max(len(s) for s in seqs)
    out = torch.zeros(len(seqs), width, dtype=torch.float64)
    mask = torch.zeros(len(seqs), width, dtype=torch.float64)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.as_tensor(s)
        mask[i, : len(s)] = 1
    return out, mask


def _value(rows, metric):
    return next(r["value"] for r in rows if r["metric"] == metric)


def test_verl_numbers_equal_verls_own_code():
    from tests import peers

    e, t = _completions()
    rows = F.panel(e, t, n_boot=50)
    pe, mask = _padded(e)
    pt, _ = _padded(t)
    ours = peers.verl_rollout_corr().compute_offpolicy_metrics(old_log_prob=pt, rollout_log_prob=pe,
                                                                response_mask=mask)
    for name in ("kl", "k3_kl", "chi2_token", "chi2_seq", "log_ppl_abs_diff"):  # verl divides by mask.sum() + 1e-8
        assert _value(rows, f"rollout_corr/{name}") == pytest.approx(ours[name], rel=1e-7), name
    debug = peers.verl_debug_metrics()
    batch = debug.DataProto.from_dict({"rollout_log_probs": pe, "old_log_probs": pt, "response_mask": mask,
                                       "responses": torch.zeros_like(mask, dtype=torch.long)})
    theirs = debug.calculate_debug_metrics(batch)
    for name in ("rollout_probs_diff_mean", "rollout_probs_diff_max", "rollout_actor_probs_pearson_corr"):
        assert _value(rows, f"training/{name}") == pytest.approx(theirs[f"training/{name}"], rel=1e-7), name


def test_the_other_frameworks_estimators_on_a_case_worked_by_hand():
    """Two completions: log r = (0.1, -0.2) and (0.3,): the frameworks' expressions written out."""
    e = [np.array([-1.0, -0.5]), np.array([-2.0])]
    t = [np.array([-0.9, -0.7]), np.array([-1.7])]
    lr = np.array([0.1, -0.2, 0.3])
    rows = F.panel(e, t, n_boot=20)
    k3 = np.mean(np.exp(lr) - 1 - lr)
    assert _value(rows, "train/token_mult_prob_error") == pytest.approx(np.mean(np.exp(np.abs(lr))))  # NeMo-RL
    assert _value(rows, "train/gen_kl_error") == pytest.approx(k3)  # NeMo-RL calculate_kl k3, prev - generation
    assert _value(rows, "mismatch_kl/all/mean") == pytest.approx(k3)  # prime-rl r - log r - 1
    assert _value(rows, "train/train_rollout_logprob_abs_diff") == pytest.approx((0.15 + 0.3) / 2)  # per sample
    assert _value(rows, "policy/rollout_train_logprobs_abs_diff_mean") == pytest.approx(0.2)  # per token
    assert _value(rows, "policy/rollout_train_logprobs_abs_diff_max") == pytest.approx(0.3)


def test_thresholds_verdicts_and_intervals():
    e, t = _completions(1, n=32, sigma=0.1)
    rows = F.panel(e, t, n_boot=200)
    by = {r["metric"]: r for r in rows}
    assert len(rows) == len(F.PANEL) and {r["framework"] for r in rows} == {"verl", "NeMo-RL", "slime", "SkyRL",
                                                                           "prime-rl"}
    # every threshold quotes where it is written; metrics without one say so
    for r in rows:
        assert (r["threshold"] is None) == (r["threshold_source"] is None) == (r["verdict"] == "no threshold")
        assert r["ci_low"] <= r["value"] + 1e-12 and r["value"] <= r["ci_high"] + 1e-12, r["metric"]
    # a 0.1-nat trainer: NeMo-RL's 1e-3 k3 bound and its 1.05 multiplicative bound are crossed, verl's 0.1 KL not
    assert by["train/gen_kl_error"]["verdict"] == "flagged" and by["train/token_mult_prob_error"]["verdict"] == \
        "flagged"
    assert by["rollout_corr/kl"]["verdict"] == "ok" and by["train/train_rollout_logprob_abs_diff"]["verdict"] == "ok"
    assert by["train/token_mult_prob_error"]["distance"] > 1 > by["rollout_corr/kl"]["distance"] >= 0
    same = F.panel(e, e, n_boot=20)  # no mismatch: nothing flagged, every distance 0
    assert all(r["verdict"] != "flagged" for r in same)
    assert all(r["distance"] == 0 for r in same if r["threshold"] is not None)
