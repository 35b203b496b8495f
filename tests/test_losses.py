"""GRPO loss on hand-made tensors (the corrections whose weights it takes: tests/test_corrections.py).

The peer check against TRL's own GRPOTrainer loss is `tests/test_trl_peer.py`; here
`test_grpo_loss_matches_independent_derivation` also re-derives the token-level clipped objective with
plain Python loops, with per-token correction weights.
"""

import math

import pytest
import torch

from rlwb.core.rl import losses


def test_group_advantages():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    a = losses.group_advantages(r, 4)
    assert torch.allclose(a[:4], torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-5)
    assert torch.equal(a[4:], torch.zeros(4))  # no signal in a uniform group, and no NaN
    with pytest.raises(ValueError, match="groups of 3"):
        losses.group_advantages(r, 3)


def _reference_loss(logp, old, adv, mask, eps, weights=None):
    total, n, clipped = 0.0, 0, 0
    for b in range(len(logp)):
        for t in range(len(logp[b])):
            if not mask[b][t]:
                continue
            r = math.exp(logp[b][t] - old[b][t])
            a = adv[b]
            u, c = r * a, min(max(r, 1 - eps), 1 + eps) * a
            term = -min(u, c) * (weights[b][t] if weights else 1.0)
            clipped += c < u
            total += term
            n += 1
    return total / n, clipped / n


def test_grpo_loss_matches_independent_derivation():
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(3, 5, generator=g) * 2
    old = logp + torch.randn(3, 5, generator=g) * 0.3
    adv = torch.tensor([1.5, -0.7, 0.2])
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]).bool()
    w = torch.rand(3, 5, generator=g) * 2
    for weights in (None, w):
        loss, st = losses.grpo_loss(logp, old, adv, mask, 0.2, weights=weights)
        ref, ref_clip = _reference_loss(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), 0.2,
                                        None if weights is None else weights.tolist())
        assert loss.item() == pytest.approx(ref, rel=1e-5)
        assert st.clip_frac == pytest.approx(ref_clip)


def test_grpo_loss_gradient_direction_and_on_policy_value():
    logp = torch.log(torch.tensor([[0.5, 0.5]])).requires_grad_()
    loss, st = losses.grpo_loss(logp, logp.detach(), torch.tensor([2.0]), torch.ones(1, 2, dtype=torch.bool))
    assert loss.item() == pytest.approx(-2.0) and st.ratio_mean == pytest.approx(1.0) and st.clip_frac == 0
    loss.backward()
    assert (logp.grad < 0).all()  # descending the loss raises the logprob of positive-advantage tokens


def test_keep_mask_and_kl_term():
    logp = torch.zeros(1, 3)
    old = torch.zeros(1, 3)
    mask = torch.ones(1, 3, dtype=torch.bool)
    keep = torch.tensor([[True, False, True]])
    loss, st = losses.grpo_loss(logp, old, torch.tensor([1.0]), mask, keep=keep)
    assert st.kept_frac == pytest.approx(2 / 3) and loss.item() == pytest.approx(-1.0)
    ref = torch.full((1, 3), -0.1)
    loss_kl, st = losses.grpo_loss(logp, old, torch.tensor([0.0]), mask, ref_logp=ref, beta=0.5)
    k3 = math.exp(-0.1) - 1 + 0.1
    assert st.kl_ref == pytest.approx(k3, rel=1e-5) and float(loss_kl) == pytest.approx(0.5 * k3, rel=1e-5)
