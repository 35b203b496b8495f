"""Notebook 02's parameters: the temperatures, top-p and top-k variants each engine samples at."""

from __future__ import annotations

import typing
from dataclasses import dataclass

from rlwb.core.checked_fields import param
from rlwb.params.schemas.base import EngineExperimentParams, engine_list


@dataclass
class KLTemperatureParams(EngineExperimentParams):
    NOTEBOOK: typing.ClassVar[str] = "02_kl_vs_temperature"
    HEADLINE: typing.ClassVar[list[str]] = ["vllm-v1/T=0.5/k3_mean", "vllm-v0/T=0.5/k3_mean"]

    engines: list[str] = engine_list(["hf", "vllm-v0", "vllm-v1", "vllm-v1-processed"],
                                     "engine presets (params/engines.yaml)")
    prompts: int = param(32, "number of task prompts sampled per engine and setting", ge=1)
    temperatures: list[float] = param([0.3, 0.5, 0.7, 0.9, 1.0, 1.1, 1.3, 1.5], "sampling temperatures (> 0)",
                                      gt=0, le=10)
    top_p_values: list[float] = param([1.0, 0.9], "top-p variants; 1.0 means untruncated", gt=0, le=1)
    top_k_values: list[int] = param([0], "top-k variants; 0 means off", ge=0)
    full_vocab: bool = param(True, "also fetch full-vocabulary logprobs (exact KL); small vocabularies only")
