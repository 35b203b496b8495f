"""Each estimator against hand-computed values, plus edge cases."""

import math

import numpy as np
import pytest

from rlwb.core.measure import metrics as M

# Two sequences: tokens 0,1 in seq 0; token 2 in seq 1.
E = np.log([0.5, 0.25, 0.8])
T = np.log([0.4, 0.25, 0.9])
SEQ = [0, 0, 1]


def test_hand_computed_values():
    m = M.mismatch_metrics(E, T, seq_ids=SEQ, clip_eps=0.2)
    lr = [math.log(0.8), 0.0, math.log(9 / 8)]
    r = [0.8, 1.0, 9 / 8]
    assert m["n_tokens"] == 3
    assert m["abs_dlogp_mean"] == pytest.approx(sum(abs(x) for x in lr) / 3)
    assert m["abs_dlogp_max"] == pytest.approx(abs(math.log(0.8)))
    assert m["k1_mean"] == pytest.approx(-sum(lr) / 3)
    assert m["k2_mean"] == pytest.approx(sum(0.5 * x * x for x in lr) / 3)
    assert m["k3_mean"] == pytest.approx(sum(ri - 1 - x for ri, x in zip(r, lr)) / 3)
    assert m["clip_frac"] == pytest.approx(0.0)  # 0.8 and 1.125 are inside [0.8, 1.2]... 0.8 is on the edge
    assert M.clip_frac(np.array(lr), eps=0.1) == pytest.approx(2 / 3)
    assert m["ess_frac"] == pytest.approx(sum(r) ** 2 / (3 * sum(x * x for x in r)))
    assert m["chi2_token"] == pytest.approx(sum(x * x for x in r) / 3 - 1)
    assert m["seq_abs_log_ratio_mean"] == pytest.approx((abs(math.log(0.8)) + abs(math.log(9 / 8))) / 2)
    assert m["prob_pearson"] == pytest.approx(np.corrcoef([0.5, 0.25, 0.8], [0.4, 0.25, 0.9])[0, 1])
    assert math.isnan(m["full_kl_mean"])  # no full distributions given


def test_identical_logprobs_are_exactly_zero_mismatch():
    m = M.mismatch_metrics(E, E, seq_ids=SEQ)
    for k in ("abs_dlogp_mean", "abs_dlogp_max", "k1_mean", "k2_mean", "k3_mean", "clip_frac", "chi2_token",
              "seq_abs_log_ratio_mean"):
        assert m[k] == 0.0, k
    assert m["ess_frac"] == pytest.approx(1.0) and m["prob_pearson"] == pytest.approx(1.0)


def test_k3_is_unbiased_for_kl_between_categoricals():
    rng = np.random.default_rng(0)
    p, q = np.array([0.6, 0.3, 0.1]), np.array([0.5, 0.3, 0.2])
    x = rng.choice(3, size=200_000, p=p)
    true_kl = float(np.sum(p * np.log(p / q)))
    m = M.mismatch_metrics(np.log(p[x]), np.log(q[x]))
    assert m["k3_mean"] == pytest.approx(true_kl, rel=0.03)
    assert m["k1_mean"] == pytest.approx(true_kl, rel=0.05)
    full = M.exact_kl(np.log(p)[None], np.log(q)[None])
    assert full[0] == pytest.approx(true_kl)


@pytest.mark.filterwarnings("ignore:divide by zero")  # log(0) = -inf is the point of the test
def test_exact_kl_handles_truncated_support():
    le = np.log(np.array([[0.5, 0.5, 0.0]]))
    lt = np.log(np.array([[0.25, 0.75, 0.0]]))
    assert M.exact_kl(le, lt)[0] == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(0.5 / 0.75))
    assert M.exact_kl(le, le)[0] == 0.0
    assert math.isinf(M.exact_kl(np.log([[0.5, 0.5]]), np.log([[1.0, 0.0]]))[0])


def test_empty_mask_gives_no_numbers_not_an_error():
    m = M.mismatch_metrics(E, T, seq_ids=SEQ, mask=[False] * 3)
    assert m["n_tokens"] == 0
    assert all(math.isnan(v) for k, v in m.items() if k != "n_tokens")


def test_mask_selects_tokens():
    m = M.mismatch_metrics(E, T, seq_ids=SEQ, mask=[False, True, True])
    assert m["n_tokens"] == 2 and m["abs_dlogp_max"] == pytest.approx(math.log(9 / 8))


@pytest.mark.parametrize("bad, name", [([np.nan, -1.0, -1.0], "logp_engine"), ([-np.inf, -1.0, -1.0], "logp_engine")])
def test_non_finite_logprobs_are_rejected(bad, name):
    with pytest.raises(ValueError, match=f"{name} has 1 non-finite"):
        M.mismatch_metrics(bad, T)
    with pytest.raises(ValueError, match="logp_trainer has 1 non-finite"):
        M.mismatch_metrics(T, bad)


def test_shape_and_sign_errors():
    with pytest.raises(ValueError, match="3 tokens but logp_trainer has 2"):
        M.log_ratio(E, T[:2])
    with pytest.raises(ValueError, match="positive values"):
        M.mismatch_metrics(-E, T)
    with pytest.raises(ValueError, match="clip eps"):
        M.clip_frac(np.zeros(3), eps=1.5)


def test_prefixed_keys():
    assert M.prefixed("vllm-v1", {"k3_mean": 1.0}) == {"vllm-v1/k3_mean": 1.0}
