"""Off-policy corrections for engine/trainer mismatch, as pure functions of per-token tensors.

Why several: the engine samples from pi_engine, the trainer's gradient wants pi_trainer. Peers correct the
gap differently — truncate the importance ratio (TIS), zero it outside a band (IcePop), or drop whole
sequences whose ratio looks off (verl's Geo-RS / Seq-MIS, SkyRL's masks, DeepSeek-V3.2's OPSM) — and each
ships its own thresholds. `rlwb.core.rl.correction_catalog` names each peer's setting; this module computes it.

Inputs: `log_ratio` = logp_trainer - logp_engine, [B, L] (log r, r = pi_trainer / pi_engine: every peer's
convention); `mask` [B, L] of real completion tokens; `advantages` [B] where a correction needs them.
Every function returns a `Correction`:
    weights  [B, L] float, detached: each token's loss term is multiplied by it (0 on padding)
    keep     [B, L] bool: tokens that still count in the loss's token mean. verl's rejection (rollout_rs edits
             the response mask its loss averages over) shrinks that count; a *weight* of 0 (IcePop, TRL's
             *_mask modes and OPSM) does not, and neither do SkyRL's masks: its token mean divides by the token
             count taken before they apply (`keep_in_count`). The same tokens gone, a different gradient
             scale, so both are kept apart; tests/test_corrections.py holds each to its peer's loss.
    truncated [B, L] bool: tokens whose weight was clamped (the TIS health number)

Sources (each function's docstring names the peer setting it equals; tests/test_corrections.py feeds the
same tensors to the peer's own code):
- TIS: Yao et al. 2025, https://fengyao.notion.site/off-policy-rl
- IcePop: Ring-1T (inclusionAI) 2025, https://arxiv.org/abs/2510.18855
- verl rollout correction: https://github.com/volcengine/verl/blob/v0.9.1/verl/trainer/ppo/rollout_corr_helper.py
- OPSM: DeepSeek-V3.2, https://arxiv.org/abs/2512.02556 (TRL's `get_off_policy_mask`)
- "When speed kills stability", Liu et al. 2025, https://richardli.xyz/rl-collapse (why sequence-level checks)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rlwb.core.measure.metrics import SAFETY_BOUND  # |log r| clamp before exp, as verl and SkyRL do (exp(20) ~ 5e8)
from rlwb.core.rl.correction_catalog import CATALOG, CORRECTIONS


@dataclass
class Correction:
    weights: torch.Tensor  # [B, L] float, detached
    keep: torch.Tensor  # [B, L] bool
    truncated: torch.Tensor  # [B, L] bool

    @staticmethod
    def identity(mask: torch.Tensor, dtype=torch.float32) -> Correction:
        m = mask.bool()
        return Correction(m.to(dtype), torch.ones_like(m), torch.zeros_like(m))


def _ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    return torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))


def _seq_sum(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (log_ratio * mask).sum(-1, keepdim=True)


def _seq_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)


def _check_band(lo: float | None, hi: float | None, what: str) -> None:
    if lo is None and hi is None:
        raise ValueError(f"{what}: give at least one bound")
    if (lo is not None and lo < 0) or (hi is not None and hi <= 0) or (lo is not None and hi is not None and lo > hi):
        raise ValueError(f"{what}: bounds must satisfy 0 <= lo <= hi and hi > 0, got [{lo}, {hi}]")


def _in_band(x: torch.Tensor, lo: float | None, hi: float | None) -> torch.Tensor:
    ok = torch.ones_like(x, dtype=torch.bool)
    if lo is not None:
        ok &= x >= lo
    if hi is not None:
        ok &= x <= hi
    return ok


def _normalize(w: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """verl's rollout_is_batch_normalize: divide by the batch mean weight (over valid tokens, or over
    sequences for sequence weights), so the weights re-centre on 1 (unless that mean is ~0)."""
    m = mask.to(w.dtype)
    if level == "token":
        mean = (w * m).sum() / (m.sum() + 1e-8)  # verl_F.masked_mean
    else:
        seq = (w * m).sum(-1) / (m.sum(-1) + 1e-8)
        valid = (m.sum(-1) > 0).to(w.dtype)
        mean = (seq * valid).sum() / valid.sum().clamp_min(1e-8)
    return w / mean if mean > 1e-8 else w


def token_tis(log_ratio: torch.Tensor, mask: torch.Tensor, cap: float = 2.0, floor: float | None = None,
              normalize: bool = False) -> Correction:
    """Token-level truncated importance sampling: w_t = clamp(r_t, floor, cap) (Yao et al. 2025).
    verl `rollout_is="token"` (cap 2, `rollout_is_batch_normalize` = normalize); TRL `token_truncate`
    (cap 3); SkyRL `tis_ratio_type="token"` (cap 2); Miles `--tis-clip-low/--tis-clip` (floor, cap)."""
    if cap <= 0 or (floor is not None and not 0 <= floor <= cap):
        raise ValueError(f"token TIS needs 0 <= floor <= cap and cap > 0, got floor={floor}, cap={cap}")
    m = mask.bool()
    r = _ratio(log_ratio)
    w = r.clamp(min=floor, max=cap) * m
    truncated = ((r > cap) | ((r < floor) if floor is not None else torch.zeros_like(m))) & m
    if normalize:
        w = _normalize(w, m, "token")
    return Correction(w.detach(), torch.ones_like(m), truncated)


def sequence_tis(log_ratio: torch.Tensor, mask: torch.Tensor, cap: float = 2.0, floor: float | None = None,
                 normalize: bool = False) -> Correction:
    """Sequence-level TIS: every token of a sequence weighted clamp(prod_t r_t, floor, cap) (unbiased before
    truncation, high variance). verl `rollout_is="sequence"` (cap 2); TRL `sequence_truncate` (cap 3);
    SkyRL `tis_ratio_type="sequence"` (cap 5)."""
    if cap <= 0 or (floor is not None and not 0 <= floor <= cap):
        raise ValueError(f"sequence TIS needs 0 <= floor <= cap and cap > 0, got floor={floor}, cap={cap}")
    m = mask.bool()
    r = _ratio(_seq_sum(log_ratio, m)).expand_as(log_ratio)
    w = r.clamp(min=floor, max=cap) * m
    truncated = ((r > cap) | ((r < floor) if floor is not None else torch.zeros_like(m))) & m
    if normalize:
        w = _normalize(w, m, "sequence")
    return Correction(w.detach(), torch.ones_like(m), truncated)


def token_band(log_ratio: torch.Tensor, mask: torch.Tensor, lo: float | None = 0.5,
               hi: float | None = 5.0) -> Correction:
    """IcePop: w_t = r_t inside [lo, hi], 0 outside; the token still counts in the loss's mean. OpenRLHF
    `is_correction_level=token, mode=mask, gating=ratio` ([0.5, 5]); verl `rollout_is_threshold="0.5_5.0"`;
    TRL `token_mask` (lo None, hi 3)."""
    _check_band(lo, hi, "token band")
    m = mask.bool()
    r = _ratio(log_ratio)
    inside = _in_band(r, lo, hi)
    return Correction((torch.where(inside, r, torch.zeros_like(r)) * m).detach(), torch.ones_like(m),
                      torch.zeros_like(m))


def sequence_band(log_ratio: torch.Tensor, mask: torch.Tensor, lo: float | None = None,
                  hi: float | None = 3.0) -> Correction:
    """Sequence-level masked IS: every token weighted by prod_t r_t when it lies in [lo, hi], else 0. TRL's
    default `vllm_importance_sampling_mode="sequence_mask"` (lo None, hi 3)."""
    _check_band(lo, hi, "sequence band")
    m = mask.bool()
    r = _ratio(_seq_sum(log_ratio, m))
    w = torch.where(_in_band(r, lo, hi), r, torch.zeros_like(r)).expand_as(log_ratio) * m
    return Correction(w.detach(), torch.ones_like(m), torch.zeros_like(m))


def _rejection(keep: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype, keep_in_count: bool) -> Correction:
    """Rejected tokens (not `keep`) leave the loss. By default they also leave its token count, as verl's do (its
    rejection edits the response mask `agg_loss` averages over). `keep_in_count`: they weigh 0 and still count,
    as in SkyRL 0.3.0, whose `token_mean` divides by the minibatch's token count before its off-policy masks
    apply (`apply_loss_reduction_to_advantages_minibatch`, then `ppo_policy_loss` sums over the masked tokens)."""
    m = mask.bool()
    keep = keep.expand_as(m)
    if keep_in_count:
        return Correction((m & keep).to(dtype), torch.ones_like(m), torch.zeros_like(m))
    return Correction(m.to(dtype), keep, torch.zeros_like(m))


def token_reject(log_ratio: torch.Tensor, mask: torch.Tensor, lo: float = 0.5, hi: float = 2.0,
                 keep_in_count: bool = False) -> Correction:
    """Tokens whose r leaves [lo, hi] leave the loss; survivors weigh 1. verl `rollout_rs="token_k1"` (bounds on
    1/r: symmetric ones like 0.5_2.0 coincide), rlwb's `mis`; SkyRL `token_mask_is_threshold_low/high` with
    `keep_in_count` (`_rejection`)."""
    _check_band(lo, hi, "token rejection")
    return _rejection(_in_band(_ratio(log_ratio), lo, hi), mask, log_ratio.dtype, keep_in_count)


def sequence_reject_product(log_ratio: torch.Tensor, mask: torch.Tensor, lo: float = 0.5,
                            hi: float = 2.0, keep_in_count: bool = False) -> Correction:
    """Whole sequences whose prod_t r_t leaves [lo, hi] leave the loss. verl `rollout_rs="seq_sum_k1"`
    (its bounds are on 1/r; symmetric ones like 0.5_2.0 coincide); SkyRL `sequence_mask_metric="product"` with
    `keep_in_count`."""
    _check_band(lo, hi, "sequence rejection")
    m = mask.bool()
    s = _seq_sum(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND), m)
    return _rejection((s >= math.log(lo)) & (s <= math.log(hi)), m, log_ratio.dtype, keep_in_count)


def sequence_reject_geometric(log_ratio: torch.Tensor, mask: torch.Tensor, lo: float = 0.99,
                              hi: float = 1.01, keep_in_count: bool = False) -> Correction:
    """Whole sequences whose geometric-mean ratio exp(mean_t log r_t) leaves [lo, hi] leave the loss: a
    length-independent check (GSPO-style). verl Geo-RS `rollout_rs="seq_mean_k1"` (0.999_1.001 on 1/r; rlwb's
    `seq_mask` is the same rule at 0.5_2.0); SkyRL `sequence_mask_metric="geometric"` (0.99, 1.01) with
    `keep_in_count`."""
    _check_band(lo, hi, "geometric sequence rejection")
    m = mask.bool()
    g = _seq_mean(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND), m)
    return _rejection((g >= math.log(lo)) & (g <= math.log(hi)), m, log_ratio.dtype, keep_in_count)


GEO_RS_REF_LEN = 4096  # tokens: the completion length at which `geo_rs_len` equals verl's Geo-RS band (see below)


def sequence_reject_geometric_scaled(log_ratio: torch.Tensor, mask: torch.Tensor, lo: float = 1 / 1.001,
                                     hi: float = 1 / 0.999, ref_len: int = GEO_RS_REF_LEN,
                                     keep_in_count: bool = False) -> Correction:
    """Geo-RS with a length-scaled band (rlwb's `geo_rs_len`): a sequence of L completion tokens is kept when its
    mean log-ratio g = mean_t log r_t lies in [log(lo) s, log(hi) s] with s = sqrt(ref_len / L); otherwise it
    leaves the loss (and its token count, as verl's rejection does).

    Why: verl's Geo-RS (`sequence_reject_geometric`, `rollout_rs="seq_mean_k1"`, band 0.999_1.001 on 1/r; verl
    v0.9.1 rollout_corr_helper.py, https://github.com/volcengine/verl/blob/v0.9.1/verl/trainer/ppo/
    rollout_corr_helper.py; introduced by Liu, Li et al. 2025, "When Speed Kills Stability", for long reasoning
    and tool-use completions) bounds the *mean* of L per-token log-ratios. Under per-token log-ratio noise of
    spread sigma that mean spreads as sigma / sqrt(L) (the standard error of a mean of L independent terms), so a
    fixed band rejects most short completions at a mismatch that long ones pass: on notebook 08's <= 32-token
    completions verl's band keeps 0.2-3% of sequences. Scaling the band by sqrt(ref_len / L) makes the statistic
    |g| sqrt(L) (a z-score of the sequence's log-ratio sum) face a fixed bound, so the kept fraction under such
    noise no longer depends on L, and equals verl's band's at L = ref_len (at L = ref_len this *is* verl's rule;
    longer completions face a narrower band). No peer ships a length-aware band (verl 0.9.1's rollout_corr_helper
    has none; SkyRL 0.3.0's geometric mask is fixed too): this is rlwb's reading, and `ref_len` (4096 tokens,
    `GEO_RS_REF_LEN`: a long reasoning completion, the setting verl's band was introduced for) is an assumption,
    stated. With `keep_in_count` rejected tokens weigh 0 and still count (`_rejection`)."""
    _check_band(lo, hi, "length-scaled geometric sequence rejection")
    if not ref_len >= 1:
        raise ValueError(f"length-scaled Geo-RS needs ref_len >= 1 token, got {ref_len}")
    m = mask.bool()
    length = m.sum(-1, keepdim=True).clamp(min=1).to(torch.float64)
    g = _seq_mean(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND).to(torch.float64), m)
    s = torch.sqrt(ref_len / length)
    keep = (g >= math.log(lo) * s) & (g <= math.log(hi) * s)
    return _rejection(keep, m, log_ratio.dtype, keep_in_count)


def sequence_reject_k3(log_ratio: torch.Tensor, mask: torch.Tensor, threshold: float = 0.01) -> Correction:
    """Whole sequences whose mean k3 = r - 1 - log r (Schulman's estimator of KL(engine || trainer)) exceeds
    `threshold` leave the loss. verl `rollout_rs="seq_mean_k3"` (0.01, `decoupled_k3_rs()`)."""
    if not threshold > 0:
        raise ValueError(f"k3 rejection threshold must be > 0, got {threshold}")
    m = mask.bool()
    lr = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return _rejection(_seq_mean(torch.exp(lr) - 1 - lr, m) <= threshold, m, log_ratio.dtype, False)


def outlier_token_reject(log_ratio: torch.Tensor, mask: torch.Tensor, lo: float | None = 1e-4,
                         hi: float | None = 100.0, keep_in_count: bool = False) -> Correction:
    """Whole sequences holding any token whose r leaves [lo, hi] leave the loss: one catastrophic token (a
    mis-sampled tail token) poisons its sequence. SkyRL `outlier_token_is_threshold_low/high` (1e-4, 100) with
    `keep_in_count`."""
    _check_band(lo, hi, "outlier rejection")
    m = mask.bool()
    out = ~_in_band(_ratio(log_ratio), lo, hi) & m
    return _rejection(~out.any(-1, keepdim=True), m, log_ratio.dtype, keep_in_count)


def off_policy_sequence_mask(log_ratio: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor,
                             delta: float = 0.5) -> Correction:
    """DeepSeek-V3.2's off-policy sequence mask (OPSM): drop a sequence when its advantage is negative *and*
    its mean KL estimate mean_t(logp_engine - logp_trainer) exceeds `delta` — learning from one's own
    mistakes only where they are one's own. TRL `off_policy_mask_threshold` (`get_off_policy_mask`; TRL's
    docs suggest 0.5). A weight of 0, as TRL applies it."""
    if not delta > 0:
        raise ValueError(f"OPSM delta must be > 0, got {delta}")
    if advantages is None:
        raise ValueError("OPSM needs the advantages")
    m = mask.bool()
    kl = _seq_mean(-log_ratio, m)
    keep_seq = (advantages.view(-1, 1) >= 0) | (kl <= delta)
    return Correction((keep_seq.expand_as(m) & m).to(log_ratio.dtype), torch.ones_like(m), torch.zeros_like(m))


PARTS = {f.__name__: f for f in (token_tis, sequence_tis, token_band, sequence_band, token_reject,
                                 sequence_reject_product, sequence_reject_geometric, sequence_reject_geometric_scaled,
                                 sequence_reject_k3,
                                 outlier_token_reject, off_policy_sequence_mask)}


def combine(parts: list[Correction], mask: torch.Tensor) -> Correction:
    """Stack corrections: weights multiply, keeps and truncations AND / OR (verl applies its IS weights and
    its rejection mask independently, both from the same ratios)."""
    out = Correction.identity(mask)
    for c in parts:
        out = Correction(out.weights * c.weights, out.keep & c.keep, out.truncated | c.truncated)
    return out


def apply(name: str, log_ratio: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor | None = None,
          tis_cap: float = 2.0) -> Correction:
    """The catalogue entry `name` on one batch. `tis_cap` is rlwb's own `tis`'s cap (notebook 03's param);
    peers' entries carry their own thresholds."""
    if name not in CATALOG:
        raise ValueError(f"unknown correction {name!r}; allowed: {list(CORRECTIONS)}")
    parts = []
    for part in CATALOG[name].parts:
        kw = dict(part.kwargs)
        if name == "tis":
            kw["cap"] = tis_cap
        if part.fn == "off_policy_sequence_mask":
            kw["advantages"] = advantages
        parts.append(PARTS[part.fn](log_ratio, mask, **kw))
    return combine(parts, mask)


def health(c: Correction, mask: torch.Tensor) -> dict[str, float]:
    """Per-step health of a correction, over the batch's real tokens, from the weights the loss applies
    (w * keep: a rejected token counts as weight 0):
    is_weight_mean/std/max; ess = (sum w)^2 / (n sum w^2) in (0, 1], the effective share of tokens (verl's
    `rollout_is_eff_sample_size`); masked_frac: tokens whose loss term is gone (weight 0 or rejected);
    truncated_frac: tokens whose weight was clamped; seq_masked_frac: sequences that lost any token."""
    m = mask.bool()
    n = m.sum().clamp(min=1)
    w = (c.weights * c.keep).double()[m]
    s1, s2 = w.sum(), (w * w).sum()
    mean = s1 / n
    gone = ((c.weights == 0) | ~c.keep) & m
    return {"is_weight_mean": float(mean), "is_weight_std": float(((w - mean) ** 2).mean().sqrt()),
            "is_weight_max": float(w.max()) if w.numel() else float("nan"),
            "ess": float(s1 * s1 / (n * s2)) if s2 > 0 else 0.0,
            "masked_frac": float(gone.sum() / n), "truncated_frac": float((c.truncated & m).sum() / n),
            "seq_masked_frac": float(gone.any(-1).double().mean())}
