"""Engine-trainer mismatch at known doses, for measuring what it costs a GRPO run (notebook 08).

Three kinds, each applied on the real engine path of `rlwb.core.rl.grpo` (the engine still samples; only what it
reports or which weights it samples with is changed):

- *ratio mismatch* (`logprob_noise_k3`): the engine samples from the trainer's policy, but the logprobs it
  reports are off by zero-mean Gaussian noise delta ~ N(0, sigma^2) per token (symmetric: log r has mean 0). For
  r = exp(-delta), E[k3] = E[r - 1 - log r] = exp(sigma^2 / 2) - 1, so sigma = sqrt(2 ln(1 + k3)) gives an
  intended mean k3 per token (k3: Schulman, http://joschu.net/blog/kl-approx.html). It reaches the update
  through the PPO ratio (behaviour logprobs from the engine) or a correction's weights, never through sampling.
- *distribution mismatch* (`engine_weight_noise`): the engine samples with weights theta + s * rms(theta) * z,
  z ~ N(0, 1) drawn once per seed (a fixed perturbation, like a lower-precision engine's rounding), at relative
  scale s. Its k3 depends on the model, so the achieved k3 is measured, not intended.
- *stale weights* (`engine_lag`): the engine samples at step t with the weights of step t - k (k updates
  behind, as an asynchronous trainer whose engine lags), the trainer scores with the current ones. Its logprobs
  are exact for what it sampled, so the PPO ratio against them (old_logprobs: engine, PipelineRL / verl bypass)
  accounts for the lag, while a decoupled update without a correction (old_logprobs: trainer) does not.
  Achieved k3 is measured.

Noise is drawn from generators seeded by (seed, step), never from a shared random state: the arms of one seed
see the same prompts and sampling seeds, and token (sequence i, position j) of a step gets the same noise draw in
every arm, so their reward gaps are paired.
"""

from __future__ import annotations

import math
from collections import deque

import torch


def logprob_noise_sigma(k3: float) -> float:
    """The std of Gaussian log-ratio noise whose mean k3 per token is `k3` (exp(sigma^2/2) - 1 = k3)."""
    if k3 < 0:
        raise ValueError(f"a k3 dose must be >= 0, got {k3}")
    return math.sqrt(2.0 * math.log1p(k3))


NOISE_WIDTH = 4096  # positions drawn per sequence whatever the batch's width: a token's draw depends on (row, pos)


def noisy_logprobs(logp: torch.Tensor, mask: torch.Tensor, k3: float, seed: int, step: int) -> torch.Tensor:
    """`logp` [B, L] plus N(0, sigma(k3)^2) on the real tokens (`mask`), seeded by (seed, step).

    Not capped at 0: a cap would make the error one-sided wherever the policy is confident (at p ~ 1 every draw
    above 0 is cut, so r = pi_trainer / pi_engine >= 1 on such tokens: a systematic bias, not noise, measured at
    +0.06 to +0.47 mean log r on the default policy before this was fixed). A reported "logprob" above 0 is not
    a probability, but it is what a symmetric error in the reported value is; the update only ever sees it in
    a ratio. The draws fill a [B, NOISE_WIDTH] array whatever the batch's width, so token (i, j) gets the same
    draw in every arm of a seed and step even when their completions' lengths differ."""
    if k3 == 0:
        return logp
    B, L = logp.shape
    g = torch.Generator().manual_seed(1_000_003 * seed + step + 17)
    z = torch.randn((B, max(L, NOISE_WIDTH)), generator=g, dtype=torch.float64)[:, :L]
    z = z.to(logp.dtype).to(logp.device)
    return logp + logprob_noise_sigma(k3) * z * mask.to(logp.dtype)


def weight_noise(state: dict, scale: float, seed: int) -> dict[str, torch.Tensor]:
    """A fixed perturbation per seed: for every floating tensor, scale * rms(tensor) * z with z ~ N(0, 1)
    (the rms of the initial weights, so the perturbation does not grow with training)."""
    g = torch.Generator().manual_seed(7_919 * seed + 5)
    out = {}
    for k, v in state.items():
        if v.is_floating_point() and v.numel() > 1:
            z = torch.randn(v.shape, generator=g, dtype=torch.float32)
            out[k] = (scale * v.detach().float().pow(2).mean().sqrt().cpu() * z).to(v.dtype)
    return out


def perturbed(state: dict, noise: dict[str, torch.Tensor] | None) -> dict:
    """`state` with `noise` added (the weights the engine samples with); `state` itself is not changed."""
    if not noise:
        return state
    return {k: (v.detach() + noise[k].to(v.device) if k in noise else v) for k, v in state.items()}


class LaggedWeights:
    """The weights an engine `lag` updates behind samples with: `push` the trainer's weights after each update
    and get those of `lag` updates earlier (the initial weights until that many updates have happened). Keeps
    `lag` + 1 detached copies."""

    def __init__(self, initial: dict, lag: int):
        if lag < 1:
            raise ValueError(f"an engine lag must be >= 1 update, got {lag}")
        self._states: deque[dict] = deque([_snapshot(initial)], maxlen=lag + 1)

    def push(self, state: dict) -> dict:
        self._states.append(_snapshot(state))
        return self._states[0]


def _snapshot(state: dict) -> dict:
    return {k: v.detach().clone() for k, v in state.items()}
