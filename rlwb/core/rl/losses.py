"""GRPO / PPO loss. Pure torch functions of per-token tensors (the off-policy corrections whose weights and
masks it takes are `rlwb.core.rl.corrections`).

Shapes: every per-token tensor is [B, L] (sequences x completion positions) with a boolean `mask` of the
real completion tokens. Nothing here touches a model or an engine.

References
- GRPO: Shao et al. 2024, DeepSeekMath, https://arxiv.org/abs/2402.03300 (group-normalised advantages).
- PPO clipped surrogate: Schulman et al. 2017, https://arxiv.org/abs/1707.06347.
- Token-level loss aggregation (mean over all tokens of the batch): DAPO, https://arxiv.org/abs/2503.14476.
- k3 KL estimator: Schulman, http://joschu.net/blog/kl-approx.html.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """(r - mean_group) / (std_group + eps) for rewards laid out group by group ([G * group_size]).
    A group whose rewards are all equal gets zero advantage (no signal), not NaN."""
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    r = rewards.float().view(-1, group_size)
    adv = (r - r.mean(1, keepdim=True)) / (r.std(1, unbiased=False, keepdim=True) + eps)
    return adv.view(-1)


@dataclass
class LossStats:
    loss: float
    clip_frac: float  # fraction of (kept) tokens where the clipped branch was active
    ratio_mean: float
    kept_frac: float  # fraction of tokens not masked out by the correction
    kl_ref: float
    passes: int = 1  # forward/backward passes the update ran in (micro-batches; `grpo.accumulate_policy_gradient`)
    ratio_abs_log_mean: float = 0.0  # mean |log ratio| over kept tokens: 0 exactly when the ratio is 1 everywhere
    # the two above in the step's last optimizer step alone (`grpo.policy_updates`; NaN where not set): with matched
    # optimizer steps, the same step of every PPO regime, whether its mini-batch was trained on already or not
    last_clip_frac: float = float("nan")
    last_ratio_abs_log_mean: float = float("nan")


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
                          kept_frac=float(m.sum() / mask.bool().sum().clamp(min=1)), kl_ref=float(kl),
                          ratio_abs_log_mean=float(((logp - old_logp.detach()).abs() * m).sum() / n))
    return loss, stats
