"""Notebook 04's parameters: the batch sizes, shared prefix and prompts of the batch-invariance, rerun and
stale-cache checks."""

from __future__ import annotations

import typing
from dataclasses import dataclass

from rlwb.core.checked_fields import param
from rlwb.params.schemas.base import EngineParams, engine_list, prompt_source_param


@dataclass
class DeterminismParams(EngineParams):
    NOTEBOOK: typing.ClassVar[str] = "04_determinism_and_staleness"
    HEADLINE: typing.ClassVar[list[str]] = ["vllm-v1/stale_cache_abs_dlogp_max", "vllm-v1/batch_invariant_frac"]

    engines: list[str] = engine_list(["hf", "vllm-v0", "vllm-v1", "vllm-v1-fixed"], "engine presets to measure")
    prompts: int = param(16, "requests whose outputs are compared", ge=1)
    batch_sizes: list[int] = param([1, 64], "batch sizes; each > 1 is a heterogeneous batch holding the requests",
                                   ge=1)
    prefix_tokens: int = param(400, "shared prefix length in tokens (several KV-cache blocks)", ge=1)
    prompt_source: str = prompt_source_param("prompts of the batch-invariance and rerun checks: task or open_ended "
                                             "(the stale-cache check always uses task prompts behind a shared prefix)")
    max_tokens: int = param(16, "max completion tokens", ge=1)
