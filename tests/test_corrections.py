"""Off-policy corrections: hand-made ratios, and every peer's own code fed the same tensors.

The peers run from their installed code (tests/peers.py): verl 0.9.1 `rollout_corr_helper` (through its
`RolloutCorrectionConfig` presets, so the catalogue's thresholds are held to verl's defaults too), TRL's
GRPOTrainer source lines and `get_off_policy_mask`, SkyRL 0.3.0's `off_policy_correction_utils`, OpenRLHF
0.11.2's `PolicyLoss`. Equality is asserted on the real tokens (padding carries no loss anywhere).

Weights and masks are half the claim: the rest is how the loss aggregates them (does a rejected token leave the
token count? a token or a sequence mean?). The `*_loss_*` tests feed one decoupled step to each peer's own loss
code (verl's `compute_policy_loss_vanilla` + `agg_loss`, SkyRL's `ppo_policy_loss` after its advantage
pre-scaling, OpenRLHF's `PolicyLoss`; TRL's `_compute_loss` in tests/test_trl_peer.py) and assert rlwb's
`grpo_loss` equals it in value and gradient, and differs under the aggregation the peer does not use.
"""

import dataclasses
import math

import pytest
import torch

from rlwb.core.measure import metrics as M
from rlwb.core.rl import correction_catalog as cat
from rlwb.core.rl import corrections as C
from rlwb.core.rl import losses
from tests import peers


def batch(seed: int = 0, B: int = 24, L: int = 12, spread: float = 1.0):
    """log r per token, rows spread from near-agreement (|log r| ~ 1e-5) to heavy mismatch (~2), with
    ragged lengths and a few tokens beyond the +-20 safety bound."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-5, 0.3, B).view(B, 1)
    lr = torch.randn(B, L, generator=g) * scale * spread
    lr[3, 1], lr[-1, 2], lr[-2, 0] = 25.0, -30.0, 8.0
    lengths = torch.randint(1, L + 1, (B,), generator=g)
    lengths[[3, -1, -2]] = L
    mask = torch.arange(L).view(1, L) < lengths.view(B, 1)
    logp_engine = (-torch.rand(B, L, generator=g) * 3).float()
    adv = torch.randn(B, generator=g)
    logp_trainer = logp_engine + lr.float()
    # log r exactly as every peer computes it from the two (float32 (a + b) - a is not b)
    return logp_trainer - logp_engine, mask, logp_engine, adv, logp_trainer


def assert_on_mask(ours: torch.Tensor, theirs: torch.Tensor, mask: torch.Tensor, what: str):
    """Equal on the real tokens to float32 rounding. atol 1e-8: verl, SkyRL and rlwb clamp |log r| at 20
    before exp, TRL and OpenRLHF do not, so a token at log r = -30 weighs 2e-9 here and 9e-14 in TRL."""
    theirs = theirs.expand_as(mask).to(ours.dtype)
    torch.testing.assert_close(ours[mask], theirs[mask], rtol=2e-6, atol=1e-8, msg=lambda m: f"{what}: {m}")


# ---- hand-made ---------------------------------------------------------------------------------------------

def test_hand_made_ratios():
    lr = torch.log(torch.tensor([[1.0, 4.0, 0.2], [1.2, 0.8, 1.0]]))  # r per token
    mask = torch.tensor([[True, True, True], [True, True, False]])
    tis = C.token_tis(lr, mask, cap=2.0)
    assert torch.allclose(tis.weights, torch.tensor([[1.0, 2.0, 0.2], [1.2, 0.8, 0.0]]), atol=1e-6)
    assert tis.truncated.tolist() == [[False, True, False], [False, False, False]]
    two_sided = C.token_tis(lr, mask, cap=1.5, floor=0.5)
    assert torch.allclose(two_sided.weights[0], torch.tensor([1.0, 1.5, 0.5]))
    assert two_sided.truncated[0].tolist() == [False, True, True]
    band = C.token_band(lr, mask, 0.5, 2.0)
    assert torch.allclose(band.weights, torch.tensor([[1.0, 0.0, 0.0], [1.2, 0.8, 0.0]]), atol=1e-6)
    assert band.keep.all()  # zero weight, still counted in the loss's token mean
    rej = C.token_reject(lr, mask, 0.5, 2.0)
    assert rej.keep.tolist() == [[True, False, False], [True, True, True]] and (rej.weights == mask).all()
    geo0 = math.exp((0 + math.log(4) + math.log(0.2)) / 3)  # 0.928; row 1 (2 tokens): sqrt(1.2*0.8) = 0.98
    assert C.sequence_reject_geometric(lr, mask, 0.5, 2.0).keep[:, 0].tolist() == [True, True]
    assert C.sequence_reject_geometric(lr, mask, 0.95, 1.05).keep[:, 0].tolist() == [geo0 >= 0.95, True]
    seq = C.sequence_tis(lr, mask, cap=2.0)  # prod r: 0.8 and 0.96
    assert torch.allclose(seq.weights, torch.tensor([[0.8] * 3, [0.96, 0.96, 0.0]]), atol=1e-6)
    opsm = C.off_policy_sequence_mask(lr, mask, torch.tensor([-1.0, -1.0]), delta=0.05)
    # mean engine-trainer KL estimate -mean(log r): row 0 0.074 (dropped), row 1 0.020 (kept)
    assert opsm.weights[:, 0].tolist() == [0.0, 1.0]
    for bad in (lambda: C.token_reject(lr, mask, 1.5, 1.2), lambda: C.token_tis(lr, mask, cap=0),
                lambda: C.token_tis(lr, mask, cap=1.5, floor=2.0), lambda: C.token_band(lr, mask, None, None),
                lambda: C.sequence_reject_k3(lr, mask, 0.0), lambda: C.off_policy_sequence_mask(lr, mask, None)):
        with pytest.raises(ValueError):
            bad()


def test_apply_combines_parts_and_reports_health():
    lr, mask, _, adv, _ = batch()
    c = C.apply("verl.geo_rs_token_tis", lr, mask, adv)
    tis, geo = C.token_tis(lr, mask, cap=2.0), C.sequence_reject_geometric(lr, mask, 1 / 1.001, 1 / 0.999)
    assert torch.equal(c.weights, tis.weights) and torch.equal(c.keep, geo.keep)
    assert 0 < (~c.keep & mask).sum() < mask.sum()  # the Geo-RS part rejects some sequences, not all
    h = C.health(c, mask)
    assert set(h) == set(cat.HEALTH)
    assert 0 < h["ess"] < 1 and 0 < h["masked_frac"] < 1 and 0 < h["truncated_frac"] < 1
    none = C.health(C.apply("none", lr, mask), mask)
    assert none["ess"] == 1 and none["masked_frac"] == 0 and none["is_weight_mean"] == 1
    assert C.apply("tis", lr, mask, tis_cap=1.25).weights.max() == pytest.approx(1.25)
    with pytest.raises(ValueError, match="unknown correction 'foo'"):
        C.apply("foo", lr, mask)


def test_catalog_names_real_parts():
    for name, entry in cat.CATALOG.items():
        for part in entry.parts:
            assert part.fn in C.PARTS, (name, part.fn)
            fields = C.PARTS[part.fn].__code__.co_varnames
            assert set(part.kwargs) <= set(fields), (name, part.kwargs)


# ---- verl --------------------------------------------------------------------------------------------------

VERL_PRESETS = {  # catalogue name -> verl RolloutCorrectionConfig factory (its default arguments)
    "verl.token_tis": "decoupled_token_is", "verl.seq_tis": "decoupled_seq_is", "verl.seq_mis": "decoupled_seq_is_rs",
    "verl.geo_rs": "decoupled_geo_rs", "verl.k3_rs": "decoupled_k3_rs",
    "verl.geo_rs_token_tis": "decoupled_geo_rs_token_tis", "icepop": "decoupled_token_icepop",
}
RLWB_ON_VERL = {  # rlwb's own names: verl's rejection rules with rlwb's band (verl's bounds are on 1/r: symmetric)
    "mis": dict(rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0"),
    "seq_mask": dict(rollout_rs="seq_mean_k1", rollout_rs_threshold="0.5_2.0"),
    "tis": dict(rollout_is="token", rollout_is_threshold=2.0),  # at notebook 03's default tis_cap
}
VERL_NAMES = [*VERL_PRESETS, "verl.token_tis_norm", *RLWB_ON_VERL]


def verl_args(name: str) -> dict:
    """The arguments of verl's `compute_rollout_correction_and_rejection_mask` that the catalogue entry `name`
    equals: a verl preset's (so the catalogue's thresholds are held to verl's defaults), or verl's rule at rlwb's
    band."""
    from verl.trainer.config.algorithm import RolloutCorrectionConfig

    if name in RLWB_ON_VERL:
        return {"rollout_is": None, "rollout_rs": None, **RLWB_ON_VERL[name]}
    if name == "verl.token_tis_norm":
        cfg = dataclasses.replace(RolloutCorrectionConfig.decoupled_token_is(), rollout_is_batch_normalize=True)
    else:
        cfg = getattr(RolloutCorrectionConfig, VERL_PRESETS[name])()
    return dict(rollout_is=cfg.rollout_is, rollout_is_threshold=cfg.rollout_is_threshold,
                rollout_is_batch_normalize=cfg.rollout_is_batch_normalize, rollout_rs=cfg.rollout_rs,
                rollout_rs_threshold=cfg.rollout_rs_threshold)


@pytest.mark.parametrize("name", VERL_NAMES)
def test_verl_settings_equal_verl(name):
    rc = peers.verl_rollout_corr()
    args = verl_args(name)
    for seed in range(3):
        lr, mask, le, adv, lt = batch(seed)
        proto, new_mask, _ = rc.compute_rollout_correction_and_rejection_mask(lt, le, mask.float(), **args)
        ours = C.apply(name, lr, mask, adv)
        w = torch.ones_like(lr) if proto is None else proto.batch["rollout_is_weights"]
        assert_on_mask(ours.weights, w, mask, f"{name} weights")
        assert torch.equal((ours.keep & mask), new_mask.bool()), f"{name} rejection mask"
        if args.get("rollout_rs") is not None:
            assert 0 < (~ours.keep & mask).sum() < mask.sum(), "the check must see kept and rejected sequences"


def test_geo_rs_bounds_are_verls_on_the_inverse_ratio():
    """verl states Geo-RS bounds on 1/r (k1 = -log r): 0.999_1.001 keeps r in [1/1.001, 1/0.999]. Sequences
    whose geometric-mean r sits between 1.001 and 1/0.999 (or 0.999 and 1/1.001) tell the two readings apart."""
    rc = peers.verl_rollout_corr()
    r = torch.tensor([1.0010005, 1.0009, 1.0010015, 0.9990005, 0.9990015, 0.9989995], dtype=torch.float64)
    lr = torch.log(r).view(-1, 1).expand(-1, 4).contiguous()
    mask = torch.ones_like(lr, dtype=torch.bool)
    _, verl_mask, _ = rc.compute_rollout_correction_and_rejection_mask(
        lr, torch.zeros_like(lr), mask.double(), rollout_rs="seq_mean_k1", rollout_rs_threshold="0.999_1.001")
    ours = C.apply("verl.geo_rs", lr, mask)
    assert verl_mask[:, 0].bool().tolist() == [True, True, False, False, True, False]
    assert torch.equal(ours.keep, verl_mask.bool())


def test_health_equals_verl_is_metrics():
    rc = peers.verl_rollout_corr()
    lr, mask, le, _, lt = batch(1)
    _, metrics = rc.compute_rollout_correction_weights(lr, mask.float(), rollout_is="token", rollout_is_threshold=2.0)
    h = C.health(C.token_tis(lr, mask, cap=2.0), mask)
    assert h["ess"] == pytest.approx(metrics["rollout_is_eff_sample_size"], rel=1e-6)
    assert h["is_weight_mean"] == pytest.approx(metrics["rollout_is_mean"], rel=1e-6)
    assert h["is_weight_max"] == pytest.approx(metrics["rollout_is_max"], rel=1e-6)
    assert h["is_weight_std"] == pytest.approx(metrics["rollout_is_std"], rel=1e-5)
    assert h["truncated_frac"] == pytest.approx(metrics["rollout_is_ratio_fraction_high"], rel=1e-6)


def test_notebook_06s_ess_is_verls_ess_of_truncated_weights():
    """Notebook 06 holds each knob to verl's ESS >= 0.3: `metrics.ess_tis` must be the number verl logs,
    `rollout_is_eff_sample_size` at verl's default token TIS (cap 2), not the raw ratios' ESS, which one large
    ratio drives towards 0 while verl's weights are capped."""
    rc = peers.verl_rollout_corr()
    for seed in range(3):
        lr, mask, *_ = batch(seed)
        _, metrics = rc.compute_rollout_correction_weights(lr, mask.float(), rollout_is="token",
                                                           rollout_is_threshold=M.TIS_CAP)
        flat = lr[mask].double().numpy()
        assert M.ess_tis(flat) == pytest.approx(metrics["rollout_is_eff_sample_size"], rel=1e-5)
        assert M.ess_frac(flat) < 0.01 < M.ess_tis(flat)  # the batch holds ratios up to e^25: raw ESS collapses


# ---- TRL ---------------------------------------------------------------------------------------------------

def test_trl_defaults_are_the_catalogues():
    from trl import GRPOConfig

    d = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    assert d["vllm_importance_sampling_mode"] == "sequence_mask"  # TRL's default: "trl.sequence_mask"
    assert d["vllm_importance_sampling_clip_max"] == 3.0 and d["vllm_importance_sampling_clip_min"] is None
    for name in ("trl.token_truncate", "trl.token_mask", "trl.sequence_truncate", "trl.sequence_mask"):
        assert 3.0 in cat.CATALOG[name].parts[0].kwargs.values()


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_trl_modes_equal_trl(mode):
    for seed in range(3):
        lr, mask, le, _, lt = batch(seed)
        trl_ratio = peers.trl_vllm_is_ratio(mode, lt, le, mask.float())
        ours = C.apply(f"trl.{mode}", lr, mask)
        assert ours.keep.all()  # TRL zeroes weights; its loss still averages over every completion token
        assert_on_mask(ours.weights, trl_ratio, mask, mode)
        if mode.endswith("mask"):
            assert 0 < (ours.weights[mask] == 0).sum() < mask.sum()  # both sides of the band seen


def test_opsm_equals_trl():
    dropped = 0
    for seed in range(3):
        lr, mask, le, adv, lt = batch(seed)
        theirs = peers.trl_off_policy_mask(adv.view(-1, 1), lt, le, mask.float(), 0.05)
        ours = C.off_policy_sequence_mask(lr, mask, adv, 0.05)
        assert_on_mask(ours.weights, theirs, mask, "OPSM")
        dropped += int((ours.weights[mask] == 0).sum())
        assert (ours.weights[mask] == 0).sum() < mask.sum()
    assert dropped > 0
    assert cat.CATALOG["trl.opsm"].parts[0].kwargs["delta"] == 0.5


# ---- SkyRL -------------------------------------------------------------------------------------------------

def _skyrl_cfg(**kw):
    OmegaConf = peers.omegaconf()
    base = dict(tis_ratio_type=None, token_tis_ratio_clip_high=2.0, sequence_tis_ratio_clip_high=5.0,
                sequence_mask_metric=None, geo_mask_high=1.01, geo_mask_low=0.99, product_mask_high=2.0,
                product_mask_low=0.5, outlier_token_is_threshold_low=None, outlier_token_is_threshold_high=None,
                token_mask_is_threshold_low=None, token_mask_is_threshold_high=None)
    return OmegaConf.create({**base, **kw})


SKYRL_CASES = [
    ("skyrl.geo_mask", dict(sequence_mask_metric="geometric")),
    ("skyrl.outlier_mask", dict(outlier_token_is_threshold_low=1e-4, outlier_token_is_threshold_high=100.0)),
    ("skyrl.token_mask", dict(token_mask_is_threshold_low=0.5, token_mask_is_threshold_high=2.0)),
    ("tis", dict(tis_ratio_type="token")),
]


@pytest.mark.parametrize("name,cfg", SKYRL_CASES)
def test_skyrl_equals_skyrl(name, cfg):
    """What reaches SkyRL's loss, token by token: its TIS ratio (or 1) where its loss mask keeps the token, 0 where
    it does not. SkyRL's masked tokens still count in its token mean (see the loss test below), so rlwb gives
    them weight 0 and keeps them in the count."""
    sk = peers.skyrl_off_policy()
    for seed in range(3):
        lr, mask, le, adv, lt = batch(seed)
        tis, _, loss_mask = sk.compute_off_policy_correction(lt, le, mask.float(), _skyrl_cfg(**cfg))
        ours = C.apply(name, lr, mask, adv)
        assert (ours.keep | ~mask).all(), name  # nothing leaves SkyRL's token count
        theirs = (torch.ones_like(lr) if tis is None else tis) * loss_mask
        assert_on_mask(ours.weights, theirs, mask, name)
        if tis is None:
            assert 0 < (ours.weights[mask] == 0).sum() < mask.sum()


def test_skyrl_product_mask_and_sequence_tis():
    sk = peers.skyrl_off_policy()
    lr, mask, le, _, lt = batch(2)
    m, _ = sk.compute_sequence_mask(lt, le, mask.float(), "product", _skyrl_cfg())
    ours = C.sequence_reject_product(lr, mask, 0.5, 2.0, keep_in_count=True)
    assert torch.equal(ours.weights.bool() & mask, m.bool().expand_as(mask) & mask)
    w, _ = sk.compute_tis_ratio(lt, le, mask.float(), "sequence", _skyrl_cfg())
    assert_on_mask(C.sequence_tis(lr, mask, cap=5.0).weights, w, mask, "SkyRL sequence TIS")


# ---- OpenRLHF ----------------------------------------------------------------------------------------------

def test_icepop_equals_openrlhf():
    """OpenRLHF applies its IcePop coefficient inside `PolicyLoss`; with the policy equal to the old policy
    (PPO ratio 1, no clipping) and a one-hot advantage, the loss is -coef[b, t] / n_tokens: one token's
    coefficient per call."""
    loss_fn = peers.openrlhf_loss().PolicyLoss(is_correction_level="token", is_correction_mode="mask",
                                                is_correction_gating="ratio")
    assert tuple(loss_fn.is_correction_threshold) == (0.5, 5.0)  # OpenRLHF's default band = the catalogue's
    lr, mask, le, _, lt = batch(0, B=6, L=6, spread=3)  # ratios across the whole band
    ours = C.apply("icepop", lr, mask)
    n = mask.sum()
    theirs = torch.zeros_like(lr)
    for b, t in mask.nonzero().tolist():
        a = torch.zeros_like(lr)
        a[b, t] = 1.0
        loss, *_ = loss_fn(lt, lt, a, action_mask=mask.float(), rollout_log_probs=le)
        theirs[b, t] = -loss * n
    assert_on_mask(ours.weights, theirs, mask, "OpenRLHF IcePop")
    assert 0 < (ours.weights[mask] == 0).sum() < mask.sum()


# ---- how each peer's loss aggregates weights and masks -----------------------------------------------------

EPS = 0.2


def decoupled_step(seed: int):
    """One decoupled step on `batch(seed)`: the trainer's current logprobs (with grad) a small update away from its
    old ones (PPO ratios within ~[0.7, 1.4]: no peer's dual clip acts), the correction from old vs engine."""
    lr, mask, le, adv, lt = batch(seed)
    g = torch.Generator().manual_seed(100 + seed)
    cur = (lt + 0.1 * torch.randn(lt.shape, generator=g)).requires_grad_()
    return lr, mask, le, adv, lt, cur


def rlwb_loss(name: str, lr, mask, adv, lt, cur, drop_from_count: bool = False):
    """rlwb's `grpo_loss` with the catalogue entry's weights and keep (as `grpo_step` hands them over).
    `drop_from_count`: the other reading of a rejection, where a token of weight 0 also leaves the count."""
    c = C.apply(name, lr, mask, adv)
    loss, _ = losses.grpo_loss(cur, lt, adv, mask, EPS, c.weights, c.keep & (c.weights != 0) if drop_from_count
                               else c.keep)
    return loss


def assert_same_loss(ours: torch.Tensor, theirs: torch.Tensor, cur: torch.Tensor, what: str):
    g_ours, = torch.autograd.grad(ours, cur, retain_graph=True)
    g_theirs, = torch.autograd.grad(theirs, cur, retain_graph=True)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5, abs=1e-8), what
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-5, atol=1e-9, msg=lambda m: f"{what} gradient: {m}")


class VerlActorConfig(dict):
    """The fields of verl's ActorConfig that `compute_policy_loss_vanilla` reads (rlwb's clip, no dual-clip
    change at these ratios; one data-parallel rank)."""

    def __getattr__(self, k):
        return self[k]


@pytest.mark.parametrize("name", VERL_NAMES)
def test_rlwb_loss_aggregates_as_verls(name):
    """verl's own pipeline: its correction edits the response mask (rejection) and gives IS weights, its vanilla PPO
    loss multiplies the weights in and `agg_loss` takes the token mean over the edited mask, so a rejected token
    leaves the count. rlwb's `grpo_loss` with the catalogue entry must give the same value and gradient; the
    sequence mean (`seq-mean-token-mean`) and, where verl rejected tokens, the count before rejection must not."""
    rc, core = peers.verl_rollout_corr(), peers.verl_policy_loss()
    config = VerlActorConfig(clip_ratio=EPS, clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0,
                             global_batch_info={})
    for seed in range(2):
        lr, mask, le, adv, lt, cur = decoupled_step(seed)
        proto, new_mask, _ = rc.compute_rollout_correction_and_rejection_mask(lt, le, mask.float(), **verl_args(name))
        w = None if proto is None else proto.batch["rollout_is_weights"]
        a = adv.view(-1, 1).expand_as(lt)

        def verl(agg, response_mask=new_mask):
            return core.compute_policy_loss_vanilla(lt, cur, a, response_mask, agg, config, rollout_is_weights=w)[0]

        ours = rlwb_loss(name, lr, mask, adv, lt, cur)
        assert_same_loss(ours, verl("token-mean"), cur, f"{name} (seed {seed})")
        assert ours.item() != pytest.approx(verl("seq-mean-token-mean").item(), rel=1e-4)
        if (new_mask.bool() != mask).any():
            assert ours.item() != pytest.approx(verl("token-mean", mask.float()).item(), rel=1e-4)


@pytest.mark.parametrize("name,cfg", SKYRL_CASES)
def test_rlwb_loss_aggregates_as_skyrls(name, cfg):
    """SkyRL's trainer pre-scales the advantages by the minibatch's token count (`token_mean`) before its
    off-policy masks exist, and `ppo_policy_loss` sums over the masked tokens: a masked token stays in the count.
    rlwb's entry must give SkyRL's value and gradient; dropping the masked tokens from the count (verl's way) must
    not."""
    OmegaConf = peers.omegaconf()
    sk = peers.skyrl_policy_loss()
    config = OmegaConf.create(dict(policy_loss_type="regular", eps_clip_low=EPS, eps_clip_high=EPS, clip_ratio_c=3.0,
                                   off_policy_correction=_skyrl_cfg(**cfg)))
    for seed in range(2):
        lr, mask, le, adv, lt, cur = decoupled_step(seed)
        B, L = mask.shape
        scaled = sk.apply_loss_reduction_to_advantages_minibatch(adv.view(-1, 1).expand(B, L) * mask, mask.float(),
                                                                 "token_mean", micro_batch_size=B, max_seq_len=L)
        theirs, _ = sk.ppo_policy_loss(cur, lt, scaled, config, loss_mask=mask.float(), rollout_logprobs=le)
        ours = rlwb_loss(name, lr, mask, adv, lt, cur)
        assert_same_loss(ours, theirs, cur, f"{name} (seed {seed})")
        if name != "tis":
            other = rlwb_loss(name, lr, mask, adv, lt, cur, drop_from_count=True)
            assert other.item() != pytest.approx(theirs.item(), rel=1e-4)


def test_rlwb_loss_aggregates_icepop_as_openrlhfs():
    """OpenRLHF applies IcePop inside `PolicyLoss`: a token outside the band gets coefficient 0 and the token-level
    loss is the masked mean over every completion token. rlwb's `icepop` must give its value and gradient (PPO
    ratio away from 1 here, unlike the coefficient check above); OpenRLHF's per-sequence mean must differ."""
    ol = peers.openrlhf_loss()
    for seed in range(2):
        lr, mask, le, adv, lt, cur = decoupled_step(seed)
        a = adv.view(-1, 1).expand_as(lt)

        def openrlhf(token_level: bool):
            fn = ol.PolicyLoss(clip_eps_low=EPS, clip_eps_high=EPS, token_level_loss=token_level,
                               is_correction_level="token", is_correction_mode="mask", is_correction_gating="ratio")
            return fn(cur, lt, a, action_mask=mask.float(), rollout_log_probs=le)[0]

        ours = rlwb_loss("icepop", lr, mask, adv, lt, cur)
        assert (C.apply("icepop", lr, mask).weights[mask] == 0).sum() > 0  # the band zeroes some tokens
        assert_same_loss(ours, openrlhf(True), cur, f"icepop (seed {seed})")
        assert ours.item() != pytest.approx(openrlhf(False).item(), rel=1e-4)


# ---- rlwb's length-scaled Geo-RS (notebook 08) ---------------------------------------------------------------


def test_length_scaled_geo_rs_is_verls_geo_rs_at_the_reference_length():
    """At L = ref_len the band is verl's own: the same kept sequences as verl's Geo-RS preset (run by verl's code)
    on a batch whose every completion is ref_len tokens long, with kept and rejected sequences in it."""
    rc = peers.verl_rollout_corr()
    g = torch.Generator().manual_seed(3)
    L = 16
    lr = (torch.randn(64, L, generator=g, dtype=torch.float64) * torch.logspace(-5, -1, 64, dtype=torch.float64)
          .view(-1, 1))
    mask = torch.ones_like(lr, dtype=torch.bool)
    _, verl_mask, _ = rc.compute_rollout_correction_and_rejection_mask(
        lr, torch.zeros_like(lr), mask.double(), rollout_rs="seq_mean_k1", rollout_rs_threshold="0.999_1.001")
    ours = C.sequence_reject_geometric_scaled(lr, mask, ref_len=L)
    assert 0 < (~ours.keep[:, 0]).sum() < 64, "the check must see kept and rejected sequences"
    assert torch.equal(ours.keep & mask, verl_mask.bool())


@pytest.mark.parametrize("L", [1, 4, 25, 400])
def test_length_scaled_geo_rs_band_widens_by_sqrt_of_ref_len_over_length(L):
    """A completion of L tokens whose mean log r sits just inside (0.99 x) the scaled bound is kept, just outside
    (1.01 x) rejected, on both sides; the catalogue's entry is this rule at `GEO_RS_REF_LEN`."""
    s = math.sqrt(C.GEO_RS_REF_LEN / L)
    lo, hi = math.log(1 / 1.001) * s, math.log(1 / 0.999) * s
    g = torch.tensor([0.99 * hi, 1.01 * hi, 0.99 * lo, 1.01 * lo, 0.0], dtype=torch.float64)
    lr = g.view(-1, 1).expand(-1, L + 3).clone()
    mask = (torch.arange(L + 3).view(1, -1) < L).expand(5, -1)  # three padding tokens of any value change nothing
    lr[:, L:] = 7.0
    out = C.apply("geo_rs_len", lr, mask)
    assert out.keep[:, 0].tolist() == [True, False, True, False, True]
    assert not (out.keep[1] & mask[0]).any() and (out.weights[mask] == 1).all()  # leaves the count
    assert cat.CATALOG["geo_rs_len"].parts[0].kwargs["ref_len"] == C.GEO_RS_REF_LEN
    assert cat.modes("geo_rs_len") == ("trainer", "engine")  # rejection only: defined in both modes
    counted = C.sequence_reject_geometric_scaled(lr, mask, keep_in_count=True)
    assert counted.keep.all() and (counted.weights[1] == 0).all() and (counted.weights[0][:L] == 1).all()


def test_length_scaled_geo_rs_keeps_the_same_share_at_every_length():
    """Under i.i.d. per-token log-ratio noise the length-scaled band keeps about the same share of 4-token and
    256-token completions (it bounds a z-score), while verl's fixed band keeps far fewer short ones than long
    ones: the scaling is what the rule claims, not a constant widening."""
    g = torch.Generator().manual_seed(0)
    sigma = 0.001 * math.sqrt(C.GEO_RS_REF_LEN) / 1.0  # the scaled bound is 1 sd of the mean: keeps ~68%
    kept = {}
    for L in (4, 256):
        lr = torch.randn(20_000, L, generator=g, dtype=torch.float64) * sigma
        mask = torch.ones_like(lr, dtype=torch.bool)
        kept[L] = (C.apply("geo_rs_len", lr, mask).keep[:, 0].double().mean().item(),
                   C.apply("verl.geo_rs", lr, mask).keep[:, 0].double().mean().item())
    assert abs(kept[4][0] - 0.683) < 0.02 and abs(kept[256][0] - 0.683) < 0.02, kept
    assert kept[256][1] > 5 * kept[4][1], kept  # verl's band: the short completions rejected far more often


def test_length_scaled_geo_rs_refuses_a_bad_reference_length():
    lr, mask = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="ref_len"):
        C.sequence_reject_geometric_scaled(lr, mask, ref_len=0)
