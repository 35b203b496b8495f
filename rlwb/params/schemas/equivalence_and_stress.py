"""Notebook 05's parameters: the validator's cases and tolerance, the memory-pressure batch and the long
contexts."""

from __future__ import annotations

import typing
from dataclasses import dataclass

from rlwb.core.checked_fields import param
from rlwb.params.schemas.base import EngineParams, prompt_source_param


@dataclass
class StressParams(EngineParams):
    NOTEBOOK: typing.ClassVar[str] = "05_equivalence_and_stress"
    HEADLINE: typing.ClassVar[list[str]] = ["vllm-v1/validate_pass_rate", "vllm-v1-fixed/validate_pass_rate",
                                             "vllm-v1-fixed/pressure_abs_dlogp_max"]

    validate_cases: int = param(50, "hypothesis-drawn validator cases per engine", ge=1)
    # at most 0.05: the raw-vs-processed gap the validator exists to catch is ~0.1 nat and more (notebook 02),
    # so a looser tolerance (0.5, say, to absorb bf16 noise) cannot fail on anything
    validate_tolerance: float = param(1e-3, "a validator case passes when its max abs dlogp is within this", gt=0,
                                      le=0.05)
    pressure_prompts: int = param(32, "requests in the memory-pressure batch (short and long prompts mixed)", ge=1)
    prompt_source: str = prompt_source_param("prompts of the memory-pressure batch: task (short and long mixed) or "
                                             "open_ended")
    pressure_kv_tokens: int = param(1024, "KV-cache capacity of the pressure engine in tokens (whole blocks)", ge=1)
    max_tokens: int = param(64, "completion tokens per memory-pressure request (EOS ignored)", ge=1)
    stress_temperature: float = param(1.0, "sampling temperature of both stress checks (> 0)", gt=0, le=10)
    longctx_lengths: list[int] = param([16, 512, 1024, 2048, 3072, 4064], "long-context prompt lengths in tokens",
                                       ge=1)
    longctx_prompts: int = param(2, "prompts per long-context length", ge=1)
    longctx_max_tokens: int = param(16, "completion tokens after each long prompt (EOS ignored)", ge=1)
    validate_max_context: int = param(0, "longest validator case (prompt + completion) in tokens; "
                                         "0 means the whole model context", ge=0)

    def trainer_forward(self, context: int, prompt_allowance: int) -> tuple[int, int]:
        """The scorer's largest forward (GPU memory plan): long contexts and validator cases go one at a time."""
        longest = max(self.longctx_lengths) + self.longctx_max_tokens
        return 1, max(longest, self.validate_max_context or context, self.max_tokens + prompt_allowance)
