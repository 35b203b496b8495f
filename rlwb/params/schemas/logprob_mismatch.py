"""Notebook 01's parameters: the engine ladder's sampling settings and the reward-equivalence test."""

from __future__ import annotations

import typing
from dataclasses import dataclass

from rlwb.core.checked_fields import param
from rlwb.params.schemas.base import EngineExperimentParams


@dataclass
class MismatchParams(EngineExperimentParams):
    NOTEBOOK: typing.ClassVar[str] = "01_logprob_mismatch"
    HEADLINE: typing.ClassVar[list[str]] = ["vllm-v1/abs_dlogp_max", "vllm-v1-fixed/abs_dlogp_max",
                                             "vllm-v0/abs_dlogp_max"]

    temperature: float = param(0.7, "sampling temperature (> 0)", gt=0, le=10)
    top_p: float = param(1.0, "nucleus sampling mass in (0, 1]; 1 means off", gt=0, le=1)
    top_k: int = param(0, "top-k sampling; 0 means off", ge=0)
    clip_eps: float = param(0.2, "PPO clip epsilon for clip_frac", gt=0, lt=1)
    full_vocab: bool = param(True, "also fetch full-vocabulary logprobs (exact KL); small vocabularies only")
    heterogeneous_batch: bool = param(False, "mix prompts of very different lengths into one batch")
    reward_samples: int = param(512, "rollouts per engine for the reward-equivalence test (8 per prompt); "
                                     "0 skips it", ge=0)
