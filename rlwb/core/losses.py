"""GRPO / PPO loss and off-policy corrections. Pure torch functions of per-token tensors.

Shapes: every per-token tensor is [B, L] (sequences x completion positions) with a boolean `mask` of the
real completion tokens. Nothing here touches a model or an engine.

References
- GRPO: Shao et al. 2024, DeepSeekMath, https://arxiv.org/abs/2402.03300 (group-normalised advantages).
- PPO clipped surrogate: Schulman et al. 2017, https://arxiv.org/abs/1707.06347.
- Token-level loss aggregation (mean over all tokens of the batch): DAPO, https://arxiv.org/abs/2503.14476.
- Truncated importance sampling for engine/trainer mismatch: Yao et al. 2025, "Your Efficient RL Framework
  Secretly Brings You Off-Policy RL Training", https://fengyao.notion.site/off-policy-rl.
- Masked importance sampling (token mask outside [lo, hi]): IcePop, Ring-1T (inclusionAI) 2025,
  https://arxiv.org/abs/2510.18855; "When speed kills stability", Liu et al. 2025.
- Sequence-level geometric-mean masking: verl `rollout_corr` seq-mask-geo / GSPO-style length
  normalisation, https://verl.readthedocs.io (rollout correction docs).
- k3 KL estimator: Schulman, http://joschu.net/blog/kl-approx.html.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

CORRECTIONS = ("none", "tis", "mis", "seq_mask")


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """(r - mean_group) / (std_group + eps) for rewards laid out group by group ([G * group_size]).
    A group whose rewards are all equal gets zero advantage (no signal), not NaN."""
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    r = rewards.float().view(-1, group_size)
    adv = (r - r.mean(1, keepdim=True)) / (r.std(1, unbiased=False, keepdim=True) + eps)
    return adv.view(-1)


def tis_weights(logp_trainer: torch.Tensor, logp_engine: torch.Tensor, cap: float = 2.0) -> torch.Tensor:
    """Token-level truncated importance weights min(pi_trainer / pi_engine, cap) (Yao et al. 2025). Detached."""
    if cap <= 0:
        raise ValueError(f"TIS cap must be > 0, got {cap}")
    return torch.exp(logp_trainer - logp_engine).clamp(max=cap).detach()


def mis_mask(logp_trainer: torch.Tensor, logp_engine: torch.Tensor, lo: float = 0.5, hi: float = 2.0) -> torch.Tensor:
    """Token mask: keep tokens whose ratio pi_trainer / pi_engine lies in [lo, hi] (IcePop-style)."""
    if not 0 <= lo < 1 < hi:
        raise ValueError(f"MIS bounds must satisfy 0 <= lo < 1 < hi, got [{lo}, {hi}]")
    r = torch.exp(logp_trainer - logp_engine)
    return (r >= lo) & (r <= hi)


def seq_mask(logp_trainer: torch.Tensor, logp_engine: torch.Tensor, mask: torch.Tensor, lo: float = 0.5,
             hi: float = 2.0) -> torch.Tensor:
    """Sequence mask [B, 1]: keep a sequence when its geometric-mean ratio exp(mean_t log r) is in [lo, hi]."""
    if not 0 <= lo < 1 < hi:
        raise ValueError(f"seq_mask bounds must satisfy 0 <= lo < 1 < hi, got [{lo}, {hi}]")
    lr = (logp_trainer - logp_engine) * mask
    geo = torch.exp(lr.sum(1) / mask.sum(1).clamp(min=1))
    return ((geo >= lo) & (geo <= hi)).unsqueeze(1)


@dataclass
class LossStats:
    loss: float
    clip_frac: float  # fraction of (kept) tokens where the clipped branch was active
    ratio_mean: float
    kept_frac: float  # fraction of tokens not masked out by the correction
    kl_ref: float


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
              clip_eps: float = 0.2, weights: torch.Tensor | None = None, keep: torch.Tensor | None = None,
              ref_logp: torch.Tensor | None = None, beta: float = 0.0) -> tuple[torch.Tensor, LossStats]:
    """Token-level clipped surrogate  -min(r A, clip(r, 1-eps, 1+eps) A) * w  (+ beta * k3 KL to a reference),
    averaged over the kept completion tokens of the batch.

    logp: current policy [B, L] (with grad); old_logp: behaviour logprobs (engine's or trainer's, detached);
    advantages: [B] per sequence; weights: per-token correction weights (e.g. TIS); keep: boolean mask from a
    correction (MIS / seq_mask), broadcastable to [B, L].
    """
    if not 0 < clip_eps < 1:
        raise ValueError(f"clip_eps must be in (0, 1), got {clip_eps}")
    m = mask.bool()
    if keep is not None:
        m = m & keep.bool()
    n = m.sum().clamp(min=1)
    ratio = torch.exp(logp - old_logp.detach())
    a = advantages.view(-1, 1).to(logp.dtype)
    unclipped, clipped = ratio * a, ratio.clamp(1 - clip_eps, 1 + clip_eps) * a
    per_tok = -torch.minimum(unclipped, clipped)
    if weights is not None:
        per_tok = per_tok * weights.detach()
    kl = torch.zeros((), dtype=logp.dtype)
    if ref_logp is not None and beta:
        lr = ref_logp.detach() - logp
        kl_tok = torch.exp(lr) - 1 - lr
        per_tok = per_tok + beta * kl_tok
        kl = (kl_tok * m).sum() / n
    loss = (per_tok * m).sum() / n
    with torch.no_grad():
        was_clipped = (clipped < unclipped) & m
        stats = LossStats(loss=float(loss), clip_frac=float(was_clipped.sum() / n),
                          ratio_mean=float((ratio * m).sum() / n),
                          kept_frac=float(m.sum() / mask.bool().sum().clamp(min=1)), kl_ref=float(kl))
    return loss, stats


def correction_terms(correction: str, logp_trainer_old: torch.Tensor, logp_engine: torch.Tensor, mask: torch.Tensor,
                     tis_cap: float = 2.0, lo: float = 0.5, hi: float = 2.0):
    """(weights, keep) for a named correction; both None for `none`."""
    if correction == "none":
        return None, None
    if correction == "tis":
        return tis_weights(logp_trainer_old, logp_engine, tis_cap), None
    if correction == "mis":
        return None, mis_mask(logp_trainer_old, logp_engine, lo, hi)
    if correction == "seq_mask":
        return None, seq_mask(logp_trainer_old, logp_engine, mask, lo, hi)
    raise ValueError(f"unknown correction {correction!r}; allowed: {list(CORRECTIONS)}")
